"""Images to stored latent rows: the one encoding `dit extract` and `dit train`'s latent cache share.

Every VAE call sees the same batch shape (`pad_to` images, each also flipped): a short batch is
padded with copies of its first image. Kernels chosen for one shape compute each image alike
whatever else is in the batch, while another batch size can change the last bits (CPU convolutions
block differently), so an image encodes to the same bytes whichever batch, rank or command asked.
"""

import numpy as np
import torch

from dit_trainer.data.images import to_model_range
from dit_trainer.vae.autoencoder import encode

# Images per VAE call: `dit extract`'s --batch-size default, so the cache holds extract's bytes.
ENCODE_BATCH = 32


def encode_rows(model, images: np.ndarray, indices, num_flips: int, posterior: str, seed: int, sf: float,
                shift: float, pad_to: int):
    """Rows b×F×K×C×H×W (float32) for uint8 images b×H×W×3, and the positions whose latents are not finite."""
    b = len(indices)
    if b > pad_to:
        raise ValueError(f"{b} images do not fit one VAE batch of {pad_to}")
    x = torch.from_numpy(to_model_range(images))
    if b < pad_to:
        x = torch.cat([x, x[:1].expand(pad_to - b, *x.shape[1:])])
    if num_flips == 2:
        x = torch.cat([x, x.flip(-1)])
    mean, std = encode(model, x, sf, shift)
    mean = mean.cpu().numpy().reshape(num_flips, pad_to, *mean.shape[1:])[:, :b].swapaxes(0, 1)
    std = std.cpu().numpy().reshape(num_flips, pad_to, *std.shape[1:])[:, :b].swapaxes(0, 1)
    if posterior == "mean_std":
        rows = np.stack([mean, std], axis=2)
    else:
        # Noise keyed by image index, so the sample does not depend on batch or rank.
        eps = np.stack([np.random.default_rng([seed, i]).standard_normal(mean.shape[1:], dtype=np.float32)
                        for i in indices])
        rows = (mean + std * eps)[:, :, None]
    bad = np.flatnonzero(~np.isfinite(rows.reshape(b, -1)).all(axis=1)).tolist()
    return rows, bad


def encode_text_rows(encoder, captions, pad_to: int = ENCODE_BATCH):
    """{field: numpy rows} of the text encoder's outputs for `captions`: float32 embeddings (and pooled
    vectors), uint8 masks; every encoder call sees a batch of `pad_to` captions, as the VAE's sees images.
    A sharded encoder's ranks each make as many calls as the busiest (encoding "" for none, with no rows)."""
    from dit_trainer.text_encoders.parallelize import agreed_calls

    parts = {}
    calls = -(-len(captions) // pad_to)
    for _ in range(calls, agreed_calls(encoder, calls)):
        encoder.encode([""], pad_to=pad_to)  # its forward is a collective: take part in the others'
    for start in range(0, len(captions), pad_to):
        for key, value in encoder.encode(captions[start:start + pad_to], pad_to=pad_to).items():
            value = value.float() if value.is_floating_point() else value.to(torch.uint8)
            parts.setdefault(key, []).append(value.cpu().numpy())
    return {key: np.concatenate(values) for key, values in parts.items()}
