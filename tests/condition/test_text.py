"""TextCondition: captions read from a batch, dropped rows replaced by the null caption's encoding, the
unconditional rows of guidance, and one-line errors for data without captions."""

import pytest
import torch

from dit_trainer.condition import TextCondition
from dit_trainer.errors import DataError

NULL = {"text_embeds": torch.full((3, 2), 9.0, dtype=torch.float16), "text_mask": torch.tensor([1, 0, 0])}


def _batch(b=4):
    g = torch.Generator().manual_seed(0)
    return {"x": torch.zeros(b, 4, 2, 2), "text_embeds": torch.randn(b, 3, 2, generator=g).bfloat16(),
            "text_mask": torch.ones(b, 3, dtype=torch.bool), "resolution": torch.ones(b, 2) * 512}


@pytest.fixture
def cond():
    c = TextCondition(("text_embeds", "text_mask", "resolution"), 0.5, "PixArt-test", width=2)
    c.set_null(NULL, "cpu")
    return c


def test_inputs_are_cast_for_training(cond):
    kwargs = cond.inputs(_batch(), "cpu")
    assert list(kwargs) == ["text_embeds", "text_mask", "resolution"]
    assert kwargs["text_embeds"].dtype == torch.float32 and kwargs["text_mask"].dtype == torch.long


def test_dropped_rows_are_the_null_caption_and_micro_conditions_stay(cond):
    batch = _batch()
    kwargs = cond.drop(cond.inputs(batch, "cpu"), torch.tensor([True, False, True, False]))
    for i in (0, 2):
        assert torch.equal(kwargs["text_embeds"][i], NULL["text_embeds"].float())
        assert kwargs["text_mask"][i].tolist() == [1, 0, 0]
    for i in (1, 3):
        assert torch.equal(kwargs["text_embeds"][i], batch["text_embeds"][i].float()) and kwargs["text_mask"][i].all()
    assert torch.equal(kwargs["resolution"], batch["resolution"])  # the image's, whatever its caption


def test_draw_is_the_same_stream_as_labels(cond):
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(cond.draw_drop(8, a), torch.rand(8, generator=b) < 0.5)


def test_unconditional_rows_and_guidance_kwargs(cond):
    kwargs = cond.inputs(_batch(2), "cpu")
    doubled = cond.guidance_kwargs(kwargs, cond.unconditional(2, "cpu"))
    assert doubled["text_embeds"].shape == (4, 3, 2) and torch.equal(doubled["text_embeds"][2], NULL["text_embeds"].float())
    assert torch.equal(doubled["resolution"][2:], kwargs["resolution"])  # repeated from the conditional rows


def test_prompts_through_an_encoder(cond):
    class Encoder:
        name = "stub"

        def encode(self, captions):
            n = len(captions)
            return {"text_embeds": torch.arange(n * 6.0).reshape(n, 3, 2), "text_mask": torch.ones(n, 3)}

    kwargs = cond.from_prompts(Encoder(), ["a", "b"], "cpu", resolution=torch.ones(2, 2))
    assert kwargs["text_embeds"].shape == (2, 3, 2) and kwargs["text_mask"].dtype == torch.long
    cond.null_from_encoder(Encoder(), "cpu")
    assert torch.equal(cond.unconditional(1, "cpu")["text_embeds"][0], torch.arange(6.0).reshape(3, 2))


def test_a_batch_without_captions_is_one_line(cond):
    with pytest.raises(DataError) as err:
        cond.inputs({"x": torch.zeros(2), "y": torch.zeros(2)}, "cpu")
    assert "lacks text_embeds, text_mask, resolution" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DataError, match="holds no captions"):
        cond.bind(object(), "cpu")


def test_a_null_caption_of_another_length_or_width_is_one_line(cond):
    with pytest.raises(DataError, match="set model.text_hidden_size 4"):
        cond.set_null({"text_embeds": torch.zeros(3, 4), "text_mask": torch.ones(3)}, "cpu")
    cond.set_null({"text_embeds": torch.zeros(5, 2), "text_mask": torch.ones(5)}, "cpu")
    with pytest.raises(DataError, match="null caption's text_embeds is"):
        cond.drop(cond.inputs(_batch(), "cpu"), torch.ones(4, dtype=torch.bool))


def test_micro_conditions_a_batch_lacks_are_the_training_images():
    """A micro-conditioned model trained on captions that carry no image sizes sees the training images' size,
    square (PixArt-alpha's fixed-resolution data); a batch's own values are kept."""
    keys = ("text_embeds", "text_mask", "resolution", "aspect_ratio")
    cond = TextCondition(keys, 0.5, "PixArt-test", width=2, image_size=256)
    batch = {k: v for k, v in _batch(3).items() if k != "resolution"}
    kwargs = cond.inputs(batch, "cpu")
    assert torch.equal(kwargs["resolution"], torch.full((3, 2), 256.0))
    assert torch.equal(kwargs["aspect_ratio"], torch.ones(3, 1))
    own = cond.inputs({**batch, "resolution": torch.full((3, 2), 512.0)}, "cpu")
    assert torch.equal(own["resolution"], torch.full((3, 2), 512.0))
    with pytest.raises(DataError, match="lacks resolution, aspect_ratio"):  # no image size known: as before
        TextCondition(keys, 0.5, "PixArt-test", width=2).inputs(batch, "cpu")
