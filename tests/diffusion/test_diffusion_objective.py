"""Gaussian diffusion behind the Objective interface: the same numbers as `training_losses`."""

import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.diffusion.objective import DiffusionObjective
from dit_trainer.errors import ConfigError
from dit_trainer.objective import build_objective, list_objectives, register_objective


def _objective(**diffusion):
    return build_objective(build_config({"diffusion": diffusion, "model": {"learn_sigma": True}}))


def _toy_model(x, t, **kwargs):
    # A fixed function of (x, t) with the learned-sigma channel layout (eps, v).
    return torch.cat([x * 0.3 + t.float()[:, None, None, None] / 1000, torch.tanh(x)], dim=1)


def test_factory_builds_diffusion_by_default():
    obj = _objective()
    assert isinstance(obj, DiffusionObjective) and obj.samplers == ("ddpm", "ddim")
    with pytest.raises(ConfigError, match="objective 'nope'"):
        build_objective(build_config({"objective": "nope"}))
    with pytest.raises(ValueError, match="already registered"):
        register_objective("diffusion", "x:y")
    assert "transport" in list_objectives()


@pytest.mark.parametrize("sampler", ["uniform", "loss-second-moment"])
def test_loss_equals_training_losses_bit_for_bit(sampler):
    obj = _objective(timestep_sampler=sampler)
    x = torch.randn(6, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    draws = obj.draw(6, x.shape[1:], torch.Generator().manual_seed(1), "cpu")
    x_t, t = obj.model_input(x, draws)
    got = obj.loss(_toy_model(x_t, t), x, draws)
    want = obj.diffusion.training_losses(_toy_model, x, draws["t"], noise=draws["noise"])["loss"] * draws["weight"]
    assert got.shape == (6,) and torch.equal(got, want)


def test_draw_comes_from_the_generator_only():
    obj = _objective()
    a = obj.draw(5, (1, 2, 2), torch.Generator().manual_seed(3), "cpu")
    torch.manual_seed(123)  # the global RNG must not matter
    b = obj.draw(5, (1, 2, 2), torch.Generator().manual_seed(3), "cpu")
    assert list(a) == ["t", "weight", "noise"]
    for k in a:
        assert torch.equal(a[k], b[k])
    # The order is part of the contract: t first, then the noise.
    g = torch.Generator().manual_seed(3)
    t, _ = obj.schedule_sampler.sample(5, "cpu", generator=g)
    assert torch.equal(a["t"], t) and torch.equal(a["noise"], torch.randn((5, 1, 2, 2), generator=g))


def test_respaced_model_input_maps_timesteps():
    cfg = build_config({"model": {"learn_sigma": True}})
    base = DiffusionObjective.from_config(cfg)
    obj = DiffusionObjective(base.respaced("ddim", 10), base.schedule_sampler, cfg)
    draws = {"t": torch.tensor([0, 9]), "noise": torch.zeros(2, 1, 2, 2), "weight": torch.ones(2)}
    _, t = obj.model_input(torch.zeros(2, 1, 2, 2), draws)
    assert t.tolist() == [obj.diffusion.timestep_map[0], obj.diffusion.timestep_map[9]] and t[1] > 9


def test_sampler_names_are_checked():
    obj = _objective()
    with pytest.raises(ConfigError, match="does not fit objective 'diffusion'"):
        obj.sample(_toy_model, torch.zeros(1, 2, 4, 4), sampler="ode")
    out = obj.sample(lambda x, t, **k: torch.cat([torch.zeros_like(x), torch.zeros_like(x)], 1), torch.zeros(1, 2, 4, 4),
                     sampler="ddim", steps=3)
    assert out.shape == (1, 2, 4, 4) and torch.isfinite(out).all()
