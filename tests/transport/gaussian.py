"""Closed forms for Gaussian data x1 ~ N(mu, s²I) and noise x0 ~ N(0, I) on any interpolant.

x_t = α x1 + σ x0 is Gaussian with mean α·mu and variance V = α²s² + σ², so the score, the
posterior means and the velocity are affine in x, and the probability-flow ODE's solution is
x_t − α_t·mu = sqrt(V_t / V_s)·(x_s − α_s·mu).
"""

import math

import torch

from dit_trainer.transport.path import expand_t_like_x


class GaussianTarget:
    def __init__(self, path, mu, s):
        self.path, self.mu, self.s = path, mu, s

    def _coeffs(self, x, t):
        te = expand_t_like_x(t, x)
        alpha, d_alpha = self.path.alpha(te)
        sigma, d_sigma = self.path.sigma(te)
        var = alpha**2 * self.s**2 + sigma**2
        return alpha, d_alpha, sigma, d_sigma, var

    def score(self, x, t):
        alpha, _, _, _, var = self._coeffs(x, t)
        return -(x - alpha * self.mu) / var

    def noise(self, x, t):
        """E[x0 | x_t]."""
        alpha, _, sigma, _, var = self._coeffs(x, t)
        return sigma * (x - alpha * self.mu) / var

    def velocity(self, x, t):
        alpha, d_alpha, sigma, d_sigma, var = self._coeffs(x, t)
        e_x1 = self.mu + alpha * self.s**2 * (x - alpha * self.mu) / var
        return d_alpha * e_x1 + d_sigma * self.noise(x, t)

    def model(self, prediction):
        """The exact minimiser of each prediction's loss, as a model_fn(x, t)."""
        return {"velocity": self.velocity, "score": self.score, "noise": self.noise}[prediction]

    def mean_var(self, t):
        t = torch.as_tensor(t, dtype=torch.float64).reshape(1)
        alpha, _ = self.path.alpha(t)
        sigma, _ = self.path.sigma(t)
        return alpha * self.mu, alpha**2 * self.s**2 + sigma**2

    def flow(self, x, t_from, t_to):
        m0, v0 = self.mean_var(t_from)
        m1, v1 = self.mean_var(t_to)
        return m1 + torch.sqrt(v1 / v0) * (x - m0)

    def logp(self, x1):
        """log N(x1; mu, s²I) per sample, nats."""
        d = x1[0].numel()
        return (-0.5 * ((x1 - self.mu) ** 2).flatten(1).sum(1) / self.s**2
                - d * math.log(self.s) - 0.5 * d * math.log(2 * math.pi))
