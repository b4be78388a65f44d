"""Tiny random-weight autoencoders of the kinds beyond the SD VAE, built from diffusers configs."""

import numpy as np
import torch


def save_dc(folder, scaling_factor=0.41407):
    """An AutoencoderDC f32c32 (DC-AE's six levels, 8-32 channels wide): 64 px images give 32×2×2 latents."""
    from diffusers import AutoencoderDC

    torch.manual_seed(0)
    blocks = ("ResBlock",) * 3 + ("EfficientViTBlock",) * 3
    AutoencoderDC(latent_channels=32, attention_head_dim=8, encoder_block_types=blocks, decoder_block_types=blocks,
                  encoder_block_out_channels=(8, 8, 16, 16, 32, 32), decoder_block_out_channels=(8, 8, 16, 16, 32, 32),
                  encoder_layers_per_block=(1,) * 6, decoder_layers_per_block=(1,) * 6,
                  encoder_qkv_multiscales=((),) * 3 + ((5,),) * 3, decoder_qkv_multiscales=((),) * 3 + ((5,),) * 3,
                  scaling_factor=scaling_factor).save_pretrained(folder)
    return str(folder)


def save_kl_f16c32(folder):
    """A VA-VAE-shaped AutoencoderKL: five levels (f16), 32 latent channels; 64 px images give 32×4×4 latents."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    AutoencoderKL(block_out_channels=(8, 8, 16, 16, 32), down_block_types=("DownEncoderBlock2D",) * 5,
                  up_block_types=("UpDecoderBlock2D",) * 5, layers_per_block=1, latent_channels=32,
                  norm_num_groups=8, sample_size=64).save_pretrained(folder)
    return str(folder)


def write_images(root, classes=2, per_class=4, size=64, seed=0):
    """Smooth random RGB images (a coarse grid upsampled), so latents differ by image and channel."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            coarse = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
            Image.fromarray(coarse).resize((size, size), Image.BILINEAR).save(root / f"c{c}" / f"{i}.png")
    return str(root)
