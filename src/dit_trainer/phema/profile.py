"""The arithmetic of power-function EMA profiles (EDM2, Karras et al., arXiv 2312.02696, section 3
and appendix C), torch-free: which exponent a width names, the per-step decay that tracks a profile
during training, and the least-squares weights that rebuild another profile from stored ones.

A profile of exponent gamma at time t averages the weights of the steps tau in [0, t] with the
density (gamma + 1) tau^gamma / t^(gamma + 1). It is named by its width relative to its length,
sigma_rel = std(tau) / t, which does not change as training goes on: the average keeps covering the
same share of the run. Times are optimizer steps (1-indexed: step t is the t-th update).
"""

import math

import numpy as np

# The width of gamma = 0, a plain mean over every step so far. sigma_rel falls as gamma grows (see
# std_to_gamma), so every width below this one has exactly one gamma > 0 and none above it has any.
MAX_STD = math.sqrt(1.0 / 12.0)


def gamma_to_std(gamma: float) -> float:
    """sigma_rel of the profile of exponent `gamma` (EDM2 eq. 123)."""
    gamma = float(gamma)
    return math.sqrt((gamma + 1.0) / ((gamma + 2.0) ** 2 * (gamma + 3.0)))


def std_to_gamma(std: float) -> float:
    """The exponent gamma > 0 of the profile of width `std` (EDM2 eq. 126); ValueError outside (0, MAX_STD)."""
    std = float(std)
    if not 0.0 < std < MAX_STD:  # NaN fails too
        raise ValueError(f"sigma_rel {std!r} has no power-function profile: it must lie in (0, {MAX_STD:.4f})")
    # sigma_rel^2 = (g + 1) / ((g + 2)^2 (g + 3)) with the fraction cleared is the cubic
    # g^3 + 7 g^2 + (16 - s) g + (12 - s) = 0, s = 1 / sigma_rel^2. Its value at g = 0 is 12 - s < 0
    # here, and at g = sqrt(s) it is 6 s + 16 sqrt(s) + 12 > 0; the width falls monotonically for
    # g > 0 (d log(sigma^-2) / dg = 2/(g+2) + 1/(g+3) - 1/(g+1) > 0), so the root between is the only
    # one. Bisection down to adjacent doubles finds it without the rounding of a closed form.
    s = 1.0 / (std * std)

    def cubic(g):
        return ((g + 7.0) * g + 16.0 - s) * g + 12.0 - s

    lo, hi = 0.0, math.sqrt(s)
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if cubic(mid) < 0.0:
            lo = mid
        else:
            hi = mid
    return lo if abs(cubic(lo)) <= abs(cubic(hi)) else hi


def beta_at(step: int, gamma: float) -> float:
    """The decay of the update after optimizer step `step` (1-indexed): (1 - 1/step)^(gamma + 1).

    Step 1 gives 0 (the average starts as a copy of the weights). Unrolled, the average after step t
    weighs step i by (i^(gamma+1) - (i-1)^(gamma+1)) / t^(gamma+1) (`step_weights`): the density
    above integrated over [i - 1, i], so the tracked average is the profile itself, step by step.
    """
    if step < 1:
        raise ValueError(f"step {step} is not a 1-indexed optimizer step")
    return (1.0 - 1.0 / step) ** (float(gamma) + 1.0)


def step_weights(t: int, gamma: float) -> np.ndarray:
    """The weight of each step 1..t in the average that `beta_at` has tracked after step t (sums to 1)."""
    edges = np.arange(t + 1, dtype=np.float64) / t
    return np.diff(edges ** (float(gamma) + 1.0))


def profile_dot(t_a, gamma_a, t_b, gamma_b):
    """The inner product of two profiles, integral of p_a(tau) p_b(tau) over tau, in closed form
    (arrays broadcast). EDM2's appendix C, Algorithm 3."""
    t_a, gamma_a, t_b, gamma_b = (np.asarray(v, dtype=np.float64) for v in (t_a, gamma_a, t_b, gamma_b))
    # Both densities are nonzero only up to their own time, so the product lives on [0, min(t_a, t_b)].
    # For t_a <= t_b it integrates to (ga + 1)(gb + 1) / ((ga + gb + 1) t_b) * (t_a / t_b)^gb; the other
    # order swaps the roles.
    a_first = t_a <= t_b
    short, long_ = np.where(a_first, t_a, t_b), np.where(a_first, t_b, t_a)
    gamma_long = np.where(a_first, gamma_b, gamma_a)
    scale = (gamma_a + 1.0) * (gamma_b + 1.0) / ((gamma_a + gamma_b + 1.0) * long_)
    return scale * (short / long_) ** gamma_long


def solve_coefficients(stored, targets) -> np.ndarray:
    """Weights that rebuild each target profile from the stored ones: column j holds x with
    sum_i x_i p_i the least-squares fit of target j (in L2 over tau), scaled to sum 1.

    `stored` and `targets` are sequences of (time, gamma). The normal equations G x = c use the
    closed-form inner products: G the stored profiles' Gram matrix, c their products with the target.
    The fit of a density need not integrate to 1; scaled so it does, the combination is a weighted
    average of weights again (a constant stays that constant).
    """
    stored = np.asarray(stored, dtype=np.float64).reshape(-1, 2)
    targets = np.asarray(targets, dtype=np.float64).reshape(-1, 2)
    gram = profile_dot(stored[:, None, 0], stored[:, None, 1], stored[None, :, 0], stored[None, :, 1])
    cross = profile_dot(stored[:, None, 0], stored[:, None, 1], targets[None, :, 0], targets[None, :, 1])
    try:
        x = np.linalg.solve(gram, cross)
    except np.linalg.LinAlgError:
        raise ValueError("the stored profiles are linearly dependent (a snapshot repeated?)") from None
    total = x.sum(axis=0, keepdims=True)
    if not np.all(np.isfinite(x)) or np.any(total == 0):
        raise ValueError("the stored profiles cannot represent the target (singular system)")
    return x / total


def fit_error(stored, target, coefficients) -> float:
    """Relative L2 distance between sum_i x_i p_i and the target profile: how well it was rebuilt."""
    stored = np.asarray(stored, dtype=np.float64).reshape(-1, 2)
    t, gamma = (float(v) for v in target)
    x = np.asarray(coefficients, dtype=np.float64).reshape(-1)
    gram = profile_dot(stored[:, None, 0], stored[:, None, 1], stored[None, :, 0], stored[None, :, 1])
    cross = profile_dot(stored[:, 0], stored[:, 1], t, gamma)
    own = float(profile_dot(t, gamma, t, gamma))
    squared = float(x @ gram @ x - 2.0 * x @ cross + own)
    return math.sqrt(max(squared, 0.0) / own)
