import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from dit_trainer.data import DigitsDataset, classify_images, digits_classifier  # noqa: E402
from dit_trainer.errors import ConfigError  # noqa: E402


@pytest.mark.parametrize("size", [16, 32])
def test_digits_dataset(size):
    ds = DigitsDataset(image_size=size)
    assert len(ds) == 1797 and ds.num_classes == 10 and ds.latent_shape == (1, size, size)
    assert ds.class_names == [str(i) for i in range(10)]
    x, y = ds[0]
    assert x.dtype == torch.float32 and tuple(x.shape) == (1, size, size)
    assert y.dtype == torch.int64 and y.ndim == 0
    assert ds.images.min() >= -1 and ds.images.max() <= 1
    assert ds.images.min() == -1 and ds.images.max() > 0.9  # uses the whole range
    assert sorted(set(ds.labels.tolist())) == list(range(10))


def test_digits_not_flipped_by_default_and_flip_deterministic():
    ds = DigitsDataset(16)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert all(torch.equal(ds[i][0], ds.images[i]) for i in range(20))
    a, b = DigitsDataset(16, random_flip=True, seed=2), DigitsDataset(16, random_flip=True, seed=2)
    a.set_epoch(1)
    b.set_epoch(1)
    flips = [not torch.equal(a[i][0], ds.images[i]) for i in range(32)]
    assert all(torch.equal(a[i][0], b[i][0]) for i in range(32)) and 0 < sum(flips) < 32


def test_bad_image_size():
    with pytest.raises(ConfigError):
        DigitsDataset(image_size=20)


@pytest.mark.parametrize("size", [16, 32])
def test_classify_real_upsampled_digits(size):
    clf = digits_classifier()
    assert clf.holdout_accuracy_ >= 0.95
    ds = DigitsDataset(size)
    held = clf.holdout_indices_
    pred = classify_images(ds.images[held])
    assert pred.dtype == np.int64 and pred.shape == (len(held),)
    assert (pred == ds.labels.numpy()[held]).mean() >= 0.9
    # numpy input without the channel axis works too
    assert np.array_equal(classify_images(ds.images[held[:10], 0].numpy()), pred[:10])
