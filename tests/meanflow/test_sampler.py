"""MeanFlow's sampler against a hand-written loop z <- z - (t - r) u, at 1 and N steps, and its noise levels."""

import math

import pytest
import torch
from tests.meanflow._tiny import tiny_config, tiny_model

from dit_trainer.errors import ConfigError
from dit_trainer.objective import build_objective
from dit_trainer.sample.sampling import sample_latents


@pytest.fixture(scope="module")
def model():
    return tiny_model().eval()


def by_hand(model, z, y, times):
    """The JAX code's solver_step over `times` (paper's t), the network at 1 - t giving -u."""
    for t, r in zip(times[:-1], times[1:]):
        tt = torch.full((len(z),), t)
        u = -model(z, 1 - tt, y, h=tt - r)
        z = z - (t - r) * u
    return z


@pytest.mark.parametrize("steps,timesteps,expected", [
    (1, None, [1.0, 0.0]), (3, None, [1.0, 2 / 3, 1 / 3, 0.0]), (None, [1.0, 0.6, 0.0], [1.0, 0.6, 0.0])])
def test_sampler_equals_hand_written_loop(model, steps, timesteps, expected):
    objective = build_objective(tiny_config())
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(3, 4, 8, 8, generator=g), torch.tensor([1, 5, 9])
    options = {} if timesteps is None else {"timesteps": timesteps}
    got = objective.sample(lambda x, t, **kw: model(x, t, **kw), z, steps=steps, model_kwargs={"y": y}, **options)
    want = by_hand(model, z, y, expected)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, z)


def test_sample_latents_draws_one_step_samples_with_the_config_schedule(model):
    """The sampling entry point takes the objective's own steps: here the config's two-step schedule."""
    cfg = tiny_config(steps=2, timesteps=[1.0, 0.8, 0.0])
    objective = build_objective(cfg)
    counter = {}
    got = sample_latents(model, objective, [2, 3], cfg_scale=1.0, steps=None, seed=4, counter=counter)
    z = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(got, by_hand(model, z, torch.tensor([2, 3]), [1.0, 0.8, 0.0]), rtol=1e-5, atol=1e-6)
    assert counter["nfe"] == 2


def test_noise_level_is_the_linear_paths():
    objective = build_objective(tiny_config())
    sigma = objective.noise_level(torch.tensor([0.0, 0.25, 0.5, 1.0]))  # the network's time: 0 is noise
    assert math.isinf(sigma[0]) and sigma[1:].tolist() == [3.0, 1.0, 0.0]


@pytest.mark.parametrize("options,match", [({"timesteps": [1.0, 0.5]}, "fall from 1"),
                                           ({"steps": 0}, "positive integer"), ({"atol": 1e-3}, "atol")])
def test_bad_schedules_are_one_line_errors(model, options, match):
    objective = build_objective(tiny_config())
    steps = options.pop("steps", None)
    with pytest.raises(ConfigError, match=match):
        objective.sample(lambda x, t, **kw: model(x, t, **kw), torch.zeros(1, 4, 8, 8), steps=steps,
                         model_kwargs={"y": torch.tensor([0])}, **options)
