"""The `transport:` section of a run's config (a plain dataclass; importing it needs no torch)."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class TransportConfig:
    """Interpolant, prediction, training-time distribution and sampling defaults of a SiT run.

    Epsilons left None take the SiT release's defaults for the path and prediction (see
    `create_transport`). Sampling fields are what `dit sample` and the training-time grids use
    unless a flag overrides them; their defaults are the release's `sample.py` ones.
    """

    path_type: str = "Linear"  # Linear | GVP | VP
    prediction: str = "velocity"  # velocity | score | noise
    loss_weight: Optional[str] = None  # None | velocity | likelihood (score and noise models only)
    train_eps: Optional[float] = None  # in [0, 0.5): t keeps this far from the path's singular ends (None: the release's default; VP and score/noise only)
    sample_eps: Optional[float] = None  # in [0, 0.5): samplers stop this far from the ends (None: the release's default; VP and score/noise only)
    t_sampler: str = "uniform"  # uniform | logit-normal (SD3's logit-normal density on t, the rectified-flow time)
    logit_mean: float = 0.0  # mean of the logit-normal t sampler; > 0 favours t near 1, the data end here (SD3's t = 1 is noise)
    logit_std: float = 1.0  # std of the logit-normal t sampler
    direction_loss_weight: float = 0.0  # w >= 0: add w * (1 - cos(predicted, true velocity)) per sample, the cosine as direction_loss_form says; velocity prediction only; 0 is off
    direction_loss_form: str = "flattened"  # flattened | per-position. flattened: one cosine over the whole flattened sample (FasterDiT's term as this project has had it). per-position: the cosine across channels at each spatial position, then the mean over positions (LightningDiT's); on one-channel data it is a sign with no gradient
    # Sampling defaults.
    sampler: str = "ode"  # ode | sde
    ode_method: str = "dopri5"  # any torchdiffeq method: euler, midpoint, rk4, dopri5, heun3, ...
    ode_steps: int = 50  # steps of fixed-step ODE methods
    atol: float = 1e-6  # ODE absolute tolerance (adaptive methods)
    rtol: float = 1e-3  # ODE relative tolerance (adaptive methods)
    sde_method: str = "Euler"  # Euler | Heun
    sde_steps: int = 250  # SDE steps
    sde_diffusion_form: str = "sigma"  # sigma | constant | SBDM | linear | decreasing | increasing-decreasing
    sde_diffusion_norm: float = 1.0  # scale of the SDE diffusion coefficient
    sde_last_step: Optional[str] = "Mean"  # Mean | Tweedie | Euler | None
    sde_last_step_size: float = 0.04  # size of the SDE last step
