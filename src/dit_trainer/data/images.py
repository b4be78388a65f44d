"""Image folders for VAE extraction: listing, RGB conversion and ADM center crop.

The crop is ADM's `center_crop_arr` (guided-diffusion), which DiT's published FIDs used: halve
with a box filter while the short side is at least twice the target, then bicubic to the target,
then crop the center. Other resizers (torchvision's antialiased bilinear, say) shift FID by
several tenths, so numbers would not be comparable with the paper.
"""

import os
from typing import List, Sequence, Tuple

import numpy as np
from PIL import Image

from dit_trainer.errors import DataError
from dit_trainer.fs import check_regular, not_regular

# torchvision's IMG_EXTENSIONS, so a folder that trains with torchvision's ImageFolder lists the same files.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# Errors PIL raises for a corrupt, truncated or unsupported file.
IMAGE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def _is_image(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def _check_image_file(path: str) -> None:
    """One line for an image entry that cannot be read as a file: a dangling symlink, a FIFO (it would hang the reader)."""
    if os.path.islink(path) and not os.path.exists(path):
        raise DataError(f"{path} is a symlink to {os.readlink(path)}, which does not exist; restore its target or "
                        "remove the link")
    check_regular(path, DataError, "in an image folder")


def _walk_images(folder: str, seen_dirs: set, seen_files: set) -> List[str]:
    """Images under `folder`, following symlinks but entering each real folder and taking each real file once.

    A symlink loop (a link to a parent) would otherwise be walked until the path length limit,
    turning a few images into thousands of mislabelled copies.
    """
    found = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen_dirs:
            dirs[:] = []
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            path = os.path.join(root, f)
            real = os.path.realpath(path)
            if _is_image(f):
                _check_image_file(path)
            if _is_image(f) and real not in seen_files:
                seen_files.add(real)
                found.append(path)
    return found


def walk_images(folder: str) -> List[str]:
    """Every image under `folder`, symlinks followed but each real folder and file taken once."""
    return _walk_images(folder, set(), set())


def list_image_folder(root) -> Tuple[List[str], np.ndarray, List[str]]:
    """(paths, labels, class_names): one sub-folder per class with sorted names as ids, or a flat folder as class 0."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise DataError(f"{root} is not a folder; pass a folder of images (one sub-folder per class)")
    entries = sorted(e for e in os.listdir(root) if not e.startswith("."))
    class_dirs = [e for e in entries if os.path.isdir(os.path.join(root, e))]
    for e in entries:
        if _is_image(e):
            _check_image_file(os.path.join(root, e))
    loose = [e for e in entries if os.path.isfile(os.path.join(root, e)) and _is_image(e)]
    if class_dirs and loose:
        # Either reading would silently drop or mislabel images, so make the user decide.
        raise DataError(
            f"{root} holds both images ({loose[0]}) and class folders ({class_dirs[0]}); "
            f"move the images into a class folder"
        )
    paths: List[str] = []
    labels: List[int] = []
    if class_dirs:
        class_names = class_dirs
        seen_dirs, seen_files = {(os.stat(root).st_dev, os.stat(root).st_ino)}, set()
        for label, name in enumerate(class_dirs):
            found = _walk_images(os.path.join(root, name), seen_dirs, seen_files)
            if not found:
                # Kept, it would be a class no sample teaches; skipped, every later class's id would shift
                # away from its folder's sorted place. torchvision's ImageFolder refuses it too.
                raise DataError(f"{os.path.join(root, name)} is a class folder without images "
                                f"({', '.join(IMAGE_EXTENSIONS)}); add its images or remove the folder")
            paths.extend(found)
            labels.extend([label] * len(found))
    else:
        class_names = [os.path.basename(os.path.normpath(root))]
        paths = [os.path.join(root, e) for e in loose]
        labels = [0] * len(paths)
    if not paths:
        raise DataError(f"{root} has no images ({', '.join(IMAGE_EXTENSIONS)}); check --data-path")
    return paths, np.asarray(labels, dtype=np.int64), class_names


def to_rgb(image: Image.Image) -> Image.Image:
    """An RGB copy of any PIL mode; transparency is composited onto white."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        # convert("RGB") clips 16-bit and float values at 255; rescale to 8 bits first.
        arr = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") else max(float(arr.max()), 1.0)
        image = Image.fromarray(np.clip(arr * (255.0 / peak), 0, 255).round().astype(np.uint8), "L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        # Fully transparent pixels often hold black or garbage colour; white is what viewers show.
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def center_crop_arr(image: Image.Image, image_size: int) -> np.ndarray:
    """ADM's center crop: box-halve while short side >= 2x target, bicubic, crop; uint8 H×W×3."""
    while min(*image.size) >= 2 * image_size:
        image = image.resize(tuple(x // 2 for x in image.size), resample=Image.BOX)
    scale = image_size / min(*image.size)
    image = image.resize(tuple(round(x * scale) for x in image.size), resample=Image.BICUBIC)
    arr = np.asarray(image)
    top = (arr.shape[0] - image_size) // 2
    left = (arr.shape[1] - image_size) // 2
    return np.ascontiguousarray(arr[top:top + image_size, left:left + image_size])


def load_image(path: str, image_size: int) -> np.ndarray:
    """The file at `path` as a center-cropped uint8 image_size×image_size×3 array; PIL errors propagate."""
    if not_regular(path):
        raise OSError(f"{path} is {not_regular(path)}, not an image file")
    with Image.open(path) as image:
        # DiT's ImageFolder loader converts before cropping; doing the same keeps pixels identical.
        return center_crop_arr(to_rgb(image), image_size)


def to_model_range(batch: np.ndarray) -> np.ndarray:
    """uint8 N×H×W×3 → float32 N×3×H×W in [-1, 1], the range the VAE was trained on."""
    return batch.transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1.0


class ImageFiles:
    """Map-style dataset of (index, uint8 image or None, error message) for extraction; `load(ref, size)`
    reads other references than paths (a captioned listing's URLs and shard members)."""

    def __init__(self, paths: Sequence[str], image_size: int, load=None):
        self.paths = list(paths)
        self.image_size = int(image_size)
        self.load = load or load_image

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        try:
            return index, self.load(self.paths[index], self.image_size), None
        except IMAGE_ERRORS as err:
            # A bad file must not kill a DataLoader worker; the extractor decides skip or stop.
            return index, None, f"{type(err).__name__}: {err}".replace("\n", " ")
