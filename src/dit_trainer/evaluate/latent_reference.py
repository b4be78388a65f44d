"""Reference statistics of a latent dataset: latents -> their VAE -> images -> the feature network.

For a user's own data when only its latents are at hand (`dit eval --ref-from-latents DIR`), and
for FID during training, which compares samples with the training set. Shards (`dit extract`) are
read unflipped and at their posterior mean, so each image is the VAE's reconstruction of a
training image; a `.npy` folder or fast-DiT features are read as they are stored. Pixel datasets
(1 or 3 channels, no VAE recorded or given) are measured as they are.
"""

import os
from pathlib import Path

import numpy as np

from dit_trainer.errors import ConfigError, DataError
from dit_trainer.evaluate.evaluator import DEFAULT_BATCH, PR_FEATURES, default_device, load_network
from dit_trainer.evaluate.stats import GaussianAccumulator, ReferenceStats


def open_latents(folder):
    """The latent dataset at `folder`, unflipped; shards at their posterior mean."""
    from dit_trainer.data.latents import open_latent_dataset

    if os.path.isfile(os.path.join(os.fspath(folder), "manifest.json")):
        from dit_trainer.data.shards import LatentShards

        return LatentShards(folder, random_flip=False, sample_posterior=False)
    return open_latent_dataset(folder, random_flip=False)


def latent_decoder(dataset, vae=None, scaling_factor=None, vae_dtype="fp32", device="cpu"):
    """(decode(latents) -> uint8 N×H×W×3, VAE name or None): the given VAE, else the one the dataset records."""
    import torch

    manifest = getattr(dataset, "manifest", None) or {}
    name = vae or manifest.get("vae")
    channels = int(dataset.latent_shape[0])
    if not name:
        if channels not in (1, 3):
            raise ConfigError(f"{channels}-channel latents need their VAE to become images: pass --vae ID_OR_DIR "
                              f"(no manifest.json names one)")

        def decode(x):
            return x.to(device).float().clamp(-1, 1)
    else:
        from dit_trainer.vae.autoencoder import decode as vae_decode
        from dit_trainer.vae.autoencoder import load_vae

        model = load_vae(name, vae_dtype, device)
        # The factor the latents were multiplied by: the dataset's record wins, as for sampling.
        factor = manifest.get("scaling_factor", scaling_factor)
        shift = manifest.get("shift_factor")

        def decode(x):
            return vae_decode(model, x, factor, shift)

    def to_uint8(latents):
        with torch.no_grad():
            images = decode(latents)
        x = ((images + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        return np.repeat(x, 3, axis=3) if x.shape[3] == 1 else x

    return to_uint8, name


def _latent_batches(dataset, indices, batch_size):
    import torch

    for start in range(0, len(indices), batch_size):
        chunk = [int(i) for i in indices[start:start + batch_size]]
        getitems = getattr(dataset, "__getitems__", None)
        items = getitems(chunk) if getitems is not None else [dataset[i] for i in chunk]
        yield torch.stack([x for x, _ in items])


def reference_from_latents(folder, out=None, vae=None, network="inception", weights=None, batch_size=None,
                           dtype="fp32", device=None, progress=True, pr_features: int = PR_FEATURES,
                           max_images=None, seed: int = 0, vae_dtype="fp32", scaling_factor=None,
                           dataset=None) -> ReferenceStats:
    """Decode the latents in `folder` (all, or a random `max_images`) and write their ReferenceStats to `out`.

    `vae` overrides the VAE the shards' manifest records; a `.npy` folder needs it unless it holds
    pixels. As `reference_from_images`, statistics cover every decoded image and the pool features
    of a random `pr_features` are kept for precision/recall.
    """
    from dit_trainer.evaluate.features import iter_features

    if max_images is not None and (isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 2):
        raise ConfigError(f"the number of reference images must be an integer >= 2, got {max_images!r}")
    device = device or default_device()
    dataset = dataset if dataset is not None else open_latents(folder)
    n = len(dataset)
    if n < 2:
        raise DataError(f"{folder} holds {n} latent(s); statistics need at least 2")
    rng = np.random.default_rng(seed)
    # Sorted: shards are read in order; a random subset (not the first N) keeps every class.
    indices = np.arange(n) if not max_images or max_images >= n else np.sort(rng.choice(n, max_images, replace=False))
    keep = np.zeros(len(indices), dtype=bool)
    keep[rng.choice(len(indices), min(len(indices), pr_features), replace=False)] = True
    to_uint8, _ = latent_decoder(dataset, vae, scaling_factor, vae_dtype, device)
    net = load_network(network, weights, device, progress) if isinstance(network, str) else network
    batch_size = batch_size or DEFAULT_BATCH.get(net.name, 64)
    images = (to_uint8(x) for x in _latent_batches(dataset, indices, batch_size))
    pool, spatial, kept, start = GaussianAccumulator(), GaussianAccumulator(), [], 0
    for f in iter_features(net, images, batch_size, dtype, device, progress, total=len(indices),
                           desc=f"reference {Path(os.fspath(folder)).name}"):
        pool.update(f.pool)
        spatial.update(f.spatial)
        kept.append(f.pool[keep[start:start + len(f)]])
        start += len(f)
    stats = ReferenceStats(*pool.result(), *spatial.result(), features=np.concatenate(kept), network=net.name)
    if out is not None:
        stats.save(out)
    return stats
