"""Training-time distributions of t, drawn from a caller's `torch.Generator` only.

`uniform` is the SiT release's: t ~ U[t0, t1] on the transport's training interval. `logit-normal`
is Stable Diffusion 3's (Esser et al., 2024, eq. 19): t = sigmoid(m + s·n) with n ~ N(0, 1), which
puts more steps in the middle of the path; here it is mapped affinely onto [t0, t1] as well so
that the epsilons that keep score and noise models away from the singular ends still hold.
"""

import torch

from dit_trainer.errors import ConfigError

T_SAMPLERS = ("uniform", "logit-normal")


def sample_uniform_t(n, t0, t1, generator=None, device="cpu"):
    """(n,) float32 times uniform on [t0, t1]."""
    return torch.rand((n,), generator=generator, device=device) * (t1 - t0) + t0


def sample_logit_normal_t(n, t0, t1, mean=0.0, std=1.0, generator=None, device="cpu"):
    """(n,) float32 times sigmoid(mean + std·N(0, 1)), mapped onto [t0, t1]."""
    u = torch.sigmoid(mean + std * torch.randn((n,), generator=generator, device=device))
    return u * (t1 - t0) + t0


def sample_t(transport, n, generator=None, device="cpu", sampler="uniform", mean=0.0, std=1.0):
    """(n,) training times on `transport`'s training interval from the named distribution."""
    t0, t1 = transport.train_interval()
    if sampler == "uniform":
        return sample_uniform_t(n, t0, t1, generator=generator, device=device)
    if sampler == "logit-normal":
        if not std > 0:
            raise ConfigError(f"transport.logit_std must be positive, got {std!r}")
        return sample_logit_normal_t(n, t0, t1, mean=mean, std=std, generator=generator, device=device)
    raise ConfigError(f"transport.t_sampler {sampler!r} is not one of {', '.join(T_SAMPLERS)}")
