"""MeanFlow's second time input: the interval h = t - r, embedded like t and added to the conditioning; and
improved MeanFlow's guidance scale w, embedded the same way where the run trains over a range of scales.

A family builds each embedder (`h_embedder`, `w_embedder`: timestep embedders of their own) only where the
objective asks for it (`objective.takes_interval`, `objective.takes_guidance_scale`), so every other model
and state dict stay the release's. Their output layers start at zero: a flow model's weights load beside
them and the model starts as that flow model, whatever h and w (Decoupled MeanFlow's start from a SiT), and
adaLN-Zero's reasoning carries over. The scale enters as w - 1, so no guidance (w = 1) is the embedder's 0.
"""

import torch
import torch.nn as nn

EMBEDDER = "h_embedder"  # the attribute, and the key prefix in state dicts
GUIDANCE_EMBEDDER = "w_embedder"  # likewise for the guidance scale
EMBEDDERS = (EMBEDDER, GUIDANCE_EMBEDDER)


def zero_interval_embedding(model) -> None:
    """Initialise a model's interval and guidance embedders (those it has): N(0, 0.02) into the MLP, as t's,
    and zero out."""
    for name in EMBEDDERS:
        embedder = getattr(model, name, None)
        if embedder is None:
            continue
        nn.init.normal_(embedder.mlp[0].weight, std=0.02)
        nn.init.zeros_(embedder.mlp[0].bias)
        nn.init.zeros_(embedder.mlp[2].weight)
        nn.init.zeros_(embedder.mlp[2].bias)


def add_interval(model, c, t, h, w=None):
    """The conditioning c plus the embeddings of h (0 where None) and of the guidance scale w - 1 (w None: 1,
    unguided) for the embedders the model has; a model without one refuses its input rather than ignore it."""
    for name, value, zero, missing in (
            (EMBEDDER, h, 0.0, "interval h; build it with the meanflow objective"),
            (GUIDANCE_EMBEDDER, w, 1.0, "guidance scale w; build it with meanflow.omega_range set")):
        embedder = getattr(model, name, None)
        if embedder is None:
            if value is not None:
                raise ValueError(f"this model takes no {missing}")
            continue
        c = c + embedder((torch.zeros_like(t) + zero if value is None else value.to(t.dtype)) - zero)
    return c


def check_interval(model, cfg, name: str) -> None:
    """A one-line ConfigError where the objective of `cfg` needs an interval input that model `name` lacks
    (a family whose builder adds no `h_embedder`)."""
    from dit_trainer.errors import ConfigError
    from dit_trainer.objective import takes_interval

    if takes_interval(cfg) and getattr(model, EMBEDDER, None) is None:
        raise ConfigError(f"objective {cfg.objective} needs the interval input h, which model {name} does not build "
                          "(its family has no interval embedding yet); use a DiT, SiT, Large-DiT or PixArt model")


def is_interval_key(key: str, name: str = None) -> bool:
    """Whether a state-dict key belongs to the interval embedder or the guidance embedder (or to `name`)."""
    return any(key.startswith(n + ".") for n in ((name,) if name else EMBEDDERS))


def fit_interval(model, state: dict) -> dict:
    """Weights to start `model` from: a `state` without the interval or guidance embedder gets `model`'s own,
    zero-output (a MeanFlow model then starts as the flow model, or the MeanFlow model, it was); the
    embedders `state` has are its own."""
    for name in EMBEDDERS:
        own = {k: v for k, v in model.state_dict().items() if is_interval_key(k, name)}
        if own and not any(is_interval_key(k, name) for k in state):
            state = {**state, **own}
    return state
