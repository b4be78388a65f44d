"""`DiffusionObjective`: DiT's Gaussian diffusion behind the trainer's objective interface."""

import contextlib

import torch

from dit_trainer.diffusion import create_diffusion, create_named_schedule_sampler
from dit_trainer.diffusion.weighting import min_snr_weights, weighted_loss
from dit_trainer.errors import ConfigError
from dit_trainer.objective import Objective
from dit_trainer.rng import seeded_global_rng

_OPTIONS = {"ddpm": ("clip_denoised", "generator"), "ddim": ("clip_denoised", "generator", "eta")}
_DEFAULT_STEPS = {"ddpm": 250, "ddim": 50}


def diffusion_kwargs(cfg) -> dict:
    """create_diffusion's arguments from `cfg.diffusion` and `cfg.model.learn_sigma`."""
    d = cfg.diffusion
    return dict(
        noise_schedule=d.noise_schedule,
        use_kl=d.use_kl,
        sigma_small=d.sigma_small,
        predict_xstart=d.predict_xstart,
        learn_sigma=cfg.model.learn_sigma,
        rescale_learned_sigmas=d.rescale_learned_sigmas,
        diffusion_steps=d.num_timesteps,
    )


def diffusion_from_config(cfg, timestep_respacing=""):
    """The Gaussian diffusion described by `cfg.diffusion` and `cfg.model.learn_sigma`."""
    return create_diffusion(timestep_respacing=timestep_respacing, **diffusion_kwargs(cfg))


class DiffusionObjective(Objective):
    """Draws (t, weight, noise) with a schedule sampler, feeds q_sample(x, t, noise), scores with
    `diffusion.training_losses` (its MSE term min-SNR weighted if asked) times the importance weight."""

    name = "diffusion"
    samplers = ("ddpm", "ddim")
    default_sampler = "ddim"

    def __init__(self, diffusion, schedule_sampler, cfg=None, min_snr_gamma=None):
        self.diffusion = diffusion
        self.schedule_sampler = schedule_sampler
        self.cfg = cfg
        self._kwargs = diffusion_kwargs(cfg) if cfg is not None else None
        # None: the release's loss, bit for bit; else the per-step weights of its MSE term.
        self.mse_weights = (None if min_snr_gamma is None
                            else torch.from_numpy(min_snr_weights(diffusion, min_snr_gamma)))

    @classmethod
    def from_config(cls, cfg):
        """Built from `cfg.diffusion` (schedule, loss, timestep sampler, weighting) and `cfg.model.learn_sigma`."""
        d = cfg.diffusion
        diffusion = create_diffusion(timestep_respacing="", **diffusion_kwargs(cfg))
        name = d.timestep_sampler
        if name in ("logit-normal", "lognormal") and not d.timestep_std > 0:
            raise ConfigError(f"diffusion.timestep_std is {d.timestep_std!r}; it must be a positive number such as 1.0")
        try:
            sampler = create_named_schedule_sampler(name, diffusion, d.timestep_mean, d.timestep_std)
        except NotImplementedError:
            raise ConfigError(f"diffusion.timestep_sampler {name!r} is not one of uniform, loss-second-moment, "
                              f"logit-normal, lognormal") from None
        weighting = getattr(d, "loss_weighting", "none")
        if weighting not in ("none", "min-snr"):
            raise ConfigError(f"diffusion.loss_weighting {weighting!r} is not one of none, min-snr")
        if weighting == "min-snr" and d.use_kl:
            raise ConfigError("diffusion.loss_weighting min-snr weighs the MSE loss, and diffusion.use_kl trains on "
                              "the bound instead; drop one of them")
        return cls(diffusion, sampler, cfg, min_snr_gamma=d.min_snr_gamma if weighting == "min-snr" else None)

    def draw(self, n, sample_shape, generator, device):
        """{"t", "weight", "noise"}: timesteps and weights from the schedule sampler, then the noise.

        The order of the draws is part of the contract: resume and parity tests replay it.
        """
        t, weight = self.schedule_sampler.sample(n, device, generator=generator)
        noise = torch.randn((n, *sample_shape), generator=generator, device=device)
        return {"t": t, "weight": weight, "noise": noise}

    def model_input(self, x, draws):
        """(q_sample(x, t, noise), t): the network sees integer timesteps of the base process
        (a respaced diffusion maps its indices to them, as its sampling loops do)."""
        t = draws["t"]
        x_t = self.diffusion.q_sample(x, t, noise=draws["noise"])
        timestep_map = getattr(self.diffusion, "timestep_map", None)
        if timestep_map is not None and len(timestep_map) != self.diffusion.original_num_steps:
            t = torch.as_tensor(timestep_map, device=t.device, dtype=t.dtype)[t]
        return x_t, t

    def loss(self, output, x, draws):
        """`training_losses(...)["loss"] * weight` (its MSE term min-SNR weighted if asked), output given."""
        terms = self.diffusion.training_losses(lambda *a, **k: output, x, draws["t"], noise=draws["noise"])
        if self.mse_weights is None:
            return terms["loss"] * draws["weight"]
        mse_weight = self.mse_weights.to(terms["mse"].device)[draws["t"]].to(terms["mse"].dtype)
        return weighted_loss(terms, mse_weight) * draws["weight"]

    def validation_times(self, k: int):
        """Timesteps j * T // k, j = 0..k-1, of the T the objective trains on: 0 is the data's end."""
        return torch.arange(k, dtype=torch.long) * self.diffusion.num_timesteps // k

    def draws_at(self, t, noise):
        """{"t", "weight" (ones), "noise"} at timesteps `t`."""
        t = torch.as_tensor(t, dtype=torch.long, device=noise.device)
        return {"t": t, "weight": torch.ones(len(t), device=noise.device), "noise": noise}

    def observe(self, draws, losses):
        """Feed the unweighted per-sample losses to a loss-aware schedule sampler."""
        update = getattr(self.schedule_sampler, "update_with_local_losses", None)
        if update is not None:
            update(draws["t"], (losses / draws["weight"]).detach())

    def state_dict(self):
        """The schedule sampler's state (loss history), if it has one."""
        fn = getattr(self.schedule_sampler, "state_dict", None)
        return {"schedule_sampler": fn()} if fn is not None else {}

    def load_state_dict(self, state):
        """Restore the schedule sampler's state."""
        fn = getattr(self.schedule_sampler, "load_state_dict", None)
        if fn is not None and "schedule_sampler" in state:
            fn(state["schedule_sampler"])

    def respaced(self, sampler, steps):
        """The diffusion respaced for `steps` steps: "ddim{steps}" for ddim, "{steps}" for ddpm."""
        if self._kwargs is None:
            raise ConfigError("this DiffusionObjective was built without a config, so it cannot respace; "
                              "use DiffusionObjective.from_config(cfg)")
        total = self._kwargs["diffusion_steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= total:
            raise ConfigError(f"--steps {steps!r} must be an integer from 1 to {total}")
        try:
            return create_diffusion(timestep_respacing=f"ddim{steps}" if sampler == "ddim" else str(steps),
                                    **self._kwargs)
        except ValueError as err:
            raise ConfigError(f"--steps {steps} does not work with {sampler} ({err}); try 25, 50, 100 or 250") from None

    def noise_level(self, t):
        """σ = sqrt((1 - ᾱ_t) / ᾱ_t) of base-process timestep t (x_t / sqrt(ᾱ_t) = x + σ·noise); the network
        always sees base timesteps, respaced or not."""
        base = getattr(self, "_base_sigmas", None)
        if base is None:
            alphas = self.diffusion.alphas_cumprod  # of the base process: built without respacing
            base = self._base_sigmas = torch.from_numpy(((1 - alphas) / alphas) ** 0.5)
        return base.to(t.device)[t.long()]

    def sampler_option_names(self, sampler) -> tuple:
        """clip_denoised and generator; ddim takes eta too."""
        return _OPTIONS[self.check_sampler(sampler)]

    def sample(self, model_fn, z, sampler=None, steps=None, model_kwargs=None, progress=False, **options):
        """The final sample of the DDPM or DDIM loop from noise z.

        Options: clip_denoised (default: only for 1- or 3-channel pixel models, as sample.py),
        eta (DDIM), generator (seeds the loop's per-step noise; the global RNG is left as it was).
        """
        sampler = self.check_sampler(sampler)
        self.check_options(sampler, options)
        diffusion = self.respaced(sampler, _DEFAULT_STEPS[sampler] if steps is None else steps)
        clip = options.get("clip_denoised", z.shape[1] in (1, 3))
        extra = {"eta": options["eta"]} if "eta" in options else {}
        loop = diffusion.ddim_sample_loop if sampler == "ddim" else diffusion.p_sample_loop
        generator = options.get("generator")
        # The loops draw per-step noise from the global RNG: a fork seeded from the caller's generator
        # leaves the caller's own global RNG state untouched.
        seeded = (seeded_global_rng(int(torch.randint(0, 2**62, (1,), generator=generator)), z.device)
                  if generator is not None else contextlib.nullcontext())
        with torch.no_grad(), seeded:
            return loop(model_fn, tuple(z.shape), noise=z, clip_denoised=clip, model_kwargs=dict(model_kwargs or {}),
                        device=z.device, progress=progress, **extra)
