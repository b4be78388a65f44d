"""The objective interface: TransportObjective and DiffusionObjective, and build_objective."""

from types import SimpleNamespace

import pytest
import torch

from dit_trainer.config import Config, build_config
from dit_trainer.diffusion.objective import DiffusionObjective
from dit_trainer.errors import ConfigError
from dit_trainer.models.dit import DiT
from dit_trainer.objective import build_objective, list_objectives
from dit_trainer.transport import TransportConfig, create_transport
from dit_trainer.transport.objective import TransportObjective

from tests.transport.gaussian import GaussianTarget


def _transport_cfg(**kw):
    return SimpleNamespace(objective="transport", transport=TransportConfig(**kw), model=SimpleNamespace(learn_sigma=True))


def test_build_objective_defaults_to_diffusion_and_builds_transport():
    assert isinstance(build_objective(build_config({})), DiffusionObjective)
    with pytest.raises(ConfigError, match="objective auto is resolved when the config is built"):
        build_objective(Config())  # auto belongs to build_config, which knows the model
    obj = build_objective(_transport_cfg(path_type="GVP", prediction="noise", t_sampler="logit-normal"))
    assert isinstance(obj, TransportObjective) and obj.transport.path_type == "GVP" and obj.learn_sigma
    assert {"diffusion", "transport"} <= set(list_objectives())
    with pytest.raises(ConfigError, match="objective 'edm'"):
        build_objective(SimpleNamespace(objective="edm"))


@pytest.mark.parametrize("t_sampler", ["uniform", "logit-normal"])
def test_transport_draw_is_deterministic_given_the_generator(t_sampler):
    obj = build_objective(_transport_cfg(prediction="score", t_sampler=t_sampler))
    a = obj.draw(8, (1, 4, 4), torch.Generator().manual_seed(0), "cpu")
    torch.manual_seed(99)
    b = obj.draw(8, (1, 4, 4), torch.Generator().manual_seed(0), "cpu")
    c = obj.draw(8, (1, 4, 4), torch.Generator().manual_seed(1), "cpu")
    assert set(a) == {"t", "noise"} and a["t"].dtype == torch.float32 and a["noise"].shape == (8, 1, 4, 4)
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["t"], c["t"])
    assert float(a["t"].min()) >= 1e-3 and float(a["t"].max()) <= 1 - 1e-3
    # t first, then the noise, from the one generator.
    g = torch.Generator().manual_seed(0)
    g_t = torch.rand(8, generator=g) if t_sampler == "uniform" else torch.randn(8, generator=g)
    assert torch.equal(torch.randn((8, 1, 4, 4), generator=g), a["noise"]) and g_t.shape == (8,)


def test_transport_loss_matches_training_losses_and_drops_a_learned_sigma_half():
    obj = build_objective(_transport_cfg())
    x = torch.randn(6, 2, 4, 4)
    draws = obj.draw(6, x.shape[1:], torch.Generator().manual_seed(3), "cpu")
    x_t, t = obj.model_input(x, draws)
    out = torch.randn(6, 4, 4, 4)  # a learned-σ DiT's 2·C channels
    expected = obj.transport.training_losses(lambda a, b: out[:, :2], x, draws["t"], draws["noise"])["loss"]
    assert torch.equal(obj.loss(out, x, draws), expected)
    assert torch.equal(x_t, t.view(-1, 1, 1, 1) * x + (1 - t.view(-1, 1, 1, 1)) * draws["noise"])
    with pytest.raises(ValueError, match="channels"):
        obj.loss(torch.randn(6, 3, 4, 4), x, draws)


@pytest.mark.parametrize("sampler,options", [("ode", {"ode_method": "rk4"}), ("sde", {"generator": None})])
def test_transport_sample_reaches_a_gaussian_target(sampler, options):
    obj = build_objective(_transport_cfg())
    target = GaussianTarget(obj.transport.path, 0.8, 0.5)
    z = torch.randn(4000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    opts = dict(options)
    if sampler == "sde":
        opts["generator"] = torch.Generator().manual_seed(1)
    x = obj.sample(lambda x, t, scale: target.velocity(x, t) * scale, z, sampler=sampler, steps=60,
                   model_kwargs={"scale": 1.0}, **opts)
    assert x.shape == z.shape
    assert abs(float(x.mean()) - 0.8) < 0.03 and abs(float(x.std()) - 0.5) < 0.03
    with pytest.raises(ConfigError, match="do not apply"):
        obj.sample(target.velocity, z, sampler=sampler, eta=0.0)
    with pytest.raises(ConfigError, match="not one of ode, sde"):
        obj.sample(target.velocity, z, sampler="ddim")


def _tiny_dit(learn_sigma):
    torch.manual_seed(0)
    model = DiT(input_size=8, patch_size=2, in_channels=2, hidden_size=32, depth=2, num_heads=2,
                num_classes=3, learn_sigma=learn_sigma)
    for p in model.parameters():  # adaLN-Zero would make every output zero
        torch.nn.init.normal_(p, std=0.05)
    return model.eval()


@pytest.mark.parametrize("sampler_name", ["uniform", "loss-second-moment"])
@pytest.mark.parametrize("learn_sigma", [True, False])
def test_diffusion_loss_equals_training_losses_bit_for_bit(learn_sigma, sampler_name):
    cfg = Config()
    cfg.model.learn_sigma = learn_sigma
    cfg.diffusion.timestep_sampler = sampler_name
    obj = DiffusionObjective.from_config(cfg)
    model, x, y = _tiny_dit(learn_sigma), torch.randn(5, 2, 8, 8), torch.tensor([0, 1, 2, 0, 1])
    draws = obj.draw(5, x.shape[1:], torch.Generator().manual_seed(4), "cpu")
    # The draw order is t and weights from the schedule sampler, then the noise.
    g = torch.Generator().manual_seed(4)
    t, w = obj.schedule_sampler.sample(5, "cpu", generator=g)
    noise = torch.randn((5, 2, 8, 8), generator=g)
    assert torch.equal(t, draws["t"]) and torch.equal(w, draws["weight"]) and torch.equal(noise, draws["noise"])
    x_t, t_model = obj.model_input(x, draws)
    with torch.no_grad():
        out = model(x_t, t_model, y)
        ours = obj.loss(out, x, draws)
        ref = obj.diffusion.training_losses(model, x, draws["t"], model_kwargs={"y": y}, noise=draws["noise"])["loss"]
    assert torch.equal(ours, ref * draws["weight"])
    obj.observe(draws, ours)
    state = obj.state_dict()
    if sampler_name == "loss-second-moment":
        assert int(state["schedule_sampler"]["loss_counts"].sum()) == 5
        fresh = DiffusionObjective.from_config(cfg)
        fresh.load_state_dict(state)
        assert torch.equal(fresh.state_dict()["schedule_sampler"]["loss_history"], state["schedule_sampler"]["loss_history"])
    else:
        assert state == {}


def test_diffusion_sample_respaces_and_is_seeded():
    cfg = Config()
    cfg.model.learn_sigma = True
    obj = DiffusionObjective.from_config(cfg)
    model = _tiny_dit(True)
    z = torch.randn(2, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    kw = {"y": torch.tensor([0, 1])}
    ddim = obj.sample(model, z, sampler="ddim", steps=5, model_kwargs=kw)
    again = obj.sample(model, z, sampler="ddim", steps=5, model_kwargs=kw)
    assert ddim.shape == z.shape and torch.equal(ddim, again)
    a = obj.sample(model, z, sampler="ddpm", steps=5, model_kwargs=kw, generator=torch.Generator().manual_seed(1))
    b = obj.sample(model, z, sampler="ddpm", steps=5, model_kwargs=kw, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, ddim)
    with pytest.raises(ConfigError, match="steps"):
        obj.sample(model, z, sampler="ddim", steps=0, model_kwargs=kw)


def test_each_objective_names_its_samplers_and_options():
    transport = build_objective(_transport_cfg())
    diffusion = build_objective(build_config({}))
    assert "ode_method" in transport.sampler_option_names("ode") and "sde_method" not in transport.sampler_option_names("ode")
    assert "sde_method" in transport.sampler_option_names("sde") and "atol" not in transport.sampler_option_names("sde")
    assert "eta" in diffusion.sampler_option_names("ddim") and "eta" not in diffusion.sampler_option_names("ddpm")
    with pytest.raises(ConfigError, match="does not fit objective 'transport'"):
        transport.sampler_option_names("ddim")
    with pytest.raises(ConfigError, match="atol do not apply to the ddpm sampler; it takes clip_denoised"):
        diffusion.check_options("ddpm", {"atol": 1e-3})
