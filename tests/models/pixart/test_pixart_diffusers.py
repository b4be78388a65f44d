"""PixArt equals diffusers' PixArtTransformer2DModel on random weights, converted either way, with and
without micro-conditions, on captions with padding; and reads the release's .pth names."""

import pytest
import torch

from dit_trainer.models.pixart.state_dict import (PixArtStateDictAdapter, diffusers_config, from_diffusers,
                                                  to_diffusers)
from tests.models.pixart.pixart_helpers import caption_batch, randomize, tiny_pixart

pytest.importorskip("diffusers")


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _theirs(model, x, t, kwargs, theirs):
    added = {k: kwargs[k] for k in ("resolution", "aspect_ratio")} if model.micro_conditions else None
    return theirs(x, encoder_hidden_states=kwargs["text_embeds"], encoder_attention_mask=kwargs["text_mask"],
                  timestep=t, added_cond_kwargs=added).sample


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "micro"])
def pair(request):
    """(ours, diffusers' built from our converted weights)."""
    from diffusers import PixArtTransformer2DModel

    ours = tiny_pixart(micro=request.param)
    theirs = PixArtTransformer2DModel(**diffusers_config(ours)).eval()
    missing, unexpected = theirs.load_state_dict(to_diffusers(ours.state_dict()), strict=True), None
    assert not missing.missing_keys and not missing.unexpected_keys and unexpected is None
    return ours, theirs


def test_ours_to_diffusers_computes_the_same(pair):
    ours, theirs = pair
    x, t, kwargs = caption_batch(micro=ours.micro_conditions)
    with torch.no_grad():
        mine, out = ours(x, t, **kwargs), _theirs(ours, x, t, kwargs, theirs)
    assert mine.shape == out.shape == (3, 8, 8, 8)
    assert _rel(mine, out) < 1e-5


def test_diffusers_to_ours_computes_the_same(pair):
    """Weights drawn in diffusers' names come back to ours and compute what diffusers computes."""
    ours, theirs = pair
    randomize(theirs, seed=7, skip=())
    back = tiny_pixart(micro=ours.micro_conditions, seed=3)
    state = from_diffusers(theirs.state_dict())
    assert "pos_embed" not in state  # diffusers holds no positions: the model's own fixed table stays
    back.load_state_dict({**state, "pos_embed": back.pos_embed}, strict=True)
    x, t, kwargs = caption_batch(seed=2, micro=ours.micro_conditions)
    with torch.no_grad():
        assert _rel(back(x, t, **kwargs), _theirs(ours, x, t, kwargs, theirs)) < 1e-5
    assert to_diffusers(back.state_dict()).keys() == theirs.state_dict().keys()


def test_padding_is_not_attended(pair):
    """Whatever a caption's padded positions hold, the output is the same (the mask is applied)."""
    ours, _ = pair
    x, t, kwargs = caption_batch(micro=ours.micro_conditions)
    noisy = dict(kwargs, text_embeds=torch.where(kwargs["text_mask"].bool()[..., None], kwargs["text_embeds"],
                                                 torch.randn_like(kwargs["text_embeds"]) * 5))
    unmasked = dict(noisy, text_mask=torch.ones_like(kwargs["text_mask"]))
    with torch.no_grad():
        a, b, c = ours(x, t, **kwargs), ours(x, t, **noisy), ours(x, t, **unmasked)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert _rel(c, a) > 1e-3  # the padding's values do reach the output once unmasked


def test_release_pth_names_load():
    """The release's .pth (DDP-wrapped here) holds our names plus its learned null caption, which is dropped."""
    ours = tiny_pixart(micro=True)
    released = {f"module.{k}": v for k, v in ours.state_dict().items()}
    released["module.y_embedder.y_embedding"] = torch.randn(5, 16)
    fresh = tiny_pixart(micro=True, seed=5)
    fresh.load_state_dict(PixArtStateDictAdapter().from_released(released), strict=True)
    x, t, kwargs = caption_batch(micro=True)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x, t, **kwargs), ours(x, t, **kwargs), rtol=0, atol=0)
