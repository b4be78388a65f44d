"""Improved precision and recall (Kynkäänniemi et al. 2019) with k = 3, as the ADM evaluator's ManifoldEstimator.

Each set's manifold is the union of balls around its points whose radius is the distance to the
k-th nearest neighbour (the point itself excluded). Precision: the share of samples inside the
reference manifold; recall: the share of references inside the sample manifold. Distances are
squared Euclidean, computed in blocks of `batch_size` rows by `batch_size` columns (ADM's 10,000).

ADM keeps a row block's distances to every point (10,000 × N) to take the k-th smallest per row,
so its memory grows with N. Here each row block keeps only its k+1 smallest distances so far and
merges each column block's k+1 smallest into them; the k+1 smallest of a union are the k+1
smallest of the parts' k+1 smallest, so the radii are the same values, in memory set by the
block size alone. Every block is the same (rows, columns) pair computed the same way as before,
into buffers allocated once (a fresh 400 MB block per step would fault its pages in each time).

ADM's graph computes each block in float16: the features are cast to float16, and the squares,
squared norms, product, difference and sum are float16 tensors; a block holding inf or NaN (an
overflow past 65,504) is computed again in float32. `dtype="fp16"` (the default) does the same,
rounding to float16 wherever the graph holds a float16 tensor and accumulating the sums inside
the norms and the product in float32, as its GPU kernels do; the result does not depend on the
device. Near a ball's edge float16 rounding decides, so precision/recall match ADM's only this
way. `dtype="fp32"` computes every block in float32 (this package's earlier behaviour).
"""

import numpy as np
import torch

DISTANCE_DTYPES = ("fp16", "fp32")
BLOCK = 10_000  # ADM's block: rows and columns per distance block
GROUP = 10  # columns per group whose minimum screens a row's nearest (see _block_smallest)


class _Workspace:
    """Buffers for distance blocks of up to `elements` entries, reused by every block."""

    def __init__(self, elements: int, dtype: str, device, masks: bool = False):
        self.f32 = torch.empty(elements, dtype=torch.float32, device=device)
        self.f16 = torch.empty(elements, dtype=torch.float16, device=device) if dtype == "fp16" else None
        self.mask = torch.empty(elements, dtype=torch.bool, device=device) if masks else None

    @staticmethod
    def view(buffer: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """The first rows×cols entries of `buffer` as a contiguous matrix."""
        return buffer[:rows * cols].view(rows, cols)


def workspace_bytes(rows: int, cols: int, dtype: str, masks: bool = False) -> int:
    """Bytes of the buffers one rows×cols distance block needs (see _Workspace)."""
    return rows * cols * (4 + (2 if dtype == "fp16" else 0) + (1 if masks else 0))


def _check_dtype(dtype: str) -> None:
    if dtype not in DISTANCE_DTYPES:
        raise ValueError(f"distance dtype must be one of {', '.join(DISTANCE_DTYPES)}, got {dtype!r}")


def _fp32_block(u: torch.Tensor, v: torch.Tensor, ws: _Workspace) -> torch.Tensor:
    # ||u||² - 2 u·v + ||v||², in that order of operations, in place.
    d = ws.view(ws.f32, len(u), len(v))
    torch.mm(u, v.t(), out=d)
    d.mul_(2.0)
    torch.sub((u * u).sum(1, keepdim=True), d, out=d)
    d.add_((v * v).sum(1)[None])
    return d.clamp_min_(0.0)


def _fp16_block(u: torch.Tensor, v: torch.Tensor, ws: _Workspace, widen: bool = True) -> torch.Tensor:
    half = torch.float16
    u16, v16 = u.to(half), v.to(half)
    # Elementwise float16 ops round their exact result once (on CPU through float32, whose 24 bits
    # make rounding twice harmless for one +, - or × of float16 values); reductions run in float32
    # and round at the end.
    norm_u = (u16 * u16).float().sum(1).to(half)
    norm_v = (v16 * v16).float().sum(1).to(half)
    product = ws.view(ws.f32, len(u), len(v))
    torch.mm(u16.float(), v16.float().t(), out=product)
    d = ws.view(ws.f16, len(u), len(v))
    d.copy_(product)
    d.mul_(2)
    torch.sub(norm_u[:, None], d, out=d)
    d.add_(norm_v[None])
    d.clamp_min_(0)
    # After the clamp every entry is >= 0, inf or NaN, and amax propagates NaN: one reduction
    # answers what isfinite().all() would, without a block-sized boolean temporary.
    if bool(torch.isfinite(d.amax())):
        return product.copy_(d) if widen else d
    return _fp32_block(u.float(), v.float(), ws)


def _block(u: torch.Tensor, v: torch.Tensor, dtype: str, ws: _Workspace, widen: bool = True) -> torch.Tensor:
    """|u_i - v_j|² in `ws`'s buffer (valid until the next block): float32, or the float16 block
    itself when it is finite and not `widen` (widening is exact, so order and values are the same)."""
    return _fp16_block(u, v, ws, widen) if dtype == "fp16" else _fp32_block(u, v, ws)


def pairwise_sq_distances(u: torch.Tensor, v: torch.Tensor, dtype: str = "fp32") -> torch.Tensor:
    """|u_i - v_j|^2 for every pair as float32, ||u||^2 - 2 u·v + ||v||^2 clamped at 0, in `dtype` (see above)."""
    _check_dtype(dtype)
    ws = _Workspace(len(u) * len(v), dtype, u.device)
    return _fp16_block(u, v, ws) if dtype == "fp16" else _fp32_block(u.float(), v.float(), ws)


def _tensor(x, device):
    if torch.is_tensor(x):
        return x.to(device=device, dtype=torch.float32)
    return torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)


def _smallest(values: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` smallest values of each row, ascending (NaN ranks above inf, as in kthvalue)."""
    return values.topk(min(count, values.shape[1]), dim=1, largest=False).values


def _block_smallest(d: torch.Tensor, count: int) -> torch.Tensor:
    """`_smallest(d, count)` as float32, through the minima of column groups (a topk over a whole
    block costs four times the distances themselves on a CPU).

    Column j of the first GROUP·g columns belongs to group j mod g. The `count` groups of smallest
    minimum hold `count` values no larger than the largest of those minima, t, and every value of
    another group is at least t, so the `count` smallest values of the chosen groups and the
    leftover columns are those of the row. A NaN hides its group's other values in the minimum, so
    a block holding one takes the plain topk.
    """
    rows, cols = d.shape
    groups = cols // GROUP
    if groups >= count:
        grouped = d[:, :groups * GROUP].unflatten(1, (GROUP, groups))
        minima = grouped.amin(1)
        if not bool(torch.isnan(minima).any()):
            chosen = minima.topk(count, dim=1, largest=False).indices
            values = grouped.gather(2, chosen[:, None, :].expand(rows, GROUP, count)).flatten(1)
            return _smallest(torch.cat([values, d[:, groups * GROUP:]], 1), count).float()
    return _smallest(d, count).float()


def _radii(f: torch.Tensor, k: int, batch_size: int, dtype: str, ws: _Workspace) -> torch.Tensor:
    radii = torch.empty(len(f), dtype=torch.float32, device=f.device)
    for start in range(0, len(f), batch_size):
        rows = f[start:start + batch_size]
        nearest = None
        for c in range(0, len(f), batch_size):
            top = _block_smallest(_block(rows, f[c:c + batch_size], dtype, ws, widen=False), k + 1)
            nearest = top if nearest is None else _smallest(torch.cat([nearest, top], 1), k + 1)
        # The smallest distance is the point to itself (0), so the k-th neighbour is the (k+1)-th smallest.
        radii[start:start + len(rows)] = nearest[:, k]
    return radii


def _check_count(f: torch.Tensor, k: int) -> None:
    if len(f) <= k:
        raise ValueError(f"need more than k={k} points to estimate a manifold, got {len(f)}")


def _check_batch(batch_size) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch size must be a positive integer, got {batch_size!r}")
    return int(batch_size)


def manifold_radii(features, k: int = 3, batch_size: int = BLOCK, device="cpu", dtype: str = "fp16") -> np.ndarray:
    """Squared distance from each point to its k-th nearest other point (N,)."""
    _check_dtype(dtype)
    batch_size = _check_batch(batch_size)
    f = _tensor(features, device)
    _check_count(f, k)
    side = min(batch_size, len(f))
    return _radii(f, k, batch_size, dtype, _Workspace(side * side, dtype, f.device)).cpu().numpy()


def precision_recall(ref_features, sample_features, k: int = 3, batch_size: int = BLOCK, device="cpu",
                     dtype: str = "fp16"):
    """(precision, recall) of samples against references, both N×D feature arrays; distances in `dtype`."""
    _check_dtype(dtype)
    batch_size = _check_batch(batch_size)
    ref, sam = _tensor(ref_features, device), _tensor(sample_features, device)
    if ref.ndim != 2 or sam.ndim != 2 or ref.shape[1] != sam.shape[1]:
        raise ValueError(f"expected two N×D feature arrays of the same D, got {tuple(ref.shape)} and {tuple(sam.shape)}")
    _check_count(ref, k)
    _check_count(sam, k)
    side = min(batch_size, max(len(ref), len(sam)))
    ws = _Workspace(side * side, dtype, ref.device, masks=True)  # fits the largest block of all three passes
    ref_radii = _radii(ref, k, batch_size, dtype, ws)
    sam_radii = _radii(sam, k, batch_size, dtype, ws)
    ref_in = torch.zeros(len(ref), dtype=torch.bool, device=ref.device)
    sam_in = torch.zeros(len(sam), dtype=torch.bool, device=sam.device)
    # As ADM: one distance block per (reference rows, sample columns) serves both directions. In
    # float16 the block is not the transpose of the (samples, references) one, so the order matters.
    for r in range(0, len(ref), batch_size):
        for c in range(0, len(sam), batch_size):
            d = _block(ref[r:r + batch_size], sam[c:c + batch_size], dtype, ws)
            inside = ws.view(ws.mask, *d.shape)
            torch.le(d, sam_radii[None, c:c + batch_size], out=inside)
            ref_in[r:r + batch_size] |= inside.any(1)
            torch.le(d, ref_radii[r:r + batch_size, None], out=inside)
            sam_in[c:c + batch_size] |= inside.any(0)
    return float(sam_in.double().mean().item()), float(ref_in.double().mean().item())
