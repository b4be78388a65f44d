"""Discrete-time Gaussian diffusion (DDPM / improved DDPM) with the numerics of facebookresearch/DiT.

All per-timestep coefficients are float64 numpy arrays; a batch gathers its coefficients and only
then casts them to float32 (see ``utils.extract_into_tensor``). Keeping that order, and the order of the
arithmetic below, is what makes results agree with the reference implementation to float32
round-off rather than merely to the same math.
"""

import enum

import numpy as np
import torch

from .losses import discretized_gaussian_log_likelihood, normal_kl
from .sampling import SamplingMixin
from .utils import extract_into_tensor as _extract_into_tensor
from .utils import mean_flat

__all__ = [
    "GaussianDiffusion",
    "LossType",
    "ModelMeanType",
    "ModelVarType",
    "mean_flat",
]


class ModelMeanType(enum.Enum):
    """What the network's (first C) output channels predict."""

    PREVIOUS_X = enum.auto()  # x_{t-1}
    START_X = enum.auto()  # x_0
    EPSILON = enum.auto()  # the noise


class ModelVarType(enum.Enum):
    """Where the reverse-step variance comes from."""

    LEARNED = enum.auto()  # the extra channels are a log-variance
    FIXED_SMALL = enum.auto()  # the true posterior variance
    FIXED_LARGE = enum.auto()  # beta_t
    LEARNED_RANGE = enum.auto()  # the extra channels interpolate log-variance in [small, large]


class LossType(enum.Enum):
    """Training objective."""

    MSE = enum.auto()  # L_simple, plus the VB term when the variance is learned
    RESCALED_MSE = enum.auto()  # as MSE, with the VB term scaled by T / 1000
    KL = enum.auto()  # the variational bound alone
    RESCALED_KL = enum.auto()  # the bound scaled by T to estimate the full VLB

    def is_vb(self):
        """Whether this objective is the variational bound rather than an MSE."""
        return self in (LossType.KL, LossType.RESCALED_KL)


class GaussianDiffusion(SamplingMixin):
    """Training losses, posteriors and samplers for one beta schedule (``betas`` run from t=1 to T)."""

    def __init__(self, *, betas, model_mean_type, model_var_type, loss_type):
        self.model_mean_type = model_mean_type
        self.model_var_type = model_var_type
        self.loss_type = loss_type

        betas = np.array(betas, dtype=np.float64)
        assert betas.ndim == 1, "betas must be 1-D"
        assert (betas > 0).all() and (betas <= 1).all()
        self.betas = betas
        self.num_timesteps = int(betas.shape[0])

        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas, axis=0)
        self.alphas_cumprod_prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.alphas_cumprod_next = np.append(self.alphas_cumprod[1:], 0.0)
        assert self.alphas_cumprod_prev.shape == (self.num_timesteps,)

        # q(x_t | x_0)
        self.sqrt_alphas_cumprod = np.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - self.alphas_cumprod)
        self.log_one_minus_alphas_cumprod = np.log(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1)

        # q(x_{t-1} | x_t, x_0)
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        # The posterior variance is 0 at t=0, so its log borrows the t=1 value there.
        if len(self.posterior_variance) > 1:
            self.posterior_log_variance_clipped = np.log(
                np.append(self.posterior_variance[1], self.posterior_variance[1:])
            )
        else:
            self.posterior_log_variance_clipped = np.array([])
        self.posterior_mean_coef1 = betas * np.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = (
            (1.0 - self.alphas_cumprod_prev) * np.sqrt(alphas) / (1.0 - self.alphas_cumprod)
        )

    # -- forward process ----------------------------------------------------------------------

    def q_mean_variance(self, x_start, t):
        """Mean, variance and log-variance of q(x_t | x_0)."""
        mean = _extract_into_tensor(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
        variance = _extract_into_tensor(1.0 - self.alphas_cumprod, t, x_start.shape)
        log_variance = _extract_into_tensor(self.log_one_minus_alphas_cumprod, t, x_start.shape)
        return mean, variance, log_variance

    def q_sample(self, x_start, t, noise=None):
        """Draw x_t ~ q(x_t | x_0); ``t`` is 0-based (t=0 is one step of noise)."""
        if noise is None:
            noise = torch.randn_like(x_start)
        assert noise.shape == x_start.shape
        return (
            _extract_into_tensor(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
            + _extract_into_tensor(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise
        )

    def q_posterior_mean_variance(self, x_start, x_t, t):
        """Mean, variance and clipped log-variance of q(x_{t-1} | x_t, x_0)."""
        assert x_start.shape == x_t.shape
        mean = (
            _extract_into_tensor(self.posterior_mean_coef1, t, x_t.shape) * x_start
            + _extract_into_tensor(self.posterior_mean_coef2, t, x_t.shape) * x_t
        )
        variance = _extract_into_tensor(self.posterior_variance, t, x_t.shape)
        log_variance = _extract_into_tensor(self.posterior_log_variance_clipped, t, x_t.shape)
        assert mean.shape[0] == variance.shape[0] == log_variance.shape[0] == x_start.shape[0]
        return mean, variance, log_variance

    # -- reverse process ----------------------------------------------------------------------

    def _fixed_variance(self):
        """(variance, log-variance) arrays for the fixed variance types."""
        if self.model_var_type == ModelVarType.FIXED_LARGE:
            # beta_t, except at t=0 where the posterior variance of t=1 gives a better decoder NLL.
            large = np.append(self.posterior_variance[1], self.betas[1:])
            return large, np.log(large)
        if self.model_var_type == ModelVarType.FIXED_SMALL:
            return self.posterior_variance, self.posterior_log_variance_clipped
        raise NotImplementedError(self.model_var_type)

    def p_mean_variance(self, model, x, t, clip_denoised=True, denoised_fn=None, model_kwargs=None):
        """Apply the model to get p(x_{t-1} | x_t): dict of mean, variance, log_variance, pred_xstart, extra."""
        if model_kwargs is None:
            model_kwargs = {}
        B, C = x.shape[:2]
        assert t.shape == (B,)
        model_output = model(x, t, **model_kwargs)
        extra = None
        if isinstance(model_output, tuple):
            model_output, extra = model_output

        if self.model_var_type in (ModelVarType.LEARNED, ModelVarType.LEARNED_RANGE):
            assert model_output.shape == (B, C * 2, *x.shape[2:])
            model_output, var_values = torch.split(model_output, C, dim=1)
            if self.model_var_type == ModelVarType.LEARNED:
                log_variance = var_values
            else:
                min_log = _extract_into_tensor(self.posterior_log_variance_clipped, t, x.shape)
                max_log = _extract_into_tensor(np.log(self.betas), t, x.shape)
                # var_values in [-1, 1] maps onto [min_log, max_log].
                frac = (var_values + 1) / 2
                log_variance = frac * max_log + (1 - frac) * min_log
            variance = torch.exp(log_variance)
        else:
            var_arr, log_var_arr = self._fixed_variance()
            variance = _extract_into_tensor(var_arr, t, x.shape)
            log_variance = _extract_into_tensor(log_var_arr, t, x.shape)

        def process_xstart(x0):
            if denoised_fn is not None:
                x0 = denoised_fn(x0)
            return x0.clamp(-1, 1) if clip_denoised else x0

        if self.model_mean_type == ModelMeanType.PREVIOUS_X:
            pred_xstart = process_xstart(self._predict_xstart_from_xprev(x_t=x, t=t, xprev=model_output))
            mean = model_output
        else:
            if self.model_mean_type == ModelMeanType.START_X:
                pred_xstart = process_xstart(model_output)
            else:
                pred_xstart = process_xstart(self._predict_xstart_from_eps(x_t=x, t=t, eps=model_output))
            mean, _, _ = self.q_posterior_mean_variance(x_start=pred_xstart, x_t=x, t=t)

        assert mean.shape == log_variance.shape == pred_xstart.shape == x.shape
        return {
            "mean": mean,
            "variance": variance,
            "log_variance": log_variance,
            "pred_xstart": pred_xstart,
            "extra": extra,
        }

    def _predict_xstart_from_eps(self, x_t, t, eps):
        """x_0 implied by x_t and a noise prediction."""
        assert x_t.shape == eps.shape
        return (
            _extract_into_tensor(self.sqrt_recip_alphas_cumprod, t, x_t.shape) * x_t
            - _extract_into_tensor(self.sqrt_recipm1_alphas_cumprod, t, x_t.shape) * eps
        )

    def _predict_xstart_from_xprev(self, x_t, t, xprev):
        """x_0 implied by x_t and a prediction of the posterior mean x_{t-1}."""
        assert x_t.shape == xprev.shape
        return (
            _extract_into_tensor(1.0 / self.posterior_mean_coef1, t, x_t.shape) * xprev
            - _extract_into_tensor(self.posterior_mean_coef2 / self.posterior_mean_coef1, t, x_t.shape)
            * x_t
        )

    def _predict_eps_from_xstart(self, x_t, t, pred_xstart):
        """Noise implied by x_t and an x_0 prediction."""
        return (
            _extract_into_tensor(self.sqrt_recip_alphas_cumprod, t, x_t.shape) * x_t - pred_xstart
        ) / _extract_into_tensor(self.sqrt_recipm1_alphas_cumprod, t, x_t.shape)

    # -- losses -------------------------------------------------------------------------------

    def _vb_terms_bpd(self, model, x_start, x_t, t, clip_denoised=True, model_kwargs=None):
        """One term of the variational bound in bits per dim: the decoder NLL at t=0, else the KL."""
        true_mean, _, true_log_var = self.q_posterior_mean_variance(x_start=x_start, x_t=x_t, t=t)
        out = self.p_mean_variance(model, x_t, t, clip_denoised=clip_denoised, model_kwargs=model_kwargs)
        kl = normal_kl(true_mean, true_log_var, out["mean"], out["log_variance"])
        kl = mean_flat(kl) / np.log(2.0)

        decoder_nll = -discretized_gaussian_log_likelihood(
            x_start, means=out["mean"], log_scales=0.5 * out["log_variance"]
        )
        assert decoder_nll.shape == x_start.shape
        decoder_nll = mean_flat(decoder_nll) / np.log(2.0)

        output = torch.where((t == 0), decoder_nll, kl)
        return {"output": output, "pred_xstart": out["pred_xstart"]}

    def training_losses(self, model, x_start, t, model_kwargs=None, noise=None):
        """Per-sample training losses at timesteps ``t``: dict with "loss" (and "mse"/"vb" for MSE types)."""
        if model_kwargs is None:
            model_kwargs = {}
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.q_sample(x_start, t, noise=noise)
        terms = {}

        if self.loss_type.is_vb():
            terms["loss"] = self._vb_terms_bpd(
                model=model, x_start=x_start, x_t=x_t, t=t, clip_denoised=False, model_kwargs=model_kwargs
            )["output"]
            if self.loss_type == LossType.RESCALED_KL:
                terms["loss"] *= self.num_timesteps
            return terms

        if self.loss_type not in (LossType.MSE, LossType.RESCALED_MSE):
            raise NotImplementedError(self.loss_type)
        model_output = model(x_t, t, **model_kwargs)
        if self.model_var_type in (ModelVarType.LEARNED, ModelVarType.LEARNED_RANGE):
            B, C = x_t.shape[:2]
            assert model_output.shape == (B, C * 2, *x_t.shape[2:])
            model_output, var_values = torch.split(model_output, C, dim=1)
            # The bound trains the variance only; the mean is trained by the MSE alone.
            frozen = torch.cat([model_output.detach(), var_values], dim=1)
            terms["vb"] = self._vb_terms_bpd(
                model=lambda *args, r=frozen: r, x_start=x_start, x_t=x_t, t=t, clip_denoised=False
            )["output"]
            if self.loss_type == LossType.RESCALED_MSE:
                # Undo the growth of the bound with T so it does not swamp the MSE term.
                terms["vb"] *= self.num_timesteps / 1000.0

        if self.model_mean_type == ModelMeanType.PREVIOUS_X:
            target = self.q_posterior_mean_variance(x_start=x_start, x_t=x_t, t=t)[0]
        elif self.model_mean_type == ModelMeanType.START_X:
            target = x_start
        else:
            target = noise
        assert model_output.shape == target.shape == x_start.shape
        terms["mse"] = mean_flat((target - model_output) ** 2)
        terms["loss"] = terms["mse"] + terms["vb"] if "vb" in terms else terms["mse"]
        return terms

    def _prior_bpd(self, x_start):
        """KL(q(x_T | x_0) || N(0, I)) in bits per dim; constant with respect to the model."""
        t = torch.tensor([self.num_timesteps - 1] * x_start.shape[0], device=x_start.device)
        qt_mean, _, qt_log_variance = self.q_mean_variance(x_start, t)
        kl_prior = normal_kl(mean1=qt_mean, logvar1=qt_log_variance, mean2=0.0, logvar2=0.0)
        return mean_flat(kl_prior) / np.log(2.0)

    def calc_bpd_loop(self, model, x_start, clip_denoised=True, model_kwargs=None):
        """Full variational bound in bits per dim, with per-timestep vb, x_0 MSE and eps MSE."""
        batch_size = x_start.shape[0]
        vb, xstart_mse, mse = [], [], []
        for i in reversed(range(self.num_timesteps)):
            t = torch.tensor([i] * batch_size, device=x_start.device)
            noise = torch.randn_like(x_start)
            x_t = self.q_sample(x_start=x_start, t=t, noise=noise)
            with torch.no_grad():
                out = self._vb_terms_bpd(
                    model, x_start=x_start, x_t=x_t, t=t, clip_denoised=clip_denoised, model_kwargs=model_kwargs
                )
            vb.append(out["output"])
            xstart_mse.append(mean_flat((out["pred_xstart"] - x_start) ** 2))
            eps = self._predict_eps_from_xstart(x_t, t, out["pred_xstart"])
            mse.append(mean_flat((eps - noise) ** 2))

        vb = torch.stack(vb, dim=1)
        prior_bpd = self._prior_bpd(x_start)
        return {
            "total_bpd": vb.sum(dim=1) + prior_bpd,
            "prior_bpd": prior_bpd,
            "vb": vb,
            "xstart_mse": torch.stack(xstart_mse, dim=1),
            "mse": torch.stack(mse, dim=1),
        }
