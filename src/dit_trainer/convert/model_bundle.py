"""What every format reads into and writes from: weights in our names plus what sampling needs."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Bundle:
    """One model in transit between formats.

    `state_dict` holds torch tensors under our (the release's) names; `model` is a model-config
    dict (see model_config.py); `vae` a diffusers AutoencoderKL/AutoencoderDC folder or hub id (None for pixel
    models); `class_names` index = class id, or None when the classes have no names (or the model is
    text-conditioned, when `text_encoder` names what encodes its captions).
    """

    state_dict: dict
    model: dict
    vae: Optional[str] = None
    scaling_factor: Optional[float] = None
    # Per-channel mean and std of the stored latents the model was trained on normalised by (see
    # vae/latent_stats.py); None for latents used as stored (the SD VAEs).
    latent_mean: Optional[list] = None
    latent_std: Optional[list] = None
    class_names: Optional[list] = None
    diffusion: dict = field(default_factory=lambda: {"num_timesteps": 1000, "noise_schedule": "linear"})
    # The `transport:` section of a run trained with `objective: transport` (SiT's interpolants);
    # None for a noise-prediction diffusion model, the only kind DiTPipeline folders hold.
    transport: Optional[dict] = None
    # A text-to-image model's frozen text encoder (a transformers folder, a pipeline folder holding
    # text_encoder/ and tokenizer/, or a Hub id) and its token count (None: the encoder's default).
    text_encoder: Optional[str] = None
    text_max_length: Optional[int] = None
    source: str = ""
