"""`MeanFlowObjective`: MeanFlow behind the trainer's objective interface.

Two times meet here. The paper's (and this section's): t = 1 noise, z_t = (1 - t) x + t e, v = e - x, a
step z_r = z_t - (t - r) u. The network's, SiT's (this project's transport, Linear path): tau = 1 - t, x_tau
= tau x + (1 - tau) e, velocity x - e. So the network is called at (z_t, tau = 1 - t, h = t - r) and its
output is -u; a SiT's weights, with the interval embedder at zero, are the MeanFlow model at h = 0.
"""

from collections.abc import Mapping

import torch

from dit_trainer.errors import ConfigError
from dit_trainer.meanflow.config import MeanFlowConfig, check_sample_scale, check_schedule, guided
from dit_trainer.meanflow.jvp import central_difference, time_derivative
from dit_trainer.meanflow.sampler import sample_meanflow, uniform_schedule
from dit_trainer.meanflow.target import guided_velocity, meanflow_loss, meanflow_target
from dit_trainer.meanflow.timesteps import sample_t_r
from dit_trainer.objective import Objective
from dit_trainer.typed import build_dataclass


def meanflow_config(cfg) -> MeanFlowConfig:
    """`cfg.meanflow` as a MeanFlowConfig (a dataclass, a mapping, or absent for the defaults)."""
    section = getattr(cfg, "meanflow", None)
    if section is None or isinstance(section, MeanFlowConfig):
        return section or MeanFlowConfig()
    if isinstance(section, Mapping):
        return build_dataclass(MeanFlowConfig, dict(section), prefix="meanflow.")
    raise ConfigError(f"config section `meanflow` must be a mapping, got {type(section).__name__}")


def _per_sample(a, like):
    return a.reshape(-1, *([1] * (like.dim() - 1)))


def _rows(mask):
    """(the samples `mask` selects, the rows to call the network on): those, or the first sample when none is,
    so that every rank makes the same calls (FSDP gathers the weights in them); the caller keeps only
    the first len(index) results."""
    index = torch.nonzero(mask).flatten()
    return index, index if len(index) else torch.zeros(1, dtype=torch.long, device=mask.device)


class MeanFlowObjective(Objective):
    """Draws (t, r, noise); its loss regresses the network's average velocity on the MeanFlow target."""

    name = "meanflow"
    samplers = ("meanflow",)
    default_sampler = "meanflow"
    guided_sampling = False  # guidance is folded into the target (omega, kappa): one evaluation per step
    float32_calls = True  # the JVP or central difference and its tangent, in float32 as the official code

    def check_condition(self, condition) -> None:
        """Guidance folded into the target needs the null condition trained (its dropout above 0)."""
        if self.guided and not condition.dropout_prob > 0:
            key = condition.dropout_key
            raise ConfigError(f"meanflow.omega/kappa guide the target with the null condition, which {key} 0 never "
                              f"trains; set {key} 0.1, or meanflow.omega 1 and meanflow.kappa 0")

    def __init__(self, config=None):
        self.config = config or MeanFlowConfig()
        self.guided = guided(self.config)

    @classmethod
    def from_config(cls, cfg):
        """Built from `cfg.meanflow`."""
        return cls(meanflow_config(cfg))

    # -- the network in the paper's time ---------------------------------------------------------

    @staticmethod
    def prediction(output, z):
        """The network's output as the paper's u: sign flipped, a learned-σ DiT's extra half dropped."""
        return -output[:, : z.shape[1]]

    def u(self, model_fn, z, t, r, **kwargs):
        """The paper's u(z, r, t) from model_fn(z, 1 - t, h=t - r, **kwargs)."""
        return self.prediction(model_fn(z, 1 - t, h=t - r, **kwargs), z)

    # -- training ---------------------------------------------------------------------------------

    def draw(self, n, sample_shape, generator, device):
        """{"t", "r": (n,) float32 paper times with r <= t, "noise": (n, *sample_shape)}, in that order, then
        with `omega_range` each sample's guidance scale "omega" (n,), uniform over the range."""
        t, r = sample_t_r(n, self.config, generator=generator, device=device)
        noise = torch.randn((n, *sample_shape), generator=generator, device=device)
        draws = {"t": t, "r": r, "noise": noise}
        if self.config.omega_range is not None:
            lo, hi = self.config.omega_range
            draws["omega"] = lo + (hi - lo) * torch.rand(n, generator=generator, device=device)
        return draws

    def model_input(self, x, draws):
        """(z_t, 1 - t): the point on the path and the network's time (h is `losses`' to add)."""
        t = draws["t"]
        return (1 - _per_sample(t, x)) * x + _per_sample(t, x) * draws["noise"].to(x), 1 - t

    def loss(self, output, x, draws):
        """MeanFlow's loss needs the network, not one output: the train step calls `losses`."""
        raise NotImplementedError("MeanFlowObjective scores through losses(model_fn, x, draws): its target takes a JVP")

    def target_velocity(self, model_fn, z, t, v, w=None):
        """v, or the guided velocity of the official code: from the network's own velocities at h = 0 (no
        gradient), computed for the samples inside the guidance's t-range whose label the step keeps; the
        others keep v (those whose label is dropped, as the JAX code's cond_drop, learn the plain v). `w`
        (n,): each sample's omega where the run draws it (`omega_range`); the unconditional velocity is then
        the network's at scale 1, which guidance leaves as it is."""
        if not self.guided:
            return v
        m = self.config
        index, rows = _rows((t >= m.guidance_t_start) & (t <= m.guidance_t_end) & (model_fn.dropped == 0))
        fn, z_g, t_g = model_fn.rows(rows), z[rows], t[rows]
        with torch.no_grad():
            v_uncond = self.u(fn, z_g, t_g, t_g, drop=torch.ones_like(fn.dropped),
                              w=None if w is None else torch.ones_like(t_g))
            v_cond = self.u(fn, z_g, t_g, t_g, drop=torch.zeros_like(fn.dropped)) if m.kappa else None
        omega = m.omega if w is None else w[rows]
        guided_v = guided_velocity(v[rows], t_g, v_uncond, v_cond, omega, m.kappa, m.guidance_t_start, m.guidance_t_end)
        v_g = v.clone()
        v_g[index] = guided_v[: len(index)].to(v.dtype)
        return v_g

    def _u_fp32(self, model_fn, w=None):
        def u_fp32(z, t, r):
            return self.u(model_fn, z, t, r, amp=False, w=w)

        return u_fp32

    def _derivative(self, u_fn, z, t, r, v):
        if self.config.jvp == "difference":
            return central_difference(u_fn, z, t, r, v)
        return time_derivative(u_fn, z, t, r, v)[1]

    def tangent(self, model_fn, z, t, v, w=None):
        """The direction in z of du/dt: the target's velocity v (the paper's), or with `tangent: predicted`
        the network's own instantaneous velocity at (z, t) under the step's condition (and scale w), no
        gradient (iMF's): the flow's direction without the noise of one sample's e - x. In float32 like the JVP
        it steers: a bf16 tangent would carry its rounding into du/dt."""
        if self.config.tangent == "sample":
            return v
        with torch.no_grad():
            return self.u(model_fn, z, t, t, amp=False, w=w).to(v.dtype)

    def _moving_derivative(self, model_fn, z, t, r, v, w=None):
        """du/dt where r != t, zero elsewhere: the target multiplies it by t - r, so the JVP (no gradient) runs
        on those samples alone, a share `ratio` of the batch."""
        index, rows = _rows(r != t)
        if len(index) == len(t):
            return self._derivative(self._u_fp32(model_fn, w), z, t, r, self.tangent(model_fn, z, t, v, w))
        fn, w_rows = model_fn.rows(rows), None if w is None else w[rows]
        part = self._derivative(self._u_fp32(fn, w_rows), z[rows], t[rows], r[rows],
                                self.tangent(fn, z[rows], t[rows], v[rows], w_rows))
        dudt = torch.zeros_like(z)
        dudt[index] = part[: len(index)].to(dudt.dtype)
        return dudt

    def losses(self, model_fn, x, draws):
        """(n,) adaptive-weighted squared error of u against sg(v_g - (t - r) du/dt), the JVP and loss in fp32."""
        t, r, w = draws["t"], draws["r"], draws.get("omega")
        z, _ = self.model_input(x, draws)
        v = draws["noise"].to(x) - x
        if self.config.jvp == "graph":
            v_g = self.target_velocity(model_fn, z, t, v, w)
            u, dudt = time_derivative(self._u_fp32(model_fn, w), z, t, r, self.tangent(model_fn, z, t, v_g, w),
                                      graph=True)
        else:
            u = self.u(model_fn, z, t, r, w=w)  # the loss's own forward, under the run's autocast like any train step
            # After that forward is queued: choosing the samples waits for the device (a GPU runs it meanwhile).
            v_g = self.target_velocity(model_fn, z, t, v, w)
            dudt = self._moving_derivative(model_fn, z, t, r, v_g, w)
        target = meanflow_target(v_g, dudt.float(), t, r)
        return meanflow_loss(u.float(), target, self.config.norm_p, self.config.norm_eps)

    # -- sampling ---------------------------------------------------------------------------------

    def sampler_option_names(self, sampler) -> tuple:
        """The schedule: `timesteps`, paper's t from 1 down to 0 (steps + 1 of them)."""
        self.check_sampler(sampler)
        return ("timesteps",)

    def noise_level(self, t):
        """σ = (1 - t) / t of the network's time t (SiT's linear path): infinite at t = 0 (noise), 0 at t = 1."""
        t = torch.as_tensor(t, dtype=torch.float64)
        return (1 - t) / t

    def schedule(self, steps=None, timesteps=None) -> list:
        """The paper's times from 1 to 0 a sample steps through: `timesteps`, else the config's for its own
        step count, else uniform."""
        if timesteps is not None:
            return check_schedule(len(timesteps) - 1 if steps is None else steps, timesteps, "steps", "timesteps")
        steps = self.config.steps if steps is None else steps
        if steps == self.config.steps and self.config.timesteps is not None:
            return list(self.config.timesteps)
        check_schedule(steps, None, "steps", "timesteps")
        return uniform_schedule(steps)

    @property
    def trained_scale(self) -> float:
        """The guidance scale a sample asks for by default: meanflow.omega where the network takes the scale,
        else 1 (the guidance is trained in)."""
        return float(self.config.omega) if self.config.omega_range is not None else 1.0

    def scale_inputs(self, scale, n, device) -> dict:
        """The model's keyword arguments that ask n samples for guidance scale `scale`: {"w": (n,)} where the
        network takes the scale (inside meanflow.omega_range), {} for a scale of 1 otherwise; one-line
        ConfigError for any other."""
        if self.config.omega_range is None:
            return super().scale_inputs(scale, n, device)
        return {"w": torch.full((n,), check_sample_scale(self.config, scale), device=device)}

    def sample(self, model_fn, z, sampler=None, steps=None, model_kwargs=None, progress=False, **options):
        """x from noise z in `steps` network evaluations, z <- z - (t - r) u over the schedule; model_fn(x, t,
        h=h, **model_kwargs) is called at the network's time 1 - t."""
        self.check_sampler(sampler)
        self.check_options(sampler, options)
        times = self.schedule(steps, options.get("timesteps"))
        return sample_meanflow(model_fn, z, times, model_kwargs)
