"""MeanFlow's sampler: z_r = z_t - (t - r) u(z_t, r, t) over a schedule of the paper's times from 1 to 0,
one network evaluation per step (the JAX code's `solver_step`; one step is py-meanflow's `sample`)."""

import torch


def uniform_schedule(steps: int) -> list:
    """steps + 1 paper times from 1 (noise) to 0 (data), evenly spaced (the official [1, 0] for one step)."""
    return [1.0 - i / steps for i in range(steps)] + [0.0]


@torch.no_grad()
def sample_meanflow(model_fn, z, times, model_kwargs=None) -> torch.Tensor:
    """The sample from noise z: at each (t, r) of `times` the network is called at its own time 1 - t with
    h = t - r, and its output (SiT's direction, -u) moves z by (t - r)."""
    kwargs = dict(model_kwargs or {})
    n = z.shape[0]
    for t, r in zip(times[:-1], times[1:]):
        tau = torch.full((n,), 1.0 - t, device=z.device)
        h = torch.full((n,), t - r, device=z.device)
        out = model_fn(z, tau, h=h, **kwargs)
        z = z + (t - r) * out[:, : z.shape[1]].to(z.dtype)
    return z
