"""The one-call DiTPipeline: labels by name, diffusers' noise from a generator, PIL and numpy out."""

import numpy as np
import pytest
import torch

from dit_trainer.convert import convert
from dit_trainer.convert.pipeline import DiTPipeline


@pytest.fixture(scope="module")
def pipe(ours_dir_1k):
    return DiTPipeline.from_pretrained(ours_dir_1k)


def test_get_label_ids(pipe):
    assert pipe.get_label_ids(["golden retriever"]) == [207]
    assert pipe.get_label_ids(["Golden Retriever", 360, "tench"]) == [207, 360, 0]


def test_call_outputs(pipe):
    images = pipe(class_labels=["golden retriever", 360], num_inference_steps=5, guidance_scale=4.0,
                  generator=torch.Generator().manual_seed(3))
    assert len(images) == 2 and images[0].size == (16, 16) and images[0].mode == "RGB"
    arr = pipe(class_labels=["golden retriever", 360], num_inference_steps=5, guidance_scale=4.0,
               generator=torch.Generator().manual_seed(3), output_type="np")
    assert arr.shape == (2, 16, 16, 3) and 0 <= arr.min() and arr.max() <= 1
    assert np.array_equal(np.asarray(images[1]), np.round(arr[1] * 255).astype(np.uint8))


def test_generator_advances_like_diffusers(pipe):
    g = torch.Generator().manual_seed(5)
    first = pipe(class_labels=[1], num_inference_steps=3, generator=g, output_type="np")
    ref = torch.Generator().manual_seed(5)
    torch.randn((1, 4, 8, 8), generator=ref)  # diffusers' one draw of the starting noise
    assert torch.equal(g.get_state(), ref.get_state())
    second = pipe(class_labels=[1], num_inference_steps=3, generator=g, output_type="np")
    assert not np.allclose(first, second)


def test_pipeline_on_diffusers_folder_gives_diffusers_images(ours_dir_1k, tmp_path):
    from diffusers import DiTPipeline as HFPipeline

    out, _ = convert("ours", ours_dir_1k, "diffusers", tmp_path / "d")
    theirs = HFPipeline.from_pretrained(str(out))(class_labels=[207], num_inference_steps=10,
                                                  generator=torch.Generator().manual_seed(0), output_type="np").images
    mine = DiTPipeline.from_pretrained(out)(class_labels=[207], num_inference_steps=10,
                                            generator=torch.Generator().manual_seed(0), output_type="np")
    assert np.abs(mine - theirs).max() < 1e-3
