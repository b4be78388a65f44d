"""The power-function EMA arithmetic: width <-> exponent, the per-step decay, the closed-form inner
products and the least-squares weights that rebuild one profile from others."""

import math

import numpy as np
import pytest

from dit_trainer.config.checks import PHEMA_MAX_STD
from dit_trainer.phema.paths import phema_folder, std_label
from dit_trainer.phema.profile import (MAX_STD, beta_at, fit_error, gamma_to_std, profile_dot, solve_coefficients,
                                       std_to_gamma, step_weights)


@pytest.mark.parametrize("std", [1e-3, 0.01, 0.05, 0.08, 0.10, 0.15, 0.2, 0.28, MAX_STD * (1 - 1e-9)])
def test_width_exponent_round_trip(std):
    gamma = std_to_gamma(std)
    assert gamma > 0
    assert gamma_to_std(gamma) == pytest.approx(std, rel=1e-12)


def test_exponents_of_edm2s_widths():
    # EDM2 quotes gamma = 16.97 for sigma_rel 0.05 and 6.94 for 0.10.
    assert std_to_gamma(0.05) == pytest.approx(16.97, abs=5e-3)
    assert std_to_gamma(0.10) == pytest.approx(6.94, abs=5e-3)
    assert std_to_gamma(0.05) > std_to_gamma(0.06) > std_to_gamma(0.10)  # narrower: larger exponent


@pytest.mark.parametrize("std", [0.0, -0.01, MAX_STD, 0.3, 1.0, float("nan"), float("inf")])
def test_widths_without_a_positive_exponent_are_refused(std):
    with pytest.raises(ValueError, match="has no power-function profile"):
        std_to_gamma(std)


def test_the_configs_bound_is_the_width_of_exponent_zero():
    assert PHEMA_MAX_STD == MAX_STD == pytest.approx(gamma_to_std(0.0), rel=1e-15)
    std_to_gamma(math.nextafter(MAX_STD, 0.0))  # just below: a (tiny) positive exponent


def test_the_first_update_copies_and_the_decays_unroll_to_the_profile():
    gamma = std_to_gamma(0.1)
    assert beta_at(1, gamma) == 0.0
    with pytest.raises(ValueError):
        beta_at(0, gamma)
    # Unrolling ema_t = beta_t ema_{t-1} + (1 - beta_t) theta_t weighs step i by (1 - beta_i) prod_{j>i} beta_j.
    t = 50
    betas = [beta_at(i, gamma) for i in range(1, t + 1)]
    unrolled = [(1 - betas[i - 1]) * math.prod(betas[i:]) for i in range(1, t + 1)]
    np.testing.assert_allclose(unrolled, step_weights(t, gamma), rtol=1e-10, atol=1e-300)
    assert step_weights(t, gamma).sum() == pytest.approx(1.0, abs=1e-12)


def _numeric_dot(t_a, g_a, t_b, g_b, n=400_000):
    tau = (np.arange(n) + 0.5) / n * max(t_a, t_b)
    p = lambda t, g: np.where(tau <= t, (g + 1) * tau**g / t ** (g + 1), 0.0)  # noqa: E731
    return float(np.sum(p(t_a, g_a) * p(t_b, g_b)) * max(t_a, t_b) / n)


@pytest.mark.parametrize("t_a,s_a,t_b,s_b", [(100, 0.05, 100, 0.05), (100, 0.05, 160, 0.10), (300, 0.2, 120, 0.07)])
def test_inner_products_match_numerical_integration(t_a, s_a, t_b, s_b):
    g_a, g_b = std_to_gamma(s_a), std_to_gamma(s_b)
    closed = float(profile_dot(t_a, g_a, t_b, g_b))
    assert closed == pytest.approx(_numeric_dot(t_a, g_a, t_b, g_b), rel=1e-4)
    assert closed == float(profile_dot(t_b, g_b, t_a, g_a))  # symmetric


def _stored(stds=(0.05, 0.10), steps=range(100, 1300, 100)):
    return [(t, std_to_gamma(s)) for t in steps for s in stds]


def test_a_stored_profile_is_rebuilt_from_itself_alone():
    stored = _stored()
    k = stored.index((1200, std_to_gamma(0.05)))
    x = solve_coefficients(stored, [stored[k]])[:, 0]
    want = np.zeros(len(stored))
    want[k] = 1.0
    np.testing.assert_allclose(x, want, atol=1e-9)
    assert fit_error(stored, stored[k], x) < 1e-6


def test_coefficients_sum_to_one_and_fit_a_width_between_the_stored_ones():
    stored = _stored()
    targets = [(1200, std_to_gamma(s)) for s in (0.06, 0.075, 0.09)]
    x = solve_coefficients(stored, targets)
    np.testing.assert_allclose(x.sum(axis=0), 1.0, rtol=1e-12)
    for j, target in enumerate(targets):
        # Fitted well, and far better than the nearest stored profile of that time.
        err = fit_error(stored, target, x[:, j])
        assert err < 0.05
        nearest = min(fit_error(stored, target, np.eye(len(stored))[i]) for i in range(len(stored)) if stored[i][0] == 1200)
        assert err < nearest / 3
        # The fit reproduces the target's inner products with the stored profiles (the normal equations,
        # up to the scaling to sum 1).
        g = np.asarray(stored)
        gram = profile_dot(g[:, None, 0], g[:, None, 1], g[None, :, 0], g[None, :, 1])
        cross = profile_dot(g[:, 0], g[:, 1], *target)
        scale = (cross @ np.linalg.solve(gram, cross)) / (cross @ x[:, j])
        np.testing.assert_allclose(gram @ (scale * x[:, j]), cross, rtol=1e-6, atol=1e-12)


def test_only_older_snapshots_are_needed():
    # A target at the oldest stored time can only use the profiles of that time: their weights carry it.
    stored = _stored(steps=(100, 200))
    x = solve_coefficients(stored[:2], [(100, std_to_gamma(0.07))])
    assert x.shape == (2, 1) and x.sum() == pytest.approx(1.0)


def test_labels_name_each_width_exactly():
    assert std_label(0.05) == "std0.050" and std_label(0.1) == "std0.100"
    assert std_label(0.0825) == "std0.0825" and std_label(0.08250001) != std_label(0.0825)
    assert phema_folder("run", 0.08, 1200).as_posix() == "run/phema/std0.080-step00001200"
