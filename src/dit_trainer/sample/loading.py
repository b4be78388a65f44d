"""A trained model and its config from a checkpoint folder, a run folder or a released weights file."""

from pathlib import Path

from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.sample.decode import DEFAULT_VAE


def load_model(ckpt, model_name=None, image_size=None, num_classes=1000, prefer_ema=True):
    """(eval-mode model, Config) from a checkpoint dir with config.yaml, a run dir, or an original DiT file."""
    from dit_trainer.checkpoint import latest_checkpoint, load_into, load_weights
    from dit_trainer.config import Config, load_config, validate
    from dit_trainer.models import get_spec

    path = Path(ckpt)
    if not path.exists():
        raise CheckpointError(f"--ckpt {ckpt} does not exist; pass a checkpoint directory or a DiT .pt/.safetensors file")
    weights = ("ema.safetensors", "model.safetensors")
    if path.is_dir() and not any((path / name).is_file() for name in weights):
        latest = latest_checkpoint(path)  # a run's output_dir: take its newest checkpoint
        if latest is None:
            raise CheckpointError(f"{ckpt} has no config.yaml; pass a checkpoint directory like OUTPUT_DIR/checkpoints/step-00001000")
        path = latest
    if path.is_dir():
        cfg = load_config(str(path / "config.yaml"))
        if model_name and get_spec(model_name).name != get_spec(cfg.model.name).name:
            raise ConfigError(f"--model {model_name} conflicts with {path}/config.yaml ({cfg.model.name}); drop --model")
    else:
        if not model_name:
            raise ConfigError(f"--ckpt {ckpt} is a weights file: pass --model (e.g. DiT-XL/2) and --image-size too")
        size = int(image_size or 256)
        if size % 8:
            raise ConfigError(f"--image-size {size} is not a multiple of 8 (the VAE's downsampling factor)")
        cfg = Config()
        cfg.model.name, cfg.model.input_size, cfg.model.num_classes = model_name, size // 8, int(num_classes)
        cfg.data.image_size, cfg.data.vae = size, DEFAULT_VAE
        try:
            validate(cfg)
        except ConfigError as err:
            raise ConfigError(f"--model {model_name} --image-size {size}: {err}") from None
    spec = get_spec(cfg.model.name)
    model = spec.build_model_fn(cfg)
    load_into(model, spec.from_released(load_weights(path, prefer_ema=prefer_ema)), path)
    return model.eval(), cfg
