"""Per-channel statistics: exact merged moments, normalise/undo, and the decode fold."""

import math

import numpy as np
import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.vae import latent_stats as ls


def _rows(rng, n, kinds):
    """Stored rows N×F×K×C×H×W with channels of very different means and spreads."""
    mean = rng.normal(size=(n, 2, 1, 3, 2, 2)) * np.array([1, 5, 0.1]).reshape(1, 1, 1, 3, 1, 1) + np.array(
        [0, -3, 7]).reshape(1, 1, 1, 3, 1, 1)
    if kinds == 1:
        return mean.astype(np.float16)
    std = np.abs(rng.normal(size=mean.shape)) * 0.3
    return np.concatenate([mean, std], axis=2).astype(np.float16)


@pytest.mark.parametrize("kinds", [1, 2])
def test_merged_shard_sums_equal_the_moments_of_all_rows(kinds):
    rng = np.random.default_rng(0)
    shards = [_rows(rng, n, kinds) for n in (5, 1, 7)]
    mean, std = ls.merge(ls.channel_sums(s) for s in [*shards, shards[0][:0]])  # an empty shard counts nothing
    rows = np.concatenate(shards).astype(np.float64)
    second = (rows[:, :, 0] ** 2).mean(axis=(0, 1, 3, 4))
    if kinds == 2:  # a posterior sample's E[z²] = E[m² + s²]
        second += (rows[:, :, 1] ** 2).mean(axis=(0, 1, 3, 4))
    want = rows[:, :, 0].mean(axis=(0, 1, 3, 4))
    np.testing.assert_allclose(mean, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(std, np.sqrt(second - want ** 2), rtol=1e-10)
    assert ls.merge([ls.channel_sums(shards[0][:0])]) is None


def test_normalize_denormalize_and_fold_agree():
    stats = ([0.5, -2.0, 3.0], [2.0, 0.25, 4.0])
    z = torch.randn(2, 3, 4, 4)
    x = ls.normalize(z, stats)
    torch.testing.assert_close(x[:, 1], (z[:, 1] + 2.0) / 0.25)
    torch.testing.assert_close(ls.denormalize(x, stats), z)
    assert ls.normalize(z, None) is z and ls.denormalize(z, None) is z
    # What the VAE decodes: x / factor + shift = (x · std + mean) / sf + shift_factor.
    factor, shift = ls.fold(stats, 0.5, 0.1)
    want = (ls.denormalize(x, stats)) / 0.5 + 0.1
    torch.testing.assert_close(x / factor.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1), want)


def test_stats_of_follows_latent_norm():
    class Data:
        latent_norm, latent_mean, latent_std = "auto", [1.0], [2.0]

    assert ls.stats_of(Data) == ([1.0], [2.0])
    Data.latent_norm = "scale"
    assert ls.stats_of(Data) is None
    Data.latent_norm, Data.latent_mean = "channel", None
    assert ls.stats_of(Data) is None


def test_bad_statistics_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"latent_mean must list 2 finite numbers"):
        ls.check_stats([0.0, math.nan], [1.0, 1.0], 2, "data", ConfigError)
    with pytest.raises(ConfigError, match=r"latent_std must list 2 finite numbers"):
        ls.check_stats([0.0, 1.0], [1.0], 2, "data", ConfigError)
    with pytest.raises(ConfigError, match=r"latent_std holds a value <= 0"):
        ls.check_stats([0.0, 1.0], [1.0, 0.0], 2, "data", ConfigError)


def test_config_takes_both_or_neither():
    from dit_trainer.config import build_config

    with pytest.raises(ConfigError, match=r"data.latent_mean is set but data.latent_std is not"):
        build_config(None, ["--data.latent_mean", "[0.0, 1.0]"])
    with pytest.raises(ConfigError, match=r"data.latent_norm 'mean' is not one of auto\|channel\|scale"):
        build_config(None, ["--data.latent_norm", "mean"])
    cfg = build_config(None, ["--data.latent_mean", "[0, 1]", "--data.latent_std", "[1, 2]"])
    assert cfg.data.latent_mean == [0.0, 1.0] and cfg.data.latent_std == [1.0, 2.0]
