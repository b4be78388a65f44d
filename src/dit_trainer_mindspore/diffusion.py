"""Gaussian diffusion for training in MindSpore: schedules, q_sample and DiT's training loss
(ε-MSE plus the variational-bound term that trains the learned σ), ported from
`dit_trainer.diffusion` (gaussian_diffusion.py, losses.py) with the same float64 coefficients
and the same order of float32 arithmetic."""

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from dit_trainer.errors import ConfigError
from dit_trainer.diffusion.schedules import get_named_beta_schedule

_HALF_BIN = 1.0 / 255.0


def _extract(arr, t, ndim):
    """arr[t] as float32 shaped (B, 1, ..., 1): cast before gathering, as the PyTorch code does."""
    res = ops.gather(Tensor(np.asarray(arr, dtype=np.float32)), t, 0)
    return res.reshape(res.shape + (1,) * (ndim - 1))


def mean_flat(x):
    return x.mean(axis=tuple(range(1, x.ndim)))


def normal_kl(mean1, logvar1, mean2, logvar2):
    return 0.5 * (-1.0 + logvar2 - logvar1 + _exp(logvar1 - logvar2) + ((mean1 - mean2) ** 2) * _exp(-logvar2))


# MindSpore 2.10's float32 CPU kernels for tanh, exp and log are off by up to 1e-4 (tanh) and
# 5e-6 relative (exp, log), where torch's are correctly rounded to ~1e-7. The decoder NLL at t=0
# is a log of a difference of two CDFs and amplifies that to 3e-5 in the loss; the float64
# kernels are exact, so the loss's transcendentals run in float64 and round back to float32.
def _f64(fn, x):
    return fn(x.astype(ms.float64)).astype(ms.float32)


def _tanh(x):
    return _f64(ops.tanh, x)


def _exp(x):
    return _f64(ops.exp, x)


def _log(x):
    return _f64(ops.log, x)


def approx_standard_normal_cdf(x):
    return 0.5 * (1.0 + _tanh(float(np.sqrt(2.0 / np.pi)) * (x + 0.044715 * ops.pow(x, 3))))


def discretized_gaussian_log_likelihood(x, means, log_scales):
    centered = x - means
    inv_std = _exp(-log_scales)
    cdf_upper = approx_standard_normal_cdf(inv_std * (centered + _HALF_BIN))
    cdf_lower = approx_standard_normal_cdf(inv_std * (centered - _HALF_BIN))
    log_upper = _log(ops.clamp(cdf_upper, min=1e-12))
    log_one_minus_lower = _log(ops.clamp(1.0 - cdf_lower, min=1e-12))
    log_bin = _log(ops.clamp(cdf_upper - cdf_lower, min=1e-12))
    return ops.where(x < -0.999, log_upper, ops.where(x > 0.999, log_one_minus_lower, log_bin))


class GaussianDiffusion:
    """`create_diffusion(...)` of dit_trainer for training (no respacing): q_sample, training_losses."""

    def __init__(self, num_timesteps=1000, noise_schedule="linear", learn_sigma=True, sigma_small=False,
                 predict_xstart=False, rescale_learned_sigmas=False, use_kl=False):
        if use_kl:
            raise ConfigError("diffusion.use_kl is not supported by backend mindspore; set it false")
        base = get_named_beta_schedule(noise_schedule, num_timesteps)
        # create_diffusion always builds a SpacedDiffusion, which recomputes betas from alphas_cumprod
        # even with every step kept; the same round-off here keeps the coefficients bit-identical.
        ac = np.cumprod(1.0 - np.array(base, dtype=np.float64))
        betas = np.array([1 - a / prev for a, prev in zip(ac, np.append(1.0, ac[:-1]))], dtype=np.float64)
        self.betas, self.num_timesteps = betas, len(betas)
        self.learn_sigma, self.sigma_small = learn_sigma, sigma_small
        self.predict_xstart, self.rescale = predict_xstart, rescale_learned_sigmas
        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas, axis=0)
        prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.sqrt_alphas_cumprod = np.sqrt(self.alphas_cumprod)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - self.alphas_cumprod)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1)
        self.posterior_variance = betas * (1.0 - prev) / (1.0 - self.alphas_cumprod)
        self.posterior_log_variance_clipped = np.log(np.append(self.posterior_variance[1], self.posterior_variance[1:]))
        self.posterior_mean_coef1 = betas * np.sqrt(prev) / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = (1.0 - prev) * np.sqrt(alphas) / (1.0 - self.alphas_cumprod)

    @classmethod
    def from_config(cls, cfg):
        """The diffusion of `cfg.diffusion` and `cfg.model.learn_sigma`."""
        d = cfg.diffusion
        if d.timestep_sampler != "uniform":
            raise ConfigError("diffusion.timestep_sampler must be uniform with backend mindspore")
        if d.loss_weighting != "none":
            raise ConfigError("diffusion.loss_weighting must be none with backend mindspore")
        return cls(d.num_timesteps, d.noise_schedule, cfg.model.learn_sigma, d.sigma_small, d.predict_xstart,
                   d.rescale_learned_sigmas, d.use_kl)

    def q_sample(self, x_start, t, noise):
        """x_t ~ q(x_t | x_0) with the given noise; `t` is 0-based."""
        return (_extract(self.sqrt_alphas_cumprod, t, x_start.ndim) * x_start
                + _extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.ndim) * noise)

    def q_posterior_mean_variance(self, x_start, x_t, t):
        n = x_t.ndim
        mean = _extract(self.posterior_mean_coef1, t, n) * x_start + _extract(self.posterior_mean_coef2, t, n) * x_t
        return mean, _extract(self.posterior_log_variance_clipped, t, n)

    def _vb(self, model_output, var_values, x_start, x_t, t):
        """The VB term (bits/dim) for an output whose mean part is frozen; trains only var_values."""
        n = x_t.ndim
        true_mean, true_log_var = self.q_posterior_mean_variance(x_start, x_t, t)
        min_log = _extract(self.posterior_log_variance_clipped, t, n)
        max_log = _extract(np.log(self.betas), t, n)
        frac = (var_values + 1) / 2
        log_variance = frac * max_log + (1 - frac) * min_log
        if self.predict_xstart:
            pred_xstart = model_output
        else:
            pred_xstart = (_extract(self.sqrt_recip_alphas_cumprod, t, n) * x_t
                           - _extract(self.sqrt_recipm1_alphas_cumprod, t, n) * model_output)
        mean, _ = self.q_posterior_mean_variance(pred_xstart, x_t, t)
        kl = mean_flat(normal_kl(true_mean, true_log_var, mean, log_variance)) / float(np.log(2.0))
        nll = -discretized_gaussian_log_likelihood(x_start, mean, 0.5 * log_variance)
        nll = mean_flat(nll) / float(np.log(2.0))
        return ops.where(t == 0, nll, kl)

    def training_losses(self, model_output, x_start, t, noise):
        """Per-sample losses {"loss", "mse"[, "vb"]} from the network's output on q_sample(x_start, t, noise)."""
        x_t = self.q_sample(x_start, t, noise)
        terms = {}
        c = x_start.shape[1]
        if self.learn_sigma:
            eps_out, var_values = model_output[:, :c], model_output[:, c:]
            terms["vb"] = self._vb(ops.stop_gradient(eps_out), var_values, x_start, x_t, t)
            if self.rescale:
                terms["vb"] = terms["vb"] * (self.num_timesteps / 1000.0)
            model_output = eps_out
        target = x_start if self.predict_xstart else noise
        terms["mse"] = mean_flat((target - model_output) ** 2)
        terms["loss"] = terms["mse"] + terms["vb"] if "vb" in terms else terms["mse"]
        return terms
