"""Which checkpoint a run resumes from, and whether it is this run's model at all."""

from pathlib import Path

import yaml

from dit_trainer.errors import ConfigError

# What decides the weights' shapes: a checkpoint of another model cannot be resumed into this one.
_MODEL_KEYS = ("name", "input_size", "in_channels", "num_classes", "learn_sigma")


def resolve_resume_from(cfg) -> Path:
    """The checkpoint folder `checkpoint.resume_from` names: a path, or a step number of `output_dir`."""
    from dit_trainer.checkpoint.files import checkpoint_root

    value = str(cfg.checkpoint.resume_from).strip()
    path = checkpoint_root(cfg.output_dir) / f"step-{int(value):08d}" if value.isdigit() else Path(value).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"checkpoint.resume_from {value!r}: {path} is not a checkpoint folder; pass a step-XXXXXXXX folder "
            f"or the step number of a checkpoint in {checkpoint_root(cfg.output_dir)}"
        )
    return path


def check_same_model(cfg, path) -> None:
    """A one-line error when checkpoint `path` holds another model than `cfg` builds."""
    saved = Path(path) / "config.yaml"
    try:
        old = (yaml.safe_load(saved.read_text()) or {}).get("model") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return  # an incomplete checkpoint is the loader's to judge; this check needs the config
    new = cfg.to_dict()["model"]
    keys = [*_MODEL_KEYS, *sorted(set(old) & set(new) - set(_MODEL_KEYS) - {"class_dropout_prob", "weights_path"})]
    norm = lambda k, v: str(v).lower() if k == "name" else v  # noqa: E731 (model names are case-insensitive)
    differ = [k for k in keys if k in old and norm(k, old.get(k)) != norm(k, new.get(k))]
    if differ:
        was = ", ".join(f"{k} {old.get(k)}" for k in differ)
        now = ", ".join(f"{k} {new.get(k)}" for k in differ)
        raise ConfigError(
            f"{path} holds another model ({was}) than this run builds ({now}); pass another output_dir, or "
            f"--checkpoint.resume false --checkpoint.on_existing archive to start over"
        )
