"""Tiny PixArts for the family's tests: width 48 (a multiple of 3 for the micro-conditions), 2 heads."""

import torch

TINY = {"depth": 2, "hidden_size": 48, "num_heads": 2, "text_hidden_size": 16}
CAPTION_TOKENS = 5


def tiny_pixart(micro=False, seed=0, name=None, **overrides):
    """A tiny PixArt of 8x8x4 latents whose every weight (but the fixed positions) is random, so that a
    zero-initialised layer cannot hide a mistake."""
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec

    name = name or ("PixArt-alpha-XL/2-1024" if micro else "PixArt-alpha-XL/2-256")
    cfg = build_config({"model": {"name": name, "input_size": 8, "in_channels": 4, **TINY, **overrides}})
    torch.manual_seed(seed)
    model = get_spec(name).build_model_fn(cfg)
    randomize(model, seed)
    return model.eval()


@torch.no_grad()
def randomize(model, seed=0, skip=("pos_embed",)):
    """Every parameter but `skip` drawn anew, N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if not any(name.endswith(s) for s in skip):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def caption_batch(b=3, seed=1, micro=False):
    """(x, t, model kwargs): padded captions of 3, 5 and 1 tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, CAPTION_TOKENS, 1, 4][:b]
    mask = torch.tensor([[1] * n + [0] * (CAPTION_TOKENS - n) for n in lengths])
    kwargs = {"text_embeds": torch.randn(b, CAPTION_TOKENS, TINY["text_hidden_size"], generator=g), "text_mask": mask}
    if micro:
        kwargs["resolution"] = torch.tensor([[1024.0, 1024.0], [768.0, 1344.0], [512.0, 512.0], [1024.0, 768.0]][:b])
        kwargs["aspect_ratio"] = kwargs["resolution"][:, :1] / kwargs["resolution"][:, 1:]
    x = torch.randn(b, 4, 8, 8, generator=g)
    t = torch.tensor([0, 500, 999, 250][:b])
    return x, t, kwargs
