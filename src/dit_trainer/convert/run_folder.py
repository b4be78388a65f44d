"""`ours`: a run folder or checkpoint folder of this project (EMA weights + config.yaml).

Written as a checkpoint folder that `dit sample --ckpt OUT` and `DiTPipeline.from_pretrained(OUT)`
read: `config.yaml`, `ema.safetensors`, the VAE under `vae/` when the source carried one, a text
model's text encoder under `text_encoder/` and `tokenizer/`, and `labels.json` with the class names
when they are not ImageNet's.
"""

import json
import shutil
from pathlib import Path

import yaml

from dit_trainer.convert.model_bundle import Bundle
from dit_trainer.convert.model_config import CONVENTION_KEYS, RELEASE_CONVENTION, check_fits
from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.fs import check_regular
from dit_trainer.vae.geometry import SD_FACTOR, downsampling
from dit_trainer.config.model_file import is_model_file, load_model_file


def read_config(path) -> tuple:
    """(Config, convention dict) from a config.yaml; the convention keys are read beside the Config,
    which does not know them yet."""
    from dit_trainer.config import build_config

    file = Path(path)
    check_regular(file, ConfigError, "a run's config")
    if not file.is_file():
        raise ConfigError(f"{file} does not exist; a converted folder needs its config.yaml")
    data = yaml.safe_load(file.read_text()) or {}
    model = dict(data.get("model") or {})
    convention = {k: model.pop(k) for k in CONVENTION_KEYS if k in model}
    return build_config({**data, "model": model}), convention


def model_dict(cfg, convention=None) -> dict:
    """Our model-config dict from a Config's model section."""
    fields = cfg.to_dict()["model"]  # family options (depth, ...) flattened beside the shared fields
    keep = {k: v for k, v in fields.items() if v is not None and k != "weights_path"}
    merged = {**keep, **(convention or {})}
    # The release's convention is the default and stays implicit, whether or not Config knows the keys.
    return {k: v for k, v in merged.items() if not (k in RELEASE_CONVENTION and v == RELEASE_CONVENTION[k])}


def read(src, model=None, vae=None) -> Bundle:
    """A Bundle from our run or checkpoint folder (EMA weights)."""
    from dit_trainer.class_names import dataset_class_names
    from dit_trainer.data.loader import caption_tokens
    from dit_trainer.sample import vae_source
    from dit_trainer import checkpoint
    from dit_trainer.sample.decode import anchor_vae
    from dit_trainer.sample.prompts import text_encoder_name
    from dit_trainer.vae.latent_stats import stats_of
    from dit_trainer.repa.attach import drop_projector

    if not Path(src).is_dir():
        raise CheckpointError(f"{src} is not a folder; --from ours takes a run folder or a checkpoint folder")
    reader = checkpoint.open(src, flag="--from ours")
    path = reader.folder
    cfg, convention = read_config(reader.config_file)
    anchor_vae(cfg, path)
    from_file = model and is_model_file(model)
    if model and not from_file and model.lower() != cfg.model.name.lower():
        raise ConfigError(f"--model {model} conflicts with {path}/config.yaml ({cfg.model.name}); drop --model")
    # Exports carry the denoiser only: a REPA run's projector stays behind.
    sd = drop_projector(reader.weights("ema"))
    if from_file:  # the run records its model; a model file given too must describe these tensors
        check_fits(sd, load_model_file(model), model)
    mcfg = model_dict(cfg, convention)
    check_fits(sd, mcfg, path)
    names = _labels(path) or dataset_class_names(cfg)
    source = vae_source(cfg, vae)
    vae_id, scaling, shift = source if source else (None, None, None)
    # `dit extract` records shift_factor 0.0 for VAEs without one; only a real shift cannot be exported.
    if shift is not None and float(shift) != 0.0:
        raise ConfigError(f"{path}: the latents carry a shift factor ({shift}), which diffusers' DiTPipeline cannot undo")
    diffusion = {"num_timesteps": cfg.diffusion.num_timesteps, "noise_schedule": cfg.diffusion.noise_schedule,
                 "predict_xstart": cfg.diffusion.predict_xstart}
    transport = cfg.to_dict()["transport"] if cfg.objective == "transport" else None
    stats = stats_of(cfg.data) if vae_id else None
    return Bundle(state_dict=sd, model=mcfg, vae=vae_id, scaling_factor=scaling, class_names=names,
                  latent_mean=stats and stats[0], latent_std=stats and stats[1],
                  diffusion=diffusion, transport=transport, text_encoder=text_encoder_name(cfg, folder=path),
                  text_max_length=caption_tokens(cfg), source=str(path))


def _labels(path):
    file = Path(path) / "labels.json"
    if file.is_file():
        names = json.loads(file.read_text()).get("class_names")
        return [str(n) for n in names] if names else None
    return None


def write(bundle: Bundle, out, final=None) -> Path:
    """Write `bundle` as our checkpoint folder at `out` (to be renamed `final`, where paths point); returns it."""
    from safetensors.torch import save_file

    from dit_trainer.class_names import imagenet_class_names
    from dit_trainer.config import Config, config_yaml, set_key

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = Config()
    plain = {k: v for k, v in bundle.model.items() if k not in CONVENTION_KEYS}
    for key, value in plain.items():
        set_key(cfg, f"model.{key}", value)
    cfg.diffusion.num_timesteps = int(bundle.diffusion.get("num_timesteps", 1000))
    cfg.diffusion.noise_schedule = bundle.diffusion.get("noise_schedule", "linear")
    cfg.diffusion.predict_xstart = bool(bundle.diffusion.get("predict_xstart", False))
    if bundle.transport is not None:
        cfg.objective = "transport"
        for key, value in bundle.transport.items():
            setattr(cfg.transport, key, value)
    cfg.model.weights_path = None
    cfg.data.path = None
    if bundle.vae:
        cfg.data.vae = _copy_vae(bundle.vae, out / "vae")
        cfg.data.scaling_factor = float(bundle.scaling_factor or 0.18215)
        cfg.data.image_size = int(bundle.model["input_size"]) * _downsampling(out / "vae")
        if bundle.latent_mean is not None:
            cfg.data.latent_mean, cfg.data.latent_std = list(bundle.latent_mean), list(bundle.latent_std)
    else:
        cfg.data.vae, cfg.data.image_size = None, int(bundle.model["input_size"])
    if bundle.text_encoder:
        cfg.data.text_encoder = _copy_text_encoder(bundle.text_encoder, out)
        cfg.data.text_max_length = int(bundle.text_max_length or 0)
    names = bundle.class_names
    if names and not (len(names) == 1000 and list(names) == imagenet_class_names()):
        (out / "labels.json").write_text(json.dumps({"class_names": list(names)}, indent=1))
        cfg.data.labels_file = str((Path(final or out) / "labels.json").resolve())
    data = yaml.safe_load(config_yaml(cfg))
    data["model"].update({k: v for k, v in bundle.model.items() if k in CONVENTION_KEYS})
    (out / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    state = {k: v.detach().contiguous().clone() for k, v in bundle.state_dict.items()}
    save_file(state, str(out / "ema.safetensors"))
    return out


def _downsampling(vae_dir: Path) -> int:
    """Pixels per latent side of a copied VAE folder's config (8, the SD VAEs', for a Hub id)."""
    file = vae_dir / "config.json"
    return (downsampling(json.loads(file.read_text())) if file.is_file() else None) or SD_FACTOR


def _copy_text_encoder(name, out: Path) -> str:
    """A local text encoder is copied (hard-linked where it can be) into `out`'s text_encoder/ and tokenizer/
    and recorded relative to the folder, as the VAE is; a Hub id is recorded as it is."""
    from dit_trainer.text_encoders import copy_text_encoder

    if not Path(name).expanduser().is_dir():
        return str(name)
    copy_text_encoder(str(Path(name).expanduser()), out)
    return "text_encoder"


def _copy_vae(vae, dest: Path) -> str:
    """A local diffusers VAE folder is copied next to the weights and recorded relative to them (the
    folder stays valid when copied or moved); a hub id is recorded as it is."""
    src = Path(vae)
    if not src.is_dir():
        return str(vae)
    if src.resolve() != dest.resolve():
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest)
    return dest.name
