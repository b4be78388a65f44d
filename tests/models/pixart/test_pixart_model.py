"""The PixArt model beside diffusers: guidance through the condition value (the sampling-side hook), the
options it refuses, and class-label sampling refusing a caption-conditioned model."""

import pytest
import torch

from dit_trainer.condition import TextCondition
from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from tests.models.pixart.pixart_helpers import CAPTION_TOKENS, TINY, caption_batch, tiny_pixart


def test_forward_with_cfg_guides_with_the_null_caption():
    """[captions; null caption] from the condition value, guided as DiT's forward_with_cfg: the first
    in_channels mixed, the learned sigma passed through from the conditional half."""
    model = tiny_pixart(micro=True)
    cond = TextCondition(model.condition_keys, 0.1, width=TINY["text_hidden_size"])
    g = torch.Generator().manual_seed(4)
    cond.set_null({"text_embeds": torch.randn(CAPTION_TOKENS, 16, generator=g),
                   "text_mask": torch.tensor([1, 0, 0, 0, 0])}, "cpu")
    x, t, batch = caption_batch(2, micro=True)
    kwargs = cond.inputs(batch, "cpu")
    doubled = cond.guidance_kwargs(kwargs, cond.unconditional(2, "cpu"))
    with torch.no_grad():
        guided = model.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), 3.0, **doubled)
        c, u = model(x, t, **kwargs), model(x, t, **{**kwargs, **cond.unconditional(2, "cpu")})
    torch.testing.assert_close(guided[:2, :4], u[:, :4] + 3.0 * (c[:, :4] - u[:, :4]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(guided[:2, 4:], c[:, 4:], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(c, u, atol=1e-3)  # the caption does change the prediction


def test_micro_conditions_are_required_where_the_model_has_them():
    model = tiny_pixart(micro=True)
    x, t, kwargs = caption_batch(micro=False)
    with pytest.raises(ValueError, match="resolution"):
        model(x, t, **kwargs)


@pytest.mark.parametrize("model,message", [
    ({"name": "PixArt-alpha-XL/2-1024", "hidden_size": 64, "num_heads": 4}, "multiple of 3"),
    ({"name": "PixArt-Sigma-XL/2-512", "hidden_size": 48, "num_heads": 5}, "does not divide"),
    ({"name": "PixArt-alpha-XL/2-256", "interpolation_scale": 0}, "positive"),
])
def test_bad_options_are_one_line(model, message):
    with pytest.raises(ConfigError) as err:
        build_config({"model": model})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_class_label_sampling_refuses_a_caption_model():
    from dit_trainer.sample import sample_latents

    with pytest.raises(ConfigError) as err:
        sample_latents(tiny_pixart(), None, [0, 1], steps=2)
    assert "text_embeds" in str(err.value) and "\n" not in str(err.value)


def test_a_micro_conditioned_pixart_trains_on_captions_without_image_sizes(tmp_path):
    """PixArt-alpha 1024's micro-conditions come from the data: captioned latents carry no image sizes, so each
    image is the training images' size (data.image_size), square; the size embedders are learnt."""
    from tests.parallel._common import TinyCaptions, learns, tiny_config

    from dit_trainer.train import DiTTrainer

    cfg = tiny_config(tmp_path / "run", kind="pixart", model={"micro_conditions": True}, data={"image_size": 64},
                      train={"max_steps": 2})
    trainer = DiTTrainer(cfg, dataset=TinyCaptions())
    assert trainer.condition.image_size == 64 and "resolution" in trainer.model.condition_keys
    out, changed = learns(trainer, ["csize_embedder.mlp.2"], 2)
    assert torch.isfinite(torch.tensor(out["loss"])) and changed
