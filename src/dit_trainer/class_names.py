"""Class names for `dit sample --class-names`: ImageNet-1k's synonym lists, or a dataset's own names.

Each entry is a string of comma-separated synonyms ("tench, Tinca tinca"), index = class id.
"""

import difflib
import functools
import json
import os
import re
from importlib import resources
from typing import Optional, Sequence

from dit_trainer.errors import ConfigError, DitError

# Up to this many classes an unknown name lists them all (a one-line error stays readable);
# beyond it only the closest names are offered.
LIST_ALL_NAMES = 20


@functools.lru_cache(maxsize=1)
def _imagenet() -> tuple:
    text = resources.files("dit_trainer").joinpath("assets", "imagenet_classes.txt").read_text(encoding="utf-8")
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(names) != 1000:
        raise RuntimeError(f"assets/imagenet_classes.txt holds {len(names)} classes, not 1000; reinstall dit-trainer")
    return names


def imagenet_class_names() -> list:
    """The 1000 ImageNet-1k class names, index = class id."""
    return list(_imagenet())


def _norm(name: str) -> str:
    # Users type "Golden_Retriever" or "golden  retriever" as often as the WordNet spelling.
    return re.sub(r"\s+", " ", name.replace("_", " ")).strip().casefold()


def synonyms(entry: str) -> list:
    """The synonyms of one class-name entry, normalised."""
    return [s for s in (_norm(p) for p in entry.split(",")) if s]


def _lookup(name: str, class_names: Sequence[str]) -> int:
    key = _norm(name)
    # Tiers settle names shared by several classes: "maillot" is all of class 638 but only the
    # first synonym of 639, and "crane" (bird and machine) stays ambiguous.
    tiers = (
        [i for i, e in enumerate(class_names) if _norm(e) == key or ", ".join(synonyms(e)) == key],
        [i for i, e in enumerate(class_names) if synonyms(e)[:1] == [key]],
        [i for i, e in enumerate(class_names) if key in synonyms(e)],
    )
    for hits in tiers:
        if len(hits) == 1:
            return hits[0]
        if hits:
            listed = ", ".join(f"{i} ({class_names[i]})" for i in hits[:4])
            raise ConfigError(f"class name {name!r} is ambiguous: {listed}; pass the id with --class-labels")
    if len(class_names) <= LIST_ALL_NAMES:
        listed = ", ".join(f"{e!r} ({i})" for i, e in enumerate(class_names))
        raise ConfigError(f"unknown class name {name!r}; this model's classes are {listed}")
    every = sorted({s for e in class_names for s in synonyms(e)})
    close = difflib.get_close_matches(key, every, n=3, cutoff=0.6)
    hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else "; pass class ids with --class-labels instead"
    raise ConfigError(f"unknown class name {name!r}{hint}")


def resolve_labels(names_or_ids, class_names: Optional[Sequence[str]] = None, num_classes: Optional[int] = None) -> list:
    """Class ids for names (case-insensitive, any synonym) or ids (ints or digit strings)."""
    if class_names is not None and num_classes is None:
        num_classes = len(class_names)
    labels = []
    for item in names_or_ids:
        if isinstance(item, bool):
            raise ConfigError(f"class label {item!r} is not an id or a name")
        if isinstance(item, int) or (isinstance(item, str) and item.strip().isdigit()):
            label = int(item)
            if num_classes is not None and not 0 <= label < num_classes:
                raise ConfigError(f"class id {label} is out of range; this model has classes 0..{num_classes - 1}")
            labels.append(label)
        elif isinstance(item, str):
            if not class_names:
                raise ConfigError(f"cannot look up {item!r}: this model has no class names; pass ids with --class-labels")
            labels.append(_lookup(item, class_names))
        else:
            raise ConfigError(f"class label {item!r} is not an id or a name")
    return labels


def _labels_json_names(path) -> Optional[list]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    names = data.get("class_names") if isinstance(data, dict) else None
    return [str(n) for n in names] if isinstance(names, list) and names else None


def dataset_class_names(cfg, num_classes: Optional[int] = None) -> Optional[list]:
    """The names a run's classes have: its dataset's own, else ImageNet's for 1000 classes, else None.

    Best effort: the training data may live on another machine, so an unreadable source is skipped.
    """
    data = cfg.data
    num_classes = cfg.model.num_classes if num_classes is None else num_classes
    names = getattr(data, "class_names", None)
    path = data.path
    if not names and path == "digits":
        from dit_trainer.data.digits import DIGIT_CLASS_NAMES

        names = list(DIGIT_CLASS_NAMES)
    if not names and path and os.path.isfile(os.path.join(path, "manifest.json")):
        try:
            from dit_trainer.data.shards import read_manifest

            names = read_manifest(path).get("class_names")
        except (ImportError, DitError, OSError):
            names = None
    if not names and path and path != "digits":
        candidates = [data.labels_file] if data.labels_file else [os.path.join(path, "labels.json")]
        for candidate in candidates:
            if candidate and str(candidate).endswith(".json") and os.path.isfile(candidate):
                names = _labels_json_names(candidate)
    if names and len(names) == num_classes:
        return [str(n) for n in names]
    return imagenet_class_names() if num_classes == 1000 else None
