"""From what the user wrote to a checked `Config`: YAML/JSON files, dicts, `--section.field value`.

Building a config is one pass: the user's settings are typed key by key (an unknown key names the
closest valid one), a model file (`model.config_file`) fills the model keys they left out, every
value is checked, the data (when a caller passes `fill`) fills the shapes the user left out,
`objective: auto` becomes the model's own objective, and the family's options are typed and
checked. What the user set is known only during that pass; the result holds no trace of it.
"""

import copy
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from dit_trainer.config.schema import MOVED_KEYS, RETIRED_KEYS, RFC_KEYS, SECTIONS, Config, ModelConfig, all_keys
from dit_trainer.typed import closest_key_error, coerce
from dit_trainer.errors import ConfigError


def _unknown(key: str, obj, prefix: str) -> ConfigError:
    # Close matches come from every key (a key typed into the wrong section is found), a key of
    # the same section winning a tie; section names count as top-level keys (`trian:` is train).
    # Without a match, only the keys of the section the user was in are listed.
    import dataclasses

    listed = [prefix + f.name for f in dataclasses.fields(obj) if f.name != "options"]
    keys = [k for k in all_keys() if k != "model.options"] + list(SECTIONS)
    return closest_key_error(key, keys, listed, section=key.rpartition(".")[0])


def set_key(cfg: Config, key: str, value: Any) -> set:
    """Set a dotted key (`optim.lr`) with type conversion; returns the dotted keys it set.

    A section key takes a mapping; a model key that is not a shared field is a family option,
    typed once the model name is known; an unknown key names the closest valid one.
    """
    import dataclasses

    if key in RETIRED_KEYS:
        return set()  # an older run's config.yaml still resumes
    if key in MOVED_KEYS:
        if value is None:
            return set()
        raise ConfigError(f"{key} was a band of normalised times; it is now {MOVED_KEYS[key]}, a band of noise levels "
                          f"sigma (sigma_lo < sigma <= sigma_hi); drop {key} and set {MOVED_KEYS[key]}")
    parts = key.split(".")
    obj = cfg
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(obj)}
        last = i == len(parts) - 1
        if isinstance(obj, ModelConfig) and last and (part not in fields or part == "options"):
            if part != "options":
                obj.options[part] = value
                return {key}
            if not isinstance(value, dict):
                raise ConfigError("config key 'model.options' needs a mapping")
            obj.options.update(value)
            return {f"model.{k}" for k in value}
        if part not in fields:
            raise _unknown(key, obj, ".".join(parts[:i]) + "." if i else "")
        f = fields[part]
        if last:
            if not dataclasses.is_dataclass(f.type):
                setattr(obj, part, coerce(value, f.type, key))
                return {key}
            if not isinstance(value, dict):
                raise ConfigError(f"config key {key!r} is a section; give it a mapping")
            done = set()
            for sub, v in value.items():
                done |= set_key(cfg, f"{key}.{sub}", v)
            return done
        if not dataclasses.is_dataclass(f.type):
            raise _unknown(key, obj, ".".join(parts[:i]) + "." if i else "")
        obj = getattr(obj, part)
    return set()


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested sections to dotted keys (`{"optim": {"lr": 1}}` -> `{"optim.lr": 1}`), the RFC's flat
    names (`model_name`) to ours; the model section's keys stay one level deep."""
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict) and prefix + str(k) in SECTIONS:
            out.update(flatten(v, prefix + str(k) + "."))
        else:
            key = prefix + str(k)
            out[RFC_KEYS.get(key, key)] = v
    return out


def _changed(cfg: Config) -> set:
    """The dotted keys of `cfg` that differ from the defaults, its family options included."""
    default = Config()
    keys = {key for key in all_keys() if key != "model.options" and _get(cfg, key) != _get(default, key)}
    return keys | {f"model.{k}" for k in cfg.model.options}


def _settings_of(config) -> dict:
    """What the user set, as dotted keys: a nested or flat dict, or a YAML/JSON file's keys."""
    if isinstance(config, (str, Path)):
        return read_settings(config)
    if isinstance(config, dict):
        return flatten(config)
    if config is None:
        return {}
    raise ConfigError(f"cannot read a config from {type(config).__name__}; pass a Config, dict or YAML path")


def given_keys(cfg: Config) -> set:
    """The dotted keys of a built Config that differ from the defaults (what the planner keeps as set)."""
    return _changed(cfg)


def _get(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


Fill = Callable[[Config, frozenset], None]


def build_config(source=None, overrides=None, shapes: Optional[Fill] = None,
                 runtime: Optional[Callable[[Config], None]] = None) -> Config:
    """The one way to a checked, resolved Config: from a YAML/JSON path, a nested or flat dict, or a Config.

    `overrides` (`--section.field value` words, or a dict of dotted keys) apply after `source`.
    `shapes(cfg, given)` (e.g. `data.loader.DataShapes`) runs after the values are checked and
    before the model is: it may set the keys not in `given` (the data's shapes) and raise on a
    conflict with those that are. `runtime(cfg)` (e.g. `train.choices.RuntimeChoices`) then decides
    the `auto` keys that depend on the machine (the layout, compile), and the values are checked
    again. `objective: auto` becomes the model's own here; nothing changes the result afterwards.
    """
    from dit_trainer.config.checks import check_model, check_values

    if isinstance(source, Config):
        # Taken as it is, not rebuilt; its keys that differ from the defaults count as set (the data fills the rest).
        cfg, given, settings = copy.deepcopy(source), _changed(source), {}
    else:
        cfg, given, settings = Config(), set(), _settings_of(source)
    if isinstance(overrides, dict):
        settings.update(flatten(overrides))
    elif overrides:
        settings = _with_overrides(settings, overrides)
    for key, value in settings.items():
        given |= set_key(cfg, key, value)
    given |= _apply_model_file(cfg, given)
    check_values(cfg)
    if shapes is not None:
        shapes(cfg, frozenset(given))
    check_model(cfg)
    if runtime is not None:
        runtime(cfg)
        check_values(cfg)
    return cfg


def _apply_model_file(cfg: Config, given: set) -> set:
    # The file's keys count as set (the data does not override a JSON's sample_size), but a key the
    # user set beside `config_file` wins. The path is cleared once read, so the run's config.yaml
    # is self-contained.
    path = cfg.model.config_file
    if not path:
        return set()
    from dit_trainer.config.model_file import load_model_file

    applied = set()
    for key, value in load_model_file(path).items():
        if f"model.{key}" not in given:
            applied |= set_key(cfg, f"model.{key}", value)
    cfg.model.config_file = None
    return applied


def parse_overrides(args: list) -> list:
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


def read_settings(path=None, overrides=None) -> dict:
    """The dotted settings of a YAML/JSON file (if given) with command-line overrides applied after it."""
    return _with_overrides(flatten(_read_file(path)) if path is not None else {}, overrides)


def _with_overrides(settings: dict, overrides) -> dict:
    settings = dict(settings)
    for key, value in parse_overrides(list(overrides or [])):
        key = RFC_KEYS.get(key, key)
        settings.pop(key, None)  # a later value moves to the end: the command line's order is kept
        # Keep strings like "DiT-S/2" or "1e-4" as typed; coerce() converts them per field.
        settings[key] = yaml.safe_load(value) if value.lower() in ("true", "false", "null", "none") else value
    return settings


def _read_file(path) -> dict:
    from dit_trainer.config.model_file import EXPECTED, is_paddlemix_config, model_section, read_mapping

    data = read_mapping(path)
    known = set(SECTIONS) | {"output_dir", "objective", "backend"} | set(RFC_KEYS)
    if is_paddlemix_config(data):  # first: its in_channels is also one of the RFC's flat keys
        return {"model": model_section(data, path)}
    if not data or known & set(data):
        return data  # our layout (unknown keys among known ones get the closest-key error)
    if "name" in data:
        return {"model": model_section(data, path)}  # a bare model section
    if str(path).lower().endswith(".json"):
        raise ConfigError(f"config file {path} holds {', '.join(list(map(str, data))[:6])}; expected {EXPECTED}")
    return data  # a YAML typo such as `modle:` gets the closest-key error


def backend_of(config) -> str:
    """The `backend` a Config, dict or YAML path names (torch when unset), read without building it:
    the engine that builds and checks the rest."""
    from dit_trainer.config.checks import ENGINES

    backend = str(config.backend if isinstance(config, Config) else _settings_of(config).get("backend", "torch"))
    if backend not in ENGINES:
        raise ConfigError(f"backend {backend!r} is not one of {', '.join(ENGINES)}")
    return backend


def config_yaml(cfg: Config) -> str:
    """The config as the YAML text that `build_config` reads back."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def save_config(cfg: Config, path) -> None:
    """Write the config as YAML."""
    Path(path).write_text(config_yaml(cfg))


__all__ = ["backend_of", "build_config", "config_yaml", "flatten", "given_keys", "parse_overrides", "read_settings",
           "save_config", "set_key"]
