"""Feature statistics in the ADM evaluator's reference-batch layout: `mu`, `sigma`, `mu_s`, `sigma_s`.

ADM's published reference batches (`VIRTUAL_imagenet256_labeled.npz`, ...) hold those four arrays
(over the whole training set) and 10,000 images in `arr_0` for precision/recall; files written
here hold the four arrays, the pool features themselves (`features`, for precision/recall without
images) and the name of the network that measured them (`network`). Both kinds load.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from dit_trainer.errors import DataError
from dit_trainer.fs import staged_file
from dit_trainer.evaluate.npz import IMAGES_KEY, npz_keys, read_npz_array

STAT_KEYS = ("mu", "sigma", "mu_s", "sigma_s")


def gaussian_stats(features):
    """(mean, covariance) of N×D features, covariance with N-1 as np.cov."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"expected N×D features with N >= 2, got shape {f.shape}")
    return f.mean(axis=0), np.cov(f, rowvar=False)


class GaussianAccumulator:
    """Mean and covariance of features seen batch by batch, equal to gaussian_stats of them all.

    A whole dataset's features need not fit in memory (ImageNet's 1.28 M images × 4,071 floats
    would take 21 GB): sums are kept in float64, shifted by the first batch's mean so the
    covariance does not cancel catastrophically.
    """

    def __init__(self):
        self.n = 0
        self.shift = self.sum = self.outer = None

    def update(self, features) -> None:
        """Add N×D features."""
        x = np.asarray(features, dtype=np.float64)
        if self.shift is None:
            self.shift = x.mean(axis=0)
            self.sum = np.zeros_like(self.shift)
            self.outer = np.zeros((len(self.shift), len(self.shift)))
        x = x - self.shift
        self.n += len(x)
        self.sum += x.sum(axis=0)
        self.outer += x.T @ x

    def result(self):
        """(mean, covariance with N-1)."""
        if self.n < 2:
            raise ValueError(f"statistics need at least 2 feature vectors, got {self.n}")
        mean = self.sum / self.n
        cov = (self.outer - self.n * np.outer(mean, mean)) / (self.n - 1)
        return mean + self.shift, cov


@dataclass
class ReferenceStats:
    """Gaussian fits of pool (`mu`, `sigma`) and spatial (`mu_s`, `sigma_s`) features, plus optional extras."""

    mu: np.ndarray
    sigma: np.ndarray
    mu_s: np.ndarray
    sigma_s: np.ndarray
    features: Optional[np.ndarray] = None  # N×D pool features, for precision/recall
    network: Optional[str] = None  # None: unknown (ADM's files, which are Inception)

    @classmethod
    def from_features(cls, features, network=None, keep_features=True) -> "ReferenceStats":
        """Fit both Gaussians to a Features value."""
        mu, sigma = gaussian_stats(features.pool)
        mu_s, sigma_s = gaussian_stats(features.spatial)
        return cls(mu, sigma, mu_s, sigma_s, np.asarray(features.pool, np.float32) if keep_features else None, network)

    def save(self, path) -> Path:
        """Write an .npz holding mu, sigma, mu_s, sigma_s (and features, network when known)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {k: getattr(self, k) for k in STAT_KEYS}
        if self.features is not None:
            arrays["features"] = self.features
        if self.network is not None:
            arrays["network"] = np.asarray(self.network)
        with staged_file(path) as tmp, open(tmp, "wb") as f:  # a file object keeps numpy from appending ".npz"
            np.savez(f, **arrays)
        return path

    @classmethod
    def load(cls, path) -> Optional["ReferenceStats"]:
        """The statistics in an .npz, or None when it holds only images (`arr_0`)."""
        path = Path(path)
        keys = npz_keys(path)
        present = [k for k in STAT_KEYS if k in keys]
        if not present:
            if IMAGES_KEY in keys:
                return None
            raise DataError(f"{path} holds neither statistics ({', '.join(STAT_KEYS)}) nor images ({IMAGES_KEY})")
        if len(present) != len(STAT_KEYS):
            missing = [k for k in STAT_KEYS if k not in keys]
            raise DataError(f"{path} lacks {', '.join(missing)}; a reference needs all of {', '.join(STAT_KEYS)}")
        remedy = (f"reference statistics are numeric arrays ({', '.join(STAT_KEYS)}), as dit eval "
                  f"--ref-from-images writes them")
        features = read_npz_array(path, "features", remedy) if "features" in keys else None
        network = str(read_npz_array(path, "network", remedy)) if "network" in keys else None
        stats = [read_npz_array(path, k, remedy) for k in STAT_KEYS]
        odd = [k for k, v in zip(STAT_KEYS, stats) if not np.issubdtype(v.dtype, np.number)]
        if odd:
            raise DataError(f"{path}: {odd[0]} is {stats[STAT_KEYS.index(odd[0])].dtype}, not numbers; rebuild the "
                            "reference with dit eval --ref-from-images")
        return cls(*stats, features=features, network=network)
