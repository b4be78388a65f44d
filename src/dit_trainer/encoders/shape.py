"""The sizes of a DINOv2 ViT (torch-free, so that the planner and the config can read them)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class VitShape:
    """The hyper-parameters that fix a DINOv2 ViT's weights and its position-embedding convention."""

    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float = 4.0
    swiglu: bool = False
    num_register_tokens: int = 0
    patch_size: int = 14
    img_size: int = 518
    in_chans: int = 3
    # dinov2's interpolate_pos_encoding: the models without registers scale by (n + 0.1) / M without
    # antialiasing (an old floating-point work-around kept for their weights); those with registers
    # ask for the size with antialiasing.
    interpolate_offset: float = 0.1
    interpolate_antialias: bool = False


def swiglu_hidden(dim: int, mlp_ratio: float) -> int:
    """Hidden width of dinov2's fused SwiGLU: 2/3 of the MLP width, rounded up to a multiple of 8."""
    return (int(int(dim * mlp_ratio) * 2 / 3) + 7) // 8 * 8
