"""The (t, r) pairs of a MeanFlow step, in the paper's time (t = 1 noise), as the official code draws them.

Both come from logit-normal densities; a share `ratio` of the samples keeps r != t (the rest, r = t, learn
the instantaneous velocity). The order in which they are made r <= t is py-meanflow's `tr_sampler`:
v0 (the paper's, and the JAX code's) sorts the two draws first, v1 (py-meanflow's CIFAR default) masks first
and then takes r = min(t, r). The JAX code keeps r = t for the first 75% of each device's batch; here every
sample is r != t with probability `ratio`, drawn for the whole global batch, so every layout draws alike.
"""

import torch


def logit_normal(n, mean, std, generator=None, device=None) -> torch.Tensor:
    """(n,) float32 times sigmoid(mean + std N(0, 1))."""
    return torch.sigmoid(torch.randn(n, generator=generator, device=device) * std + mean)


def sample_t_r(n, m, generator=None, device=None):
    """(t, r), each (n,) float32 with r <= t, for a `MeanFlowConfig` m: t's normal draw, r's, then the mask's
    uniforms, all from `generator`."""
    t = logit_normal(n, m.logit_mean, m.logit_std, generator, device)
    r_mean = m.logit_mean if m.r_logit_mean is None else m.r_logit_mean
    r_std = m.logit_std if m.r_logit_std is None else m.r_logit_std
    r = logit_normal(n, r_mean, r_std, generator, device)
    if m.tr_sampler == "v0":
        t, r = torch.maximum(t, r), torch.minimum(t, r)
    same = torch.rand(n, generator=generator, device=device) < 1 - m.ratio
    r = torch.where(same, t, r)
    if m.tr_sampler == "v1":
        r = torch.minimum(t, r)
    return t, r
