"""Which per-channel statistics a run normalises its latents with, decided once when the config is
built (`DataShapes`) and kept in the run's config.yaml, so sampling and export read them from there."""

from dit_trainer.errors import ConfigError, DataError
from dit_trainer.vae.latent_stats import check_stats


def fill_latent_stats(cfg, given: frozenset, dataset, source: str) -> None:
    """Set data.latent_mean/std from the shards' manifest where the data calls for them, or refuse in one
    line latents of a named VAE other than the 4-channel SD ones that no statistics were measured for."""
    data = cfg.data
    shape = getattr(dataset, "latent_shape", None)
    if shape is None or data.path == "digits":
        return  # pixels: no VAE, nothing to normalise
    channels = int(shape[0])
    manifest = getattr(dataset, "manifest", None) or {}
    norm = data.latent_norm
    if norm == "scale":
        return
    vae = manifest.get("vae") or data.vae
    if norm == "auto" and "data.latent_mean" not in given:
        recorded = manifest.get("latent_norm")
        # The SD VAEs' calibrated scaling_factor, or latents of no known VAE: used as stored.
        if recorded == "scale" or (recorded is None and (channels == 4 or not vae)):
            return
    if "data.latent_mean" not in given and manifest.get("latent_mean") is not None:
        data.latent_mean, data.latent_std = list(manifest["latent_mean"]), list(manifest.get("latent_std") or [])
        check_stats(data.latent_mean, data.latent_std, channels, source, DataError)
        return
    if data.latent_mean is None:
        why = "data.latent_norm channel needs them" if norm == "channel" else \
            "the latents of VAEs other than the 4-channel SD ones need them to train well"
        raise DataError(f"{source} holds {channels}-channel latents{f' of {vae}' if vae else ''} but no per-channel "
                        f"statistics ({why}); re-run `dit extract` on the images (it records them in manifest.json), "
                        f"or set data.latent_mean and data.latent_std ({channels} numbers each)")
    if len(data.latent_mean) != channels:
        raise ConfigError(f"data.latent_mean lists {len(data.latent_mean)} numbers but {source} holds {channels}-channel "
                          f"latents; give one mean and one std per channel")


def refuse_channel_norm(cfg, engine: str) -> None:
    """A one-line ConfigError where `engine` (which feeds latents as stored) would get per-channel statistics to
    apply: set in the config, or recorded by `dit extract` in data.path's manifest.json."""
    import json
    import os

    from dit_trainer.vae.latent_stats import stats_of

    data, recorded = cfg.data, None
    file = os.path.join(str(data.path), "manifest.json")
    if data.latent_norm != "scale" and os.path.isfile(file):
        try:
            with open(file, encoding="utf-8") as f:
                recorded = json.load(f).get("latent_norm")
        except (OSError, ValueError, AttributeError):
            recorded = None
    if stats_of(data) is not None or recorded == "channel":
        raise ConfigError(f"{engine} trains on latents as stored, but {file if recorded == 'channel' else 'data.latent_mean/std'} "
                          f"asks for per-channel normalisation; use backend torch, or data.latent_norm scale")
