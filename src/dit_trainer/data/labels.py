"""Class labels for folders of per-image latents.

A labels file sits beside the latents and takes one of these forms:

- ``labels.json``: ``{"stem": label, ...}``, or ``{"labels": {"stem": label, ...},
  "class_names": ["cat", ...]}`` when the classes have names (the form to prefer: it is keyed by
  file name, so it survives files being added or removed, and it can carry the class names);
- ``labels.npy``: an integer array aligned with the latent files in their sorted order;
- ``labels.txt``: one ``stem label`` per line; blank lines and lines starting with ``#`` skipped.
"""

import json
import os
from typing import Optional, Sequence

import numpy as np

from dit_trainer.data.indexing import NPY_ERRORS
from dit_trainer.errors import DataError, one_line
from dit_trainer.fs import check_regular
from dit_trainer.npy import read_array

LABEL_FILE_NAMES = ("labels.json", "labels.npy", "labels.txt")


def find_labels_file(folder: str) -> Optional[str]:
    """The one labels file in `folder`, or None when there is none."""
    found = [os.path.join(folder, n) for n in LABEL_FILE_NAMES if os.path.isfile(os.path.join(folder, n))]
    if len(found) > 1:
        # Two files may disagree; guessing which one wins would silently mislabel the data.
        raise DataError(f"{found[0]} and {found[1]} both exist; keep one labels file or pass labels_file")
    return found[0] if found else None


def _as_label(value, where: str) -> int:
    # Some tools write labels as floats (3.0); accept those, but never 2.5, booleans or strings.
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DataError(f"{where}: label {value!r} is not an integer; write integer class ids")
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise DataError(f"{where}: label {value!r} is not an integer; write integer class ids")
    if not -(2**62) < value < 2**62:
        # Far outside any class range, and past what an int64 label array holds.
        raise DataError(f"{where}: label {value!r} is not a class id; write labels in 0..num_classes-1")
    return int(value)


def read_labels_file(path: str, stems: Sequence[str]):
    """Labels for latent files named `stems` (in their sorted order) and class names or None."""
    ext = os.path.splitext(path)[1].lower()
    check_regular(path, DataError, "a labels file")
    if not os.path.isfile(path):
        raise DataError(f"{path} does not exist; pass an existing labels file or none")
    try:
        if ext == ".npy":
            return _read_npy(path, stems), None
        if ext == ".json":
            return _read_json(path, stems)
        if ext == ".txt":
            return _read_txt(path, stems), None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {path} ({err}); check it is readable") from None
    raise DataError(f"{path}: unknown labels format; use labels.json, labels.npy or labels.txt")


def _read_npy(path: str, stems: Sequence[str]) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            arr = read_array(f)
    except NPY_ERRORS as err:
        raise DataError(f"{path} is not a valid .npy file ({one_line(err)}); re-save it with numpy.save") from None
    if arr.size != len(stems) or arr.ndim > 2:
        raise DataError(
            f"{path} holds {arr.size} labels (shape {arr.shape}) but the folder has {len(stems)} latent "
            f"files; save one label per file, in sorted file order"
        )
    if arr.dtype.kind not in "iuf":
        raise DataError(f"{path} holds {arr.dtype} values; save an integer array")
    return np.array([_as_label(v, path) for v in arr.reshape(-1).tolist()], dtype=np.int64)


def _read_json(path: str, stems: Sequence[str]):
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as err:
            raise DataError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}); fix it") from None
    class_names = None
    if isinstance(data, dict) and isinstance(data.get("labels"), dict):
        class_names = data.get("class_names")
        if class_names is not None and (
            not isinstance(class_names, list) or not all(isinstance(n, str) for n in class_names)
        ):
            raise DataError(f"{path}: class_names must be a list of strings")
        data = data["labels"]
    if not isinstance(data, dict):
        raise DataError(f'{path} must map file stem to label: {{"img0": 3, ...}}')
    labels = np.empty(len(stems), dtype=np.int64)
    for i, stem in enumerate(stems):
        if stem not in data:
            raise DataError(f"{path} has no label for {stem}.npy; add it or remove that file")
        labels[i] = _as_label(data[stem], f"{path} ({stem})")
    return labels, class_names


def _read_txt(path: str, stems: Sequence[str]) -> np.ndarray:
    table = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            where = f"{path} line {lineno}"
            if len(parts) != 2:
                raise DataError(f"{where}: expected 'stem label', got {line!r}")
            try:
                value = int(parts[1])
            except ValueError:
                raise DataError(f"{where}: label {parts[1]!r} is not an integer; write integer class ids") from None
            if parts[0] in table:
                raise DataError(f"{where}: {parts[0]} is labelled twice; keep one line per file")
            table[parts[0]] = value
    labels = np.empty(len(stems), dtype=np.int64)
    for i, stem in enumerate(stems):
        if stem not in table:
            raise DataError(f"{path} has no label for {stem}.npy; add a line '{stem} LABEL' or remove that file")
        labels[i] = table[stem]
    return labels


def check_label_range(labels: np.ndarray, num_classes: int, names: Sequence[str]) -> None:
    """Raise DataError naming the first file whose label is negative or >= num_classes."""
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise DataError(
            f"{names[i]}: label {int(labels[i])} is outside 0..{num_classes - 1}; "
            f"fix the label or raise num_classes"
        )
