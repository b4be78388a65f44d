"""A trained model and its config from a checkpoint folder, a run folder or a released weights file."""

from dit_trainer.errors import ConfigError
from dit_trainer.config.model_file import is_model_file, load_model_file
from dit_trainer.sample.decode import DEFAULT_VAE


def load_model(ckpt, model_name=None, image_size=None, num_classes=1000, weights="ema"):
    """(eval-mode model, Config) from a checkpoint dir with config.yaml, a run dir, or an original DiT file.

    `ckpt` is a path or a `checkpoint.open` reader; `weights` "ema" (what sampling uses) or "model"
    (the training weights, from a sharded checkpoint's dcp/ too). `model_name` is a registered name or
    a model config file (PaddleMIX DiT JSON, our YAML)."""
    from dit_trainer import checkpoint
    from dit_trainer.checkpoint import load_into
    from dit_trainer.config import build_config
    from dit_trainer.sample.decode import anchor_vae
    from dit_trainer.models import get_spec
    from dit_trainer.repa.attach import drop_projector

    reader = checkpoint.open(ckpt, flag="--ckpt")
    path = reader.path
    from_file = bool(model_name) and is_model_file(model_name)
    if reader.folder is not None:
        cfg = anchor_vae(reader.config(), path)
        if from_file:
            _check_same(cfg, model_name, path)
        elif model_name and get_spec(model_name).name != get_spec(cfg.model.name).name:
            raise ConfigError(f"--model {model_name} conflicts with {path}/config.yaml ({cfg.model.name}); drop --model")
    elif from_file:
        cfg = _from_model_file(model_name, image_size)
    else:
        if not model_name:
            raise ConfigError(f"--ckpt {path} is a weights file: pass --model (e.g. DiT-XL/2) and --image-size too")
        size = int(image_size or 256)
        if size % 8:
            raise ConfigError(f"--image-size {size} is not a multiple of 8 (the VAE's downsampling factor)")
        try:
            cfg = build_config({"model": {"name": model_name, "input_size": size // 8, "num_classes": int(num_classes)},
                                    "data": {"image_size": size, "vae": DEFAULT_VAE}})
        except ConfigError as err:
            raise ConfigError(f"--model {model_name} --image-size {size}: {err}") from None
    spec = get_spec(cfg.model.name)
    # Sampling needs the denoiser only: a REPA run's projector is neither built nor loaded.
    cfg.repa.enabled = False
    model = spec.build_model_fn(cfg)
    load_into(model, drop_projector(spec.from_released(reader.weights(weights))), path)
    return model.eval(), cfg


def _from_model_file(model_file, image_size=None):
    """Config of a weights file whose model a PaddleMIX JSON / our YAML describes (its classes and size)."""
    from dit_trainer.config import build_config

    cfg = build_config({"model": load_model_file(model_file)})
    latent = cfg.model.in_channels == 4  # SD's VAE latents; 1 or 3 channels are pixels
    size = int(image_size or cfg.model.input_size * (8 if latent else 1))
    if latent and size != cfg.model.input_size * 8:
        raise ConfigError(f"--image-size {size} does not fit {model_file} (sample_size {cfg.model.input_size} latents "
                          f"are {cfg.model.input_size * 8} px); drop --image-size")
    cfg.data.image_size, cfg.data.vae = size, DEFAULT_VAE if latent else None
    return cfg


def _check_same(cfg, model_file, path) -> None:
    """A model file given with a checkpoint folder must describe the model its config.yaml records."""
    from dit_trainer.config import build_config

    model = build_config({"model": load_model_file(model_file)}).model
    want, have = model_dict_of(model), model_dict_of(cfg.model)
    keys = ["name", "input_size", "in_channels", "num_classes", "learn_sigma", *model.options]
    differ = [k for k in keys if str(want.get(k)).lower() != str(have.get(k)).lower()]
    if differ:
        raise ConfigError(f"--model {model_file} ({', '.join(f'{k} {want.get(k)}' for k in differ)}) conflicts with "
                          f"{path}/config.yaml ({', '.join(f'{k} {have.get(k)}' for k in differ)}); drop --model")


def model_dict_of(model) -> dict:
    """A ModelConfig's shared fields and family options as one dict."""
    import dataclasses

    return {**{f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "options"}, **model.options}
