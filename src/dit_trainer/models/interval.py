"""MeanFlow's second time input: the interval h = t - r, embedded like t and added to the conditioning.

A family builds the embedder (`h_embedder`, a timestep embedder of its own) only where the objective asks
for it (`objective.takes_interval`), so every other model and state dict stay the release's. Its output
layer starts at zero: a flow model's weights load beside it and the model starts as that flow model,
whatever h (Decoupled MeanFlow's start from a SiT), and adaLN-Zero's reasoning carries over.
"""

import torch
import torch.nn as nn

EMBEDDER = "h_embedder"  # the attribute, and the key prefix in state dicts


def zero_interval_embedding(model) -> None:
    """Initialise a model's interval embedder (if it has one): N(0, 0.02) into the MLP, as t's, and zero out."""
    embedder = getattr(model, EMBEDDER, None)
    if embedder is None:
        return
    nn.init.normal_(embedder.mlp[0].weight, std=0.02)
    nn.init.zeros_(embedder.mlp[0].bias)
    nn.init.zeros_(embedder.mlp[2].weight)
    nn.init.zeros_(embedder.mlp[2].bias)


def add_interval(model, c, t, h):
    """The conditioning c plus the embedding of h (0 where h is None) for a model with an interval embedder;
    c itself for any other model, which refuses an h rather than ignore it."""
    embedder = getattr(model, EMBEDDER, None)
    if embedder is None:
        if h is not None:
            raise ValueError("this model takes no interval h; build it with the meanflow objective")
        return c
    return c + embedder(torch.zeros_like(t) if h is None else h)


def check_interval(model, cfg, name: str) -> None:
    """A one-line ConfigError where the objective of `cfg` needs an interval input that model `name` lacks
    (a family whose builder adds no `h_embedder`, such as PixArt)."""
    from dit_trainer.errors import ConfigError
    from dit_trainer.objective import takes_interval

    if takes_interval(cfg) and getattr(model, EMBEDDER, None) is None:
        raise ConfigError(f"objective {cfg.objective} needs the interval input h, which model {name} does not build "
                          "(its family has no interval embedding yet); use a DiT, SiT or Large-DiT model")


def is_interval_key(key: str) -> bool:
    """Whether a state-dict key belongs to the interval embedder."""
    return key.startswith(EMBEDDER + ".")


def fit_interval(model, state: dict) -> dict:
    """Weights to start `model` from: a flow model's `state` gets `model`'s own zero-output interval embedder
    where it has none (a MeanFlow model then starts as that flow model); otherwise `state` as it is."""
    own = {k: v for k, v in model.state_dict().items() if is_interval_key(k)}
    if not own or any(is_interval_key(k) for k in state):
        return state
    return {**state, **own}
