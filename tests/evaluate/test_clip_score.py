"""CLIP score from a local CLIPModel folder: 100 · max(cos, 0) of the projected image and caption embeddings
(torchmetrics' CLIPScore), checked against a computation by hand; anything but a local folder is one line."""

import numpy as np
import pytest
import torch

from tests.text_helpers import save_tiny_clip_model

pytest.importorskip("transformers")

from dit_trainer.errors import ConfigError, DataError  # noqa: E402
from dit_trainer.evaluate.clip_score import clip_score, load_clip  # noqa: E402

CAPTIONS = ["a cat", "two dogs", "a red photo", "the blue digit", "one small cat", "a large dog on a mat",
            "thin left digit", "bold right digit"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny CLIP, and the same with its text projection negated: every cosine's sign flips (below 0: score 0)."""
    import shutil

    from transformers import CLIPModel

    root = tmp_path_factory.mktemp("clip")
    folder = save_tiny_clip_model(root / "clip")
    model = CLIPModel.from_pretrained(folder)
    with torch.no_grad():
        model.text_projection.weight.neg_()
    shutil.copytree(folder, root / "flipped")
    model.save_pretrained(root / "flipped")
    return {"clip": folder, "flipped": str(root / "flipped")}


def _by_hand(folder, images, captions):
    """The projected embeddings computed from the towers themselves, the cosine in float64, then 100 · max(cos, 0)."""
    from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizer

    model = CLIPModel.from_pretrained(folder).eval()
    pixels = CLIPImageProcessor.from_pretrained(folder)(images=list(images), return_tensors="pt")["pixel_values"]
    tokens = CLIPTokenizer.from_pretrained(folder)(captions, padding=True, truncation=True, max_length=16,
                                                   return_tensors="pt")  # its 16 positions
    with torch.no_grad():
        image = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output).double().numpy()
        text = model.text_projection(model.text_model(**tokens).pooler_output).double().numpy()
    cos = (image * text).sum(1) / np.linalg.norm(image, axis=1) / np.linalg.norm(text, axis=1)
    return cos, 100 * np.maximum(cos, 0)


@pytest.mark.parametrize("which", ["clip", "flipped"])
def test_scores_are_100_max_cos_0_by_hand(folders, which):
    images = np.random.default_rng(0).integers(0, 256, (8, 40, 48, 3), dtype=np.uint8)  # resized and cropped to 32
    folder = folders[which]
    scorer = load_clip(folder)
    cos, want = _by_hand(folder, images, CAPTIONS)
    assert (cos > 0).all() if which == "clip" else (cos < 0).all()  # the flipped model exercises the clamp
    np.testing.assert_allclose(scorer.scores(images, CAPTIONS), want, rtol=1e-5, atol=1e-4)
    assert clip_score(scorer, images, CAPTIONS) == pytest.approx(want.mean(), rel=1e-5, abs=1e-4)


def test_a_hub_id_or_a_folder_without_its_processor_is_one_line(folders, tmp_path):
    with pytest.raises(ConfigError) as err:
        load_clip("openai/clip-vit-large-patch14")
    assert "local transformers CLIPModel folder" in str(err.value) and "\n" not in str(err.value)
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(folders["clip"], bare)
    (bare / "preprocessor_config.json").unlink()
    with pytest.raises(DataError, match="holds no preprocessor_config.json"):
        load_clip(bare)
