"""Improved MeanFlow's guidance scale as a condition (`meanflow.omega_range`): the network gains a zero-started
scale embedder, each sample's omega is drawn after the noise and guides its own target, and a sample picks
its scale in one evaluation; what it does not fit is one line."""

import pytest
import torch
from tests.meanflow._tiny import batch, step_model, tiny_config, tiny_model
from tests.meanflow.test_objective import draws_for, reference_loss

from dit_trainer.errors import ConfigError
from dit_trainer.meanflow.sampler import sample_meanflow
from dit_trainer.models import get_spec
from dit_trainer.models.interval import fit_interval
from dit_trainer.objective import build_objective
from dit_trainer.sample.sampling import sample_latents

RANGE = {"omega_range": [1.0, 3.0], "omega": 1.5, "kappa": 0.0}


def _build(cfg):
    """The model of `cfg` as built, its new embedders at zero."""
    return get_spec(cfg.model.name).build_model_fn(cfg)


def _family_config(name, **meanflow):
    """The tiny model of family `name` trained as MeanFlow (Large-DiT's own size keys)."""
    from dit_trainer.config import build_config
    from tests.meanflow._tiny import MODEL

    model = {**MODEL, "name": name}
    if name.startswith("Large"):
        model = {k: v for k, v in model.items() if k not in ("depth", "hidden_size", "num_heads")}
        model.update(dim=32, n_layers=1, n_heads=2)
    return build_config({"objective": "meanflow", "model": model, "meanflow": meanflow})


@pytest.mark.parametrize("name", ["SiT-S/2", "DiT-S/2", "LargeDiT-600M/2"])
def test_the_scale_embedder_starts_at_zero_beside_a_meanflow_models_weights(name):
    torch.manual_seed(0)
    plain = tiny_model(_family_config(name)).eval()
    scaled = _build(_family_config(name, **RANGE)).eval()
    assert not hasattr(plain, "w_embedder") and hasattr(scaled, "w_embedder")
    assert scaled.load_state_dict(fit_interval(scaled, plain.state_dict())).missing_keys == []
    g = torch.Generator().manual_seed(1)
    x, t, h = torch.randn(3, 4, 8, 8, generator=g), torch.rand(3, generator=g), torch.rand(3, generator=g)
    y = torch.tensor([0, 4, 9])
    with torch.no_grad():
        want = plain(x, t, y, h=h)
        for w in (None, torch.full((3,), 1.0), torch.tensor([1.0, 2.0, 3.0])):
            assert torch.equal(scaled(x, t, y, h=h, w=w), want)
        with pytest.raises(ValueError, match="guidance scale"):
            plain(x, t, y, h=h, w=torch.ones(3))


def test_the_scale_is_drawn_after_the_noise_uniform_over_the_range():
    n, g = 4000, torch.Generator().manual_seed(0)
    d = build_objective(tiny_config(**RANGE)).draw(n, (1, 2, 2), g, torch.device("cpu"))
    plain = build_objective(tiny_config(omega=1.5, kappa=0.0)).draw(n, (1, 2, 2), torch.Generator().manual_seed(0),
                                                                     torch.device("cpu"))
    assert all(torch.equal(d[k], plain[k]) for k in plain) and set(d) == set(plain) | {"omega"}
    assert float(d["omega"].min()) >= 1.0 and float(d["omega"].max()) <= 3.0
    assert abs(float(d["omega"].mean()) - 2.0) < 0.05  # uniform over [1, 3]


@pytest.mark.parametrize("tangent", ["sample", "predicted"])
def test_each_sample_is_guided_and_asked_at_its_own_scale(tangent):
    """The loss equals py-meanflow's formula with each sample's u at its scale w and its target guided by that
    w (v_uncond the network's at the null label and scale 1); the dropped sample learns the plain v."""
    model = tiny_model(tiny_config(**RANGE))
    x, y, drop = batch()
    d = {**draws_for(x), "omega": torch.tensor([1.0, 2.5, 1.7, 3.0, 1.2, 2.0])}
    objective = build_objective(tiny_config(norm_p=0.0, tangent=tangent, **RANGE))
    got = objective.losses(step_model(model, y, drop), x, d)
    w, t, e = d["omega"], d["t"], d["noise"]
    tt = t.view(-1, 1, 1, 1)
    z, v = (1 - tt) * x + tt * e, e - x

    def net(z, t, h, labels_drop=drop, scale=w):
        return -model(z, 1 - t, y=y, force_drop_ids=labels_drop, h=h, w=scale)

    with torch.no_grad():
        v_uncond = net(z, t, torch.zeros_like(t), torch.ones_like(drop), torch.ones_like(w))
        own = net(z, t, torch.zeros_like(t))
    v_g = torch.where(drop.bool().view(-1, 1, 1, 1), v, v_uncond + w.view(-1, 1, 1, 1) * (v - v_uncond))
    want = reference_loss(net, x, e, t, d["r"], v_g, 0.0, 0.01, tangent=own if tangent == "predicted" else None)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    fixed = objective.losses(step_model(model, y, drop), x, {**d, "omega": torch.full((6,), 1.5)})
    assert not torch.allclose(got, fixed)  # the scales reached the target


def test_training_learns_the_scale(tmp_path):
    from tests.parallel._common import TinyLatents, learns, tiny_config as run_config

    from dit_trainer.config import build_config
    from dit_trainer.train import DiTTrainer

    d = run_config(tmp_path, kind="mf", train={"max_steps": 3}).to_dict()
    d["meanflow"] = {**d.get("meanflow", {}), **RANGE}
    d["sample"]["cfg_scale"] = None  # the plain run's resolved 1: let this one recommend its own
    trainer = DiTTrainer(build_config(d), dataset=TinyLatents())
    out, changed = learns(trainer, ["w_embedder.mlp.2"], 3)
    assert torch.isfinite(torch.tensor(out["loss"])) and changed
    assert trainer.cfg.sample.cfg_scale == 1.5  # the run recommends sampling at its own omega


def test_a_sample_picks_its_scale_in_one_evaluation_per_step():
    cfg = tiny_config(**RANGE)
    model = tiny_model(cfg).eval()
    got = sample_latents(model, cfg, [1, 7], cfg_scale=2.5, steps=2, seed=3)
    z = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(3))
    calls = []

    def fn(x, t, **kw):
        calls.append(kw["w"])
        return model(x, t, **kw)

    want = sample_meanflow(fn, z, [1.0, 0.5, 0.0], {"y": torch.tensor([1, 7]), "w": torch.full((2,), 2.5)})
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(calls) == 2 and all(bool((c == 2.5).all()) for c in calls)
    assert not torch.equal(got, sample_latents(model, cfg, [1, 7], cfg_scale=1.0, steps=2, seed=3))
    with pytest.raises(ConfigError, match=r"outside the scales this run trained on.*\[1, 3\]"):
        sample_latents(model, cfg, [1], cfg_scale=4.0, steps=1)


@pytest.mark.parametrize("meanflow, match", [
    ({"omega_range": [0.5, 2.0]}, "1 <= lo <= hi"),
    ({"omega_range": [2.0]}, "1 <= lo <= hi"),
    ({"omega_range": [1.0, 2.0], "kappa": 0.5}, "set meanflow.kappa 0"),
    ({"omega_range": [1.0, 2.0], "omega": 2.5, "kappa": 0.0}, "outside meanflow.omega_range"),
])
def test_what_the_scale_range_does_not_fit_is_one_line(meanflow, match):
    with pytest.raises(ConfigError, match=match) as err:
        tiny_config(**meanflow)
    assert "\n" not in str(err.value)
