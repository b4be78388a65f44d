"""Typed values from YAML and the command line: the coercion every config dataclass shares.

Kept out of `config/` so that model families can declare their own config dataclasses
(validated the same way) without importing the whole config.
"""

import dataclasses
import difflib
import types
import typing
from typing import Any, Optional, Union

import yaml

from dit_trainer.errors import ConfigError, one_line


def coerce(value: Any, tp, key: str):
    """Convert a YAML or command-line value to the field's declared type."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return coerce(value, args[0], key)
    if tp is Any:
        return value
    if origin is list or tp is list:
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError as err:
                raise ConfigError(f"config key {key!r}: {value!r} is not a YAML list, {yaml_problem(err)}; "
                                  "write it like [1, 2]") from None
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split()]
            value = [yaml.safe_load(v) if isinstance(v, str) else v for v in value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r} needs a list, got {value!r}")
        return list(value)
    if (origin is dict or tp is dict) and isinstance(value, str):
        # A mapping on the command line is written as YAML: --repa.encoder_overrides '{embed_dim: 16}'.
        try:
            value = yaml.safe_load(value) if value.strip() else {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config key {key!r}: {value!r} is not a YAML mapping, {yaml_problem(err)}; "
                              "write it like '{a: 1, b: 2}'") from None
        return {} if value is None else value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"config key {key!r} needs true or false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"config key {key!r} needs a number, got {value!r}")
        if tp is int and isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value)  # exact: float() would round a 20-digit seed to another number
        try:
            num = float(value) if isinstance(value, str) else value
            if tp is int:
                if isinstance(num, int):
                    return num
                # A float past 2**53 (1e30, inf from 1e400) names no integer exactly: refused, not rounded.
                if not abs(float(num)) <= 2**53 or float(num) != int(float(num)):
                    raise ValueError
                return int(float(num))
            return float(num)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"config key {key!r} needs {tp.__name__}, got {value!r}"
                              + ("; write a whole number in digits" if tp is int else "")) from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"config key {key!r} needs a string, got {value!r}")
        return str(value)
    return value



def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML parse error as one line with where it is: `line 2, column 1: expected ',' or ']', but got
    '<stream end>' (while parsing a flow sequence from line 1, column 8)` (1-based, as editors count)."""
    def at(mark):
        return f"line {mark.line + 1}, column {mark.column + 1}"

    problem_mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if problem is None:
        return one_line(err)
    text = f"{at(problem_mark)}: {problem}" if problem_mark is not None else problem
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context:
        text += f" ({context}" + (f" from {at(context_mark)})" if context_mark is not None else ")")
    return text


# Names users bring from other code bases (PaddleMIX, LLaMA, the other model family) for a key of ours.
SYNONYMS = {
    "learning_rate": "lr",
    "batch_size": "global_batch_size",  # not eval.sample_batch_size, as close in spelling
    "n_layers": "depth",
    "num_layers": "depth",
    "depth": "n_layers",
    "num_heads": "n_heads",
    "n_heads": "num_heads",
    "hidden_size": "dim",
    "dim": "hidden_size",
}


def closest_name(name: str, names) -> Optional[str]:
    """The one of `names` that `name` most likely means: a synonym (`learning_rate` -> `lr`), else
    the closest spelling; None when nothing is close."""
    names = list(names)
    for known in difflib.get_close_matches(name, list(SYNONYMS), n=3, cutoff=0.8):
        if SYNONYMS[known] in names:
            return SYNONYMS[known]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return close[0] if close else None


def closest_key(key: str, candidates, section: Optional[str] = None) -> Optional[str]:
    """The dotted candidate whose field name is closest to `key`'s, one in `section` where several
    share that name (sections are not compared: `optim.zzzz` shares `optim.` with every optim key)."""
    by_leaf = {}
    for c in candidates:
        by_leaf.setdefault(c.rpartition(".")[2], []).append(c)
    leaf = closest_name(key.rpartition(".")[2], by_leaf)
    if leaf is None:
        return None
    return min(by_leaf[leaf], key=lambda c: c.rpartition(".")[0] != section)


def closest_key_error(key: str, candidates, listed=None, section: Optional[str] = None) -> ConfigError:
    """An unknown-key error naming the closest valid key (one in `section` winning a tie), or listing
    `listed` (default: the candidates).

    Pass the keys of the key's own section as `listed`: a list of every key of every section is
    too long to read on one line.
    """
    candidates = list(candidates)
    close = closest_key(key, candidates, section)
    listed = candidates if listed is None else list(listed)
    hint = f"; did you mean {close!r}?" if close else f"; valid keys: {', '.join(listed)}"
    return ConfigError(f"unknown config key {key!r}{hint}")


def build_dataclass(cls, values: dict, prefix: str = ""):
    """`cls(**values)` with each value coerced to its field's type; unknown keys name the closest one."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise closest_key_error(prefix + key, [prefix + n for n in fields])
        kwargs[key] = coerce(value, fields[key].type, prefix + key)
    return cls(**kwargs)
