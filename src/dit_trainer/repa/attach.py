"""The projector as an optional submodule of a model, created from `cfg.repa` by the family's builder.

Torch-free at import: model families register without torch and import this module then.
"""

from dit_trainer.repa.config import resolve_depth

PROJECTOR = "repa_projector"  # the attribute, and the key prefix in state dicts


def model_width(model) -> int:
    """The width of the model's tokens (Large-DiT's dim, DiT's hidden_size)."""
    return getattr(model, "dim", None) or model.pos_embed.shape[-1]


def attach_projector(model, cfg):
    """Give `model` the projector `cfg.repa` asks for (nothing when REPA is off); returns the model."""
    r = getattr(cfg, "repa", None)
    if r is None or not getattr(r, "enabled", False):
        return model
    from dit_trainer.repa.config import encoder_width
    from dit_trainer.repa.projector import build_projector

    model.repa_depth = resolve_depth(r, len(model.blocks))
    model.repa_projector = build_projector(model_width(model), r.projector_dim, encoder_width(r))
    return model


def aligned_depth(model) -> int:
    """The block whose output the projector reads (1-based); a ValueError for a model without one."""
    depth = getattr(model, "repa_depth", None)
    if depth is None:
        raise ValueError("this model has no REPA projector; build it with repa.enabled true")
    return depth


def project(model, hidden):
    """The projector's (B, N, z_dim) output for the aligned block's (B, N, D) tokens."""
    projector = getattr(model, PROJECTOR, None)
    if projector is None:
        raise ValueError("this model has no REPA projector; build it with repa.enabled true")
    return projector(hidden)


def is_projector_key(key: str) -> bool:
    """Whether a state-dict key belongs to the REPA projector."""
    return key.startswith(PROJECTOR + ".")


def drop_projector(state: dict) -> dict:
    """`state` without the projector's keys (exports and sampling carry the denoiser only)."""
    return {k: v for k, v in state.items() if not is_projector_key(k)}


def fit_projector(model, state: dict) -> dict:
    """Weights to start `model` from: the projector of `state` where `model` has one of its shape, else
    `model`'s own fresh projector; none where `model` has none (a REPA run's weights start a plain one)."""
    own = {k: v for k, v in model.state_dict().items() if is_projector_key(k)}
    theirs = {k: v for k, v in state.items() if is_projector_key(k)}
    fits = theirs.keys() == own.keys() and all(theirs[k].shape == own[k].shape for k in own)
    return {**drop_projector(state), **(theirs if fits else own)}
