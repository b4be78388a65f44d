"""The frozen encoder REPA-style training reads targets from: a DINOv2 ViT that stays in eval mode."""

import dataclasses

import torch

from dit_trainer.encoders.preprocessing import check_size, preprocess
from dit_trainer.encoders.vit import DinoViT, VitShape


class Encoder(DinoViT):
    """A frozen DINOv2 ViT: `encode(images, size)` → (patch tokens (B, N, D), class token (B, D)).

    Attributes: `name`, `embed_dim`, `patch_size` (14), `num_register_tokens`, `shape` (VitShape).
    """

    def __init__(self, shape: VitShape, name: str = "dinov2"):
        super().__init__(shape)
        self.name = name
        self.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True):
        """Stays in eval mode whatever `mode` is: the encoder is never trained."""
        return super().train(False)

    def num_patches(self, size: int) -> int:
        """Patch tokens per image at input size `size`."""
        check_size(size, self.patch_size)
        return (size // self.patch_size) ** 2

    @torch.no_grad()
    def resample_pos_embed(self, size: int) -> None:
        """Keep the position table resampled once to the patch grid of `size` px (with the shape's
        convention), as REPA does at load: a forward at `size` then uses it as it is, with no resampling."""
        check_size(size, self.patch_size)
        table = self.interpolate_pos_encoding(size, size).detach().clone()
        self.pos_embed = torch.nn.Parameter(table, requires_grad=False)
        self.shape = dataclasses.replace(self.shape, img_size=size)

    @torch.no_grad()
    def encode(self, images: torch.Tensor, size: int):
        """(final-norm patch tokens (B, (size/14)², D), class token (B, D)) of images in [0, 1]."""
        check_size(size, self.patch_size)
        x = preprocess(images.to(self.pos_embed.device), size, dtype=self.patch_embed.proj.weight.dtype)
        out = self.forward_features(x)
        return out["x_norm_patchtokens"], out["x_norm_clstoken"]
