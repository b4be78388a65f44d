"""Gaussian diffusion with the numerics and API of facebookresearch/DiT's ``diffusion`` package.

Names load on first use: `diffusion.schedules` (the float64 beta schedules) is torch-free and
shared with the MindSpore backend, which imports it without torch.
"""

from dit_trainer.lazy import lazy_exports

_LAZY = {
    "create_diffusion": "factory",
    "GaussianDiffusion": "gaussian_diffusion", "LossType": "gaussian_diffusion",
    "ModelMeanType": "gaussian_diffusion", "ModelVarType": "gaussian_diffusion",
    "SpacedDiffusion": "respace", "space_timesteps": "respace",
    "get_named_beta_schedule": "schedules",
    "LossSecondMomentResampler": "timestep_sampler", "UniformSampler": "timestep_sampler",
    "create_named_schedule_sampler": "timestep_sampler",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = sorted(_LAZY)
