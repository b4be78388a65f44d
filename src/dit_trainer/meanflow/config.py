"""The `meanflow:` section of a run's config (a plain dataclass; importing it needs no torch).

Times here are the MeanFlow paper's, as its code writes them: t = 1 is noise, t = 0 the data, and a
step goes from t down to r <= t. The network sees the flow-matching time of this project's transport
(SiT's: 1 - t, 0 noise) and h = t - r, and predicts the average velocity in SiT's direction (-u of the
paper), so a SiT's weights are a MeanFlow model at h = 0; `meanflow/objective.py` does the mapping.
"""

import math
from dataclasses import dataclass, field
from typing import Optional

from dit_trainer.errors import ConfigError

TR_SAMPLERS = ("v0", "v1")
TANGENTS = ("sample", "predicted")
JVP_PATHS = ("separate", "graph", "difference")


@dataclass
class MeanFlowConfig:
    """MeanFlow (Geng et al., 2025): the defaults are the official ImageNet code's (Gsunshine/meanflow)."""

    logit_mean: float = -0.4  # mean of the logit-normal density of t and r (t = 1 noise: below 0 favours the data side)
    logit_std: float = 1.0  # std (> 0) of that density
    r_logit_mean: Optional[float] = None  # r's own logit-normal mean (py-meanflow's CIFAR recipe: -4.0); None: logit_mean
    r_logit_std: Optional[float] = None  # r's own std; None: logit_std
    ratio: float = 0.25  # share of samples whose r differs from t (the rest learn the instantaneous velocity, h = 0), in [0, 1]
    tr_sampler: str = "v0"  # v0 | v1. v0 (the paper's): t, r = max and min of two draws, then r = t with probability 1 - ratio; v1 (py-meanflow's CIFAR default): r = t with probability 1 - ratio, then r = min(t, r)
    norm_p: float = 1.0  # adaptive loss weight 1 / sg(loss + norm_eps)^norm_p, loss the squared error summed over a sample (0: plain squared error)
    norm_eps: float = 0.01  # the c of the adaptive weight, > 0
    omega: float = 1.0  # guidance folded into training: the target velocity is omega v + (1 - omega - kappa) v_uncond + kappa v_cond (the network's at h = 0); omega 1, kappa 0 is no guidance
    kappa: float = 0.5  # the conditional velocity's share of the guided target (the official default: effective scale omega / (1 - kappa) = 2)
    guidance_t_start: float = 0.0  # guide the target only for t in [guidance_t_start, guidance_t_end] (paper's t); elsewhere omega 1, kappa 0
    guidance_t_end: float = 1.0  # end of that t range
    omega_range: Optional[list] = field(default=None)  # [lo, hi], 1 <= lo <= hi: improved MeanFlow's guidance as a condition: each sample's omega drawn uniformly from the range and given to the network (its own embedder, zero-initialised), so a sample picks its scale in one evaluation (`--cfg-scale`, default meanflow.omega, inside the range); needs kappa 0. None: omega is fixed and the network takes no scale
    jvp: str = "separate"  # separate | graph | difference: how du/dt is taken. separate: the JVP under no_grad, the loss from a second forward (works under DDP, FSDP, AC, compile); graph: the loss's prediction from the JVP itself, one forward fewer (refused under DDP, whose second step fails, and with activation checkpointing); difference: as separate, with a central difference of two fp32 forwards in place of the JVP (no forward-mode AD; cheaper where it is slow)
    tangent: str = "sample"  # sample | predicted: the z-direction of du/dt. sample (the paper's): the target velocity v (e - x, guided); predicted (improved MeanFlow's): the network's own instantaneous velocity at h = 0 under the step's condition, one forward more without gradient
    steps: int = 1  # sampling steps (network evaluations) when none are given: z <- z - (t - r) u from t = 1 to 0
    timesteps: Optional[list] = field(default=None)  # the sampling schedule, paper's t from 1 down to 0, steps + 1 values; None: uniform


def check_meanflow(cfg) -> None:
    """One-line ConfigErrors for `meanflow.*` values outside what they allow, and for what MeanFlow does not
    combine with (checked where `objective` is meanflow)."""
    if getattr(cfg, "objective", None) != "meanflow":
        return
    m = cfg.meanflow
    numbers = {"logit_mean": m.logit_mean, "logit_std": m.logit_std, "ratio": m.ratio, "norm_p": m.norm_p,
               "norm_eps": m.norm_eps, "omega": m.omega, "kappa": m.kappa, "guidance_t_start": m.guidance_t_start,
               "guidance_t_end": m.guidance_t_end}
    numbers.update({k: v for k, v in (("r_logit_mean", m.r_logit_mean), ("r_logit_std", m.r_logit_std)) if v is not None})
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"meanflow.{key} is {value!r}; it must be a finite number")
    for key, value in (("logit_std", m.logit_std), ("r_logit_std", m.r_logit_std), ("norm_eps", m.norm_eps)):
        if value is not None and not value > 0:
            raise ConfigError(f"meanflow.{key} is {value!r}; it must be > 0")
    if not 0 <= m.ratio <= 1:
        raise ConfigError(f"meanflow.ratio is {m.ratio!r}; it must be a share in [0, 1] (the official 0.25)")
    if m.norm_p < 0:
        raise ConfigError(f"meanflow.norm_p is {m.norm_p!r}; it must be >= 0 (1 is the official, 0 no adaptive weight)")
    if not 0 <= m.guidance_t_start <= m.guidance_t_end <= 1:
        raise ConfigError(f"meanflow.guidance_t_start {m.guidance_t_start} and guidance_t_end {m.guidance_t_end} must "
                          "satisfy 0 <= start <= end <= 1")
    for key, value, known in (("tr_sampler", m.tr_sampler, TR_SAMPLERS), ("jvp", m.jvp, JVP_PATHS),
                               ("tangent", m.tangent, TANGENTS)):
        if value not in known:
            raise ConfigError(f"meanflow.{key} {value!r} is not one of {'|'.join(known)}")
    m.timesteps = check_schedule(m.steps, m.timesteps)
    m.omega_range = check_omega_range(m)
    if cfg.sample.cfg_scale is None:  # guidance is trained in: the run recommends sampling at the trained scale
        cfg.sample.cfg_scale = float(m.omega) if m.omega_range else 1.0
    elif m.omega_range:
        check_sample_scale(m, cfg.sample.cfg_scale, "sample.cfg_scale")
    _check_eval(cfg, m)
    _check_combinations(cfg)


def _check_eval(cfg, m) -> None:
    """FID during training samples as `dit sample` does: at a trained scale, without a guide."""
    ev = cfg.eval
    if not ev.every:
        return
    if ev.guide is not None and (ev.guide_scale or 1.0) != 1.0:
        raise ConfigError("eval.guide: objective meanflow samples unguided (its guidance is trained in); set eval.guide "
                          "null")
    if m.omega_range:
        check_sample_scale(m, ev.cfg_scale, "eval.cfg_scale")
    elif ev.cfg_scale != 1:
        raise ConfigError(f"eval.cfg_scale {ev.cfg_scale:g}: objective meanflow samples unguided (its guidance is "
                          "trained in); set eval.cfg_scale 1")


def _check_combinations(cfg) -> None:
    if cfg.parallel.pp != 1:
        raise ConfigError(f"objective meanflow does not run under pipeline parallelism (parallel.pp {cfg.parallel.pp}): "
                          "its JVP needs the whole network in one call; set parallel.pp 1 (DDP, FSDP and HSDP work)")
    if cfg.parallel.tp != 1 and cfg.meanflow.jvp != "difference":
        # Measured on torch 2.13: DTensor's from_local/to_local/redistribute have no forward-mode derivative,
        # and a JVP by double backward comes out wrong through TP's collectives.
        raise ConfigError(f"meanflow.jvp {cfg.meanflow.jvp} does not run under tensor parallelism (parallel.tp "
                          f"{cfg.parallel.tp}): torch's DTensor has no forward-mode AD for the JVP; set meanflow.jvp "
                          "difference (two forwards in its place), or parallel.tp 1 and shard with FSDP")
    if cfg.meanflow.jvp == "graph" and cfg.train.activation_checkpointing != "none":
        raise ConfigError("meanflow.jvp graph does not run with train.activation_checkpointing (the recomputation "
                          "meets the JVP's saved tensors); use meanflow.jvp separate or activation_checkpointing none")
    if cfg.repa.enabled:
        raise ConfigError("objective meanflow does not combine with repa.enabled: REPA's term would need the features of "
                          "the JVP's forward; set repa.enabled false")
    if cfg.backend != "torch":
        raise ConfigError("objective meanflow runs on the torch backend only; set backend torch")


def check_omega_range(m):
    """`meanflow.omega_range` as [lo, hi] floats (None for None), refused in one line where it is not two
    numbers 1 <= lo <= hi holding meanflow.omega, or where kappa is not 0."""
    r = m.omega_range
    if r is None:
        return None
    if (not isinstance(r, (list, tuple)) or len(r) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in r)
            or not 1 <= r[0] <= r[1]):
        raise ConfigError(f"meanflow.omega_range is {r!r}; it must be [lo, hi] with 1 <= lo <= hi, e.g. [1.0, 2.0]")
    if m.kappa != 0:
        raise ConfigError(f"meanflow.omega_range trains the scale omega as a condition, which kappa {m.kappa} would "
                          "change; set meanflow.kappa 0")
    if not r[0] <= m.omega <= r[1]:
        raise ConfigError(f"meanflow.omega {m.omega} (the scale a run samples at by default) is outside "
                          f"meanflow.omega_range {list(r)}; choose one inside it")
    return [float(r[0]), float(r[1])]


def check_sample_scale(m, scale, name="cfg scale") -> float:
    """The guidance scale a sample of section `m` (with meanflow.omega_range) asks for, inside that range; a
    one-line ConfigError naming it `name` otherwise."""
    scale = float(scale)
    lo, hi = m.omega_range
    if not lo <= scale <= hi:
        raise ConfigError(f"{name} {scale:g} is outside the scales this run trained on (meanflow.omega_range "
                          f"[{lo:g}, {hi:g}]); choose one inside it")
    return scale


def guided(m) -> bool:
    """Whether the section guides the training target (anything but omega 1, kappa 0, or a range of omegas)."""
    return m.omega_range is not None or not (m.omega == 1 and m.kappa == 0)


def check_schedule(steps, timesteps, steps_name="meanflow.steps", times_name="meanflow.timesteps"):
    """A sampling schedule's steps and times checked: timesteps None, or steps + 1 numbers from 1 down to 0
    (paper's t); returns them as floats (None for None)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"{steps_name} is {steps!r}; it must be a positive integer (1: one-step generation)")
    if timesteps is None:
        return None
    if not isinstance(timesteps, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                                       for v in timesteps):
        raise ConfigError(f"{times_name} is {timesteps!r}; it must be a list of numbers from 1 down to 0")
    times = [float(v) for v in timesteps]
    if len(times) != steps + 1:
        raise ConfigError(f"{times_name} holds {len(times)} times for {steps_name} {steps}; give steps + 1 times, "
                          "from 1 down to 0")
    if times[0] != 1.0 or times[-1] != 0.0 or any(a <= b for a, b in zip(times, times[1:])):
        raise ConfigError(f"{times_name} {times} must fall from 1 (noise) to 0 (data) strictly")
    return times
