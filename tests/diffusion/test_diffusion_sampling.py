"""Sample loops: they run, are reproducible, report progress, and handle guidance hooks."""

import pytest
import torch

from dit_trainer.diffusion import create_diffusion

C = 3
SHAPE = (2, C, 4, 4)


@pytest.mark.parametrize("learn_sigma", [True, False])
@pytest.mark.parametrize("loop", ["p_sample_loop", "ddim_sample_loop"])
def test_loops_run_and_are_deterministic(loop, learn_sigma, toy_model):
    diffusion = create_diffusion("50", learn_sigma=learn_sigma)
    model = toy_model(C, learn_sigma=learn_sigma)
    run = getattr(diffusion, loop)
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))

    torch.manual_seed(1)
    a = run(model, SHAPE, noise=noise)
    torch.manual_seed(1)
    b = run(model, SHAPE, noise=noise)
    assert a.shape == SHAPE and torch.isfinite(a).all() and a.abs().max() <= 1 + 1e-3
    assert torch.equal(a, b)

    torch.manual_seed(2)
    c = run(model, SHAPE, noise=noise)
    if loop == "ddim_sample_loop":
        assert torch.equal(a, c), "eta=0 DDIM depends only on the starting noise"
    else:
        assert not torch.equal(a, c), "ancestral sampling draws fresh noise each step"

    # Without explicit noise the start is drawn from the global generator.
    torch.manual_seed(3)
    d = run(model, SHAPE)
    torch.manual_seed(3)
    assert torch.equal(d, run(model, SHAPE))


def test_ddim_with_eta_is_stochastic_but_seeded(toy_model):
    diffusion = create_diffusion("ddim10")
    model = toy_model(C)
    noise = torch.randn(SHAPE)
    torch.manual_seed(0)
    a = diffusion.ddim_sample_loop(model, SHAPE, noise=noise, eta=1.0)
    torch.manual_seed(0)
    b = diffusion.ddim_sample_loop(model, SHAPE, noise=noise, eta=1.0)
    torch.manual_seed(1)
    c = diffusion.ddim_sample_loop(model, SHAPE, noise=noise, eta=1.0)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("loop", ["p_sample_loop_progressive", "ddim_sample_loop_progressive"])
def test_progressive_yields_every_step(loop, toy_model):
    diffusion = create_diffusion("ddim10")
    outs = list(getattr(diffusion, loop)(toy_model(C), SHAPE))
    assert len(outs) == 10
    assert all(set(o) == {"sample", "pred_xstart"} and o["sample"].shape == SHAPE for o in outs)


@pytest.mark.parametrize("loop", ["p_sample_loop", "ddim_sample_loop"])
def test_progress_bar(loop, toy_model, capsys):
    diffusion = create_diffusion("ddim10")
    getattr(diffusion, loop)(toy_model(C), SHAPE, progress=False)
    assert "10/10" not in capsys.readouterr().err
    getattr(diffusion, loop)(toy_model(C), SHAPE, progress=True)
    assert "10/10" in capsys.readouterr().err


def test_device_resolution_without_parameters(toy_model):
    diffusion = create_diffusion("ddim5")
    module = toy_model(C)
    # A plain function has no parameters; a bound method carries its module in __self__.
    out_fn = diffusion.ddim_sample_loop(lambda x, t: module(x, t), SHAPE)
    out_bound = diffusion.ddim_sample_loop(module.forward, SHAPE, noise=torch.zeros(SHAPE))
    assert out_fn.device.type == "cpu" and out_bound.shape == SHAPE


def test_guidance_hooks_see_original_timesteps(toy_model):
    diffusion = create_diffusion("ddim5")
    model = toy_model(C)
    seen = []

    def cond_fn(x, t, **kwargs):
        seen.append(int(t[0]))
        return torch.zeros_like(x)

    noise = torch.randn(SHAPE)
    for loop in ("p_sample_loop", "ddim_sample_loop"):
        torch.manual_seed(0)
        guided = getattr(diffusion, loop)(model, SHAPE, noise=noise, cond_fn=cond_fn)
        torch.manual_seed(0)
        plain = getattr(diffusion, loop)(model, SHAPE, noise=noise)
        torch.testing.assert_close(guided, plain)  # a zero gradient changes nothing
    assert seen == sorted(diffusion.timestep_map, reverse=True) * 2


def test_ddim_reverse_inverts_ddim_step():
    diffusion = create_diffusion("ddim20", learn_sigma=False)
    eps = torch.randn(SHAPE, generator=torch.Generator().manual_seed(4))
    # An eps that ignores (x, t) makes one DDIM step and one inversion step exact inverses.
    model = lambda x, t: eps  # noqa: E731
    x = torch.randn(SHAPE) * 0.3
    t = torch.full((2,), 7)
    up = diffusion.ddim_reverse_sample(model, x, t, clip_denoised=False)["sample"]
    down = diffusion.ddim_sample(model, up, t + 1, clip_denoised=False)["sample"]
    torch.testing.assert_close(down, x, rtol=1e-4, atol=1e-5)
