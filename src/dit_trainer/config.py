"""One typed config for every command: dataclass sections, YAML files, `--section.field value`.

Field names follow what PaddleMIX/DiT users already type (`model.name`, `data.path`,
`train.max_steps`, `train.global_batch_size`, `optim.lr`, `checkpoint.save_steps`, ...).
"""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from dit_trainer.errors import ConfigError
from dit_trainer.typed import closest_key_error, coerce


@dataclass
class ModelConfig:
    """What every model family shares. The family's own fields (`depth`, `hidden_size`, `dim`, ...)
    live in `options`, are written at this section's level in YAML, and are checked against the
    family's config dataclass (`ModelSpec.config_cls`) once the model name is known."""

    name: str = "DiT-S/2"
    input_size: int = 32  # latent (or pixel) side
    in_channels: int = 4
    num_classes: int = 1000
    learn_sigma: bool = True
    class_dropout_prob: float = 0.1
    weights_path: Optional[str] = None  # our checkpoint dir, an original DiT .pt, or .safetensors
    options: dict = field(default_factory=dict)

    # `cfg.model.depth` reads and writes the family option, as if it were a field.
    def __getattr__(self, name):
        options = self.__dict__.get("options")
        if options is not None and not name.startswith("_") and name in options:
            return options[name]
        raise AttributeError(f"model config has no field {name!r}")

    def __setattr__(self, name, value):
        if name in _MODEL_FIELDS or name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self.options[name] = value


@dataclass
class DiffusionConfig:
    num_timesteps: int = 1000
    noise_schedule: str = "linear"  # linear | cosine | sigmoid
    predict_xstart: bool = False
    use_kl: bool = False
    sigma_small: bool = False
    rescale_learned_sigmas: bool = False
    timestep_sampler: str = "uniform"  # uniform | loss-second-moment


@dataclass
class DataConfig:
    path: Optional[str] = None  # latents (.npy folder, fast-DiT features, shards) or "digits"
    labels_file: Optional[str] = None
    random_flip: bool = True
    num_workers: int = 2
    image_size: int = 256  # pixel size the latents came from (for decoding)
    digits_size: int = 16  # side of the upsampled digits when path == "digits"
    vae: Optional[str] = None  # VAE id or folder for decoding; None when training on pixels
    scaling_factor: float = 0.18215


@dataclass
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0
    max_grad_norm: float = 0.0  # 0 disables clipping


@dataclass
class TrainConfig:
    max_steps: int = 1000
    global_batch_size: int = 256
    grad_accum_steps: int = 1
    seed: int = 0
    mixed_precision: str = "bf16"  # bf16 | fp16 | fp32; bf16 falls back to fp32 where unsupported
    ema_decay: float = 0.9999
    ema_warmup: bool = False  # decay min(ema_decay, (1+step)/(10+step)): short runs get a useful EMA
    activation_checkpointing: str = "none"  # none | full | selective
    compile: bool = False
    device: str = "auto"  # auto | cpu | cuda


@dataclass
class CheckpointConfig:
    save_steps: int = 1000
    save_total_limit: int = 3
    resume: bool = True  # resume from the newest checkpoint in output_dir
    sharded: bool = False  # torch.distributed.checkpoint instead of full safetensors


@dataclass
class LoggingConfig:
    log_steps: int = 10
    image_steps: int = 0  # 0 disables sample grids during training
    tensorboard: bool = True
    progress: bool = True
    sample_steps: int = 50  # DDIM steps for the training-time grid
    sample_cfg_scale: float = 4.0
    samples_per_class: int = 1
    sample_classes: Optional[list] = None  # None: up to 10 classes spread over the label range


@dataclass
class ParallelConfig:
    dp_replicate: int = 1
    dp_shard: int = -1  # -1: whatever the other degrees leave of the world size
    tp: int = 1
    pp: int = 1
    pp_schedule: str = "gpipe"  # gpipe | 1f1b | interleaved1f1b
    pp_microbatches: int = 4
    reshard_after_forward: bool = True
    backend: str = "auto"  # auto: nccl on GPU, gloo on CPU


@dataclass
class Config:
    output_dir: str = "outputs/run"
    objective: str = "diffusion"  # diffusion | transport: what the model learns and how it samples
    backend: str = "torch"  # torch | mindspore (the `mindspore` extra; DiT with the diffusion objective)
    model: ModelConfig = field(default_factory=ModelConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def to_dict(self) -> dict:
        """A plain nested dict (what `config.yaml` holds); family options sit in the model section."""
        d = dataclasses.asdict(self)
        d["model"].update(d["model"].pop("options"))
        return d


_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}
SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.type))


# The RFC's flat dict: {"model_name": "DiT-S/2", "weights_path": None, "lr": 1e-4, ...}
RFC_KEYS = {
    "model_name": "model.name",
    "weights_path": "model.weights_path",
    "lr": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "num_timesteps": "diffusion.num_timesteps",
    "num_classes": "model.num_classes",
    "input_size": "model.input_size",
    "in_channels": "model.in_channels",
    "learn_sigma": "model.learn_sigma",
    "batch_size": "train.global_batch_size",
    "seed": "train.seed",
    "max_steps": "train.max_steps",
    "ema_decay": "train.ema_decay",
    "mixed_precision": "train.mixed_precision",
    "data_path": "data.path",
    "output_dir": "output_dir",
}


def _all_keys(cls=Config, prefix="") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type):
            keys += _all_keys(f.type, prefix + f.name + ".")
        else:
            keys.append(prefix + f.name)
    return keys


_unknown = closest_key_error


def set_key(cfg: Config, key: str, value: Any) -> None:
    """Set a dotted key (`optim.lr`) with type conversion; unknown keys name the closest valid one."""
    parts = key.split(".")
    obj = cfg
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(obj)}
        if isinstance(obj, ModelConfig) and i == len(parts) - 1 and (part not in fields or part == "options"):
            # A family option: checked against the family's config once the name is known.
            if part == "options":
                if not isinstance(value, dict):
                    raise ConfigError("config key 'model.options' needs a mapping")
                obj.options.update(value)
            else:
                obj.options[part] = value
            return
        if part not in fields:
            raise _unknown(key, _all_keys())
        f = fields[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(f.type):
                if not isinstance(value, dict):
                    raise ConfigError(f"config key {key!r} is a section; give it a mapping")
                for sub, v in value.items():
                    set_key(cfg, f"{key}.{sub}", v)
            else:
                setattr(obj, part, coerce(value, f.type, key))
            return
        if not dataclasses.is_dataclass(f.type):
            raise _unknown(key, _all_keys())
        obj = getattr(obj, part)


def _flatten(d: dict, prefix="") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and prefix + str(k) in SECTIONS:
            out.update(_flatten(v, prefix + str(k) + "."))
        else:
            out[prefix + str(k)] = v
    return out


def config_from_dict(d: Optional[dict]) -> Config:
    """A Config from a nested dict (YAML layout) or the RFC's flat dict."""
    cfg = Config()
    for key, value in _flatten(d or {}).items():
        set_key(cfg, RFC_KEYS.get(key, key), value)
    return validate(cfg)


def validate(cfg: Config) -> Config:
    """Check and type the model family's options against its config dataclass; returns `cfg`."""
    from dit_trainer.models.spec import family_options

    cfg.model.options = family_options(cfg.model.name, cfg.model.options)
    return cfg


def parse_overrides(args: list[str]) -> list[tuple[str, str]]:
    """`--section.field value` and `--section.field=value` pairs from a command line."""
    pairs, i = [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; overrides look like --section.field value")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
            i += 2
        else:
            raise ConfigError(f"override {arg!r} has no value; write {arg} VALUE")
        pairs.append((key.replace("-", "_"), value))
    return pairs


def load_config(path: Optional[str] = None, overrides: Optional[list] = None) -> Config:
    """Read a YAML file (if given) and apply command-line overrides on top."""
    data = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {path} does not exist; pass a YAML file such as configs/demo_digits.yaml")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {str(err).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections")
    cfg = config_from_dict(data)
    for key, value in parse_overrides(list(overrides or [])):
        set_key(cfg, key, yaml.safe_load(value) if _is_yaml_scalar(value) else value)
    return validate(cfg)


def _is_yaml_scalar(value: str) -> bool:
    # Keep strings like "DiT-S/2" or "1e-4" as typed; YAML would read "1e-4" as a string anyway,
    # and coerce() converts it per field.
    return value.lower() in ("true", "false", "null", "none")


def config_yaml(cfg: Config) -> str:
    """The config as the YAML text that `load_config` reads back."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def save_config(cfg: Config, path) -> None:
    """Write the config as YAML."""
    Path(path).write_text(config_yaml(cfg))


def as_config(config) -> Config:
    """Accept a Config, a nested/flat dict, or a YAML path."""
    if isinstance(config, Config):
        return config
    if isinstance(config, (str, Path)):
        return load_config(config)
    if isinstance(config, dict):
        return config_from_dict(config)
    raise ConfigError(f"cannot read a config from {type(config).__name__}; pass a Config, dict or YAML path")
