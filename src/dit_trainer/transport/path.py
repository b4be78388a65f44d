"""Interpolants x_t = α_t·x1 + σ_t·x0 between noise x0 (t = 0) and data x1 (t = 1).

Ma et al. (2024), "Exploring Flow and Diffusion-based Generative Models with Scalable Interpolant
Transformers" (SiT), Sec. 2: a path is fixed by (α_t, σ_t); its velocity is u_t = α̇_t·x1 + σ̇_t·x0,
and the same path defines the probability-flow ODE and a family of SDEs through the score. Each
class returns a coefficient together with its time derivative, as the release does, so the
conversions below read like the paper's formulas.
"""

import math

import torch


def expand_t_like_x(t, x):
    """(B,) times reshaped to (B, 1, ..., 1) so that they broadcast against x."""
    return t.view(t.size(0), *([1] * (x.dim() - 1)))


class LinearPath:
    """α_t = t, σ_t = 1 − t: the rectified-flow / flow-matching straight line."""

    def alpha(self, t):
        """(α_t, dα_t/dt)."""
        return t, 1

    def sigma(self, t):
        """(σ_t, dσ_t/dt)."""
        return 1 - t, -1

    def alpha_ratio(self, t):
        """α̇_t / α_t, written per path where the plain quotient loses precision."""
        return 1 / t

    def drift(self, x, t):
        """(f, g²/2) of the SDE whose probability flow is velocity = −f + (g²/2)·score.

        With x_t = α x1 + σ x0, the velocity is (α̇/α)·x + (α̇/α·σ² − σ·σ̇)·∇log p_t(x) (SiT eq. 5);
        the first term is −f and the coefficient of the score is g²/2.
        """
        t = expand_t_like_x(t, x)
        ratio = self.alpha_ratio(t)
        sigma_t, d_sigma_t = self.sigma(t)
        return -ratio * x, ratio * sigma_t**2 - sigma_t * d_sigma_t

    def diffusion(self, x, t, form="sigma", norm=1.0):
        """The SDE's diffusion coefficient w_t (the sampler adds sqrt(2 w_t) dW) for a named form."""
        t = expand_t_like_x(t, x)
        if form == "constant":
            return torch.full_like(t, float(norm))
        if form == "SBDM":
            return norm * self.drift(x, t)[1]
        if form == "sigma":
            return norm * self.sigma(t)[0]
        if form == "linear":
            return norm * (1 - t)
        if form == "decreasing":
            return 0.25 * (norm * torch.cos(math.pi * t) + 1) ** 2
        # The release spells this key "inccreasing-decreasing"; both spellings are accepted.
        if form in ("increasing-decreasing", "inccreasing-decreasing"):
            return norm * torch.sin(math.pi * t) ** 2
        raise ValueError(
            f"unknown diffusion form {form!r}; use sigma, constant, SBDM, linear, decreasing or increasing-decreasing"
        )

    def score_from_velocity(self, velocity, x, t):
        """∇log p_t(x) from a velocity: invert velocity = (α̇/α)·x + (g²/2)·score, solved with α/α̇."""
        t = expand_t_like_x(t, x)
        alpha_t, d_alpha_t = self.alpha(t)
        sigma_t, d_sigma_t = self.sigma(t)
        inv_ratio = alpha_t / d_alpha_t
        var = sigma_t**2 - inv_ratio * d_sigma_t * sigma_t
        return (inv_ratio * velocity - x) / var

    def noise_from_velocity(self, velocity, x, t):
        """The x0 (noise) that a velocity implies: x0 = −σ_t·score."""
        t = expand_t_like_x(t, x)
        alpha_t, d_alpha_t = self.alpha(t)
        sigma_t, d_sigma_t = self.sigma(t)
        inv_ratio = alpha_t / d_alpha_t
        var = inv_ratio * d_sigma_t - sigma_t
        return (inv_ratio * velocity - x) / var

    def velocity_from_score(self, score, x, t):
        """velocity = −f + (g²/2)·score."""
        t = expand_t_like_x(t, x)
        f, half_g2 = self.drift(x, t)
        return half_g2 * score - f

    def xt(self, t, x0, x1):
        """The point on the path: α_t·x1 + σ_t·x0."""
        t = expand_t_like_x(t, x1)
        return self.alpha(t)[0] * x1 + self.sigma(t)[0] * x0

    def ut(self, t, x0, x1):
        """The conditional velocity: α̇_t·x1 + σ̇_t·x0."""
        t = expand_t_like_x(t, x1)
        return self.alpha(t)[1] * x1 + self.sigma(t)[1] * x0

    def plan(self, t, x0, x1):
        """(t, x_t, u_t) for a given time, noise and data."""
        return t, self.xt(t, x0, x1), self.ut(t, x0, x1)


class GVPPath(LinearPath):
    """α_t = sin(πt/2), σ_t = cos(πt/2): α² + σ² = 1, a variance-preserving trigonometric path."""

    def alpha(self, t):
        """(α_t, dα_t/dt)."""
        return torch.sin(t * math.pi / 2), math.pi / 2 * torch.cos(t * math.pi / 2)

    def sigma(self, t):
        """(σ_t, dσ_t/dt)."""
        return torch.cos(t * math.pi / 2), -math.pi / 2 * torch.sin(t * math.pi / 2)

    def alpha_ratio(self, t):
        """α̇/α = (π/2)·cot(πt/2)."""
        return math.pi / (2 * torch.tan(t * math.pi / 2))


class VPPath(LinearPath):
    """The VP SDE of Song et al. (2021) with linear β from β_min to β_max, run with data at t = 1.

    log α_t = −¼(1−t)²(β_max − β_min) − ½(1−t)β_min and σ_t = sqrt(1 − α_t²); the release's
    defaults are β_min = 0.1, β_max = 20.
    """

    def __init__(self, sigma_min=0.1, sigma_max=20.0):
        self.sigma_min = sigma_min
        self.sigma_max = sigma_max

    def log_mean_coeff(self, t):
        """log α_t."""
        return -0.25 * ((1 - t) ** 2) * (self.sigma_max - self.sigma_min) - 0.5 * (1 - t) * self.sigma_min

    def d_log_mean_coeff(self, t):
        """d log α_t / dt = β(1 − t) / 2."""
        return 0.5 * (1 - t) * (self.sigma_max - self.sigma_min) + 0.5 * self.sigma_min

    def alpha(self, t):
        """(α_t, dα_t/dt)."""
        alpha_t = torch.exp(self.log_mean_coeff(t))
        return alpha_t, alpha_t * self.d_log_mean_coeff(t)

    def sigma(self, t):
        """(σ_t, dσ_t/dt) with σ_t = sqrt(1 − α_t²)."""
        alpha_sq = torch.exp(2 * self.log_mean_coeff(t))
        sigma_t = torch.sqrt(1 - alpha_sq)
        return sigma_t, alpha_sq * (2 * self.d_log_mean_coeff(t)) / (-2 * sigma_t)

    def alpha_ratio(self, t):
        """α̇/α = d log α_t / dt, exact where α_t underflows."""
        return self.d_log_mean_coeff(t)

    def drift(self, x, t):
        """(f, g²/2) = (−β/2·x, β/2) with β = β_min + (1 − t)(β_max − β_min)."""
        t = expand_t_like_x(t, x)
        beta_t = self.sigma_min + (1 - t) * (self.sigma_max - self.sigma_min)
        return -0.5 * beta_t * x, beta_t / 2


PATHS = {"Linear": LinearPath, "GVP": GVPPath, "VP": VPPath}
