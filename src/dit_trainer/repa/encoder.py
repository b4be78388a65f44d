"""The encoder's side of REPA: a frozen vision encoder that turns the clean images of a batch into
the patch tokens the projector is pulled towards.

The encoder is no part of the model: it is frozen, in eval mode, run under no_grad (and the run's
autocast), replicated whole on every rank, and never saved, optimised or exported.
"""

import torch
import torch.nn as nn

from dit_trainer.errors import ConfigError, DataError
from dit_trainer.repa.config import encoder_overrides, encoder_size

RANDOM = "random"  # repa.encoder_weights of a random-weight encoder (tests)


def _build(r, size: int) -> nn.Module:
    """The frozen encoder as the release loads it: weights, then its position table resampled once, on the
    CPU in float32, to the grid of `size` px (bicubic, antialiased unless `r.encoder_overrides` say otherwise)."""
    from dit_trainer.encoders import build_encoder

    weights = None if r.encoder_weights == RANDOM else r.encoder_weights
    encoder = build_encoder(r.encoder, weights=weights, **encoder_overrides(r))
    encoder.resample_pos_embed(size)
    return encoder


class AlignmentTargets:
    """The frozen encoder on this rank and the targets (B, N, D) it gives for a batch of images."""

    def __init__(self, r, grid: int, device, amp_dtype=None):
        self.size = encoder_size(r, grid)
        # build_encoder's encoders are frozen and stay in eval mode whatever train() a caller makes.
        self.encoder = _build(r, self.size).to(device)
        self.device, self.amp_dtype = torch.device(device), amp_dtype
        self.tokens = grid * grid

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """float32 (B, N, D) patch tokens of `images` (B, C, H, W) in [0, 1]; one channel is repeated to three."""
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        images = images.to(self.device, dtype=torch.float32)
        if self.amp_dtype is not None:
            with torch.autocast(self.device.type, dtype=self.amp_dtype):
                tokens, _ = self.encoder.encode(images, self.size)
        else:
            tokens, _ = self.encoder.encode(images, self.size)
        if tokens.shape[1] != self.tokens:
            raise ConfigError(f"the encoder gave {tokens.shape[1]} patch tokens for the model's {self.tokens}; "
                              "set repa.encoder_size to the model's tokens per side x the encoder's patch size")
        return tokens.float()


def check_images(dataset, path) -> None:
    """A one-line error when REPA is on and `dataset` cannot give the clean images it needs."""
    if getattr(dataset, "stored_images", False):
        dataset.return_images = True  # shards of `dit extract --keep-images`: read their images too
    if getattr(dataset, "pixel_space", False) or getattr(dataset, "return_images", False):
        return
    raise DataError(f"repa.enabled needs the clean images beside the latents, and {path} holds latents only; "
                    "train on the image folder itself (its latent cache keeps them) or re-extract with "
                    "`dit extract --keep-images` (with the same --text-encoder for captioned data), or set "
                    "repa.enabled false")


def batch_images(batch, x: torch.Tensor, pixel_space: bool) -> torch.Tensor:
    """The batch's clean images as float (B, C, H, W) in [0, 1]: the stored uint8 images, or the data
    itself where it is pixels in [-1, 1] (the digits)."""
    if isinstance(batch, dict) and "image" in batch:
        image = batch["image"]
        return image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
    if pixel_space:
        return ((x.float() + 1.0) / 2.0).clamp(0.0, 1.0)
    raise DataError("repa.enabled needs the clean images, and this batch holds latents only; re-extract the "
                    "data with `dit extract --keep-images` or set repa.enabled false")


class Alignment:
    """What a training run needs of REPA beside the model: the frozen encoder, and the targets it
    adds to each step's draws from the batch's clean images."""

    def __init__(self, cfg, model, device, amp_dtype=None):
        self.targets = AlignmentTargets(cfg.repa, model.input_size // model.patch_size, device, amp_dtype)
        self.path = cfg.data.path
        self.pixel_space = False

    @classmethod
    def for_run(cls, cfg, model, device, amp_dtype=None):
        """The run's Alignment, or None when repa.enabled is off."""
        r = getattr(cfg, "repa", None)
        return cls(cfg, model, device, amp_dtype) if r is not None and r.enabled else None

    def flops_per_image(self) -> float:
        """What REPA adds to a training step's FLOPs per image beside the model's own: the frozen encoder's
        forward. (The projector is one of the model's modules: a family's FLOP count walks it with the rest.)"""
        from dit_trainer.encoders import encoder_flops

        return encoder_flops(self.targets.encoder, self.targets.size)

    def check_data(self, dataset) -> None:
        """A one-line error when `dataset` holds no images; remembers whether it is pixels itself."""
        check_images(dataset, self.path)
        self.pixel_space = bool(getattr(dataset, "pixel_space", False))

    def add_targets(self, batch, x, draws: dict) -> dict:
        """`draws` with the encoder's targets of this rank's images (no randomness is drawn)."""
        from dit_trainer.repa.objective import TARGET

        draws[TARGET] = self.targets(batch_images(batch, x, self.pixel_space))
        return draws
