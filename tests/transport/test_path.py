"""Interpolant identities: α, σ and their derivatives, the target velocity, and the conversions
between velocity, score and noise against the closed forms of Gaussian data."""

import pytest
import torch

from dit_trainer.transport import PATHS, create_transport
from dit_trainer.transport.path import expand_t_like_x

from tests.transport.gaussian import GaussianTarget

T = torch.linspace(0.05, 0.95, 19, dtype=torch.float64)


@pytest.mark.parametrize("name", list(PATHS))
def test_derivatives_match_finite_differences(name):
    path, h = PATHS[name](), 1e-6
    for coeff in (path.alpha, path.sigma):
        value, deriv = coeff(T)
        fd = (coeff(T + h)[0] - coeff(T - h)[0]) / (2 * h)
        assert torch.allclose(torch.as_tensor(deriv, dtype=torch.float64).expand_as(T), fd, rtol=1e-6, atol=1e-8)
    # The stabilised ratio must equal the plain quotient where both are finite.
    alpha, d_alpha = path.alpha(T)
    assert torch.allclose(path.alpha_ratio(T), d_alpha / alpha, rtol=1e-10)


@pytest.mark.parametrize("name", list(PATHS))
def test_ends_put_noise_at_zero_and_data_at_one(name):
    path = PATHS[name]()
    x0, x1 = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    near_data = path.xt(torch.full((4,), 1.0, dtype=torch.float64), x0, x1)
    assert torch.allclose(near_data, x1, atol=1e-12)
    if name != "VP":  # VP reaches pure noise only as β integrates to infinity
        assert torch.allclose(path.xt(torch.zeros(4, dtype=torch.float64), x0, x1), x0, atol=1e-12)
    else:
        alpha0, _ = path.alpha(torch.zeros(1, dtype=torch.float64))
        assert alpha0.item() < 1e-2


@pytest.mark.parametrize("name", list(PATHS))
def test_ut_is_time_derivative_of_xt(name):
    path, h = PATHS[name](), 1e-6
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(len(T), 2, 2, generator=g, dtype=torch.float64), torch.randn(len(T), 2, 2, generator=g, dtype=torch.float64)
    fd = (path.xt(T + h, x0, x1) - path.xt(T - h, x0, x1)) / (2 * h)
    assert torch.allclose(path.ut(T, x0, x1), fd, rtol=1e-6, atol=1e-8)


def test_linear_target_is_x1_minus_x0():
    path = PATHS["Linear"]()
    x0, x1 = torch.randn(len(T), 5, dtype=torch.float64), torch.randn(len(T), 5, dtype=torch.float64)
    t, xt, ut = path.plan(T, x0, x1)
    assert torch.equal(ut, x1 - x0)
    assert torch.allclose(xt, expand_t_like_x(T, x1) * x1 + (1 - expand_t_like_x(T, x1)) * x0)


@pytest.mark.parametrize("name", list(PATHS))
def test_conversions_recover_gaussian_closed_forms(name):
    path = PATHS[name]()
    target = GaussianTarget(path, mu=0.7, s=0.4)
    x = torch.randn(len(T), 3, dtype=torch.float64) * 1.5
    v, score, noise = target.velocity(x, T), target.score(x, T), target.noise(x, T)
    assert torch.allclose(path.score_from_velocity(v, x, T), score, rtol=1e-8, atol=1e-8)
    assert torch.allclose(path.noise_from_velocity(v, x, T), noise, rtol=1e-8, atol=1e-8)
    assert torch.allclose(path.velocity_from_score(score, x, T), v, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("name", list(PATHS))
@pytest.mark.parametrize("prediction", ["velocity", "score", "noise"])
def test_each_prediction_converts_to_the_same_velocity_and_score(name, prediction):
    transport = create_transport(name, prediction)
    target = GaussianTarget(transport.path, mu=-0.3, s=1.3)
    x = torch.randn(len(T), 2, 3, dtype=torch.float64)
    out = target.model(prediction)(x, T)
    assert torch.allclose(transport.velocity_from_output(out, x, T), target.velocity(x, T), rtol=1e-8, atol=1e-8)
    assert torch.allclose(transport.score_from_output(out, x, T), target.score(x, T), rtol=1e-8, atol=1e-8)


def test_diffusion_forms():
    path = PATHS["Linear"]()
    x, t = torch.zeros(3, 2), torch.tensor([0.25, 0.5, 0.75])
    te = t.view(3, 1)
    assert torch.allclose(path.diffusion(x, t, "sigma", 2.0), 2 * (1 - te))
    assert torch.allclose(path.diffusion(x, t, "constant", 0.5), torch.full_like(te, 0.5))
    assert torch.allclose(path.diffusion(x, t, "SBDM"), (1 - te) ** 2 / te + (1 - te))
    assert torch.allclose(path.diffusion(x, t, "increasing-decreasing"), torch.sin(torch.pi * te) ** 2)
    assert torch.allclose(path.diffusion(x, t, "decreasing"), 0.25 * (torch.cos(torch.pi * te) + 1) ** 2)
    with pytest.raises(ValueError, match="unknown diffusion form"):
        path.diffusion(x, t, "cosine")
