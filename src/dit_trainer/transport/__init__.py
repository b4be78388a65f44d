"""Interpolant transport (flow matching) as in SiT (Ma et al., 2024): paths, losses, samplers.

`create_transport(...)` and `Sampler(transport)` follow the API of willisma/SiT's `transport`
package; the loss takes t and the noise as arguments instead of drawing them.
"""

from dit_trainer.transport.config import TransportConfig
from dit_trainer.transport.guidance import cfg_model_fn
from dit_trainer.transport.path import PATHS, GVPPath, LinearPath, VPPath, expand_t_like_x
from dit_trainer.transport.sampler import DIFFUSION_FORMS, LAST_STEPS, Sampler, bits_per_dim
from dit_trainer.transport.timesteps import T_SAMPLERS, sample_logit_normal_t, sample_t, sample_uniform_t
from dit_trainer.transport.transport import LOSS_WEIGHTS, PREDICTIONS, Transport, create_transport, mean_flat

__all__ = [
    "create_transport", "Transport", "Sampler", "TransportConfig", "cfg_model_fn",
    "LinearPath", "GVPPath", "VPPath", "PATHS", "PREDICTIONS", "LOSS_WEIGHTS", "DIFFUSION_FORMS", "LAST_STEPS",
    "T_SAMPLERS", "sample_t", "sample_uniform_t", "sample_logit_normal_t", "bits_per_dim", "mean_flat",
    "expand_t_like_x",
]
