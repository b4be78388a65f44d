"""Interpolant transport (flow matching) as in SiT (Ma et al., 2024): paths, losses, samplers.

`create_transport(...)` and `Sampler(transport)` follow the API of willisma/SiT's `transport`
package; the loss takes t and the noise as arguments instead of drawing them. Names load on first
use, so reading the config's `transport:` section (`transport.config`) does not import torch.
"""

from dit_trainer.lazy import lazy_exports

_LAZY = {
    "TransportConfig": "dit_trainer.transport.config",
    "PATHS": "dit_trainer.transport.path",
    "GVPPath": "dit_trainer.transport.path",
    "LinearPath": "dit_trainer.transport.path",
    "VPPath": "dit_trainer.transport.path",
    "expand_t_like_x": "dit_trainer.transport.path",
    "DIFFUSION_FORMS": "dit_trainer.transport.sampler",
    "LAST_STEPS": "dit_trainer.transport.sampler",
    "Sampler": "dit_trainer.transport.sampler",
    "bits_per_dim": "dit_trainer.transport.sampler",
    "T_SAMPLERS": "dit_trainer.transport.timesteps",
    "sample_logit_normal_t": "dit_trainer.transport.timesteps",
    "sample_t": "dit_trainer.transport.timesteps",
    "sample_uniform_t": "dit_trainer.transport.timesteps",
    "LOSS_WEIGHTS": "dit_trainer.transport.transport",
    "PREDICTIONS": "dit_trainer.transport.transport",
    "Transport": "dit_trainer.transport.transport",
    "create_transport": "dit_trainer.transport.transport",
    "mean_flat": "dit_trainer.transport.transport",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = sorted(_LAZY)
