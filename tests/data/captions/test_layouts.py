"""Captioned images in a folder, a JSONL/CSV manifest and webdataset shards, local, file:// and memory://:
the same images and captions give the same items in every layout."""

import csv
import json

import fsspec
import numpy as np
import pytest

from tests.text_helpers import tar_bytes, webdataset_members, write_captioned_folder

from dit_trainer.data.captions import dropped_line, list_captioned  # noqa: E402
from dit_trainer.data.captions.files import read_image  # noqa: E402
from dit_trainer.errors import DataError  # noqa: E402

SIZE = 16


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """One set of captioned images in every layout; returns the items and a path per layout."""
    root = tmp_path_factory.mktemp("layouts")
    items = write_captioned_folder(root / "folder", count=6, nested=True)
    rows = [{"path": f"{key}.png", "caption": caption} for key, _, caption in items]
    (root / "folder" / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with open(root / "folder" / "captions.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["file_name", "text"])
        writer.writeheader()
        writer.writerows({"file_name": r["path"], "text": r["caption"]} for r in rows)
    (root / "shards").mkdir()
    for s, part in enumerate((items[:4], items[4:])):
        (root / "shards" / f"{s:05d}.tar").write_bytes(tar_bytes(webdataset_members(part)))
    memory = fsspec.filesystem("memory")
    memory.pipe("/layouts/shards/00000.tar", tar_bytes(webdataset_members(items)))
    for key, png, caption in items:
        memory.pipe(f"/layouts/folder/{key}.png", png)
        memory.pipe(f"/layouts/folder/{key}.txt", caption.encode())
    memory.pipe("/layouts/folder/captions.jsonl", (root / "folder" / "captions.jsonl").read_bytes())
    paths = {"folder": root / "folder", "jsonl": root / "folder" / "captions.jsonl",
             "csv": root / "folder" / "captions.csv", "shards": root / "shards",
             "one shard": root / "shards" / "00000.tar", "file:// folder": f"file://{root / 'folder'}",
             "file:// shards": f"file://{root / 'shards'}", "memory:// folder": "memory://layouts/folder",
             "memory:// manifest": "memory://layouts/folder/captions.jsonl",
             "memory:// shard": "memory://layouts/shards/00000.tar"}
    return items, {k: str(v) for k, v in paths.items()}


LAYOUTS = ["folder", "jsonl", "csv", "shards", "file:// folder", "file:// shards", "memory:// folder",
           "memory:// manifest", "memory:// shard"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_the_same_items(layouts, layout):
    items, paths = layouts
    listing = list_captioned(paths[layout])
    assert listing.keys == [key for key, _, _ in items]
    assert listing.captions == [caption for _, _, caption in items]
    reference = list_captioned(paths["folder"])
    for ref, want in zip(listing.images, reference.images):
        np.testing.assert_array_equal(read_image(ref, SIZE), read_image(want, SIZE))


def test_one_shard_lists_its_own_items(layouts):
    items, paths = layouts
    assert list_captioned(paths["one shard"]).keys == [key for key, _, _ in items[:4]]


def test_json_sidecar_caption_and_a_missing_caption_by_policy(tmp_path):
    items = write_captioned_folder(tmp_path, count=4)
    (tmp_path / "0001.txt").unlink()
    (tmp_path / "0001.json").write_text(json.dumps({"caption": " from json ", "url": "x"}))
    (tmp_path / "0002.txt").write_text("   \n")
    (tmp_path / "0003.txt").unlink()
    with pytest.raises(DataError, match="0002.txt: the caption of 0002 is missing or empty") as err:
        list_captioned(tmp_path)
    assert "data.empty_captions drop" in str(err.value)
    listing = list_captioned(tmp_path, empty="drop")
    assert listing.keys == ["0000", "0001"] and listing.captions == [items[0][2], "from json"]
    assert listing.dropped == 2 and "2 images without a caption left out" in dropped_line(listing)


def test_a_shard_sample_without_caption_names_its_key(tmp_path):
    items = write_captioned_folder(tmp_path / "images", count=2)
    members = webdataset_members(items)[:-1]  # the last sample loses its txt
    (tmp_path / "s.tar").write_bytes(tar_bytes(members))
    with pytest.raises(DataError, match=r"s\.tar:0001 \(no txt member\): the caption of 0001 is missing"):
        list_captioned(tmp_path / "s.tar")
    assert list_captioned(tmp_path / "s.tar", empty="drop").keys == ["0000"]


def test_two_images_of_one_name_are_refused(tmp_path):
    items = write_captioned_folder(tmp_path, count=2)
    (tmp_path / "0001.jpg").write_bytes(items[0][1])
    with pytest.raises(DataError, match="are both image 0001"):
        list_captioned(tmp_path)


def test_what_is_no_captioned_source(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        list_captioned(tmp_path / "missing")
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(DataError, match="is not a folder of captioned images"):
        list_captioned(tmp_path / "notes.md")
    with pytest.raises(DataError, match="holds no captioned images"):
        list_captioned(tmp_path)


def test_a_dot_in_a_shard_members_name_keeps_its_image(tmp_path):
    items = write_captioned_folder(tmp_path / "images", count=2)
    members = webdataset_members(items)
    members[0] = ("0000.v2.png", members[0][1])  # webdataset's key is "0000", its image's extension "v2.png"
    (tmp_path / "s.tar").write_bytes(tar_bytes(members))
    listing = list_captioned(tmp_path / "s.tar")
    assert listing.keys == ["0000", "0001"]
    assert np.array_equal(read_image(listing.images[0], 8), read_image(str(tmp_path / "images" / "0000.png"), 8))
