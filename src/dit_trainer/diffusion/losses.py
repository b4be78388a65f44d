"""Gaussian KL and likelihood terms used by the variational bound."""

import numpy as np
import torch

__all__ = [
    "normal_kl",
    "approx_standard_normal_cdf",
    "continuous_gaussian_log_likelihood",
    "discretized_gaussian_log_likelihood",
]

# Half the width of one 8-bit intensity bin once pixels are mapped onto [-1, 1].
_HALF_BIN = 1.0 / 255.0


def normal_kl(mean1, logvar1, mean2, logvar2):
    """Elementwise KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)); arguments broadcast."""
    ref = next((v for v in (mean1, logvar1, mean2, logvar2) if isinstance(v, torch.Tensor)), None)
    assert ref is not None, "at least one argument must be a Tensor"
    # torch.exp rejects Python scalars, so the log-variances must become tensors first.
    if not isinstance(logvar1, torch.Tensor):
        logvar1 = torch.tensor(logvar1).to(ref)
    if not isinstance(logvar2, torch.Tensor):
        logvar2 = torch.tensor(logvar2).to(ref)
    return 0.5 * (
        -1.0
        + logvar2
        - logvar1
        + torch.exp(logvar1 - logvar2)
        + ((mean1 - mean2) ** 2) * torch.exp(-logvar2)
    )


def approx_standard_normal_cdf(x):
    """Standard normal CDF via the tanh (GELU-style) approximation, as in the reference code."""
    return 0.5 * (1.0 + torch.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * torch.pow(x, 3))))


def continuous_gaussian_log_likelihood(x, *, means, log_scales):
    """Elementwise log density (nats) of ``x`` under N(means, exp(log_scales)**2), standardised."""
    z = (x - means) * torch.exp(-log_scales)
    return torch.distributions.Normal(torch.zeros_like(x), torch.ones_like(x)).log_prob(z)


def discretized_gaussian_log_likelihood(x, *, means, log_scales):
    """Elementwise log probability (nats) of 8-bit images in [-1, 1] under a binned Gaussian."""
    assert x.shape == means.shape == log_scales.shape
    centered = x - means
    inv_std = torch.exp(-log_scales)
    cdf_upper = approx_standard_normal_cdf(inv_std * (centered + _HALF_BIN))
    cdf_lower = approx_standard_normal_cdf(inv_std * (centered - _HALF_BIN))
    # The extreme bins absorb the tails, so pixels at -1/+1 use a one-sided mass.
    log_upper = torch.log(cdf_upper.clamp(min=1e-12))
    log_one_minus_lower = torch.log((1.0 - cdf_lower).clamp(min=1e-12))
    log_bin = torch.log((cdf_upper - cdf_lower).clamp(min=1e-12))
    log_probs = torch.where(
        x < -0.999, log_upper, torch.where(x > 0.999, log_one_minus_lower, log_bin)
    )
    assert log_probs.shape == x.shape
    return log_probs
