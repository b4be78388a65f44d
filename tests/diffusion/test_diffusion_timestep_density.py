"""Shaped timestep densities: logit-normal on the step axis and FasterDiT's lognormal by noise level."""

import numpy as np
import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.diffusion import create_diffusion
from dit_trainer.diffusion.timestep_sampler import (
    LogitNormalSampler,
    LogNormalSNRSampler,
    create_named_schedule_sampler,
)
from dit_trainer.errors import ConfigError
from dit_trainer.objective import build_objective

N = 200_000


def _direct_steps(name, diffusion, mean, std, n):
    """The documented formulas, computed here from the same normal draws."""
    z = (mean + std * n).double()
    u = torch.sigmoid(z)
    if name == "logit-normal":
        return torch.clamp(torch.floor(u * diffusion.num_timesteps), max=diffusion.num_timesteps - 1).long()
    acp = torch.as_tensor(diffusion.alphas_cumprod, dtype=torch.float64)
    step_log_snr = torch.log(acp / (1 - acp))
    target = torch.log(((1 - u) / u) ** 2)
    return (step_log_snr[None, :] - target[:, None]).abs().argmin(dim=1)


@pytest.mark.parametrize("name", ["logit-normal", "lognormal"])
@pytest.mark.parametrize("mean,std", [(0.0, 1.0), (1.0, 0.5), (-0.5, 1.5)])
def test_steps_follow_the_documented_formula(name, mean, std):
    diffusion = create_diffusion("")
    sampler = create_named_schedule_sampler(name, diffusion, mean, std)
    t, w = sampler.sample(4096, "cpu", generator=torch.Generator().manual_seed(0))
    n = torch.randn((4096,), generator=torch.Generator().manual_seed(0))
    want = _direct_steps(name, diffusion, mean, std, n)
    # Only a draw on a bin edge (float rounding) may land one step over.
    assert (t - want).abs().max() <= 1 and (t == want).float().mean() > 0.999
    assert t.dtype == torch.long and torch.equal(w, torch.ones(4096))


@pytest.mark.parametrize("name", ["logit-normal", "lognormal"])
def test_histogram_matches_the_density_and_the_mean_moves_it(name):
    diffusion = create_diffusion("")
    steps = np.arange(diffusion.num_timesteps)
    means = {}
    for mean in (0.0, 1.0):
        sampler = create_named_schedule_sampler(name, diffusion, mean, 1.0)
        p = sampler.weights()
        assert p.shape == (1000,) and abs(p.sum() - 1) < 1e-9 and (p >= 0).all()
        t = sampler.sample(N, "cpu", generator=torch.Generator().manual_seed(1))[0].numpy()
        mu = (steps * p).sum()
        sd = np.sqrt((steps**2 * p).sum() - mu**2)
        assert abs(t.mean() - mu) < 4 * sd / np.sqrt(N), (t.mean(), mu)
        cdf = np.cumsum(p)
        for q in (0.1, 0.25, 0.5, 0.75, 0.9):
            assert abs(np.quantile(t, q) - np.searchsorted(cdf, q)) <= 3, (q, np.quantile(t, q))
        means[mean] = t.mean()
    # mean > 0 favours the noisier (later) steps.
    assert means[1.0] > means[0.0] + 50


def test_logit_normal_is_symmetric_and_lognormal_centres_on_snr_one():
    diffusion = create_diffusion("")
    p = LogitNormalSampler(diffusion).weights()
    np.testing.assert_allclose(p, p[::-1], atol=1e-12)
    # lognormal(0, s): the median step is the one where the signal and noise are equal (SNR 1).
    q = LogNormalSNRSampler(diffusion).weights()
    snr = diffusion.alphas_cumprod / (1 - diffusion.alphas_cumprod)
    assert abs(np.searchsorted(np.cumsum(q), 0.5) - np.abs(np.log(snr)).argmin()) <= 1


def test_objective_draws_the_shaped_steps_from_the_generator_only():
    cfg = build_config({"diffusion": {"timestep_sampler": "lognormal", "timestep_mean": 0.5,
                                          "timestep_std": 0.8}})
    obj = build_objective(cfg)
    assert isinstance(obj.schedule_sampler, LogNormalSNRSampler) and obj.schedule_sampler.std == 0.8
    a = obj.draw(16, (1, 2, 2), torch.Generator().manual_seed(3), "cpu")
    torch.manual_seed(7)
    np.random.seed(7)
    b = obj.draw(16, (1, 2, 2), torch.Generator().manual_seed(3), "cpu")
    assert all(torch.equal(a[k], b[k]) for k in a)
    g = torch.Generator().manual_seed(3)
    t, _ = obj.schedule_sampler.sample(16, "cpu", generator=g)  # t first, then the noise
    assert torch.equal(a["t"], t) and torch.equal(a["noise"], torch.randn((16, 1, 2, 2), generator=g))


@pytest.mark.parametrize("key,value", [("timestep_std", 0.0), ("timestep_std", -1.0), ("timestep_sampler", "log")])
def test_bad_density_settings_are_one_line(key, value):
    with pytest.raises(ConfigError, match=f"diffusion.{key}") as err:
        build_objective(build_config({"diffusion": {"timestep_sampler": "logit-normal", key: value}}))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["logit-normal", "lognormal"])
def test_a_tiny_run_learns_under_each_density(tiny_train_losses, name):
    losses = tiny_train_losses(40, diffusion={"timestep_sampler": name})
    assert sum(losses[-8:]) / 8 < 0.8 * sum(losses[:8]) / 8, losses
