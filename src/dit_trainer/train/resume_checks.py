"""Which checkpoint a run resumes from, and whether it is this run's model at all."""

from pathlib import Path

import yaml

from dit_trainer.errors import ConfigError
from dit_trainer.fs import check_regular

# What decides the weights' shapes: a checkpoint of another model cannot be resumed into this one.
_MODEL_KEYS = ("name", "input_size", "in_channels", "num_classes", "learn_sigma")
# What decides the target the model learns, per objective (learn_sigma is one of the model keys).
_OBJECTIVE_KEYS = {
    "diffusion": ("diffusion.noise_schedule", "diffusion.num_timesteps", "diffusion.predict_xstart"),
    "transport": ("transport.path_type", "transport.prediction"),
}


def resolve_resume_from(cfg) -> Path:
    """The checkpoint folder `checkpoint.resume_from` names: a path, or a step number or a bare
    `step-XXXXXXXX` name of `output_dir`'s checkpoints."""
    from dit_trainer.checkpoint.files import CKPT_RE, checkpoint_root, list_checkpoints

    value = str(cfg.checkpoint.resume_from).strip()
    root = checkpoint_root(cfg.output_dir)
    path = root / f"step-{int(value):08d}" if value.isdigit() else Path(value).expanduser()
    if not path.is_dir() and CKPT_RE.match(value):
        path = root / value  # the name `dit train` prints, without its folder
    if not path.is_dir():
        steps = [str(int(CKPT_RE.match(p.name).group(1))) for p in list_checkpoints(cfg.output_dir)]
        held = f"it holds steps {', '.join(steps)}" if steps else "it holds no checkpoint"
        raise ConfigError(
            f"checkpoint.resume_from {value!r}: {path} is not a checkpoint folder ({root}: {held}); pass one "
            f"of those step numbers or a step-XXXXXXXX folder"
        )
    return path


def check_same_model(cfg, path):
    """A one-line error when checkpoint `path` holds another model than `cfg` builds, one trained with
    another objective (what its output means), or with another seed (its data order); returns the
    checkpoint's config as a dict (None when it has none to read)."""
    saved = Path(path) / "config.yaml"
    try:
        check_regular(saved, ConfigError)
        config = yaml.safe_load(saved.read_text()) or {}
        old = config.get("model") or {}
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        return None  # an incomplete checkpoint is the loader's to judge; this check needs the config
    new = cfg.to_dict()["model"]
    _check_same_objective(cfg, path, config)
    _check_same_seed(cfg, path, config)
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
    return config


def _check_same_seed(cfg, path, saved: dict) -> None:
    """A one-line error when `train.seed` changed since `path`: the seed orders the data, so the rest of
    the epoch would repeat some samples and skip others, unless `checkpoint.allow_new_seed` says so."""
    old = (saved.get("train") or {}).get("seed", 0)
    if old == cfg.train.seed or cfg.checkpoint.allow_new_seed:
        return
    raise ConfigError(
        f"{path} was trained with train.seed {old} but this run sets {cfg.train.seed}; the seed orders the data, so "
        f"set train.seed {old} to continue it, or pass --checkpoint.allow_new_seed true to continue with the new "
        "order from the saved sample on (the rest of this epoch then repeats some samples and skips others)")


def _check_same_objective(cfg, path, saved: dict) -> None:
    """A one-line error when the checkpoint's model learnt another target than `cfg` trains
    (resuming would silently retrain it: the loss jumps); optimizer-like keys may change."""
    new = cfg.to_dict()
    keys = ["objective", *_OBJECTIVE_KEYS.get(cfg.objective, ())]
    for key in keys:
        section, _, name = key.rpartition(".")
        old_value = (saved.get(section) or {}).get(name) if section else saved.get(name, "diffusion")
        new_value = new[section][name] if section else new[name]
        if old_value is None and section:
            continue  # a config written before the key existed
        same = str(old_value).lower() == str(new_value).lower() if isinstance(new_value, str) else old_value == new_value
        if not same:
            raise ConfigError(
                f"{path} was trained with {key} {old_value} but this run sets {new_value}; set {key} {old_value} "
                f"to continue it, or train the new objective in another output_dir (or --checkpoint.resume false "
                f"--checkpoint.on_existing archive)"
            )
