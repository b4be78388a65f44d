"""`TransportObjective`: SiT's interpolant transport behind the trainer's objective interface."""

import dataclasses
from collections.abc import Mapping

import torch

from dit_trainer.errors import ConfigError
from dit_trainer.objective import Objective
from dit_trainer.transport.config import TransportConfig
from dit_trainer.transport.direction import check_direction_form, check_direction_weight, direction_loss
from dit_trainer.transport.sampler import Sampler
from dit_trainer.transport.timesteps import T_SAMPLERS, sample_t
from dit_trainer.transport.transport import create_transport

_ODE_OPTIONS = ("ode_method", "atol", "rtol", "reverse")
_SDE_OPTIONS = ("sde_method", "sde_diffusion_form", "sde_diffusion_norm", "sde_last_step", "sde_last_step_size",
                "generator")


def transport_config(cfg) -> TransportConfig:
    """`cfg.transport` as a TransportConfig (a dataclass, a mapping, or absent for the defaults)."""
    section = getattr(cfg, "transport", None)
    if section is None:
        return TransportConfig()
    if isinstance(section, TransportConfig):
        return section
    if isinstance(section, Mapping):
        known = {f.name for f in dataclasses.fields(TransportConfig)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"unknown transport key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return TransportConfig(**section)
    raise ConfigError(f"config section `transport` must be a mapping, got {type(section).__name__}")


class TransportObjective(Objective):
    """Draws (t, noise), feeds x_t = α_t x + σ_t noise at time t, scores with the release's loss."""

    name = "transport"
    samplers = ("ode", "sde")
    default_sampler = "ode"

    def __init__(self, transport, t_sampler="uniform", logit_mean=0.0, logit_std=1.0, learn_sigma=False,
                 sampling=None, direction_loss_weight=0.0, direction_loss_form="flattened"):
        if t_sampler not in T_SAMPLERS:
            raise ConfigError(f"transport.t_sampler {t_sampler!r} is not one of {', '.join(T_SAMPLERS)}")
        check_direction_weight(direction_loss_weight, transport.prediction)
        self.direction_loss_weight = float(direction_loss_weight)
        check_direction_form(direction_loss_form)
        self.direction_loss_form = direction_loss_form
        self.transport = transport
        self.t_sampler, self.logit_mean, self.logit_std = t_sampler, float(logit_mean), float(logit_std)
        self.learn_sigma = bool(learn_sigma)
        self.sampling = sampling or TransportConfig()
        if self.sampling.sampler not in self.samplers:
            raise ConfigError(f"transport.sampler {self.sampling.sampler!r} is not one of ode, sde")
        self.default_sampler = self.sampling.sampler

    @classmethod
    def from_config(cls, cfg):
        """Built from `cfg.transport` (a TransportConfig) and `cfg.model.learn_sigma`."""
        tc = transport_config(cfg)
        transport = create_transport(tc.path_type, tc.prediction, tc.loss_weight, tc.train_eps, tc.sample_eps)
        model = getattr(cfg, "model", None)
        return cls(transport, tc.t_sampler, tc.logit_mean, tc.logit_std,
                   learn_sigma=getattr(model, "learn_sigma", False), sampling=tc,
                   direction_loss_weight=tc.direction_loss_weight, direction_loss_form=tc.direction_loss_form)

    # -- training ---------------------------------------------------------------------------------

    def draw(self, n, sample_shape, generator, device):
        """{"t": (n,) float32, "noise": (n, *sample_shape)}: t first, then the noise."""
        t = sample_t(self.transport, n, generator=generator, device=device, sampler=self.t_sampler,
                     mean=self.logit_mean, std=self.logit_std)
        noise = torch.randn((n, *sample_shape), generator=generator, device=device)
        return {"t": t, "noise": noise}

    def model_input(self, x, draws):
        """(x_t, t) with x_t = α_t·x + σ_t·noise; the network sees the continuous t in [0, 1]."""
        t = draws["t"]
        return self.transport.path.xt(t, draws["noise"].to(x), x), t

    def validation_times(self, k: int):
        """Times t1 - (j / k)(t1 - t0), j = 0..k-1, on the training interval: t1 is the data's end (SiT's t runs
        from noise at 0 to data at 1, SD3's the other way)."""
        t0, t1 = self.transport.train_interval()
        return t1 - torch.arange(k, dtype=torch.float32) / k * (t1 - t0)

    def draws_at(self, t, noise):
        """{"t", "noise"} at times `t`."""
        return {"t": torch.as_tensor(t, dtype=torch.float32).to(noise.device), "noise": noise}

    def prediction(self, output, x):
        """The model output as a prediction shaped like x (a learned-σ DiT's extra half dropped)."""
        if output.shape[1] == x.shape[1]:
            return output
        if output.shape[1] == 2 * x.shape[1]:
            # A DiT built with learn_sigma predicts a variance half that transport has no use for;
            # SiT's own forward already drops it.
            return output[:, : x.shape[1]]
        raise ValueError(f"model output has {output.shape[1]} channels for data with {x.shape[1]}")

    def loss(self, output, x, draws):
        """(n,) per-sample loss as the SiT release computes it, for the given t and noise, plus the
        direction term when `direction_loss_weight` is set."""
        pred, noise = self.prediction(output, x), draws["noise"].to(x)
        loss = self.transport.loss_from_output(pred, x, draws["t"], noise)
        if not self.direction_loss_weight:
            return loss
        target = self.transport.path.ut(draws["t"], noise, x)
        return loss + self.direction_loss_weight * direction_loss(pred, target, self.direction_loss_form)

    # -- sampling ---------------------------------------------------------------------------------

    def sampler_option_names(self, sampler) -> tuple:
        """The ODE solver's settings for ode; the SDE integrator's and its generator for sde."""
        return {"ode": _ODE_OPTIONS, "sde": _SDE_OPTIONS}[self.check_sampler(sampler)]

    def noise_level(self, t):
        """σ = σ_t / α_t of the path at time t (x_t / α_t = x + σ·noise): infinite at t = 0 (noise), 0 at t = 1."""
        t = torch.as_tensor(t, dtype=torch.float64)
        alpha, sigma = self.transport.path.alpha(t)[0], self.transport.path.sigma(t)[0]
        return torch.as_tensor(sigma, dtype=torch.float64) / torch.as_tensor(alpha, dtype=torch.float64)

    def sample(self, model_fn, z, sampler=None, steps=None, model_kwargs=None, progress=False, **options):
        """The sample (x at t = 1) from noise z by the probability-flow ODE or the SDE.

        Options: ode_method, atol, rtol, reverse (ODE); sde_method, sde_diffusion_form,
        sde_diffusion_norm, sde_last_step, sde_last_step_size, generator (SDE noise). Unset
        options and `steps` take the `transport:` section's sampling defaults.
        """
        sampler = self.check_sampler(sampler)
        s = self.sampling
        self.check_options(sampler, options)
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 2):
            raise ConfigError(f"--steps {steps!r} must be an integer of at least 2")
        kwargs = dict(model_kwargs or {})

        def fn(x, t, **kw):
            return self.prediction(model_fn(x, t, **kw), x)

        transport_sampler = Sampler(self.transport)
        if sampler == "ode":
            sample_fn = transport_sampler.sample_ode(
                sampling_method=options.get("ode_method", s.ode_method), num_steps=steps or s.ode_steps,
                atol=options.get("atol", s.atol), rtol=options.get("rtol", s.rtol),
                reverse=options.get("reverse", False))
            with torch.no_grad():
                return sample_fn(z, fn, **kwargs)[-1]
        sample_fn = transport_sampler.sample_sde(
            sampling_method=options.get("sde_method", s.sde_method),
            diffusion_form=options.get("sde_diffusion_form", s.sde_diffusion_form),
            diffusion_norm=options.get("sde_diffusion_norm", s.sde_diffusion_norm),
            last_step=options.get("sde_last_step", s.sde_last_step),
            last_step_size=options.get("sde_last_step_size", s.sde_last_step_size),
            num_steps=steps or s.sde_steps)
        return sample_fn(z, fn, generator=options.get("generator"), progress=progress, **kwargs)[-1]
