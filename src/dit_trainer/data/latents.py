"""Datasets of precomputed latents stored one `.npy` file per image.

Items are ``(x, y)``: ``x`` a float32 C×H×W tensor, ``y`` an int64 scalar tensor.

Random flips are a pure function of ``(seed, epoch, index)``: the flip of item ``i`` in epoch ``e``
is ``np.random.default_rng([seed, e, i]).random() < 0.5``. That makes a resumed run see exactly the
flips it would have seen, whatever the number of DataLoader workers. ``set_epoch`` must be called
before the epoch's DataLoader iterator is created; with ``persistent_workers=True`` the workers keep
their own copy of the dataset and would not see the new epoch.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from dit_trainer.errors import ConfigError, DataError, one_line
from dit_trainer.fs import check_regular
from dit_trainer.data.indexing import NPY_ERRORS, check_epoch, check_index, flip_for  # noqa: F401 (flip_for is public here)
from dit_trainer.npy import NpyError, check_data_length, read_array, read_header
from dit_trainer.data.labels import check_label_range, find_labels_file, read_labels_file

FASTDIT_FEATURES = "imagenet256_features"
FASTDIT_LABELS = "imagenet256_labels"

# Below this many files a thread pool costs more than it saves; above it, header reads on a
# network file system are latency-bound and overlap well.
_PARALLEL_SCAN_MIN = 512


def read_npy_header(path: str) -> Tuple[Tuple[int, ...], np.dtype]:
    """Shape and dtype of a `.npy` file from its header; DataError if unreadable or truncated."""
    check_regular(path, DataError, "a latent file")
    try:
        with open(path, "rb") as f:
            shape, _, dtype = read_header(f)
            data_start = f.tell()
            size = os.fstat(f.fileno()).st_size
    except OSError as err:
        raise DataError(f"cannot read {path} ({err.strerror or err}); check it exists and is readable") from None
    except NPY_ERRORS as err:
        raise DataError(f"{path} is not a valid .npy file ({one_line(err)}); re-save it with numpy.save") from None
    if dtype.hasobject or dtype.kind != "f":
        raise DataError(f"{path} holds {dtype} values; latents must be float16/32/64 arrays")
    try:
        check_data_length(shape, dtype, size - data_start)
    except NpyError as err:
        raise DataError(f"{path} does not match its .npy header ({err}); re-extract it or delete it") from None
    return tuple(int(s) for s in shape), dtype


def _latent_shape(path: str, shape: Tuple[int, ...]) -> Tuple[int, int, int]:
    if len(shape) == 4 and shape[0] == 1:
        return shape[1:]
    if len(shape) == 3:
        return shape
    raise DataError(f"{path} has shape {shape}; save one latent per file as C×H×W or 1×C×H×W")


def _scan_shapes(paths: Sequence[str]) -> Tuple[int, int, int]:
    """The common C×H×W of `paths`, reading headers only; DataError names the first odd file."""
    if len(paths) >= _PARALLEL_SCAN_MIN:
        with ThreadPoolExecutor(max_workers=min(32, 4 * (os.cpu_count() or 1))) as pool:
            headers = list(pool.map(read_npy_header, paths))
    else:
        headers = [read_npy_header(p) for p in paths]
    first = _latent_shape(paths[0], headers[0][0])
    for path, (shape, _) in zip(paths, headers):
        got = _latent_shape(path, shape)
        if got != first:
            raise DataError(
                f"{path} has shape {got} but {os.path.basename(paths[0])} has {first}; "
                f"all latents must share one shape (re-extract at one resolution)"
            )
    return first


def _sorted_npy_names(folder: str, exclude=()) -> List[str]:
    # Integer names sort numerically (2.npy before 10.npy), the order fast-DiT writes them in.
    names = [
        n for n in os.listdir(folder)
        if n.endswith(".npy") and not n.startswith(".") and n not in exclude
        and os.path.isfile(os.path.join(folder, n))
    ]
    stems = [n[:-4] for n in names]
    if stems and all(s.isdigit() for s in stems):
        return sorted(names, key=lambda n: (int(n[:-4]), n))
    return sorted(names)


def _resolve_num_classes(num_classes: Optional[int], labels: np.ndarray, class_names, names) -> int:
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
        num_classes = int(num_classes)
    elif class_names is not None:
        num_classes = len(class_names)
    else:
        num_classes = int(labels.max()) + 1 if labels.size else 1
    check_label_range(labels, num_classes, names)
    return num_classes


class _LatentFiles(Dataset):
    """One latent per `.npy` file with one label each; subclasses find the files and labels."""

    def __init__(self, paths, labels, latent_shape, num_classes, class_names, random_flip, seed):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
        self.paths = list(paths)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.latent_shape = tuple(latent_shape)
        self.num_classes = num_classes
        self.class_names = class_names
        self.random_flip = bool(random_flip)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose flips `__getitem__` draws."""
        self.epoch = check_epoch(epoch)

    def __len__(self) -> int:
        return len(self.paths)

    def load_latent(self, index: int) -> np.ndarray:
        """The unflipped float32 C×H×W latent of item `index`; DataError if the file is bad."""
        path = self.paths[index]
        try:
            with open(path, "rb") as f:
                arr = read_array(f)
        except OSError as err:
            raise DataError(f"cannot read {path} ({err.strerror or err}); check it exists and is readable") from None
        except NPY_ERRORS as err:
            raise DataError(f"{path} is not a valid .npy file ({one_line(err)}); re-extract it or delete it") from None
        if arr.ndim == 4 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.shape != self.latent_shape:
            # The file changed since the dataset was built; the header scan saw another shape.
            raise DataError(f"{path} has shape {arr.shape}, expected {self.latent_shape}; re-extract it")
        if arr.dtype.kind != "f":
            raise DataError(f"{path} holds {arr.dtype} values; latents must be float16/32/64 arrays")
        # Checked after the cast: a float64 1e300 is finite but overflows float32 to inf.
        with np.errstate(over="ignore"):
            out = arr.astype(np.float32, copy=False)
        if not np.isfinite(out).all():
            raise DataError(f"{path} contains NaN, inf or values beyond float32; re-extract it or delete it")
        return out

    def __getitem__(self, index: int):
        index = check_index(index, len(self))
        arr = self.load_latent(index)
        if self.random_flip and flip_for(self.seed, self.epoch, index):
            arr = arr[:, :, ::-1]
        x = torch.from_numpy(np.ascontiguousarray(arr))
        return x, torch.tensor(int(self.labels[index]), dtype=torch.int64)


class NpyLatentFolder(_LatentFiles):
    """A folder of per-image `.npy` latents with an optional labels file beside them."""

    def __init__(self, path, num_classes=None, random_flip=False, labels_file=None, seed=0, unconditional=None):
        """`unconditional`: None labels a folder without labels file 0; False refuses such a folder
        (what `dit train` asks, so labels are never silently lost); True ignores labels (one class)."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise DataError(f"{path} is not a folder; pass a folder of .npy latents")
        if unconditional:
            labels_file = None
        elif labels_file is None:
            labels_file = find_labels_file(path)
        else:
            labels_file = os.fspath(labels_file)
        exclude = {"labels.npy"}
        if labels_file is not None and os.path.dirname(os.path.abspath(labels_file)) == os.path.abspath(path):
            exclude.add(os.path.basename(labels_file))
        names = _sorted_npy_names(path, exclude)
        if not names:
            raise DataError(f"{path} has no .npy latent files; extract latents into it first")
        paths = [os.path.join(path, n) for n in names]
        shape = _scan_shapes(paths)
        stems = [n[:-4] for n in names]
        if labels_file is None:
            if unconditional is False:
                raise DataError(
                    f"{path} has no labels file; write labels.json beside the latents mapping each file name to "
                    f'its class ({{"labels": {{"{stems[0]}": 0, ...}}, "class_names": ["cat", ...]}}), pass '
                    f"data.labels_file, or set data.unconditional: true to train one class"
                )
            labels, class_names, where = np.zeros(len(paths), dtype=np.int64), None, paths
        else:
            labels, class_names = read_labels_file(labels_file, stems)
            where = [f"{labels_file} ({s}.npy)" for s in stems]
        n = _resolve_num_classes(num_classes, labels, class_names, where)
        if class_names is not None and len(class_names) != n:
            raise DataError(
                f"{labels_file} lists {len(class_names)} class_names but num_classes is {n}; make them agree"
            )
        self.root = path
        self.labels_file = labels_file
        super().__init__(paths, labels, shape, n, class_names, random_flip, seed)


def _read_fastdit_label(path: str) -> int:
    check_regular(path, DataError, "a label file")
    try:
        with open(path, "rb") as f:
            arr = read_array(f)
    except FileNotFoundError:
        raise DataError(f"{path} is missing; re-run feature extraction or delete its feature file") from None
    except OSError as err:
        raise DataError(f"cannot read {path} ({err.strerror or err}); check it is readable") from None
    except NPY_ERRORS as err:
        raise DataError(f"{path} is not a valid .npy file ({one_line(err)}); re-extract it") from None
    if arr.size != 1 or arr.dtype.kind not in "iuf":
        raise DataError(f"{path} holds {arr.dtype} shape {arr.shape}; a label file holds one integer")
    value = arr.reshape(-1)[0].item()
    if not float(value).is_integer():
        raise DataError(f"{path}: label {value!r} is not an integer; re-extract it")
    return int(value)


class FastDiTFeatures(_LatentFiles):
    """fast-DiT / PaddleMIX features: `root/imagenet256_features/N.npy` and `root/imagenet256_labels/N.npy`."""

    def __init__(self, root, num_classes=None, random_flip=False, seed=0,
                 features_dir=FASTDIT_FEATURES, labels_dir=FASTDIT_LABELS):
        root = os.fspath(root)
        feat_dir = os.path.join(root, features_dir)
        lab_dir = os.path.join(root, labels_dir)
        if not os.path.isdir(feat_dir):
            raise DataError(f"{feat_dir} is not a folder; pass the folder that holds {features_dir}/")
        if not os.path.isdir(lab_dir):
            raise DataError(f"{lab_dir} is missing; it must sit beside {features_dir}/ with one label per feature")
        names = _sorted_npy_names(feat_dir)
        if not names:
            raise DataError(f"{feat_dir} has no .npy feature files; run feature extraction first")
        paths = [os.path.join(feat_dir, n) for n in names]
        label_paths = [os.path.join(lab_dir, n) for n in names]
        shape = _scan_shapes(paths)
        # Label files are a few bytes each, so reading them whole costs what reading a header would.
        if len(label_paths) >= _PARALLEL_SCAN_MIN:
            with ThreadPoolExecutor(max_workers=min(32, 4 * (os.cpu_count() or 1))) as pool:
                values = list(pool.map(_read_fastdit_label, label_paths))
        else:
            values = [_read_fastdit_label(p) for p in label_paths]
        labels = np.asarray(values, dtype=np.int64)
        n = _resolve_num_classes(num_classes, labels, None, label_paths)
        self.root = root
        super().__init__(paths, labels, shape, n, None, random_flip, seed)


def _looks_like_shards(path: str) -> bool:
    # A shard's labels file, or extract's plan: read as a .npy folder they give a wrong error about dtypes.
    return os.path.isfile(os.path.join(path, "extract.json")) or any(
        n.startswith("shard-") and n.endswith(".labels.npy") for n in os.listdir(path))


def open_latent_dataset(path, num_classes=None, random_flip=False, seed=0, labels_file=None, unconditional=None):
    """The latent dataset at `path`, its layout detected: shards, fast-DiT features or a `.npy` folder.

    `labels_file` and `unconditional` (see `NpyLatentFolder`) apply to a `.npy` folder only; the
    other layouts carry their own labels.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist; pass the folder holding the latents")
    if not os.path.isdir(path):
        raise DataError(f"{path} is not a folder; pass the folder holding the latents")
    if os.path.isfile(os.path.join(path, "manifest.json")):
        from dit_trainer.data.text_shards import open_shards

        ds = open_shards(path, random_flip=random_flip, seed=seed)
        have = getattr(ds, "num_classes", None)
        if num_classes is not None and have is not None and have > num_classes:
            raise DataError(
                f"{os.path.join(path, 'manifest.json')} declares {have} classes but num_classes is "
                f"{num_classes}; raise num_classes"
            )
        return ds
    if _looks_like_shards(path):
        raise DataError(
            f"{os.path.join(path, 'manifest.json')} is missing, though {path} holds latent shards; re-run the "
            f"`dit extract` (or `dit data convert`) that wrote them with the same arguments and --out to finish and "
            f"write it (finished shards are kept), then check it with `dit data verify {path}`"
        )
    if os.path.isdir(os.path.join(path, FASTDIT_FEATURES)):
        return FastDiTFeatures(path, num_classes=num_classes, random_flip=random_flip, seed=seed)
    # Pointing at the features folder itself would otherwise load it label-less, every label 0.
    parent, base = os.path.split(os.path.normpath(path))
    if base == FASTDIT_FEATURES and os.path.isdir(os.path.join(parent, FASTDIT_LABELS)):
        return FastDiTFeatures(parent, num_classes=num_classes, random_flip=random_flip, seed=seed)
    return NpyLatentFolder(path, num_classes=num_classes, random_flip=random_flip, labels_file=labels_file, seed=seed,
                           unconditional=unconditional)
