"""Beta schedules for the discrete Gaussian diffusion process.

Every schedule is a float64 numpy array: the diffusion code derives all of its coefficients in
float64 and only casts to float32 when a coefficient is gathered for a batch, which is what keeps
the numbers identical to facebookresearch/DiT (and OpenAI's guided-diffusion before it).
"""

import math

import numpy as np

__all__ = [
    "betas_for_alpha_bar",
    "get_beta_schedule",
    "get_named_beta_schedule",
    "NAMED_SCHEDULES",
]

# Names accepted by get_named_beta_schedule; "cosine" is our alias of the name diffusers uses.
NAMED_SCHEDULES = ("linear", "cosine", "squaredcos_cap_v2", "sigmoid")

# DDPM's endpoints for a 1000-step chain; other lengths rescale them so that the total amount
# of noise added stays roughly the same.
_DDPM_BETA_START = 0.0001
_DDPM_BETA_END = 0.02


def _warmup_betas(beta_start, beta_end, num_diffusion_timesteps, warmup_frac):
    """Constant ``beta_end`` after a linear ramp over the first ``warmup_frac`` of the chain."""
    betas = np.full(num_diffusion_timesteps, beta_end, dtype=np.float64)
    n_warm = int(num_diffusion_timesteps * warmup_frac)
    betas[:n_warm] = np.linspace(beta_start, beta_end, n_warm, dtype=np.float64)
    return betas


def get_beta_schedule(beta_schedule, *, beta_start, beta_end, num_diffusion_timesteps):
    """Betas of a schedule given by explicit endpoints (the legacy DDPM-style API)."""
    n = num_diffusion_timesteps
    if beta_schedule == "linear":
        betas = np.linspace(beta_start, beta_end, n, dtype=np.float64)
    elif beta_schedule == "quad":
        betas = np.linspace(beta_start**0.5, beta_end**0.5, n, dtype=np.float64) ** 2
    elif beta_schedule == "warmup10":
        betas = _warmup_betas(beta_start, beta_end, n, 0.1)
    elif beta_schedule == "warmup50":
        betas = _warmup_betas(beta_start, beta_end, n, 0.5)
    elif beta_schedule == "const":
        betas = np.full(n, beta_end, dtype=np.float64)
    elif beta_schedule == "jsd":
        # beta_t = 1 / (T - t): the chain of Sohl-Dickstein et al.
        betas = 1.0 / np.linspace(n, 1, n, dtype=np.float64)
    elif beta_schedule == "sigmoid":
        # The same curve diffusers' DDPMScheduler calls "sigmoid" (and GeoDiff used), in float64.
        ramp = 1.0 / (1.0 + np.exp(-np.linspace(-6.0, 6.0, n, dtype=np.float64)))
        betas = ramp * (beta_end - beta_start) + beta_start
    else:
        raise NotImplementedError(f"unknown beta schedule: {beta_schedule}")
    assert betas.shape == (n,)
    return betas


def betas_for_alpha_bar(num_diffusion_timesteps, alpha_bar, max_beta=0.999):
    """Discretise a continuous cumulative-alpha curve ``alpha_bar(t)``, t in [0, 1], into betas."""
    n = num_diffusion_timesteps
    betas = []
    for i in range(n):
        # Python floats (not numpy) so the values match the reference bit for bit.
        ratio = alpha_bar((i + 1) / n) / alpha_bar(i / n)
        betas.append(min(1 - ratio, max_beta))
    return np.array(betas)


def _cosine_alpha_bar(t):
    """Nichol & Dhariwal's cosine cumulative alpha with the s=0.008 offset."""
    return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2


def get_named_beta_schedule(schedule_name, num_diffusion_timesteps):
    """Betas of a named schedule that keeps its shape for any number of diffusion steps.

    ``"linear"``: DDPM's 1e-4 -> 0.02, both scaled by 1000/T.
    ``"cosine"`` / ``"squaredcos_cap_v2"``: the improved-DDPM cosine schedule, betas capped at 0.999.
    ``"sigmoid"``: ``sigmoid(linspace(-6, 6, T))`` mapped onto the same (scaled) endpoints as
    ``"linear"``; this is the diffusers/GeoDiff sigmoid *beta* schedule, not the sigmoid
    *alpha-bar* schedule of Jabri/Chen et al. It is not part of the original DiT code.
    """
    if schedule_name in ("linear", "sigmoid"):
        scale = 1000 / num_diffusion_timesteps
        return get_beta_schedule(
            schedule_name,
            beta_start=scale * _DDPM_BETA_START,
            beta_end=scale * _DDPM_BETA_END,
            num_diffusion_timesteps=num_diffusion_timesteps,
        )
    if schedule_name in ("cosine", "squaredcos_cap_v2"):
        return betas_for_alpha_bar(num_diffusion_timesteps, _cosine_alpha_bar)
    raise NotImplementedError(f"unknown beta schedule: {schedule_name}")
