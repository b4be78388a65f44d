"""Min-SNR-γ loss weighting (Hang et al., 2023): timesteps whose SNR passes γ stop dominating the loss.

The weight multiplies the per-sample MSE term. For noise prediction it is min(SNR, γ) / SNR: the
noise MSE is the clean-data MSE times SNR, so this caps the clean-data weight at γ. For clean-data
prediction (predict_xstart) it is min(SNR, γ) for the same reason. A learned variance's bound term
trains the variance only and keeps weight one.
"""

import numpy as np
import torch

from dit_trainer.diffusion.gaussian_diffusion import ModelMeanType


def snr(alphas_cumprod) -> np.ndarray:
    """Per-step signal-to-noise ratio alpha_bar / (1 - alpha_bar), float64."""
    acp = np.asarray(alphas_cumprod, dtype=np.float64)
    return acp / (1.0 - acp)


def min_snr_weights(diffusion, gamma) -> np.ndarray:
    """(num_timesteps,) float64 weights of the MSE term of `diffusion`'s loss."""
    if diffusion.model_mean_type not in (ModelMeanType.EPSILON, ModelMeanType.START_X):
        raise ValueError(f"min-snr weighting has no form for {diffusion.model_mean_type}")
    s = snr(diffusion.alphas_cumprod)
    capped = np.minimum(s, gamma)
    return capped if diffusion.model_mean_type == ModelMeanType.START_X else capped / s


def weighted_loss(terms, mse_weight) -> torch.Tensor:
    """(B,) `mse_weight * terms["mse"]` plus the variance's bound term where the model learns it."""
    loss = mse_weight * terms["mse"]
    return loss + terms["vb"] if "vb" in terms else loss
