"""Diffusion processes that keep only a subset of a base process's timesteps (respacing)."""

import numpy as np
import torch

from .gaussian_diffusion import GaussianDiffusion

__all__ = ["SpacedDiffusion", "space_timesteps"]


def _ddim_stride_steps(num_timesteps, desired_count):
    """The DDIM paper's striding: the smallest integer stride that yields exactly ``desired_count`` steps."""
    for stride in range(1, num_timesteps):
        steps = range(0, num_timesteps, stride)
        if len(steps) == desired_count:
            return set(steps)
    raise ValueError(f"cannot create exactly {desired_count} steps with an integer stride")


def space_timesteps(num_timesteps, section_counts):
    """Set of base timesteps to keep: ``section_counts`` steps from each of equal-sized sections.

    ``section_counts`` is a list of ints or a comma-separated string ("10,20,30": the first third
    of the chain gets 10 evenly spaced steps, and so on), or "ddimN" for DDIM's fixed stride.
    """
    if isinstance(section_counts, str):
        if section_counts.startswith("ddim"):
            return _ddim_stride_steps(num_timesteps, int(section_counts[len("ddim") :]))
        section_counts = [int(x) for x in section_counts.split(",")]
    n_sections = len(section_counts)
    size_per, extra = divmod(num_timesteps, n_sections)
    start = 0
    kept = []
    for i, count in enumerate(section_counts):
        # The first `extra` sections absorb the remainder, one step each.
        size = size_per + (1 if i < extra else 0)
        if size < count:
            raise ValueError(f"cannot divide section of {size} steps into {count}")
        stride = 1 if count <= 1 else (size - 1) / (count - 1)
        pos = 0.0
        for _ in range(count):
            # Python's round (half to even) and the accumulated float position both matter:
            # they decide which steps the reference keeps.
            kept.append(start + round(pos))
            pos += stride
        start += size
    return set(kept)


class SpacedDiffusion(GaussianDiffusion):
    """A GaussianDiffusion over the kept timesteps of a base process, with matching alphas_cumprod.

    Timestep ``i`` of this process is timestep ``timestep_map[i]`` of the base process; models are
    wrapped so they always see base-process timesteps, never the respaced indices.
    """

    def __init__(self, use_timesteps, **kwargs):
        self.use_timesteps = set(use_timesteps)
        self.timestep_map = []
        self.original_num_steps = len(kwargs["betas"])

        base = GaussianDiffusion(**kwargs)
        # Choose betas so the cumulative product at every kept step equals the base one.
        last_alpha_cumprod = 1.0
        new_betas = []
        for i, alpha_cumprod in enumerate(base.alphas_cumprod):
            if i in self.use_timesteps:
                new_betas.append(1 - alpha_cumprod / last_alpha_cumprod)
                last_alpha_cumprod = alpha_cumprod
                self.timestep_map.append(i)
        kwargs["betas"] = np.array(new_betas)
        super().__init__(**kwargs)

    def p_mean_variance(self, model, *args, **kwargs):
        """As GaussianDiffusion.p_mean_variance, calling the model with base-process timesteps."""
        return super().p_mean_variance(self._wrap_model(model), *args, **kwargs)

    def training_losses(self, model, *args, **kwargs):
        """As GaussianDiffusion.training_losses, calling the model with base-process timesteps."""
        return super().training_losses(self._wrap_model(model), *args, **kwargs)

    def condition_mean(self, cond_fn, *args, **kwargs):
        """As GaussianDiffusion.condition_mean, calling cond_fn with base-process timesteps."""
        return super().condition_mean(self._wrap_model(cond_fn), *args, **kwargs)

    def condition_score(self, cond_fn, *args, **kwargs):
        """As GaussianDiffusion.condition_score, calling cond_fn with base-process timesteps."""
        return super().condition_score(self._wrap_model(cond_fn), *args, **kwargs)

    def _wrap_model(self, model):
        """Wrap ``model`` once so respaced indices are translated before it is called."""
        if isinstance(model, _WrappedModel):
            return model
        return _WrappedModel(model, self.timestep_map, self.original_num_steps)

    def _scale_timesteps(self, t):
        """Identity: the wrapper does the translation and DiT never rescales timesteps."""
        return t


class _WrappedModel:
    """Callable that maps respaced timestep indices to base-process timesteps before the model."""

    def __init__(self, model, timestep_map, original_num_steps):
        self.model = model
        self.timestep_map = timestep_map
        self.original_num_steps = original_num_steps
        self._map_cache = {}

    def __call__(self, x, ts, **kwargs):
        key = (ts.device, ts.dtype)
        map_tensor = self._map_cache.get(key)
        if map_tensor is None:
            map_tensor = torch.tensor(self.timestep_map, device=ts.device, dtype=ts.dtype)
            self._map_cache[key] = map_tensor
        # Unlike guided-diffusion's rescale_timesteps, DiT feeds the raw base timesteps.
        return self.model(x, map_tensor[ts], **kwargs)
