"""What a diffusers autoencoder's config says of its latents, read without torch: whether its encoder
gives a posterior (AutoencoderKL) or one latent (AutoencoderDC), and how many pixels a latent spans.

`config` is a loaded model's `.config` or the dict of its config.json: the planner and the exporters
read the file, the loaders ask the model, and all of them get the same answer.
"""

from typing import Optional

SD_FACTOR = 8  # pixels per latent side of the SD VAEs (and what is assumed where no config is read)


def has_posterior(config) -> bool:
    """Whether the encoder gives a distribution (KL) rather than one latent (DC, whose blocks are named
    `encoder_block_out_channels`)."""
    return "encoder_block_out_channels" not in config


def downsampling(config) -> Optional[int]:
    """Pixels per latent side: 2^(levels - 1) of the encoder's blocks (8 for the SD VAEs, 32 for DC-AE f32);
    None when the config lists no blocks."""
    blocks = config.get("block_out_channels") if has_posterior(config) else config.get("encoder_block_out_channels")
    return 2 ** (len(blocks) - 1) if blocks else None
