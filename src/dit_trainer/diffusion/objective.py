"""Gaussian diffusion as an objective: facebookresearch/DiT's `training_losses` and sampling
loops behind the `Objective` interface, with the step's t and noise given by the trainer."""

import torch

from dit_trainer.diffusion import create_diffusion, create_named_schedule_sampler
from dit_trainer.errors import ConfigError
from dit_trainer.objective import Objective


def diffusion_from_config(cfg, timestep_respacing=""):
    """The Gaussian diffusion described by `cfg.diffusion` and `cfg.model.learn_sigma`."""
    d = cfg.diffusion
    return create_diffusion(
        timestep_respacing=timestep_respacing,
        noise_schedule=d.noise_schedule,
        use_kl=d.use_kl,
        sigma_small=d.sigma_small,
        predict_xstart=d.predict_xstart,
        learn_sigma=cfg.model.learn_sigma,
        rescale_learned_sigmas=d.rescale_learned_sigmas,
        diffusion_steps=d.num_timesteps,
    )


class DiffusionObjective(Objective):
    """DDPM ε-prediction (learned σ with the VB term) on integer timesteps; DDPM and DDIM samplers."""

    name = "diffusion"
    samplers = ("ddpm", "ddim")
    default_sampler = "ddim"

    def __init__(self, cfg, diffusion=None, schedule_sampler="uniform"):
        self.cfg = cfg
        self.diffusion = diffusion if diffusion is not None else diffusion_from_config(cfg)
        self.schedule_sampler = create_named_schedule_sampler(schedule_sampler, self.diffusion)

    @classmethod
    def from_config(cls, cfg):
        """The objective of `cfg.diffusion` (schedule, loss type, timestep sampler)."""
        return cls(cfg, schedule_sampler=cfg.diffusion.timestep_sampler)

    def draw(self, n, sample_shape, generator, device):
        """Timesteps and importance weights from the schedule sampler, then the noise."""
        t, w = self.schedule_sampler.sample(n, device, generator=generator)
        noise = torch.randn((n, *sample_shape), generator=generator, device=device)
        return {"t": t, "weight": w, "noise": noise}

    def model_input(self, x, draws):
        """x_t = q_sample(x, t, noise), and t as the network sees it (respacing maps it)."""
        t = draws["t"]
        x_t = self.diffusion.q_sample(x, t, noise=draws["noise"])
        timestep_map = getattr(self.diffusion, "timestep_map", None)
        if timestep_map is not None:
            t = torch.as_tensor(timestep_map, device=t.device, dtype=t.dtype)[t]
        return x_t, t

    def loss(self, output, x, draws):
        """`training_losses` with the network's output already computed, times the sampler's weights."""
        losses = self.diffusion.training_losses(lambda *a, **k: output, x, draws["t"], noise=draws["noise"])
        return losses["loss"] * draws["weight"]

    def observe(self, draws, losses):
        """Feed the loss-second-moment sampler (a no-op for uniform)."""
        update = getattr(self.schedule_sampler, "update_with_local_losses", None)
        if update is not None:
            update(draws["t"], losses.detach())

    def state_dict(self):
        """The loss-second-moment sampler's history, if any."""
        sd = getattr(self.schedule_sampler, "state_dict", None)
        return {"schedule_sampler": sd()} if sd is not None else {}

    def load_state_dict(self, state):
        """Restore `state_dict()`."""
        if "schedule_sampler" in state and hasattr(self.schedule_sampler, "load_state_dict"):
            self.schedule_sampler.load_state_dict(state["schedule_sampler"])

    def respaced(self, sampler, steps):
        """The diffusion respaced for `steps` steps of "ddpm" (even spacing) or "ddim" (DDIM stride)."""
        total = self.cfg.diffusion.num_timesteps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= total:
            raise ConfigError(f"--steps {steps!r} must be an integer from 1 to {total}")
        try:
            return diffusion_from_config(self.cfg, timestep_respacing=f"ddim{steps}" if sampler == "ddim" else str(steps))
        except ValueError as err:
            raise ConfigError(f"--steps {steps} does not work with {sampler} ({err}); try 25, 50, 100 or 250") from None

    def sample(self, model_fn, z, sampler=None, steps=None, model_kwargs=None, progress=False, clip_denoised=None,
               **options):
        """DDPM or DDIM from noise `z`; the loops draw their per-step noise from the global RNG.

        `clip_denoised` defaults to clipping x_0 for pixel models (1 or 3 channels) only, as the
        release does not clip latents.
        """
        if options:
            raise ConfigError(f"diffusion sampling takes no options {', '.join(sorted(options))}")
        sampler = self.check_sampler(sampler)
        if clip_denoised is None:
            clip_denoised = z.shape[1] in (1, 3)
        diffusion = self.respaced(sampler, 250 if steps is None else steps)
        loop = diffusion.ddim_sample_loop if sampler == "ddim" else diffusion.p_sample_loop
        return loop(model_fn, tuple(z.shape), noise=z, clip_denoised=clip_denoised, model_kwargs=model_kwargs or {},
                    device=z.device, progress=progress)
