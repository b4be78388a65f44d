"""The latent cache of an image folder proves what it holds: damaged shards and labels, a swapped image
that kept its size and mtime, a changed folder on resume, an empty class, a dangling symlink and a
full disk are each one line before a step trains."""

import errno
import os
import shutil
import time

import numpy as np
import pytest
from tests.train.trainer_helpers import save_tiny_vae, write_images

pytest.importorskip("diffusers")

from dit_trainer.data import checksums  # noqa: E402
from dit_trainer.data import shards as sh  # noqa: E402
from dit_trainer.data.images import list_image_folder  # noqa: E402
from dit_trainer.data.loader import GlobalBatchSampler, StepLoader  # noqa: E402
from dit_trainer.data.online import cache as lc  # noqa: E402
from dit_trainer.data.online import open_image_folder  # noqa: E402
from dit_trainer.data.online.encoder import encoder_for  # noqa: E402
from dit_trainer.errors import DataError  # noqa: E402

SIZE = 16


@pytest.fixture(scope="module")
def vae(tmp_path_factory):
    return save_tiny_vae(tmp_path_factory.mktemp("vae") / "vae")


def _open(images, vae, cache):
    return open_image_folder(images, vae=vae, image_size=SIZE, device="cpu", cache_dir=cache)


def _complete_cache(tmp_path, vae):
    """A complete cache of 4 images, built as the first epoch's end builds it."""
    images = write_images(tmp_path / "images", classes=2, per_class=2)
    dataset = _open(images, vae, tmp_path / "cache")
    encoder_for(dataset, "cpu", progress=False).start_epoch(1)
    return images, dataset.root


def _one_line(err, *words):
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text


def _keep_times(path, change):
    """`change(path)` with the file's size and mtime put back, as `cp -p` or a careful forger leaves it."""
    st = os.stat(path)
    time.sleep(0.02)  # the kernel's coarse clock: let ctime move on
    change(path)
    assert os.path.getsize(path) == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _flip(path, at=200):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))


def test_flipped_byte_and_rewritten_labels_are_refused_before_a_step(tmp_path, vae, monkeypatch, capsys):
    images, folder = _complete_cache(tmp_path, vae)
    manifest = sh.read_manifest(folder)
    assert all(len(s["sha256"]) == 64 and s["bytes"] > 0 and s["labels_sha256"] for s in manifest["shards"])
    # The writer's checksums were stamped: a later open hashes nothing.
    hashed = []
    monkeypatch.setattr(checksums, "file_sha256", lambda p: hashed.append(p) or "x")
    checksums._known.clear()
    assert len(_open(images, vae, tmp_path / "cache")) == 4 and hashed == []
    monkeypatch.undo()
    shard, labels = os.path.join(folder, "shard-00000.npy"), os.path.join(folder, "shard-00000.labels.npy")
    saved = open(shard, "rb").read()

    _keep_times(shard, _flip)
    with pytest.raises(DataError) as err:
        _open(images, vae, tmp_path / "cache")
    _one_line(err, shard, "sha256", f"delete the latent cache folder {folder}")
    open(shard, "wb").write(saved)
    _keep_times(labels, lambda p: np.save(p, np.zeros(4, np.int64)))
    with pytest.raises(DataError) as err:
        _open(images, vae, tmp_path / "cache")
    _one_line(err, labels, "sha256", "delete the latent cache folder")
    # A truncated shard is told by its size alone, and `dit data verify` hashes every file.
    with open(shard, "r+b") as f:
        f.truncate(len(saved) - 1)
    with pytest.raises(DataError) as err:
        _open(images, vae, tmp_path / "cache")
    _one_line(err, shard, f"is {len(saved) - 1} bytes, its manifest says {len(saved)}")
    from dit_trainer.data.tools import verify

    open(shard, "wb").write(saved)
    assert any("labels.npy does not match the sha256" in p for p in verify(folder))


def test_a_damaged_piece_of_an_incomplete_cache_is_encoded_again(tmp_path):
    folder = str(tmp_path / "images-16px-abc")
    writer = lc.PieceWriter(folder)
    writer.add(np.arange(2), np.ones((2, 2, 2, 4, 8, 8), np.float16))
    writer.flush()
    entry = (2, 2, 4, 8, 8)
    assert lc.scan(folder, 2, entry).covered == 2
    (rows,) = (tmp_path / "images-16px-abc" / lc.PIECES).glob("*.rows.npy")
    _keep_times(rows, _flip)
    assert lc.scan(folder, 2, entry).covered == 0  # never read: its images are encoded again


def test_an_image_swapped_with_size_and_mtime_kept_is_a_new_cache(tmp_path):
    images = tmp_path / "images"
    for name in ("a.png", "b.png"):
        (images / "c0").mkdir(parents=True, exist_ok=True)
        (images / "c0" / name).write_bytes(name.encode() * 50)  # the key reads stats, never the images

    def key():
        paths, labels, _ = list_image_folder(images)
        return lc.cache_plan(str(images), paths, labels, "vae", "fp32", SIZE)["key"]

    first = key()
    assert key() == first
    target = images / "c0" / "a.png"
    _keep_times(target, lambda p: shutil.copyfile(images / "c0" / "b.png", p))  # cp -p: same inode, new bytes
    second = key()
    assert second != first

    def rsync_t(path):  # a temporary file renamed over the image: a new inode
        (images / "c0" / ".a.png.tmp").write_bytes(b"c.png" * 50)
        os.replace(images / "c0" / ".a.png.tmp", path)

    _keep_times(target, rsync_t)
    assert key() not in (first, second)


def test_changed_folder_on_resume_is_refused_unless_allowed(tmp_path, vae, capsys):
    images = write_images(tmp_path / "images", classes=2, per_class=2)

    def loader():
        dataset = _open(images, vae, tmp_path / "cache")
        return StepLoader(dataset, GlobalBatchSampler(len(dataset), 2), stage=encoder_for(dataset, "cpu", progress=False))

    state = loader().state_dict()
    assert state["fingerprint"]["images"] == 4
    same = loader()
    same.load_state_dict(state)
    assert same._refusal is None
    write_images(tmp_path / "images", classes=2, per_class=3)  # one more image per class (the others rewritten)
    changed = loader()
    changed.load_state_dict(state)
    with pytest.raises(DataError) as err:
        next(changed)
    _one_line(err, f"the image folder {images} holds 6 images, the checkpoint's run read 4", "--data.allow_changed true")
    allowed = loader()
    allowed.dataset.allow_changed = True
    capsys.readouterr()
    allowed.load_state_dict(state)
    assert allowed._refusal is None
    warning = capsys.readouterr().err
    assert "warning: the image folder" in warning and "not exact" in warning


def test_empty_class_folder_and_dangling_symlink_are_one_line(tmp_path):
    images = write_images(tmp_path / "images", classes=2, per_class=1)
    (tmp_path / "images" / "c2").mkdir()
    with pytest.raises(DataError) as err:
        list_image_folder(images)
    _one_line(err, os.path.join(images, "c2"), "class folder without images")
    os.rmdir(tmp_path / "images" / "c2")
    os.symlink(tmp_path / "gone.png", tmp_path / "images" / "c1" / "link.png")
    with pytest.raises(DataError) as err:
        list_image_folder(images)
    _one_line(err, os.path.join(images, "c1", "link.png"), "does not exist", "remove the link")


def test_full_disk_names_the_cache_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    folder = tmp_path / "cache" / "images-16px-abc"
    lc.write_plan(str(folder), {"key": "abc"})
    real_save = np.save

    def full(f, array, **kwargs):
        f.write(b"\x93NUMPY half")
        raise OSError(errno.ENOSPC, "No space left on device")

    writer = lc.PieceWriter(str(folder))
    rows = np.zeros((2, 2, 2, 4, 8, 8), np.float16)
    monkeypatch.setattr(np, "save", full)
    with pytest.raises(DataError) as err:
        writer.add(np.arange(2), rows)
        writer.flush()
    _one_line(err, "latent cache: cannot write", str(folder / lc.PIECES), "No space left on device", "data.cache_dir")
    assert os.listdir(folder / lc.PIECES) == []
    # Packing the shards fails the same way, with no shard-*.tmp left.
    monkeypatch.setattr(np, "save", real_save)
    writer = lc.PieceWriter(str(folder))
    writer.add(np.arange(2), rows)
    writer.flush()
    monkeypatch.setattr(np, "save", full)
    with pytest.raises(DataError) as err:
        lc.pack(str(folder), lc.scan(str(folder), 2, rows.shape[1:]), [0], np.zeros(2, np.int64))
    _one_line(err, str(folder / "shard-00000.npy"), "No space left on device")
    assert not [n for n in os.listdir(folder) if ".tmp" in n]
