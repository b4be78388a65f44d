"""`MeanFlowObjective`: MeanFlow behind the trainer's objective interface.

Two times meet here. The paper's (and this section's): t = 1 noise, z_t = (1 - t) x + t e, v = e - x, a
step z_r = z_t - (t - r) u. The network's, SiT's (this project's transport, Linear path): tau = 1 - t, x_tau
= tau x + (1 - tau) e, velocity x - e. So the network is called at (z_t, tau = 1 - t, h = t - r) and its
output is -u; a SiT's weights, with the interval embedder at zero, are the MeanFlow model at h = 0.
"""

from collections.abc import Mapping

import torch

from dit_trainer.errors import ConfigError
from dit_trainer.meanflow.config import MeanFlowConfig, check_schedule, guided
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
        """{"t", "r": (n,) float32 paper times with r <= t, "noise": (n, *sample_shape)}, in that order."""
        t, r = sample_t_r(n, self.config, generator=generator, device=device)
        noise = torch.randn((n, *sample_shape), generator=generator, device=device)
        return {"t": t, "r": r, "noise": noise}

    def model_input(self, x, draws):
        """(z_t, 1 - t): the point on the path and the network's time (h is `losses`' to add)."""
        t = draws["t"]
        return (1 - _per_sample(t, x)) * x + _per_sample(t, x) * draws["noise"].to(x), 1 - t

    def loss(self, output, x, draws):
        """MeanFlow's loss needs the network, not one output: the train step calls `losses`."""
        raise NotImplementedError("MeanFlowObjective scores through losses(model_fn, x, draws): its target takes a JVP")

    def target_velocity(self, model_fn, z, t, v):
        """v, or the guided velocity of the official code: from the network's own velocities at h = 0 (no
        gradient), computed for the samples inside the guidance's t-range whose label the step keeps; the
        others keep v (those whose label is dropped, as the JAX code's cond_drop, learn the plain v)."""
        if not self.guided:
            return v
        m = self.config
        index, rows = _rows((t >= m.guidance_t_start) & (t <= m.guidance_t_end) & (model_fn.dropped == 0))
        fn, z_g, t_g = model_fn.rows(rows), z[rows], t[rows]
        with torch.no_grad():
            v_uncond = self.u(fn, z_g, t_g, t_g, drop=torch.ones_like(fn.dropped))
            v_cond = self.u(fn, z_g, t_g, t_g, drop=torch.zeros_like(fn.dropped)) if m.kappa else None
        guided_v = guided_velocity(v[rows], t_g, v_uncond, v_cond, m.omega, m.kappa, m.guidance_t_start, m.guidance_t_end)
        v_g = v.clone()
        v_g[index] = guided_v[: len(index)].to(v.dtype)
        return v_g

    def _u_fp32(self, model_fn):
        def u_fp32(z, t, r):
            return self.u(model_fn, z, t, r, amp=False)

        return u_fp32

    def _derivative(self, u_fn, z, t, r, v):
        if self.config.jvp == "difference":
            return central_difference(u_fn, z, t, r, v)
        return time_derivative(u_fn, z, t, r, v)[1]

    def tangent(self, model_fn, z, t, v):
        """The direction in z of du/dt: the target's velocity v (the paper's), or with `tangent: predicted`
        the network's own instantaneous velocity at (z, t) under the step's condition, no gradient (iMF's):
        the flow's direction without the noise of one sample's e - x."""
        if self.config.tangent == "sample":
            return v
        with torch.no_grad():
            return self.u(model_fn, z, t, t).to(v.dtype)

    def _moving_derivative(self, model_fn, z, t, r, v):
        """du/dt where r != t, zero elsewhere: the target multiplies it by t - r, so the JVP (no gradient) runs
        on those samples alone, a share `ratio` of the batch."""
        index, rows = _rows(r != t)
        if len(index) == len(t):
            return self._derivative(self._u_fp32(model_fn), z, t, r, self.tangent(model_fn, z, t, v))
        fn = model_fn.rows(rows)
        part = self._derivative(self._u_fp32(fn), z[rows], t[rows], r[rows], self.tangent(fn, z[rows], t[rows], v[rows]))
        dudt = torch.zeros_like(z)
        dudt[index] = part[: len(index)].to(dudt.dtype)
        return dudt

    def losses(self, model_fn, x, draws):
        """(n,) adaptive-weighted squared error of u against sg(v_g - (t - r) du/dt), the JVP and loss in fp32."""
        t, r = draws["t"], draws["r"]
        z, _ = self.model_input(x, draws)
        v = draws["noise"].to(x) - x
        if self.config.jvp == "graph":
            v_g = self.target_velocity(model_fn, z, t, v)
            u, dudt = time_derivative(self._u_fp32(model_fn), z, t, r, self.tangent(model_fn, z, t, v_g), graph=True)
        else:
            u = self.u(model_fn, z, t, r)  # the loss's own forward, under the run's autocast like any train step
            # After that forward is queued: choosing the samples waits for the device (a GPU runs it meanwhile).
            v_g = self.target_velocity(model_fn, z, t, v)
            dudt = self._moving_derivative(model_fn, z, t, r, v_g)
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

    def sample(self, model_fn, z, sampler=None, steps=None, model_kwargs=None, progress=False, **options):
        """x from noise z in `steps` network evaluations, z <- z - (t - r) u over the schedule; model_fn(x, t,
        h=h, **model_kwargs) is called at the network's time 1 - t."""
        self.check_sampler(sampler)
        self.check_options(sampler, options)
        times = self.schedule(steps, options.get("timesteps"))
        return sample_meanflow(model_fn, z, times, model_kwargs)
