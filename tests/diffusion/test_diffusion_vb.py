"""The variational-bound terms against analytic Gaussian formulas evaluated in float64 here."""

import math

import pytest
import torch

from dit_trainer.diffusion import create_diffusion
from dit_trainer.diffusion.losses import (
    approx_standard_normal_cdf,
    discretized_gaussian_log_likelihood,
    normal_kl,
)

C = 3


def _reference_p(model, x_t, t, betas):
    """Model mean and log-variance of p(x_{t-1} | x_t) for eps prediction + learned range, in float64."""
    ab = torch.cumprod(1 - betas, 0)
    ab_prev = torch.cat([torch.ones(1, dtype=torch.float64), ab[:-1]])
    post_var = betas * (1 - ab_prev) / (1 - ab)
    post_var_clipped = torch.cat([post_var[1:2], post_var[1:]])
    v = lambda a: a[t].view(-1, 1, 1, 1)  # noqa: E731
    with torch.no_grad():
        out = model(x_t, t).double()
    eps, var_values = out[:, :C], out[:, C:]
    x_t = x_t.double()
    pred_x0 = (x_t - (1 - v(ab)).sqrt() * eps) / v(ab).sqrt()
    coef1 = v(betas) * v(ab_prev).sqrt() / (1 - v(ab))
    coef2 = (1 - v(ab_prev)) * (1 - v(betas)).sqrt() / (1 - v(ab))
    mean = coef1 * pred_x0 + coef2 * x_t
    frac = (var_values + 1) / 2
    log_var = frac * v(betas).log() + (1 - frac) * v(post_var_clipped).log()
    return mean, log_var, coef1, coef2, v(post_var)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_vb_term_is_gaussian_kl_for_t_positive(schedule, toy_model, x_start, ref_betas):
    diffusion = create_diffusion("", noise_schedule=schedule)
    model = toy_model(C, learn_sigma=True)
    t = torch.tensor([1, 5, 500, 999])
    x_t = diffusion.q_sample(x_start, t)
    got = diffusion._vb_terms_bpd(model, x_start, x_t, t, clip_denoised=False)["output"]

    mean_p, log_var_p, coef1, coef2, var_q = _reference_p(model, x_t, t, ref_betas(schedule))
    mean_q = coef1 * x_start.double() + coef2 * x_t.double()
    var_p = log_var_p.exp()
    kl = 0.5 * (log_var_p - var_q.log() + var_q / var_p + (mean_q - mean_p) ** 2 / var_p - 1)
    expected = kl.mean(dim=(1, 2, 3)) / math.log(2.0)
    assert got.shape == (4,) and torch.all(expected > 0)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_vb_term_is_decoder_nll_at_t0(schedule, x_start, ref_betas):
    diffusion = create_diffusion("", noise_schedule=schedule)
    t = torch.zeros(4, dtype=torch.long)
    noise = torch.randn_like(x_start)
    x_t = diffusion.q_sample(x_start, t, noise=noise)

    # A near-oracle eps keeps the decoder mean within a few bins of x_0. (A random model puts it in
    # the far tails, where float32 cdf differences cancel catastrophically in any implementation.)
    def model(x, t):
        return torch.cat([noise + 0.5 * torch.sin(3 * x), torch.tanh(x)], dim=1)
    got = diffusion._vb_terms_bpd(model, x_start, x_t, t, clip_denoised=False)["output"]

    mean, log_var, *_ = _reference_p(model, x_t, t, ref_betas(schedule))
    x = x_start.double()
    inv_std = (-0.5 * log_var).exp()
    upper, lower = inv_std * (x - mean + 1 / 255), inv_std * (x - mean - 1 / 255)

    def nll_bits(cdf):
        # Edge pixels own the whole tail beyond them; interior pixels own one 2/255-wide bin.
        below = cdf(upper).clamp_min(1e-12).log()
        above = (1 - cdf(lower)).clamp_min(1e-12).log()
        inside = (cdf(upper) - cdf(lower)).clamp_min(1e-12).log()
        log_p = torch.where(x < -0.999, below, torch.where(x > 0.999, above, inside))
        return -log_p.mean(dim=(1, 2, 3)) / math.log(2.0)

    tanh_cdf = lambda z: 0.5 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))  # noqa: E731
    torch.testing.assert_close(got.double(), nll_bits(tanh_cdf), rtol=1e-4, atol=1e-5)
    # The tanh CDF is an approximation; against the exact normal CDF it is good to ~1%.
    torch.testing.assert_close(got.double(), nll_bits(torch.special.ndtr), rtol=2e-2, atol=1e-3)


def test_normal_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    m1, m2, lv1, lv2 = (torch.randn(5, 7, generator=g, dtype=torch.float64) for _ in range(4))
    ref = torch.distributions.kl_divergence(
        torch.distributions.Normal(m1, (0.5 * lv1).exp()), torch.distributions.Normal(m2, (0.5 * lv2).exp())
    )
    torch.testing.assert_close(normal_kl(m1, lv1, m2, lv2), ref)
    # Scalars broadcast against tensors (the prior term compares with N(0, 1)).
    zeros = torch.zeros_like(m1)
    torch.testing.assert_close(normal_kl(m1, lv1, 0.0, 0.0), normal_kl(m1, lv1, zeros, zeros))


def test_discretized_likelihood_sums_to_one_over_bins():
    levels = torch.linspace(-1, 1, 256, dtype=torch.float64)
    means = torch.full_like(levels, 0.1)
    log_scales = torch.full_like(levels, math.log(0.3))
    total = discretized_gaussian_log_likelihood(levels, means=means, log_scales=log_scales).exp().sum()
    assert total.item() == pytest.approx(1.0, abs=1e-3)
    assert approx_standard_normal_cdf(torch.tensor(0.0)).item() == pytest.approx(0.5)


def test_training_vb_equals_vb_term_of_same_output(toy_model, x_start):
    diffusion = create_diffusion("")
    model = toy_model(C, learn_sigma=True)
    t = torch.tensor([0, 3, 400, 999])
    noise = torch.randn_like(x_start)
    losses = diffusion.training_losses(model, x_start, t, noise=noise)
    x_t = diffusion.q_sample(x_start, t, noise=noise)
    vb = diffusion._vb_terms_bpd(model, x_start, x_t, t, clip_denoised=False)["output"]
    torch.testing.assert_close(losses["vb"], vb, rtol=0, atol=0)


def test_calc_bpd_loop_shapes_and_total(toy_model, x_start):
    diffusion = create_diffusion("ddim5")
    torch.manual_seed(0)
    out = diffusion.calc_bpd_loop(toy_model(C, learn_sigma=True), x_start, clip_denoised=False)
    assert out["vb"].shape == out["mse"].shape == out["xstart_mse"].shape == (4, 5)
    torch.testing.assert_close(out["total_bpd"], out["vb"].sum(dim=1) + out["prior_bpd"])
    assert torch.all(out["prior_bpd"] >= 0) and torch.isfinite(out["total_bpd"]).all()
