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


def _guide_folder(root, num_classes, vae_dir, seed):
    from dit_trainer.convert import Bundle, write
    from dit_trainer.convert.model_config import build_dit
    from tests.convert.convert_helpers import TINY, randomize

    cfg = {**TINY, "num_classes": num_classes}
    model = randomize(build_dit(cfg), seed=seed).eval()
    return write("ours", Bundle(state_dict=model.state_dict(), model=cfg, vae=vae_dir, scaling_factor=0.5), root / "g")


def test_autoguidance_with_a_guide_folder(pipe, vae_dir, tmp_path):
    guide = _guide_folder(tmp_path, 1000, vae_dir, seed=11)
    kw = dict(class_labels=[3, 7], num_inference_steps=3, guidance_scale=1.0, seed=2, output_type="np")
    plain = pipe(**kw)
    assert np.array_equal(pipe(**kw, guide=guide, guide_scale=1.0), plain)  # w = 1: the main model alone
    guided = pipe(**kw, guide=DiTPipeline.from_pretrained(guide), guide_scale=2.0)
    assert guided.shape == plain.shape and not np.allclose(guided, plain)
    assert np.array_equal(pipe(**kw, guide=guide, guide_scale=2.0), guided)


def test_a_guide_of_other_classes_is_refused_in_one_line(pipe, vae_dir, tmp_path):
    from dit_trainer.errors import ConfigError

    other = _guide_folder(tmp_path, 10, vae_dir, seed=12)
    with pytest.raises(ConfigError, match=r"^guide has 10 classes but the main model 1000; a guide must be trained on"):
        pipe(class_labels=[3], num_inference_steps=2, guide=other, guide_scale=2.0)
