"""Ancestral (DDPM) and DDIM samplers, mixed into ``GaussianDiffusion``.

The host class supplies the schedule arrays, ``p_mean_variance``, ``q_posterior_mean_variance``
and the x_0 / eps conversions; this module only walks the chain.
"""

import torch
from dit_trainer.progress import progress_bar

from .utils import extract_into_tensor as _extract

__all__ = ["SamplingMixin"]


def _resolve_device(model, device, noise):
    """Device to sample on: explicit, else the model's parameters, else the noise, else CPU."""
    if device is not None:
        return device
    # Bound methods such as ``model.forward_with_cfg`` carry their module in __self__.
    owner = getattr(model, "__self__", model)
    params = getattr(owner, "parameters", None)
    if callable(params):
        first = next(iter(params()), None)
        if first is not None:
            return first.device
    if noise is not None:
        return noise.device
    return torch.device("cpu")


def _nonzero_mask(t, ndim):
    """1 where t > 0 and 0 at the last step, which adds no noise; shaped to broadcast over x."""
    return (t != 0).float().view(-1, *([1] * (ndim - 1)))


class SamplingMixin:
    """p_sample / ddim_sample and their loops for a discrete Gaussian diffusion."""

    def condition_mean(self, cond_fn, p_mean_var, x, t, model_kwargs=None):
        """Shift the mean by variance * grad log p(y|x) (Sohl-Dickstein et al. 2015 guidance)."""
        gradient = cond_fn(x, t, **(model_kwargs or {}))
        return p_mean_var["mean"].float() + p_mean_var["variance"] * gradient.float()

    def condition_score(self, cond_fn, p_mean_var, x, t, model_kwargs=None):
        """Redo p_mean_variance's outputs with the score shifted by cond_fn (Song et al. 2020)."""
        alpha_bar = _extract(self.alphas_cumprod, t, x.shape)
        eps = self._predict_eps_from_xstart(x, t, p_mean_var["pred_xstart"])
        eps = eps - (1 - alpha_bar).sqrt() * cond_fn(x, t, **(model_kwargs or {}))
        out = p_mean_var.copy()
        out["pred_xstart"] = self._predict_xstart_from_eps(x, t, eps)
        out["mean"], _, _ = self.q_posterior_mean_variance(x_start=out["pred_xstart"], x_t=x, t=t)
        return out

    # -- DDPM -----------------------------------------------------------------------------------

    def p_sample(self, model, x, t, clip_denoised=True, denoised_fn=None, cond_fn=None, model_kwargs=None):
        """One ancestral step x_t -> x_{t-1}: dict with "sample" and "pred_xstart"."""
        out = self.p_mean_variance(
            model, x, t, clip_denoised=clip_denoised, denoised_fn=denoised_fn, model_kwargs=model_kwargs
        )
        noise = torch.randn_like(x)
        if cond_fn is not None:
            out["mean"] = self.condition_mean(cond_fn, out, x, t, model_kwargs=model_kwargs)
        sample = out["mean"] + _nonzero_mask(t, x.dim()) * torch.exp(0.5 * out["log_variance"]) * noise
        return {"sample": sample, "pred_xstart": out["pred_xstart"]}

    def p_sample_loop(
        self,
        model,
        shape,
        noise=None,
        clip_denoised=True,
        denoised_fn=None,
        cond_fn=None,
        model_kwargs=None,
        device=None,
        progress=False,
    ):
        """Run the full ancestral chain from noise and return the final sample."""
        final = None
        for final in self.p_sample_loop_progressive(
            model,
            shape,
            noise=noise,
            clip_denoised=clip_denoised,
            denoised_fn=denoised_fn,
            cond_fn=cond_fn,
            model_kwargs=model_kwargs,
            device=device,
            progress=progress,
        ):
            pass
        return final["sample"]

    def p_sample_loop_progressive(
        self,
        model,
        shape,
        noise=None,
        clip_denoised=True,
        denoised_fn=None,
        cond_fn=None,
        model_kwargs=None,
        device=None,
        progress=False,
    ):
        """Yield each p_sample output from t = T-1 down to 0."""
        return self._walk_chain(
            self.p_sample,
            model,
            shape,
            noise,
            device,
            progress,
            dict(clip_denoised=clip_denoised, denoised_fn=denoised_fn, cond_fn=cond_fn, model_kwargs=model_kwargs),
        )

    # -- DDIM -----------------------------------------------------------------------------------

    def ddim_sample(
        self, model, x, t, clip_denoised=True, denoised_fn=None, cond_fn=None, model_kwargs=None, eta=0.0
    ):
        """One DDIM step x_t -> x_{t-1} (eta=0 is deterministic): dict with "sample", "pred_xstart"."""
        out = self.p_mean_variance(
            model, x, t, clip_denoised=clip_denoised, denoised_fn=denoised_fn, model_kwargs=model_kwargs
        )
        if cond_fn is not None:
            out = self.condition_score(cond_fn, out, x, t, model_kwargs=model_kwargs)
        # Re-derive eps from the (possibly clipped) x_0 so every mean type is handled alike.
        eps = self._predict_eps_from_xstart(x, t, out["pred_xstart"])
        alpha_bar = _extract(self.alphas_cumprod, t, x.shape)
        alpha_bar_prev = _extract(self.alphas_cumprod_prev, t, x.shape)
        sigma = (
            eta
            * torch.sqrt((1 - alpha_bar_prev) / (1 - alpha_bar))
            * torch.sqrt(1 - alpha_bar / alpha_bar_prev)
        )
        noise = torch.randn_like(x)
        # Eq. 12 of Song et al. (DDIM).
        mean_pred = (
            out["pred_xstart"] * torch.sqrt(alpha_bar_prev)
            + torch.sqrt(1 - alpha_bar_prev - sigma**2) * eps
        )
        sample = mean_pred + _nonzero_mask(t, x.dim()) * sigma * noise
        return {"sample": sample, "pred_xstart": out["pred_xstart"]}

    def ddim_reverse_sample(
        self, model, x, t, clip_denoised=True, denoised_fn=None, cond_fn=None, model_kwargs=None, eta=0.0
    ):
        """One deterministic DDIM inversion step x_t -> x_{t+1}."""
        assert eta == 0.0, "the reverse ODE is only defined for the deterministic path"
        out = self.p_mean_variance(
            model, x, t, clip_denoised=clip_denoised, denoised_fn=denoised_fn, model_kwargs=model_kwargs
        )
        if cond_fn is not None:
            out = self.condition_score(cond_fn, out, x, t, model_kwargs=model_kwargs)
        eps = (
            _extract(self.sqrt_recip_alphas_cumprod, t, x.shape) * x - out["pred_xstart"]
        ) / _extract(self.sqrt_recipm1_alphas_cumprod, t, x.shape)
        alpha_bar_next = _extract(self.alphas_cumprod_next, t, x.shape)
        mean_pred = out["pred_xstart"] * torch.sqrt(alpha_bar_next) + torch.sqrt(1 - alpha_bar_next) * eps
        return {"sample": mean_pred, "pred_xstart": out["pred_xstart"]}

    def ddim_sample_loop(
        self,
        model,
        shape,
        noise=None,
        clip_denoised=True,
        denoised_fn=None,
        cond_fn=None,
        model_kwargs=None,
        device=None,
        progress=False,
        eta=0.0,
    ):
        """Run the full DDIM chain from noise and return the final sample."""
        final = None
        for final in self.ddim_sample_loop_progressive(
            model,
            shape,
            noise=noise,
            clip_denoised=clip_denoised,
            denoised_fn=denoised_fn,
            cond_fn=cond_fn,
            model_kwargs=model_kwargs,
            device=device,
            progress=progress,
            eta=eta,
        ):
            pass
        return final["sample"]

    def ddim_sample_loop_progressive(
        self,
        model,
        shape,
        noise=None,
        clip_denoised=True,
        denoised_fn=None,
        cond_fn=None,
        model_kwargs=None,
        device=None,
        progress=False,
        eta=0.0,
    ):
        """Yield each ddim_sample output from t = T-1 down to 0."""
        return self._walk_chain(
            self.ddim_sample,
            model,
            shape,
            noise,
            device,
            progress,
            dict(
                clip_denoised=clip_denoised,
                denoised_fn=denoised_fn,
                cond_fn=cond_fn,
                model_kwargs=model_kwargs,
                eta=eta,
            ),
        )

    def _walk_chain(self, step, model, shape, noise, device, progress, step_kwargs):
        """Generator shared by the loops: start from ``noise`` (or fresh N(0, I)) and apply ``step``."""
        device = _resolve_device(model, device, noise)
        assert isinstance(shape, (tuple, list))
        img = noise if noise is not None else torch.randn(*shape, device=device)
        indices = list(range(self.num_timesteps))[::-1]
        if progress:
            indices = progress_bar(indices)
        for i in indices:
            # A fill on the device: torch.tensor(list, device=cuda) is a blocking copy, a host wait per step.
            t = torch.full((shape[0],), i, device=device, dtype=torch.long)
            with torch.no_grad():
                out = step(model, img, t, **step_kwargs)
                yield out
                img = out["sample"]
