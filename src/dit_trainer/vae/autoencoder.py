"""The frozen autoencoder that maps images to latents and back: diffusers' `AutoencoderKL` (the SD
VAEs, SDXL's, VA-VAE-style f16c32) or `AutoencoderDC` (deterministic, f32c32), picked by the
`_class_name` of its config.json.

diffusers is an optional extra (`pip install dit-trainer[vae]`), imported only here and only when
a VAE is needed, so training on stored latents works without it. Latents are stored already
multiplied by the VAE config's `scaling_factor` (0.18215 for the SD VAEs), and shifted by its
`shift_factor` when it has one; VAEs whose scale is not calibrated that way get per-channel
statistics on top (see latent_stats.py).
"""

import importlib.util
import json
import os
import warnings
from typing import Optional, Tuple, Union

import torch

from dit_trainer.errors import DataError, one_line
from dit_trainer.pretrained_lock import PRETRAINED_LOCK
from dit_trainer.vae import geometry

# Seconds the one reachability check of the Hub may take before an uncached id is reported as unavailable.
HUB_PROBE_TIMEOUT_S = 5

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    """torch dtype for 'fp32'/'bf16' (or a torch dtype); fp16 is refused because the SD VAEs overflow in it."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise DataError(f"VAE dtype {dtype} is not supported; use fp32 or bf16 (fp16 overflows in the SD VAEs)")
        return dtype
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise DataError(f"VAE dtype {dtype!r} is not supported; use fp32 or bf16") from None


def looks_like_path(name: str) -> bool:
    """Whether a VAE name is meant as a folder rather than a Hub id (`org/name`)."""
    # Anything else with a separator or a leading ./ ~ is meant as a folder.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or name.endswith("/")


# The diffusers classes `load_vae` loads; their encoders give a posterior (KL) or a latent (DC).
CLASSES = ("AutoencoderKL", "AutoencoderDC")


def _autoencoder_class():
    try:
        from diffusers import AutoencoderKL
    except ImportError:
        raise DataError("loading a VAE needs diffusers; pip install dit-trainer[vae]") from None
    return AutoencoderKL


def _class_named(class_name: Optional[str], where: str):
    """The diffusers class a config's `_class_name` names (AutoencoderKL when it names none)."""
    if class_name in (None, "AutoencoderKL"):
        return _autoencoder_class()
    if class_name not in CLASSES:
        raise DataError(f"{where} holds a {class_name}, not an {' or '.join(CLASSES)}; pass one of those")
    import diffusers

    found = getattr(diffusers, class_name, None)
    if found is None:
        raise DataError(f"{where} holds a {class_name}, which this diffusers {diffusers.__version__} lacks; "
                        f"upgrade diffusers")
    return found


def _config_class(config_file: str) -> Optional[str]:
    """`_class_name` of a diffusers config.json, or None when it has none or cannot be read."""
    try:
        with open(config_file, encoding="utf-8") as f:
            name = json.load(f).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def _cached_class(name: str) -> Optional[str]:
    """`_class_name` of Hub id `name`'s config.json when the local cache holds it (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001 - an odd id or cache: fall back to AutoencoderKL
        return None
    return _config_class(path) if isinstance(path, str) else None


def _quiet_from_pretrained(AutoencoderKL, name: str, **kwargs):
    # diffusers passes the deprecated local_dir_use_symlinks to huggingface_hub, which warns on every load;
    # every VAE load comes here, under the one lock that keeps loads apart (see pretrained_lock).
    with warnings.catch_warnings(), PRETRAINED_LOCK:
        warnings.filterwarnings("ignore", message=".*local_dir_use_symlinks.*")
        return AutoencoderKL.from_pretrained(name, **kwargs)


def _hub_unreachable(name: str) -> Optional[str]:
    """Why config.json of Hub repo `name` cannot be fetched right now, or None when it can."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    # One HEAD request without retries: offline, the default download retries 5 times for ~30 s.
    try:
        get_hf_file_metadata(hf_hub_url(name, "config.json"), timeout=HUB_PROBE_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 - any failure here means the download cannot work
        return one_line(err)
    return None


def _downloaded_class(cls, name: str):
    """The class Hub id `name`'s config.json names, fetched with `cls`'s loader (the Hub answered)."""
    load_config = getattr(cls, "load_config", None)
    if load_config is None:
        return cls
    try:
        config = load_config(name)
    except (OSError, ValueError):
        return cls  # from_pretrained then reports what went wrong
    return _class_named(config.get("_class_name") if isinstance(config, dict) else None, name)


def _load_hub_vae(AutoencoderKL, name: str, kwargs: dict):
    """The VAE of Hub id `name`: from the local cache, else downloaded if the Hub answers at once."""
    try:
        return _quiet_from_pretrained(AutoencoderKL, name, local_files_only=True, **kwargs)
    except (OSError, ValueError):
        pass
    from huggingface_hub.constants import HF_HUB_CACHE

    reason = _hub_unreachable(name)
    if reason is not None:
        raise DataError(
            f"VAE {name!r} is not in the Hugging Face cache ({HF_HUB_CACHE}) and cannot be downloaded ({reason}); "
            f"pass a local folder saved with save_pretrained (--vae DIR; on a connected machine: "
            f"huggingface-cli download {name} --local-dir DIR, then copy DIR here), or set HF_HOME to a cache that holds it"
        )
    try:
        return _quiet_from_pretrained(_downloaded_class(AutoencoderKL, name), name, **kwargs)
    except (OSError, ValueError) as err:
        raise DataError(f"cannot download VAE {name!r} ({one_line(err)}); pass a local folder saved with "
                        f"save_pretrained (--vae DIR)") from None


def load_vae(id_or_dir, dtype: Union[str, torch.dtype] = "fp32", device: Union[str, torch.device] = "cpu"):
    """A frozen, eval-mode AutoencoderKL or AutoencoderDC from a Hub id or a save_pretrained folder."""
    dtype = resolve_dtype(dtype)
    name = os.fspath(id_or_dir)
    # Without accelerate, diffusers warns and falls back to this anyway.
    kwargs = {"torch_dtype": dtype, "low_cpu_mem_usage": importlib.util.find_spec("accelerate") is not None}
    if os.path.isdir(os.path.expanduser(name)):
        folder = os.path.expanduser(name)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            # A whole diffusion pipeline folder keeps its VAE in vae/.
            if os.path.isfile(os.path.join(folder, "vae", "config.json")):
                kwargs["subfolder"] = "vae"
            else:
                raise DataError(f"{folder} has no config.json; pass a folder written by AutoencoderKL.save_pretrained")
        config = os.path.join(folder, kwargs.get("subfolder", ""), "config.json")
        AutoencoderKL = _class_named(_config_class(config), config)
        try:
            vae = _quiet_from_pretrained(AutoencoderKL, folder, **kwargs)
        except (OSError, ValueError) as err:
            raise DataError(f"cannot load the VAE in {folder} ({one_line(err)}); re-save it with save_pretrained") from None
    elif looks_like_path(name):
        raise DataError(f"VAE folder {name} does not exist; pass an existing folder or a Hub id "
                        f"like stabilityai/sd-vae-ft-mse")
    else:
        vae = _load_hub_vae(_class_named(_cached_class(name), name), name, kwargs)
    if type(vae).__name__ not in CLASSES:
        raise DataError(f"{name} holds a {type(vae).__name__}, not an {' or '.join(CLASSES)}; pass one of those")
    vae.requires_grad_(False)
    return vae.eval().to(device)


def scaling(vae, scaling_factor=None, shift_factor=None) -> Tuple:
    """(scaling_factor, shift_factor): the given ones, else the VAE config's (0.18215 and 0 for SD VAEs);
    floats, or per-channel tensors kept as given (`latent_stats.fold`)."""
    if scaling_factor is None:
        scaling_factor = getattr(vae.config, "scaling_factor", None) or 0.18215
    if shift_factor is None:
        shift_factor = getattr(vae.config, "shift_factor", None) or 0.0
    return tuple(v if isinstance(v, torch.Tensor) else float(v) for v in (scaling_factor, shift_factor))


def _channels(value, z):
    """A per-channel tensor shaped to broadcast over N×C×H×W `z`; a float as it is."""
    return value.to(z.device, z.dtype).view(1, -1, 1, 1) if isinstance(value, torch.Tensor) else value


def has_posterior(vae) -> bool:
    """Whether the VAE's encoder gives a distribution (KL) rather than one latent (DC)."""
    return geometry.has_posterior(vae.config)


def downsampling(vae) -> int:
    """Pixels per latent side: 2^(levels - 1) of the encoder's blocks (8 for the SD VAEs, 32 for DC-AE f32)."""
    return geometry.downsampling(vae.config)


def latent_shape(vae, image_size: int) -> Tuple[int, int, int]:
    """C×H×W of the latents the VAE makes from image_size² images; DataError if the size does not divide."""
    factor = downsampling(vae)
    if image_size % factor:
        raise DataError(f"--image-size {image_size} is not a multiple of the VAE's downsampling factor {factor}")
    side = image_size // factor
    return int(vae.config.latent_channels), side, side


@torch.no_grad()
def encode(vae, images: torch.Tensor, scaling_factor: Optional[float] = None, shift_factor: Optional[float] = None):
    """(mean, std) float32 of the scaled posterior for images in [-1, 1], N×3×H×W."""
    sf, shift = scaling(vae, scaling_factor, shift_factor)
    x = images.to(device=vae.device, dtype=vae.dtype)
    if not has_posterior(vae):
        # A deterministic encoder: its latent is the mean, with nothing around it.
        mean = (vae.encode(x).latent.float() - shift) * sf
        return mean, torch.zeros_like(mean)
    posterior = vae.encode(x).latent_dist
    mean = (posterior.mean.float() - shift) * sf
    std = posterior.std.float() * sf
    return mean, std


@torch.no_grad()
def decode(vae, latents: torch.Tensor, scaling_factor: Optional[float] = None, shift_factor: Optional[float] = None):
    """Images in [-1, 1] (float32, clamped) from scaled latents N×C×H×W."""
    sf, shift = scaling(vae, scaling_factor, shift_factor)
    z = latents.to(device=vae.device, dtype=torch.float32)
    z = z / _channels(sf, z) + _channels(shift, z)
    images = vae.decode(z.to(vae.dtype)).sample
    return images.float().clamp_(-1, 1)
