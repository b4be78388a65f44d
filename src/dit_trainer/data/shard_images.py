"""The clean images beside a shard's latents (`dit extract --keep-images`), for REPA's encoder.

Each shard `NAME` then has `NAME.images.npy`: uint8 N×H×W×3, the same center crop the VAE encoded,
unflipped; a batch flips each image where the draw picked the flipped latent, so image and latent
always show the same picture. The manifest's `images` records their H×W×3 shape.
"""

import os

import numpy as np
import torch

from dit_trainer.data.atomic import atomic_npy
from dit_trainer.errors import DataError
from dit_trainer.fs import check_regular
from dit_trainer.npy import open_memmap

SUFFIX = ".images.npy"


class ImageSidecar:
    """Buffers one shard's images, then writes them (before the shard's marker, which means 'complete')."""

    def __init__(self, root: str, name: str, capacity: int, image_size: int):
        self.root, self.name = root, name
        self.data = np.empty((capacity, image_size, image_size, 3), dtype=np.uint8)
        self.count = 0

    def add(self, images: np.ndarray) -> None:
        """Append a batch of uint8 b×H×W×3 images (the rows the shard keeps, in its order)."""
        self.data[self.count:self.count + len(images)] = images
        self.count += len(images)

    def close(self) -> dict:
        """Write the images; returns their checksum fields for the shard's marker (none when empty)."""
        if not self.count:
            return {}
        sums = atomic_npy(os.path.join(self.root, self.name + SUFFIX), self.data[:self.count])
        self.data = None
        return {"images_bytes": sums["bytes"], "images_sha256": sums["sha256"]}


def open_images(root: str, name: str, count: int, shape) -> np.ndarray:
    """The images of shard `name` as a memmap, checked against the manifest's count and shape."""
    path = os.path.join(root, name + SUFFIX)
    check_regular(path, DataError, "shard images")
    try:
        array = open_memmap(path)
    except (OSError, ValueError) as err:
        raise DataError(f"cannot open {path} ({err}); re-extract with `dit extract --keep-images`") from None
    if array.shape != (count, *shape) or array.dtype != np.uint8:
        raise DataError(f"{path} holds {array.dtype} {array.shape}, the manifest says uint8 {(count, *shape)}; "
                        "re-extract with `dit extract --keep-images`")
    return array


def folder_images(paths, index, image_size: int, flips) -> torch.Tensor:
    """uint8 b×3×H×W center crops of the images `paths[index]` (files, or a captioned listing's URLs and
    webdataset members), flipped where `flips` says."""
    from dit_trainer.data.captions.files import read_image

    out = np.stack([read_image(paths[int(i)], image_size) for i in index])
    return _flipped(out, flips)


def _flipped(out: np.ndarray, flips) -> torch.Tensor:
    images = torch.from_numpy(out).permute(0, 3, 1, 2)
    mask = torch.from_numpy(np.asarray(flips, dtype=bool))
    if mask.any():
        images[mask] = images[mask].flip(-1)
    return images.contiguous()


def batch_images(shards, index: np.ndarray, shard_of: np.ndarray, flips: np.ndarray) -> torch.Tensor:
    """uint8 b×3×H×W images of the items `index` of `shards` (a LatentShards), flipped where `flips` says:
    from the shards' own image files, or from the image folder a latent cache was made of."""
    paths = getattr(shards, "image_paths", None)
    if paths is not None:
        return folder_images(paths, index, int(shards.manifest["image_size"]), flips)
    shape = tuple(shards.manifest["images"])
    out = np.empty((len(index), *shape), dtype=np.uint8)
    opened = shards.__dict__.setdefault("_images", {})
    for shard in np.unique(shard_of):
        s = int(shard)
        if s not in opened:
            count = int(shards.offsets[s + 1] - shards.offsets[s])
            opened[s] = open_images(shards.root, shards.names[s], count, shape)
        where = np.flatnonzero(shard_of == shard)
        out[where] = np.asarray(opened[s])[index[where] - shards.offsets[s]]
    return _flipped(out, flips)
