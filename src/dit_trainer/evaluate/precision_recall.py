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
into buffers allocated once (a fresh 400 MB block per step would fault its pages in each time):
the block, in float16 its rows and columns rounded and widened for the product, and a chunk of
rows' squares for the norms; a block allocates only its group minima and a few values per row
beside them (`workspace_bytes` and evaluate/memory.py count both).

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
# Feature elements whose squared norms are taken at once, in buffers of the workspace: 8 bytes each
# (32 MB) whatever the block, and a few kernel launches per block on a GPU.
CHUNK = 2**22


def _chunk_rows(rows: int, dim: int) -> int:
    """Rows of `dim` features whose norms are taken at once."""
    return min(rows, max(1, CHUNK // max(1, dim)))


class _Workspace:
    """Buffers for distance blocks of up to rows×cols entries of `dim` features, reused by every block."""

    def __init__(self, rows: int, cols: int, dim: int, dtype: str, device, masks: bool = False):
        elements, half = rows * cols, dtype == "fp16"
        self.f32 = torch.empty(elements, dtype=torch.float32, device=device)
        self.f16 = torch.empty(elements, dtype=torch.float16, device=device) if half else None
        self.mask = torch.empty(elements, dtype=torch.bool, device=device) if masks else None
        # float16: the block's rows and columns rounded to float16 and widened back for the product.
        self.u32 = torch.empty(rows * dim if half else 0, dtype=torch.float32, device=device)
        self.v32 = torch.empty(cols * dim if half else 0, dtype=torch.float32, device=device)
        # A chunk of rows' squares (float16: the rounded rows, their float16 squares, widened).
        chunk = _chunk_rows(max(rows, cols), dim) * dim
        self.sq32 = torch.empty(chunk, dtype=torch.float32, device=device)
        self.h16 = torch.empty(chunk if half else 0, dtype=torch.float16, device=device)
        self.sq16 = torch.empty(chunk if half else 0, dtype=torch.float16, device=device)

    @staticmethod
    def view(buffer: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """The first rows×cols entries of `buffer` as a contiguous matrix."""
        return buffer[:rows * cols].view(rows, cols)


def workspace_bytes(rows: int, cols: int, dtype: str, masks: bool = False, dim: int = 0) -> int:
    """Bytes of the buffers one rows×cols distance block of `dim` features needs (see _Workspace)."""
    half = dtype == "fp16"
    block = rows * cols * (4 + (2 if half else 0) + (1 if masks else 0))
    features = 4 * (rows + cols) * dim if half else 0
    return block + features + _chunk_rows(max(rows, cols), dim) * dim * (8 if half else 4)


def _chunks(x: torch.Tensor):
    """(row slice, rows) of `x` a chunk at a time."""
    step = _chunk_rows(len(x), x.shape[1])
    for start in range(0, len(x), step):
        yield slice(start, start + step), x[start:start + step]


def _sq_norms(x: torch.Tensor, ws: _Workspace) -> torch.Tensor:
    """(x * x).sum(1) of float32 `x`, a chunk of rows at a time (a row's sum does not depend on the rows beside it)."""
    out = torch.empty(len(x), dtype=torch.float32, device=x.device)
    for rows, part in _chunks(x):
        square = torch.mul(part, part, out=ws.view(ws.sq32, *part.shape))
        torch.sum(square, 1, out=out[rows])
    return out


def _rounded(x: torch.Tensor, buffer: torch.Tensor, ws: _Workspace):
    """(x rounded to float16 and widened back, in `buffer`; its rows' float16 squared norms): ADM's
    graph's u16 and (u16 * u16).sum(1), squares rounded to float16 and summed in float32."""
    out = buffer[:x.numel()].view(x.shape)
    norms = torch.empty(len(x), dtype=torch.float16, device=x.device)
    for rows, part in _chunks(x):
        h = ws.view(ws.h16, *part.shape).copy_(part)
        square = torch.mul(h, h, out=ws.view(ws.sq16, *part.shape))
        norms[rows] = ws.view(ws.sq32, *part.shape).copy_(square).sum(1)
        out[rows].copy_(h)
    return out, norms


def _check_dtype(dtype: str) -> None:
    if dtype not in DISTANCE_DTYPES:
        raise ValueError(f"distance dtype must be one of {', '.join(DISTANCE_DTYPES)}, got {dtype!r}")


def _fp32_block(u: torch.Tensor, v: torch.Tensor, ws: _Workspace) -> torch.Tensor:
    # ||u||² - 2 u·v + ||v||², in that order of operations, in place.
    d = ws.view(ws.f32, len(u), len(v))
    torch.mm(u, v.t(), out=d)
    d.mul_(2.0)
    torch.sub(_sq_norms(u, ws)[:, None], d, out=d)
    d.add_(_sq_norms(v, ws)[None])
    return d.clamp_min_(0.0)


def _fp16_block(u: torch.Tensor, v: torch.Tensor, ws: _Workspace, widen: bool = True) -> torch.Tensor:
    # Elementwise float16 ops round their exact result once (on CPU through float32, whose 24 bits
    # make rounding twice harmless for one +, - or × of float16 values); reductions run in float32
    # and round at the end.
    u16, norm_u = _rounded(u, ws.u32, ws)
    v16, norm_v = _rounded(v, ws.v32, ws)
    product = ws.view(ws.f32, len(u), len(v))
    torch.mm(u16, v16.t(), out=product)
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
    ws = _Workspace(len(u), len(v), u.shape[1], dtype, u.device)
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
    return _radii(f, k, batch_size, dtype, _Workspace(side, side, f.shape[1], dtype, f.device)).cpu().numpy()


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
    ws = _Workspace(side, side, ref.shape[1], dtype, ref.device, masks=True)  # fits the largest block of all three passes
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
