"""The `repa:` section of a run's config (a plain dataclass; importing it needs no torch)."""

import math
from dataclasses import dataclass, field
from dit_trainer.errors import ConfigError

# The release aligns block 8 whatever the model's depth (its --encoder-depth default); 8 of SiT-XL/2's 28
# is the share `encoder_depth: 0` keeps for other depths.
RELEASE_DEPTH, RELEASE_BLOCKS = 8, 28


@dataclass
class RepaConfig:
    """Representation alignment (REPA): off unless `enabled`; the defaults are the REPA release's."""

    enabled: bool = False  # add REPA's alignment loss: an MLP on the tokens after block encoder_depth is pulled towards a frozen encoder's patch tokens of the clean image (the data must hold the images: digits, an image folder, or dit extract --keep-images shards)
    coefficient: float = 0.5  # weight of the alignment loss added to the denoising loss (REPA's proj_coeff), > 0
    encoder: str = "dinov2_vitb14"  # the frozen encoder, a name dit_trainer.encoders knows (DINOv2 ViT-S/B/L/g /14, with _reg for registers)
    encoder_weights: str = "torch.hub"  # the encoder's weights: torch.hub (the official file torch.hub.load left in its cache, as REPA loads it), a torch-hub .pth file, a transformers folder or a cached Hugging Face id (facebook/dinov2-base); random: random weights (tests)
    encoder_overrides: dict = field(default_factory=dict)  # architecture keys passed to the encoder's builder over REPA's position-table convention (resampled once to the input's grid, bicubic, antialiased, as the release does for every DINOv2); tests use tiny random encoders, e.g. {embed_dim: 32, depth: 2, num_heads: 2}
    encoder_depth: int = 8  # align the tokens after this many blocks: 8, the release's --encoder-depth for every model (SiT-B, L and XL alike); 0: 8 of 28 scaled to the model's depth (round(depth * 8 / 28), at least 1), for models shallower than 8 blocks
    projector_dim: int = 2048  # width of the projector MLP (Linear, SiLU, Linear, SiLU, Linear to the encoder's width)
    encoder_size: int = 0  # the encoder's input side in pixels; 0: the size whose patch grid equals the model's token grid (tokens per side x the encoder's patch, 224 for a /2 model on 256 px images)


def check_repa(cfg) -> None:
    """One-line ConfigErrors for `repa.*` values outside what they allow (only when enabled)."""
    r = getattr(cfg, "repa", None)
    if r is None or not r.enabled:
        return
    if not (isinstance(r.coefficient, (int, float)) and r.coefficient > 0 and math.isfinite(r.coefficient)):
        raise ConfigError(f"repa.coefficient is {r.coefficient!r}; it must be a positive number such as 0.5")
    for key, value in (("encoder_depth", r.encoder_depth), ("encoder_size", r.encoder_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"repa.{key} is {value!r}; it must be 0 (derived from the model) or a positive integer")
    if isinstance(r.projector_dim, bool) or not isinstance(r.projector_dim, int) or r.projector_dim < 1:
        raise ConfigError(f"repa.projector_dim is {r.projector_dim!r}; it must be a positive integer such as 2048")
    if not isinstance(r.encoder, str) or not r.encoder.strip():
        raise ConfigError(f"repa.encoder is {r.encoder!r}; name an encoder such as dinov2_vitb14")
    if not isinstance(r.encoder_overrides, dict):
        raise ConfigError(f"repa.encoder_overrides must be a mapping of architecture keys, got {r.encoder_overrides!r}")
    encoder_shape(r)  # an unknown encoder or override is one line here, before any model is built
    if getattr(cfg, "backend", "torch") != "torch":
        raise ConfigError("repa.enabled runs on the torch backend only; set backend torch or repa.enabled false")
    par = getattr(cfg, "parallel", None)
    if par is not None and par.pp != 1:
        raise ConfigError(f"repa.enabled does not run under pipeline parallelism (parallel.pp {par.pp}): the aligned "
                          "block's tokens live on another stage; set parallel.pp 1 (FSDP and TP work)")


def resolve_depth(r, blocks: int) -> int:
    """The block whose output is aligned (1-based) for a model of `blocks` blocks; a one-line error outside it."""
    depth = r.encoder_depth or max(1, round(blocks * RELEASE_DEPTH / RELEASE_BLOCKS))
    if not 1 <= depth <= blocks:
        raise ConfigError(f"repa.encoder_depth {depth} is past the model's {blocks} blocks; pick 1..{blocks} "
                          "or 0 (REPA's 8 of 28 scaled to the model's depth)")
    return depth


def encoder_overrides(r) -> dict:
    """The builder's keys for the encoder `r` names: REPA's position-table convention, then `r.encoder_overrides`."""
    from dit_trainer.encoders import REPA_POS_RESAMPLE

    return {**REPA_POS_RESAMPLE, **dict(r.encoder_overrides)}


def encoder_shape(r) -> tuple:
    """(embed_dim, patch_size) of the encoder `r` (a RepaConfig) names, without building it."""
    from dit_trainer.encoders import shape_of

    shape = shape_of(r.encoder, **encoder_overrides(r))
    return int(shape.embed_dim), int(shape.patch_size)


def encoder_width(r) -> int:
    """The width of the encoder's patch tokens: the projector's output size."""
    return encoder_shape(r)[0]


def encoder_size(r, grid: int) -> int:
    """The encoder's input side: `repa.encoder_size`, or the one whose patch grid is the model's `grid`
    tokens per side; a one-line error when the two grids differ."""
    patch = encoder_shape(r)[1]
    size = r.encoder_size or grid * patch
    if size // patch != grid:
        raise ConfigError(f"repa.encoder_size {size} gives the encoder a {size // patch}x{size // patch} patch grid but "
                          f"the model has {grid}x{grid} tokens; set repa.encoder_size {grid * patch} (or 0)")
    return size
