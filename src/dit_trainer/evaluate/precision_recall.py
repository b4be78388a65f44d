"""Improved precision and recall (Kynkäänniemi et al. 2019) with k = 3, as the ADM evaluator's ManifoldEstimator.

Each set's manifold is the union of balls around its points whose radius is the distance to the
k-th nearest neighbour (the point itself excluded). Precision: the share of samples inside the
reference manifold; recall: the share of references inside the sample manifold. Distances are
squared Euclidean, computed in blocks (`batch_size` rows by `batch_size` columns, ADM's 10,000)
so 50k×50k never sits in memory.

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


def _fp32_distances(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    d = (u * u).sum(1, keepdim=True) - 2.0 * (u @ v.t()) + (v * v).sum(1)[None]
    return d.clamp_min_(0.0)


def _fp16_distances(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    half = torch.float16
    u16, v16 = u.to(half), v.to(half)
    # Elementwise float16 ops round their exact result once (on CPU through float32, which is exact
    # for one +, - or × of float16 values); reductions run in float32 and round at the end.
    norm_u = (u16 * u16).float().sum(1).to(half)
    norm_v = (v16 * v16).float().sum(1).to(half)
    product = (u16.float() @ v16.float().t()).to(half)
    d = (norm_u[:, None] - 2 * product) + norm_v[None]
    return d.clamp_min_(0)


def pairwise_sq_distances(u: torch.Tensor, v: torch.Tensor, dtype: str = "fp32") -> torch.Tensor:
    """|u_i - v_j|^2 for every pair as float32, ||u||^2 - 2 u·v + ||v||^2 clamped at 0, in `dtype` (see above)."""
    if dtype not in DISTANCE_DTYPES:
        raise ValueError(f"distance dtype must be one of {', '.join(DISTANCE_DTYPES)}, got {dtype!r}")
    if dtype == "fp16":
        d = _fp16_distances(u, v)
        if bool(torch.isfinite(d).all()):
            return d.float()
    return _fp32_distances(u.float(), v.float())


def _tensor(x, device):
    if torch.is_tensor(x):
        return x.to(device=device, dtype=torch.float32)
    return torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)


def manifold_radii(features, k: int = 3, batch_size: int = 10000, device="cpu", dtype: str = "fp16") -> np.ndarray:
    """Squared distance from each point to its k-th nearest other point (N,)."""
    f = _tensor(features, device)
    if len(f) <= k:
        raise ValueError(f"need more than k={k} points to estimate a manifold, got {len(f)}")
    radii = []
    for start in range(0, len(f), batch_size):
        rows = f[start:start + batch_size]
        d = torch.cat([pairwise_sq_distances(rows, f[c:c + batch_size], dtype) for c in range(0, len(f), batch_size)], 1)
        # The smallest distance is the point to itself (0), so the k-th neighbour is the (k+1)-th smallest.
        radii.append(d.kthvalue(k + 1, dim=1).values)
    return torch.cat(radii).cpu().numpy()


def precision_recall(ref_features, sample_features, k: int = 3, batch_size: int = 10000, device="cpu",
                     dtype: str = "fp16"):
    """(precision, recall) of samples against references, both N×D feature arrays; distances in `dtype`."""
    ref, sam = _tensor(ref_features, device), _tensor(sample_features, device)
    if ref.ndim != 2 or sam.ndim != 2 or ref.shape[1] != sam.shape[1]:
        raise ValueError(f"expected two N×D feature arrays of the same D, got {tuple(ref.shape)} and {tuple(sam.shape)}")
    ref_radii = _tensor(manifold_radii(ref, k, batch_size, device, dtype), device)
    sam_radii = _tensor(manifold_radii(sam, k, batch_size, device, dtype), device)
    ref_in = torch.zeros(len(ref), dtype=torch.bool, device=ref.device)
    sam_in = torch.zeros(len(sam), dtype=torch.bool, device=sam.device)
    # As ADM: one distance block per (reference rows, sample columns) serves both directions. In
    # float16 the block is not the transpose of the (samples, references) one, so the order matters.
    for r in range(0, len(ref), batch_size):
        for c in range(0, len(sam), batch_size):
            d = pairwise_sq_distances(ref[r:r + batch_size], sam[c:c + batch_size], dtype)
            ref_in[r:r + batch_size] |= (d <= sam_radii[None, c:c + batch_size]).any(1)
            sam_in[c:c + batch_size] |= (d <= ref_radii[r:r + batch_size, None]).any(0)
    return float(sam_in.double().mean().item()), float(ref_in.double().mean().item())
