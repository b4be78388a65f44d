"""Reading the images of a captioned listing, wherever they are: a local file, an fsspec URL or a
member of a webdataset shard; decoded and cropped exactly as an image folder's (`images.load_image`),
for `images.ImageFiles(refs, size, load=read_image)`."""

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from dit_trainer.data.captions.sources import is_url, url_fs
from dit_trainer.data.captions.webdataset import read_member
from dit_trainer.data.images import center_crop_arr, load_image, to_rgb


def read_image(ref, image_size: int) -> np.ndarray:
    """The center-cropped uint8 image_size×image_size×3 image at `ref`; PIL and OS errors propagate."""
    if isinstance(ref, str) and not is_url(ref):
        return load_image(ref, image_size)
    if isinstance(ref, str):
        fs, inner = url_fs(ref)
        raw = fs.cat_file(inner)
    else:
        raw = read_member(ref)
    try:
        image = Image.open(io.BytesIO(raw))
    except UnidentifiedImageError:  # named by its reference, not by the in-memory buffer PIL saw
        raise UnidentifiedImageError(f"cannot identify image file {ref_name(ref)!r}") from None
    with image:
        return center_crop_arr(to_rgb(image), image_size)


def ref_name(ref) -> str:
    """An image reference as a user finds it: a path, a URL or `shard:member`."""
    return ref if isinstance(ref, str) else f"{ref[0]}:{ref[3]}"
