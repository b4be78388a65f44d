"""Samples to images: the VAE the latents came from (recorded in the config or the shard
manifest), or nothing for pixel models such as the digits demo. A model trained on per-channel
normalised latents (data.latent_mean/std in its config) has them undone before the VAE decodes."""

import os

from dit_trainer.vae import DEFAULT_VAE
from dit_trainer.errors import ConfigError, DitError
_VAE_CACHE: dict = {}


def data_manifest(path):
    """The shard manifest of the latents at `path`, or None (pixels, digits, no or unreadable manifest)."""
    if not path or path == "digits" or not os.path.isfile(os.path.join(path, "manifest.json")):
        return None
    try:
        from dit_trainer.data.shards import read_manifest

        return read_manifest(path)
    except (ImportError, DitError):
        return None


def anchor_vae(cfg, folder):
    """`cfg` with a relative data.vae that names a folder inside checkpoint `folder` (the `vae/` a
    converted folder carries) made absolute, so the checkpoint folder can be copied or moved."""
    vae = cfg.data.vae
    if vae and not os.path.isabs(os.path.expanduser(str(vae))):
        inside = os.path.join(os.fspath(folder), str(vae))
        if os.path.isdir(inside):
            cfg.data.vae = os.path.abspath(inside)
    return cfg


def vae_source(cfg, override=None):
    """(VAE id or folder, scaling_factor, shift_factor) that decodes the model's latents, or None for pixels."""
    data = cfg.data
    if data.path == "digits" and not override:
        return None
    manifest = data_manifest(data.path) or {}
    vae = override or data.vae or manifest.get("vae")
    if not vae:
        return None
    # The latents were multiplied by the manifest's factor when extracted; the config's is the fallback.
    if manifest.get("scaling_factor") is not None:
        return str(vae), float(manifest["scaling_factor"]), manifest.get("shift_factor")
    return str(vae), float(data.scaling_factor), None


def load_decoder(cfg, vae=None, device="cpu", dtype="fp32"):
    """(autoencoder or None, scaling_factor, shift_factor) that decode `cfg`'s model samples; the last VAE
    stays cached. Where the model saw latents normalised per channel, factor and shift are per-channel
    tensors that fold z · std + mean into them (`latent_stats.fold`)."""
    source = vae_source(cfg, vae)
    if source is None:
        return None, None, None
    name, scaling_factor, shift_factor = source
    from dit_trainer.vae.latent_stats import fold, stats_of

    stats = stats_of(cfg.data)
    if stats is not None:
        scaling_factor, shift_factor = fold(stats, scaling_factor, shift_factor)
    key = (name, str(device), str(dtype))
    if key not in _VAE_CACHE:
        from dit_trainer.vae.autoencoder import load_vae

        _VAE_CACHE.clear()  # one resident VAE is plenty; the trainer asks for the same one every time
        _VAE_CACHE[key] = load_vae(name, dtype, device)
    return _VAE_CACHE[key], scaling_factor, shift_factor


def decode(samples, vae=None, scaling_factor=None, shift_factor=None):
    """Images in [-1, 1], N×C×H×W float32: VAE-decoded latents, or the samples themselves for pixel models."""
    if vae is None:
        return samples.float().clamp(-1, 1)
    from dit_trainer.vae.autoencoder import decode as vae_decode

    return vae_decode(vae, samples, scaling_factor, shift_factor).float()


def _no_vae_error(channels: int) -> ConfigError:
    return ConfigError(f"the model makes {channels}-channel latents but no VAE is recorded (data.vae or the "
                       f"dataset's manifest.json); pass --vae ID_OR_DIR, e.g. {DEFAULT_VAE}")


def to_images(samples, vae=None, scaling_factor=None, shift_factor=None, strict=True):
    """`decode`, refusing (strict) or previewing the first three channels of latents no VAE is known for."""
    if vae is None and samples.shape[1] not in (1, 3):
        if strict:
            raise _no_vae_error(samples.shape[1])
        samples = samples[:, :3]  # a training-time preview is better than a crash mid-run
    return decode(samples, vae, scaling_factor, shift_factor)
