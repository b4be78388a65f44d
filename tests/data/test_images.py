"""ImageFolder listing, RGB conversion and the ADM center crop."""

import numpy as np
import pytest
from PIL import Image

from dit_trainer.data.images import (IMAGE_ERRORS, ImageFiles, center_crop_arr, list_image_folder, load_image,
                                     to_model_range, to_rgb)
from dit_trainer.errors import DataError


def adm_center_crop_arr(pil_image, image_size):
    """The ADM recipe from its description, through PIL's own crop: the independent reference."""
    width, height = pil_image.size
    # Box-filter halvings first: they average many pixels, which bicubic alone would alias.
    while min(width, height) >= 2 * image_size:
        width, height = width // 2, height // 2
        pil_image = pil_image.resize((width, height), resample=Image.BOX)
    factor = image_size / min(width, height)
    pil_image = pil_image.resize((round(width * factor), round(height * factor)), resample=Image.BICUBIC)
    left = (pil_image.size[0] - image_size) // 2
    upper = (pil_image.size[1] - image_size) // 2
    return np.asarray(pil_image.crop((left, upper, left + image_size, upper + image_size)))


def _save(path, shape=(20, 30, 3), mode=None, seed=0):
    arr = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, mode).save(path) if mode else Image.fromarray(arr).save(path)
    return path


def test_class_folders_sorted_names_are_ids(tmp_path):
    _save(tmp_path / "zebra" / "b.png")
    _save(tmp_path / "zebra" / "a.JPG")
    _save(tmp_path / "ant" / "sub" / "x.png")
    _save(tmp_path / "bee" / "c.png")
    (tmp_path / "ant" / "notes.txt").write_text("not an image")
    _save(tmp_path / "ant" / ".hidden.png")
    paths, labels, names = list_image_folder(tmp_path)
    assert names == ["ant", "bee", "zebra"]
    assert [p.split("/")[-1] for p in paths] == ["x.png", "c.png", "a.JPG", "b.png"]
    assert labels.tolist() == [0, 1, 2, 2]


def test_flat_folder_is_class_zero(tmp_path):
    for i in range(3):
        _save(tmp_path / f"{i}.png")
    paths, labels, names = list_image_folder(tmp_path)
    assert len(paths) == 3 and labels.tolist() == [0, 0, 0] and names == [tmp_path.name]


def test_listing_errors_name_the_folder(tmp_path):
    with pytest.raises(DataError, match="no images"):
        list_image_folder(tmp_path)
    with pytest.raises(DataError, match="not a folder"):
        list_image_folder(tmp_path / "missing")
    _save(tmp_path / "cls" / "a.png")
    _save(tmp_path / "loose.png")
    with pytest.raises(DataError, match="both images"):
        list_image_folder(tmp_path)


@pytest.mark.parametrize("mode,shape", [("L", (9, 7)), ("RGBA", (9, 7, 4)), ("LA", (9, 7, 2)),
                                        ("CMYK", (9, 7, 4)), ("RGB", (9, 7, 3))])
def test_to_rgb_modes(mode, shape):
    arr = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    out = to_rgb(Image.fromarray(arr, mode))
    assert out.mode == "RGB" and out.size == (7, 9)


def test_alpha_composited_on_white_and_16bit_rescaled():
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)
    rgba[0, 0] = (10, 20, 30, 255)
    out = np.asarray(to_rgb(Image.fromarray(rgba, "RGBA")))
    assert out[0, 0].tolist() == [10, 20, 30] and out[1, 1].tolist() == [255, 255, 255]
    palette = Image.fromarray(np.zeros((4, 4), dtype=np.uint8), "P")
    palette.info["transparency"] = 0
    assert np.asarray(to_rgb(palette)).min() == 255
    wide = Image.fromarray(np.full((4, 4), 65535, dtype=np.uint16))
    assert wide.mode == "I;16"
    assert np.asarray(to_rgb(wide)).min() == 255


@pytest.mark.parametrize("size,target", [((50, 40), 16), ((300, 130), 32), ((33, 90), 32), ((16, 16), 16),
                                         ((10, 12), 16)])
def test_center_crop_matches_adm(size, target):
    arr = np.random.default_rng(2).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(arr)
    got = center_crop_arr(image, target)
    assert got.shape == (target, target, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, adm_center_crop_arr(image, target))


def test_load_image_and_range(tmp_path):
    path = _save(tmp_path / "g.png", (40, 24), "L")
    arr = load_image(str(path), 16)
    assert arr.shape == (16, 16, 3)
    x = to_model_range(arr[None])
    assert x.shape == (1, 3, 16, 16) and x.dtype == np.float32 and -1 <= x.min() and x.max() <= 1
    assert to_model_range(np.array([[[[0, 255, 0]]]], dtype=np.uint8)).ravel().tolist() == [-1.0, 1.0, -1.0]


def test_corrupt_and_truncated_files_report_instead_of_raising(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    good = _save(tmp_path / "good.jpg", (32, 32, 3))
    truncated = tmp_path / "cut.jpg"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(IMAGE_ERRORS):
        load_image(str(bad), 16)
    files = ImageFiles([str(good), str(bad), str(truncated)], 16)
    assert files[0][1].shape == (16, 16, 3) and files[0][2] is None
    for i in (1, 2):
        index, arr, err = files[i]
        assert index == i and arr is None and "\n" not in err and err
