"""Fréchet distance between two Gaussians fitted to features (FID on pool features, sFID on spatial)."""

import warnings

import numpy as np

from dit_trainer.errors import DitError


def frechet_distance(mu1, sigma1, mu2, sigma2, eps: float = 1e-6) -> float:
    """||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^1/2), with the numerics of pytorch-fid and the ADM evaluator."""
    try:
        from scipy import linalg
    except ImportError:
        raise DitError("FID needs scipy; pip install 'dit-trainer[eval]'") from None

    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    sigma1, sigma2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape:
        raise DitError(
            f"feature sizes differ: mean {mu1.shape} vs {mu2.shape}, covariance {sigma1.shape} vs {sigma2.shape}; "
            f"were both sets measured with the same network?"
        )
    diff = mu1 - mu2

    def sqrtm(m):
        # Without disp: the same square root, and scipy >= 1.18 drops the argument. Its "singular matrix"
        # warning is silenced, as disp=False did in ADM's evaluator: the finiteness check handles that case.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", linalg.LinAlgWarning)
            return linalg.sqrtm(m)

    covmean = sqrtm(sigma1.dot(sigma2))
    if not np.isfinite(covmean).all():
        # A (nearly) singular product, e.g. fewer samples than feature dimensions: nudge both diagonals.
        warnings.warn(f"FID: singular covariance product; adding {eps} to the diagonals", RuntimeWarning)
        offset = np.eye(sigma1.shape[0]) * eps
        covmean = sqrtm((sigma1 + offset).dot(sigma2 + offset))
    if np.iscomplexobj(covmean):
        # Round-off gives tiny imaginary parts; a large one means the square root is meaningless.
        if not np.allclose(np.diagonal(covmean).imag, 0, atol=1e-3):
            raise DitError(f"FID: matrix square root has an imaginary component {np.max(np.abs(covmean.imag)):.3g}; "
                           f"use more samples")
        covmean = covmean.real
    return float(diff.dot(diff) + np.trace(sigma1) + np.trace(sigma2) - 2.0 * np.trace(covmean))
