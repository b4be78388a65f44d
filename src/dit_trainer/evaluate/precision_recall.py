"""Improved precision and recall (Kynkäänniemi et al. 2019) with k = 3, as the ADM evaluator's ManifoldEstimator.

Each set's manifold is the union of balls around its points whose radius is the distance to the
k-th nearest neighbour (the point itself excluded). Precision: the share of samples inside the
reference manifold; recall: the share of references inside the sample manifold. Distances are
squared Euclidean, computed in blocks (`batch_size` rows by `batch_size` columns) so 50k×50k
never sits in memory. ADM computes the blocks in float16 and falls back to float32; here they
are float32 (a point right on a ball's edge may count differently).
"""

import numpy as np
import torch


def pairwise_sq_distances(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """|u_i - v_j|^2 for every pair, as ||u||^2 - 2 u·v + ||v||^2 clamped at 0."""
    d = (u * u).sum(1, keepdim=True) - 2.0 * (u @ v.t()) + (v * v).sum(1)[None]
    return d.clamp_min_(0.0)


def _tensor(x, device):
    if torch.is_tensor(x):
        return x.to(device=device, dtype=torch.float32)
    return torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)


def manifold_radii(features, k: int = 3, batch_size: int = 10000, device="cpu") -> np.ndarray:
    """Squared distance from each point to its k-th nearest other point (N,)."""
    f = _tensor(features, device)
    if len(f) <= k:
        raise ValueError(f"need more than k={k} points to estimate a manifold, got {len(f)}")
    radii = []
    for start in range(0, len(f), batch_size):
        rows = f[start:start + batch_size]
        d = torch.cat([pairwise_sq_distances(rows, f[c:c + batch_size]) for c in range(0, len(f), batch_size)], 1)
        # The smallest distance is the point to itself (0), so the k-th neighbour is the (k+1)-th smallest.
        radii.append(d.kthvalue(k + 1, dim=1).values)
    return torch.cat(radii).cpu().numpy()


def _inside(points, centres, radii, batch_size):
    """For each point: does it lie in some ball (centre, radius)?"""
    out = []
    for start in range(0, len(points), batch_size):
        rows = points[start:start + batch_size]
        hit = torch.zeros(len(rows), dtype=torch.bool, device=rows.device)
        for c in range(0, len(centres), batch_size):
            d = pairwise_sq_distances(rows, centres[c:c + batch_size])
            hit |= (d <= radii[None, c:c + batch_size]).any(1)
        out.append(hit)
    return torch.cat(out)


def precision_recall(ref_features, sample_features, k: int = 3, batch_size: int = 10000, device="cpu"):
    """(precision, recall) of samples against references, both N×D feature arrays."""
    ref, sam = _tensor(ref_features, device), _tensor(sample_features, device)
    if ref.ndim != 2 or sam.ndim != 2 or ref.shape[1] != sam.shape[1]:
        raise ValueError(f"expected two N×D feature arrays of the same D, got {tuple(ref.shape)} and {tuple(sam.shape)}")
    ref_radii = _tensor(manifold_radii(ref, k, batch_size, device), device)
    sam_radii = _tensor(manifold_radii(sam, k, batch_size, device), device)
    precision = _inside(sam, ref, ref_radii, batch_size).double().mean().item()
    recall = _inside(ref, sam, sam_radii, batch_size).double().mean().item()
    return float(precision), float(recall)
