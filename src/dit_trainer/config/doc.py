"""Every config key with its type, default and meaning, read from the config dataclasses.

The meaning is the comment after each field (`lr: float = 1e-4  # AdamW learning rate`), so the
reference that `dit train --help` prints and `docs/config.md` holds cannot drift from the code.
Regenerate the doc with `python -m dit_trainer.config.doc docs/config.md`.
"""

import dataclasses
import inspect
import io
import sys
import tokenize
import types
import typing
from typing import NamedTuple, Union


class FieldDoc(NamedTuple):
    key: str  # dotted key, e.g. optim.lr
    type: str  # int, float, str, bool, list, each possibly "or null"
    default: object
    help: str


def field_comments(cls) -> dict:
    """{field name: its trailing comment} of a dataclass, from its source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # no source (a frozen install): types and defaults still list
        return {}
    comments, line_name = {}, {}
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        # A field line starts `NAME :` at the class body's indent.
        if tok.type == tokenize.NAME and i + 1 < len(tokens) and tokens[i + 1].string == ":" and tok.start[1] == 4:
            line_name.setdefault(tok.start[0], tok.string)
        if tok.type == tokenize.COMMENT and tok.start[0] in line_name:
            comments[line_name[tok.start[0]]] = tok.string.lstrip("#").strip()
    return comments


def type_name(tp) -> str:
    """A field type as a user reads it: int, float, str, bool, list; 'or null' when optional."""
    if isinstance(tp, str):
        return tp
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{type_name(args[0])} or null"
    if origin is list or tp is list:
        return "list"
    if origin is dict or tp is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def dataclass_docs(cls, prefix: str = "", skip=("options",)) -> list:
    """FieldDoc for each field of `cls` (sections recursed into), in declaration order."""
    comments = field_comments(cls)
    hints = typing.get_type_hints(cls)
    docs = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(tp):
            docs += dataclass_docs(tp, prefix + f.name + ".")
        else:
            docs.append(FieldDoc(prefix + f.name, type_name(tp), _default(f), comments.get(f.name, "")))
    return docs


def config_docs() -> list:
    """FieldDoc of every key of `Config` (torch-free)."""
    from dit_trainer.config import Config

    return dataclass_docs(Config)


def family_docs() -> list:
    """(family, [FieldDoc]) for each model family's own options, written under `model:` (imports the models)."""
    from dit_trainer.models.spec import registered_specs

    registry = registered_specs()
    seen, out = set(), []
    for spec in registry.values():
        if spec.config_cls is None or spec.config_cls in seen:
            continue
        seen.add(spec.config_cls)
        names = [n for n, s in registry.items() if s.config_cls is spec.config_cls]
        out.append((f"{spec.family} ({names[0]} ... {names[-1]})", dataclass_docs(spec.config_cls, "model.")))
    return out


def section_of(key: str) -> str:
    """The YAML section a dotted key belongs to ('' for top-level keys)."""
    return key.split(".")[0] if "." in key else ""


def show(value) -> str:
    """A default as YAML would spell it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def markdown() -> str:
    """docs/config.md: every key by section, then each model family's options."""
    lines = [
        "# Config reference",
        "",
        "Generated from the config dataclasses by `python -m dit_trainer.config.doc docs/config.md`;",
        "a test checks that this file matches them. Set a key in the YAML file (`optim:` then `lr: 2e-4`)",
        "or on the command line (`dit train --config X.yaml --optim.lr 2e-4`). `dit train --print-config`",
        "prints the merged result.",
        "",
    ]

    def table(docs):
        rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
        for d in docs:
            rows.append(f"| `{d.key}` | {d.type} | `{show(d.default)}` | {d.help.replace('|', '&#124;')} |")
        return rows

    docs = config_docs()
    for section in dict.fromkeys(section_of(d.key) for d in docs):
        lines += [f"## {section or 'top level'}", ""] + table([d for d in docs if section_of(d.key) == section]) + [""]
    for family, fdocs in family_docs():
        lines += [f"## model options of the {family} family", "",
                  "Written in the `model:` section beside the shared keys.", ""] + table(fdocs) + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    text = markdown()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
