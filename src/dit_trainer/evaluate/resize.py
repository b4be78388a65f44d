"""TensorFlow 1.x bilinear resize, the one inside the FID Inception graph the ADM evaluator runs.

TF1's `ResizeBilinear` (align_corners=False) maps output pixel i to input coordinate i * in/out,
with no half-pixel offset, and clamps the right/bottom neighbour at the edge. torch's
`F.interpolate(mode="bilinear", align_corners=False)` uses half-pixel centres instead, which
shifts every pixel and changes FID by a few tenths at 256 px; torch-fidelity reproduces TF1 for
the same reason.
"""

import torch


def _axis(in_size: int, out_size: int, device):
    # TF computes the source coordinate in float32: out_index * (in / out).
    scale = torch.tensor(in_size / out_size, dtype=torch.float32)
    src = torch.arange(out_size, dtype=torch.float32) * scale
    lo = src.floor().long().clamp_max(in_size - 1)
    hi = (lo + 1).clamp_max(in_size - 1)
    frac = src - lo.float()
    return lo.to(device), hi.to(device), frac.to(device)


def resize_bilinear_tf1(x: torch.Tensor, size: int) -> torch.Tensor:
    """N×C×H×W float images resized to size×size as TF1's ResizeBilinear (align_corners=False) does."""
    if x.ndim != 4 or not x.is_floating_point():
        raise ValueError(f"expected a float N×C×H×W tensor, got {x.dtype} {tuple(x.shape)}")
    h, w = x.shape[-2:]
    if (h, w) == (size, size):
        return x
    y_lo, y_hi, dy = _axis(h, size, x.device)
    x_lo, x_hi, dx = _axis(w, size, x.device)
    dx = dx.to(x.dtype)
    dy = dy.to(x.dtype)
    # Same order of operations as TF: lerp along x on the two rows, then along y.
    top = x.index_select(2, y_lo)
    bottom = x.index_select(2, y_hi)
    top = top.index_select(3, x_lo) + (top.index_select(3, x_hi) - top.index_select(3, x_lo)) * dx
    bottom = bottom.index_select(3, x_lo) + (bottom.index_select(3, x_hi) - bottom.index_select(3, x_lo)) * dx
    return top + (bottom - top) * dy[:, None]
