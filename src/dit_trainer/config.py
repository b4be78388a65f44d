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
from dit_trainer.transport.config import TransportConfig
from dit_trainer.typed import closest_key_error, coerce


@dataclass
class ModelConfig:
    """What every model family shares. The family's own fields (`depth`, `hidden_size`, `dim`, ...)
    live in `options`, are written at this section's level in YAML, and are checked against the
    family's config dataclass (`ModelSpec.config_cls`) once the model name is known."""

    name: str = "DiT-S/2"  # registered model name, e.g. DiT-XL/2 (any case)
    input_size: int = 32  # latent (or pixel) side; taken from the data when not set
    in_channels: int = 4  # latent (or pixel) channels; taken from the data when not set
    num_classes: int = 1000  # class labels 0..num_classes-1; taken from the data when not set
    learn_sigma: bool = True  # also predict the variance (the DiT release does)
    class_dropout_prob: float = 0.1  # share of labels dropped for classifier-free guidance, in [0, 1)
    weights_path: Optional[str] = None  # start from weights: our checkpoint dir, an original DiT .pt, or .safetensors
    config_file: Optional[str] = None  # model from a PaddleMIX DiT JSON or our model YAML/JSON; keys set beside it win
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
    num_timesteps: int = 1000  # diffusion steps of training
    noise_schedule: str = "linear"  # linear | cosine | sigmoid
    predict_xstart: bool = False  # predict the clean input instead of the noise
    use_kl: bool = False  # train on the variational bound instead of the noise MSE
    sigma_small: bool = False  # fixed small variance when the model does not learn it
    rescale_learned_sigmas: bool = False  # rescale the variance term of the loss (improved DDPM)
    timestep_sampler: str = "uniform"  # uniform | loss-second-moment


@dataclass
class DataConfig:
    path: Optional[str] = None  # latents (shards from dit extract, .npy folder, fast-DiT features) or "digits"
    labels_file: Optional[str] = None  # labels.json|.npy|.txt of a .npy folder (default: the one beside it)
    unconditional: bool = False  # a .npy folder without labels: train one class
    class_names: Optional[list] = None  # names of the classes, index = label; taken from the data when not set
    random_flip: bool = True  # flip latents horizontally at random
    num_workers: int = 2  # data loading processes
    image_size: int = 256  # pixel size the latents came from (for decoding); taken from shards when not set
    digits_size: int = 16  # side of the upsampled digits when path is "digits"
    vae: Optional[str] = None  # VAE id or folder for decoding (shards record theirs); None for pixels
    scaling_factor: float = 0.18215  # factor the latents were multiplied by (shards record theirs)


@dataclass
class OptimConfig:
    lr: float = 1e-4  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    beta1: float = 0.9  # AdamW beta1, in [0, 1)
    beta2: float = 0.999  # AdamW beta2, in [0, 1)
    eps: float = 1e-8  # AdamW epsilon
    warmup_steps: int = 0  # linear learning-rate warmup steps
    max_grad_norm: float = 0.0  # clip the gradient norm to this; 0 disables clipping


@dataclass
class TrainConfig:
    max_steps: int = 1000  # optimizer steps to train for
    global_batch_size: int = 256  # samples per optimizer step over all processes
    grad_accum_steps: int = 1  # split each process's batch into this many micro-batches
    seed: int = 0  # seed of the data order, noise and initial weights
    mixed_precision: str = "bf16"  # bf16 | fp16 | fp32; bf16 falls back to fp32 where unsupported
    ema_decay: float = 0.9999  # EMA weight decay per step, in [0, 1]; lower it for short runs
    ema_warmup: bool = False  # decay min(ema_decay, (1+step)/(10+step)): short runs get a useful EMA
    activation_checkpointing: str = "none"  # none | full | selective
    compile: str = "auto"  # auto | true | false: torch.compile each block; auto: for runs that repay the ~1 min compile
    activation_memory_budget: float = 0.8  # compiled blocks without AC keep this fraction of the activations inductor would keep, recomputing the cheapest rest; 1 keeps all
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    keep_freed_memory: bool = True  # on CPU with glibc: freed blocks stay in the heap for the next step instead of being unmapped and page-faulted back each step
    skip_nonfinite_steps: bool = False  # a NaN/inf loss or grad norm skips the update instead of stopping
    host_sync: str = "auto"  # step | log | auto: read loss and checks every step, or only at log steps (no device wait per step); auto: log on a GPU


@dataclass
class CheckpointConfig:
    save_steps: int = 1000  # save a checkpoint every this many steps (and at the end)
    save_total_limit: int = 3  # keep the newest this many checkpoints; 0 keeps all
    resume: bool = True  # resume from the newest usable checkpoint in output_dir
    resume_from: Optional[str] = None  # resume from this checkpoint folder or step number instead of the newest
    sharded: bool = False  # torch.distributed.checkpoint instead of full safetensors
    on_existing: str = "refuse"  # resume false over an earlier run: refuse | archive (move aside) | overwrite


@dataclass
class LoggingConfig:
    log_steps: int = 10  # log the loss every this many steps
    image_steps: int = 0  # draw a sample grid every this many steps; 0 disables
    tensorboard: bool = True  # also write TensorBoard events (scalars and sample grids)
    progress: bool = True  # show a progress bar
    sample_steps: int = 50  # DDIM steps for the training-time grid
    sample_cfg_scale: float = 4.0  # guidance scale of the training-time grid, >= 1
    samples_per_class: int = 1  # grid samples per class
    sample_classes: Optional[list] = None  # grid classes; None: up to 10 spread over the label range
    mfu: bool = False  # log model FLOPs utilisation (measures the peak at start unless peak_tflops is set)
    peak_tflops: float = 0.0  # peak TFLOP/s of one device for MFU (e.g. 989 for an H100 in bf16); 0 measures it
    wandb: bool = False  # also log to Weights & Biases (pip install wandb; WANDB_MODE=offline works offline)
    wandb_project: str = "dit-trainer"  # Weights & Biases project name


@dataclass
class ParallelConfig:
    layout: str = "manual"  # manual | auto: auto takes dit plan's fastest layout that fits the launched world size (degrees, schedule, micro-batches, AC, compile) and writes it into the run's config.yaml
    dp_replicate: int = 1  # data-parallel replicas (DDP, or HSDP's replicate groups)
    dp_shard: int = -1  # FSDP shard degree; -1: whatever the other degrees leave of the world size
    tp: int = 1  # tensor-parallel degree
    pp: int = 1  # pipeline-parallel degree
    pp_schedule: str = "gpipe"  # gpipe | 1f1b | interleaved1f1b
    pp_microbatches: int = 4  # micro-batches per pipeline step
    reshard_after_forward: bool = True  # FSDP frees gathered weights after forward (less memory, more traffic)
    backend: str = "auto"  # auto | nccl | gloo; auto: nccl on GPU, gloo on CPU


@dataclass
class Config:
    output_dir: str = "outputs/run"  # where checkpoints, metrics and samples go
    objective: str = "auto"  # auto | diffusion | transport: what the model learns and how it samples; auto: what the model's releases used (transport for SiT, else diffusion)
    backend: str = "torch"  # torch | mindspore (the `mindspore` extra; DiT with the diffusion objective)
    model: ModelConfig = field(default_factory=ModelConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
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


def _unknown(key: str, obj, prefix: str) -> ConfigError:
    # Close matches come from every key (a key typed into the wrong section is found), a key of
    # the same section winning a tie; section names count as top-level keys (`trian:` is train).
    # Without a match, only the keys of the section the user was in are listed.
    listed = [prefix + f.name for f in dataclasses.fields(obj) if f.name != "options"]
    keys = [k for k in _all_keys() if k != "model.options"] + list(SECTIONS)
    return closest_key_error(key, keys, listed, section=key.rpartition(".")[0])


def _set_keys(cfg: Config) -> set:
    return cfg.__dict__.setdefault("_explicit", set())


def user_keys(cfg: Config) -> set:
    """The dotted keys set by a YAML file, a dict or the command line (not those taken from the data)."""
    return set(_set_keys(cfg))


def explicit_keys(cfg: Config) -> set:
    """The dotted keys the user set: by the YAML, a dict or the command line, or (for a Config built
    in code) to a value other than the default. Model shape keys not set are taken from the data."""
    default = Config()
    changed = {k for k in _all_keys() if _get(cfg, k) != _get(default, k)}
    return _set_keys(cfg) | changed | {f"model.{k}" for k in cfg.model.options}


def _get(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


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
                _set_keys(cfg).update(f"model.{k}" for k in value)
            else:
                obj.options[part] = value
                _set_keys(cfg).add(key)
            return
        if part not in fields:
            raise _unknown(key, obj, ".".join(parts[:i]) + "." if i else "")
        f = fields[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(f.type):
                if not isinstance(value, dict):
                    raise ConfigError(f"config key {key!r} is a section; give it a mapping")
                for sub, v in value.items():
                    set_key(cfg, f"{key}.{sub}", v)
            else:
                setattr(obj, part, coerce(value, f.type, key))
                _set_keys(cfg).add(key)
            return
        if not dataclasses.is_dataclass(f.type):
            raise _unknown(key, obj, ".".join(parts[:i]) + "." if i else "")
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
    """Check every value (ranges, names) and type the model family's options; returns `cfg`.

    Each impossible value is a one-line ConfigError naming the key, the value and what is allowed.
    """
    from dit_trainer.config_checks import check_values
    from dit_trainer.models.spec import family_options

    _apply_model_file(cfg)
    _resolve_objective(cfg)
    check_values(cfg)
    elsewhere = [k for k in _all_keys() if not k.startswith("model.")]
    cfg.model.options = family_options(cfg.model.name, cfg.model.options, cfg.model, elsewhere)
    return cfg


def _resolve_objective(cfg: Config) -> None:
    """`objective: auto` becomes the model's own, so the run's config.yaml names what it trained."""
    from dit_trainer.models.spec import objective_fits, release_objective

    # A value an earlier validate() chose for `auto` follows a model name set after it (the
    # command line's --model.name comes after the file), unless the user has set it since.
    chosen = cfg.__dict__.get("_objective_from_auto")
    if cfg.objective == "auto" or (cfg.objective == chosen and "objective" not in _set_keys(cfg)):
        cfg.objective = cfg.__dict__["_objective_from_auto"] = release_objective(cfg.model.name)
    objective_fits(cfg.model.name, cfg.objective, cfg.model.learn_sigma)


def _apply_model_file(cfg: Config) -> None:
    # The file's keys count as set (the data does not override a JSON's sample_size), but a key the
    # user set beside `config_file` wins. The path is cleared once read, so the run's config.yaml is
    # self-contained and a later `--model.config_file` (applied after the YAML) replaces the first.
    path = cfg.model.config_file
    if not path:
        return
    from dit_trainer.model_file import load_model_file

    values = load_model_file(path)
    user = _set_keys(cfg) - cfg.__dict__.get("_from_model_file", set()) - {"model.config_file"}
    applied = set()
    for key, value in values.items():
        if f"model.{key}" not in user:
            set_key(cfg, f"model.{key}", value)
            applied.add(f"model.{key}")
    cfg.__dict__["_from_model_file"] = applied
    cfg.model.config_file = None


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
    """Read a YAML or JSON file (if given) and apply command-line overrides on top.

    A PaddleMIX DiT JSON (`num_layers`, `num_attention_heads`, ...) is read as the model section.
    """
    data = {}
    if path is not None:
        data = _read_file(path)
    cfg = config_from_dict(data)
    for key, value in parse_overrides(list(overrides or [])):
        set_key(cfg, key, yaml.safe_load(value) if _is_yaml_scalar(value) else value)
    return validate(cfg)


def _read_file(path) -> dict:
    # model_file is torch-free, but imported here so that `import dit_trainer.config` stays light.
    from dit_trainer.model_file import EXPECTED, is_paddlemix_config, model_section, read_mapping

    data = read_mapping(path)
    known = set(SECTIONS) | {f.name for f in dataclasses.fields(Config)} | set(RFC_KEYS)
    if is_paddlemix_config(data):  # first: its in_channels is also one of the RFC's flat keys
        return {"model": model_section(data, path)}
    if not data or known & set(data):
        return data  # our layout (unknown keys among known ones get the closest-key error)
    if "name" in data:
        return {"model": model_section(data, path)}  # a bare model section
    if str(path).lower().endswith(".json"):
        raise ConfigError(f"config file {path} holds {', '.join(list(map(str, data))[:6])}; expected {EXPECTED}")
    return data  # a YAML typo such as `modle:` gets the closest-key error


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
