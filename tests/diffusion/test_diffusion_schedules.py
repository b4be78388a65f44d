"""Beta schedules and the forward process q(x_t | x_0), checked against formulas written here."""

import numpy as np
import pytest
import torch

from dit_trainer.diffusion import create_diffusion, get_named_beta_schedule


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_named_schedule_matches_independent_betas(schedule, ref_betas):
    np.testing.assert_allclose(get_named_beta_schedule(schedule, 1000), ref_betas(schedule).numpy(), rtol=1e-12)


def test_schedule_dtype_aliases_and_scaling():
    lin = get_named_beta_schedule("linear", 1000)
    assert lin.dtype == np.float64 and lin[0] == pytest.approx(1e-4) and lin[-1] == pytest.approx(0.02)
    # Fewer steps scale both endpoints by 1000 / T.
    lin250 = get_named_beta_schedule("linear", 250)
    assert lin250[0] == pytest.approx(4e-4) and lin250[-1] == pytest.approx(0.08)
    np.testing.assert_array_equal(
        get_named_beta_schedule("cosine", 100), get_named_beta_schedule("squaredcos_cap_v2", 100)
    )
    assert get_named_beta_schedule("cosine", 1000).max() == pytest.approx(0.999)
    with pytest.raises(NotImplementedError):
        get_named_beta_schedule("nope", 10)


def _sigmoid_ref(T):
    scale = 1000 / T
    ramp = 1 / (1 + np.exp(-np.linspace(-6, 6, T)))
    return scale * 1e-4 + ramp * (scale * 0.02 - scale * 1e-4)


def test_sigmoid_schedule():
    betas = get_named_beta_schedule("sigmoid", 1000)
    assert betas.dtype == np.float64 and np.all(np.diff(betas) > 0)
    # sigmoid(+-6) is 0.0025 away from 0/1, so the endpoints are just inside [1e-4, 0.02].
    assert 1e-4 < betas[0] < 1.6e-4 and 0.0199 < betas[-1] < 0.02
    np.testing.assert_allclose(betas, _sigmoid_ref(1000), rtol=1e-12)
    np.testing.assert_allclose(get_named_beta_schedule("sigmoid", 500), _sigmoid_ref(500), rtol=1e-12)
    diffusers = pytest.importorskip("diffusers")
    sched = diffusers.DDPMScheduler(
        num_train_timesteps=1000, beta_schedule="sigmoid", beta_start=1e-4, beta_end=0.02
    )
    np.testing.assert_allclose(betas, sched.betas.double().numpy(), rtol=1e-5)
    assert create_diffusion("", noise_schedule="sigmoid").num_timesteps == 1000


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_q_sample_matches_closed_form(schedule, ref_betas, x_start):
    diffusion = create_diffusion("", noise_schedule=schedule)
    alphabar = torch.cumprod(1 - ref_betas(schedule), dim=0)
    noise = torch.randn_like(x_start)
    t = torch.tensor([0, 1, 500, 999])
    ab = alphabar[t].view(-1, 1, 1, 1)
    expected = ab.sqrt() * x_start.double() + (1 - ab).sqrt() * noise.double()
    got = diffusion.q_sample(x_start, t, noise=noise)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)

    mean, var, log_var = diffusion.q_mean_variance(x_start, t)
    torch.testing.assert_close(mean.double(), ab.sqrt() * x_start.double(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(var.double(), (1 - ab).expand_as(var), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(log_var.double(), (1 - ab).log().expand_as(var), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_q_posterior_matches_closed_form(schedule, ref_betas, x_start):
    diffusion = create_diffusion("", noise_schedule=schedule)
    betas = ref_betas(schedule)
    ab = torch.cumprod(1 - betas, 0)
    ab_prev = torch.cat([torch.ones(1, dtype=torch.float64), ab[:-1]])
    t = torch.tensor([1, 2, 300, 999])
    x_t = diffusion.q_sample(x_start, t)
    v = lambda a: a[t].view(-1, 1, 1, 1)  # noqa: E731
    mean_ref = (
        v(betas) * v(ab_prev).sqrt() * x_start.double()
        + (1 - v(ab_prev)) * (1 - v(betas)).sqrt() * x_t.double()
    ) / (1 - v(ab))
    var_ref = v(betas) * (1 - v(ab_prev)) / (1 - v(ab))
    mean, var, log_var = diffusion.q_posterior_mean_variance(x_start, x_t, t)
    torch.testing.assert_close(mean.double(), mean_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(var.double(), var_ref.expand_as(var), rtol=1e-5, atol=0)
    torch.testing.assert_close(log_var.double(), var_ref.log().expand_as(var), rtol=1e-5, atol=1e-6)
    # At t=0 the posterior variance is 0; its log is clipped to the t=1 value instead of -inf.
    _, var0, log_var0 = diffusion.q_posterior_mean_variance(x_start, x_t, torch.zeros(4, dtype=torch.long))
    assert torch.all(var0 == 0) and torch.isfinite(log_var0).all()
