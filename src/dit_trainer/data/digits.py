"""scikit-learn's bundled 8×8 digits: the demo's training set, and a classifier to score its samples.

scikit-learn ships the digits inside the package, so the demo needs no download. It is an optional
dependency (``pip install 'dit-trainer[demo]'``) and is imported only when digits are asked for.
"""

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from dit_trainer.errors import ConfigError, DitError
from dit_trainer.data.indexing import check_epoch, check_index, flip_for

DIGIT_CLASS_NAMES = [str(i) for i in range(10)]
_MAX_PIXEL = 16.0  # load_digits() pixels count 4×4 blocks of set bits: 0..16


def _sklearn_datasets():
    try:
        import sklearn.datasets
    except ImportError:
        raise DitError("the digits demo needs scikit-learn; pip install 'dit-trainer[demo]'") from None
    return sklearn.datasets


@functools.lru_cache(maxsize=1)
def load_digit_arrays():
    """All 1797 digits as (float32 N×8×8 images in 0..16, int64 N labels)."""
    digits = _sklearn_datasets().load_digits()
    return digits.images.astype(np.float32), digits.target.astype(np.int64)


def upsample_digits(images8, image_size: int) -> torch.Tensor:
    """8×8 digits in 0..16 as float32 N×1×S×S images in [-1, 1]."""
    x = torch.as_tensor(np.asarray(images8, dtype=np.float32)).reshape(-1, 1, 8, 8)
    x = x / _MAX_PIXEL * 2.0 - 1.0
    if image_size != 8:
        # Bilinear gives smooth strokes that look like handwriting; nearest gives 2×2 or 4×4 blocks
        # that the model must reproduce exactly. Bilinear mixes neighbours, so it stays in [-1, 1].
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    return x.contiguous()


class DigitsDataset(Dataset):
    """The scikit-learn digits as 1×S×S images in [-1, 1] with labels 0..9."""

    num_classes = 10
    class_names = DIGIT_CLASS_NAMES
    pixel_space = True  # the data is the images themselves (REPA's encoder reads them as they are)

    def __init__(self, image_size=16, random_flip=False, seed=0):
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8 or image_size % 8:
            # A multiple of 8 keeps classify_images' box-downsampling back to 8×8 exact.
            raise ConfigError(f"digits image_size must be a multiple of 8 (16 or 32), got {image_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
        images8, labels = load_digit_arrays()
        self.images = upsample_digits(images8, image_size)
        self.labels = torch.from_numpy(labels)
        self.image_size = image_size
        self.latent_shape = (1, image_size, image_size)
        # Off by default: a mirrored 2 or 7 is not a digit, so flipping teaches the model wrong glyphs.
        self.random_flip = bool(random_flip)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose flips `__getitem__` draws."""
        self.epoch = check_epoch(epoch)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        index = check_index(index, len(self))
        x = self.images[index].clone()
        if self.random_flip and flip_for(self.seed, self.epoch, index):
            x = x.flip(-1)
        return x, self.labels[index].clone()


@functools.lru_cache(maxsize=4)
def digits_classifier(holdout: float = 0.2, seed: int = 0):
    """An RBF SVC fit on the real 8×8 digits, less a stratified `holdout` share kept for scoring it.

    The fitted classifier carries `holdout_indices_` (into load_digit_arrays()) and
    `holdout_accuracy_` (None when holdout is 0). It is cached: do not refit it.
    """
    _sklearn_datasets()
    from sklearn.model_selection import train_test_split
    from sklearn.svm import SVC

    images8, labels = load_digit_arrays()
    flat = images8.reshape(len(images8), -1)
    indices = np.arange(len(labels))
    if holdout > 0:
        train, test = train_test_split(indices, test_size=holdout, random_state=seed, stratify=labels)
    else:
        train, test = indices, indices[:0]
    # The classic digits SVC on raw 0..16 pixels. A StandardScaler in front would blow up the nearly
    # constant border pixels, making the classifier brittle to the blur of up- then down-sampling.
    clf = SVC(gamma=0.001, C=1.0).fit(flat[train], labels[train])
    clf.holdout_indices_ = test
    clf.holdout_accuracy_ = float(clf.score(flat[test], labels[test])) if len(test) else None
    return clf


def images_to_digits8(images) -> np.ndarray:
    """N×1×S×S (or N×S×S) images in [-1, 1] box-downsampled to N×64 pixels in 0..16."""
    x = torch.as_tensor(np.asarray(images, dtype=np.float32))
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4 or x.shape[1] != 1 or x.shape[2] != x.shape[3] or x.shape[2] < 8:
        raise ValueError(f"expected N×1×S×S images with S >= 8, got shape {tuple(x.shape)}")
    # A diverged model yields NaN; score it as a blank (wrong) digit instead of crashing the check.
    x = torch.nan_to_num(x, nan=-1.0, posinf=1.0, neginf=-1.0)
    x = F.adaptive_avg_pool2d(x, 8)
    x = ((x + 1.0) / 2.0 * _MAX_PIXEL).clamp(0.0, _MAX_PIXEL)
    return x.reshape(len(x), 64).numpy()


def classify_images(images, classifier=None) -> np.ndarray:
    """Predicted digit (int64) for each of N×1×S×S images in [-1, 1]."""
    clf = digits_classifier() if classifier is None else classifier
    flat = images_to_digits8(images)
    if len(flat) == 0:
        return np.zeros(0, dtype=np.int64)
    return clf.predict(flat).astype(np.int64)
