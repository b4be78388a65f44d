"""Guidance (`sample.guidance`): classifier-free guidance, autoguidance, and the guidance interval in
noise levels sigma, one unit for both objectives; the papers' identities hold for every family."""

import math

import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.models import get_spec
from dit_trainer.objective import build_objective
from dit_trainer.config.checks import guidance_interval as check_interval
from dit_trainer.sample.guidance import Guidance, guided_model_fn
from dit_trainer.sample.sampling import sample_latents

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = {
    "DiT-S/2": ("diffusion", {"depth": 2, "hidden_size": 32, "num_heads": 2}),
    "SiT-S/2": ("transport", {"depth": 2, "hidden_size": 32, "num_heads": 2}),
    "LargeDiT-600M/2": ("transport", {"dim": 32, "n_layers": 2, "n_heads": 2}),
}


def _setup(name, learn_sigma=True, seed=0, dropout=0.1):
    objective_name, sizes = FAMILIES[name]
    cfg = build_config({"objective": objective_name, "model": {
        "name": name, "input_size": 8, "in_channels": 4, "num_classes": 5, "learn_sigma": learn_sigma,
        "class_dropout_prob": dropout, **sizes}})
    torch.manual_seed(seed)
    model = get_spec(name).build_model_fn(cfg)
    with torch.no_grad():  # adaLN-zero leaves a fresh model's output at 0: give it some
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval(), build_objective(cfg), cfg


class Counting(torch.nn.Module):
    """A model wrapper that records the batch size of every call."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, []
        self.num_classes, self.in_channels, self.input_size = model.num_classes, model.in_channels, model.input_size
        self.y_embedder = model.y_embedder

    def forward(self, x, t, y, **kw):
        self.calls.append(len(x))
        return self.model(x, t, y, **kw)

    def forward_with_cfg(self, x, t, y, cfg_scale, **kw):
        self.calls.append(len(x))
        return self.model.forward_with_cfg(x, t, y, cfg_scale, **kw)


def _batch(objective, n=3, level=1.0):
    x = torch.randn(n, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    t = _time_at(objective, level, n)
    return x, t, torch.tensor([1, 2, 4][:n])


def _time_at(objective, sigma, n):
    """A network time input whose noise level is about `sigma`."""
    if objective.name == "transport":
        return torch.full((n,), 1 / (1 + sigma))  # Linear: sigma = (1 - t) / t
    levels = objective.noise_level(torch.arange(objective.diffusion.num_timesteps))
    return torch.full((n,), int(torch.argmin((levels - sigma).abs())))


def test_noise_level_is_the_noise_over_the_signal_scale_for_both_objectives():
    x = torch.randn(4, 4, 8, 8)
    noise = torch.randn(4, 4, 8, 8)
    for name in ("DiT-S/2", "SiT-S/2"):
        _, objective, _ = _setup(name)
        t = torch.tensor([10, 400, 700, 990]) if objective.name == "diffusion" else torch.tensor([0.05, 0.3, 0.6, 0.95])
        x_t, _ = objective.model_input(x, {"t": t, "noise": noise, "weight": torch.ones(4)})
        sigma = objective.noise_level(t).float().view(-1, 1, 1, 1)
        # x_t / (signal scale) = x + sigma * noise: the signal scale is 1 / sqrt(1 + sigma^2) times the
        # noise-plus-signal scale for the VP diffusion, t for the linear path.
        scale = (1 / (1 + sigma**2).sqrt()) if objective.name == "diffusion" else t.float().view(-1, 1, 1, 1)
        assert torch.allclose(x_t / scale, x + sigma * noise, atol=1e-4), name
        # Noisier inputs have larger sigma: decreasing towards the data.
        order = objective.noise_level(t)
        assert (order[:-1] > order[1:]).all() if objective.name == "transport" else (order[:-1] < order[1:]).all()
    _, transport, _ = _setup("SiT-S/2")
    assert math.isinf(float(transport.noise_level(torch.tensor([0.0])))) and float(transport.noise_level(torch.tensor([1.0]))) == 0


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_autoguidance_weight_one_is_the_main_model_and_an_unconditional_guide_is_cfg(name):
    model, objective, _ = _setup(name)
    guide_net, _, _ = _setup(name, seed=1)
    x, t, y = _batch(objective)
    null = torch.full_like(y, model.num_classes)
    with torch.no_grad():
        main = model(x, t, y=y)
        alone = guided_model_fn(model, Guidance(guide=guide_net, guide_scale=1.0), objective)(x, t, y=y)
        assert torch.equal(alone, main)
        # Autoguidance whose guide is the model's own null-label branch is classifier-free guidance.
        unconditional = lambda x_, t_, y: model(x_, t_, torch.full_like(y, model.num_classes))  # noqa: E731
        auto = guided_model_fn(model, Guidance(guide=unconditional, guide_scale=3.0), objective)(x, t, y=y)
        cfg = model.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]), 3.0,
                                     cfg_channels=model.in_channels)
    assert (auto - cfg[: len(x)]).abs().max() < 1e-6
    assert not torch.allclose(auto, main)


def test_cfg_and_autoguidance_add_their_terms_in_one_batched_call_and_one_guide_call():
    model, objective, _ = _setup("DiT-S/2")
    guide_net, _, _ = _setup("DiT-S/2", seed=1)
    counted, guide = Counting(model), Counting(guide_net)
    x, t, y = _batch(objective)
    null = torch.full_like(y, model.num_classes)
    x2, t2, y2 = torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null])
    counter = {}
    with torch.no_grad():
        out = guided_model_fn(counted, Guidance(cfg_scale=2.0, guide=guide, guide_scale=1.5), objective,
                              counter)(x2, t2, y=y2)
        cond, uncond, g = model(x, t, y), model(x, t, null), guide_net(x, t, y=y)
    assert counted.calls == [6] and guide.calls == [3] and counter == {"nfe": 3}
    want = cond[:, :4] + 1.0 * (cond[:, :4] - uncond[:, :4]) + 0.5 * (cond[:, :4] - g[:, :4])
    assert torch.allclose(out[:3, :4], want, atol=1e-5) and torch.allclose(out[3:, :4], want, atol=1e-5)
    assert torch.allclose(out[:3, 4:], cond[:, 4:], atol=1e-6)  # the learned sigma is the main model's own


def test_outside_the_interval_only_the_conditional_pass_runs():
    model, objective, _ = _setup("DiT-S/2")
    counted = Counting(model)
    x, t, y = _batch(objective, level=20.0)  # sigma about 20: above the interval
    null = torch.full_like(y, model.num_classes)
    x2, t2, y2 = torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null])
    fn = guided_model_fn(counted, Guidance(cfg_scale=4.0, interval=(0.5, 5.0)), objective)
    with torch.no_grad():
        outside = fn(x2, t2, y=y2)
        assert counted.calls == [3]
        cond = model(x, t, y=y)
        assert torch.equal(outside, torch.cat([cond, cond]))
        t_in = torch.cat([_time_at(objective, 1.0, 3)] * 2)
        inside = fn(x2, t_in, y=y2)
        assert torch.equal(inside, model.forward_with_cfg(x2, t_in, y2, 4.0))


def test_interval_bounds_are_half_open_and_checked_in_one_line():
    assert check_interval([0.28, "inf"], "--gi") == (0.28, math.inf)
    assert check_interval(None, "--gi") is None
    for bad in ([0.5, 0.2], [-1, 2], [1, 1], 0.5, ["a", 1]):
        with pytest.raises(ConfigError, match=r"^--gi must "):
            check_interval(bad, "--gi")
    _, objective, _ = _setup("SiT-S/2")
    model, _, _ = _setup("SiT-S/2")
    counted = Counting(model)
    t = torch.full((2,), 0.5)  # sigma exactly 1 for the linear path
    x, y = torch.randn(2, 4, 8, 8), torch.tensor([0, 1])
    batch = (torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, torch.full_like(y, 5)]))
    with torch.no_grad():
        guided_model_fn(counted, Guidance(cfg_scale=2.0, interval=(0.5, 1.0)), objective)(*batch[:2], y=batch[2])  # 1 in (0.5, 1]
        guided_model_fn(counted, Guidance(cfg_scale=2.0, interval=(1.0, 2.0)), objective)(*batch[:2], y=batch[2])  # 1 not in (1, 2]
    assert counted.calls == [4, 2]


@pytest.mark.parametrize("name", ["DiT-S/2", "SiT-S/2"])
def test_sampling_in_an_interval_that_holds_every_step_is_full_guidance_and_a_band_is_not(name):
    model, objective, _ = _setup(name)
    counter_full, counter_band = {}, {}
    full = sample_latents(model, objective, [1, 2], cfg_scale=3.0, steps=6, seed=3, counter=counter_full)
    every = sample_latents(model, objective, [1, 2], cfg_scale=3.0, steps=6, seed=3, guidance_interval=(0, math.inf))
    band = sample_latents(model, objective, [1, 2], cfg_scale=3.0, steps=6, seed=3, guidance_interval=(0.5, 3.0),
                          counter=counter_band)
    assert torch.equal(every, full) and not torch.equal(band, full)
    assert counter_band["nfe"] < counter_full["nfe"]


def test_autoguidance_needs_no_null_class_and_samples_differ_from_the_main_model():
    model, objective, _ = _setup("SiT-S/2", learn_sigma=False, dropout=0.0)
    guide, _, _ = _setup("SiT-S/2", learn_sigma=False, dropout=0.0, seed=1)
    plain = sample_latents(model, objective, [1, 2], cfg_scale=1.0, steps=4, seed=0)
    with pytest.raises(ConfigError, match="no null class"):
        sample_latents(model, objective, [1, 2], cfg_scale=2.0, steps=4, seed=0)
    counter, counted, guide_counted = {}, Counting(model), Counting(guide)
    auto = sample_latents(counted, objective, [1, 2], cfg_scale=1.0, steps=4, seed=0, guide=guide_counted,
                          guide_scale=2.0, counter=counter)
    same = sample_latents(model, objective, [1, 2], cfg_scale=1.0, steps=4, seed=0, guide=guide, guide_scale=1.0)
    assert torch.equal(same, plain) and not torch.allclose(auto, plain)
    # One main and one guide evaluation per sampler call, on the undoubled batch.
    assert len(counted.calls) == len(guide_counted.calls) > 0 and set(counted.calls) == {2}
    assert counter["nfe"] == 2 * len(counted.calls)
