"""No command replaces what it did not write: `dit convert`, `dit extract --out` and `dit eval --out/--json`
refuse a target holding the user's files in one line naming it and `--overwrite`, which allows it; a full
disk under each names the path and leaves no temporary file behind."""

import errno
import os

import numpy as np
import pytest
from tests.reliability.helpers import train
from tests.train.trainer_helpers import save_tiny_vae, write_images

from dit_trainer.cli import main

MINE = {"config.yaml": b"lr: 0.1\n", "thesis.tex": b"\\documentclass{article}\n", "model_index.json": b"{}\n"}


def _dit(capsys, *argv):
    """(exit code, stderr) of `dit ARGV` in this process."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err.strip()


def _refused(rc, err, target, flag):
    assert rc == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    assert str(target) in err and "--overwrite" in err and flag in err, err


def _user_folder(folder):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in MINE.items():
        (folder / name).write_bytes(data)
    return folder


def _untouched(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()} == MINE


def _full(*args, **kwargs):
    """A write that gets some bytes out, then meets a full disk."""
    target = args[1] if len(args) > 1 and isinstance(args[1], (str, os.PathLike)) else None
    if target is not None:
        with open(target, "wb") as f:
            f.write(b"partial")
    elif args and hasattr(args[0], "write"):
        args[0].write(b"partial")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _no_temporaries(folder):
    left = [p.name for p in folder.rglob("*") if ".tmp" in p.name or p.name.endswith(".old")]
    assert not left, left


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    train(root, 2)
    return root / "run"


@pytest.mark.parametrize("to", ["ours", "diffusers", "ppdiffusers"])
def test_convert_keeps_a_folder_holding_files(run_dir, tmp_path, capsys, to):
    out = _user_folder(tmp_path / "out")
    _refused(*_dit(capsys, "convert", "--from", "ours", run_dir, "--to", to, out), out, "OUT")
    assert _untouched(out)


def test_convert_overwrite_replaces_and_an_empty_folder_is_fine(run_dir, tmp_path, capsys):
    out = _user_folder(tmp_path / "out")
    assert _dit(capsys, "convert", "--from", "ours", run_dir, "--to", "ours", out, "--overwrite")[0] == 0
    assert (out / "ema.safetensors").is_file() and not (out / "thesis.tex").exists()
    (tmp_path / "empty").mkdir()
    assert _dit(capsys, "convert", "--from", "ours", run_dir, "--to", "ours", tmp_path / "empty")[0] == 0
    _no_temporaries(tmp_path)


def test_convert_on_a_full_disk_names_out_and_leaves_nothing(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("safetensors.torch.save_file", _full)
    rc, err = _dit(capsys, "convert", "--from", "ours", run_dir, "--to", "ours", tmp_path / "out")
    assert rc == 2 and err.count("\n") == 0 and f"cannot write {tmp_path / 'out'}: No space left" in err, err
    assert os.listdir(tmp_path) == []


def _extract(capsys, images, vae, out, *extra):
    return _dit(capsys, "extract", "--data-path", images, "--vae", vae, "--image-size", "16", "--out", out,
                "--workers", "0", "--device", "cpu", "--no-progress", "--batch-size", "4", *extra)


@pytest.fixture(scope="module")
def images_and_vae(tmp_path_factory):
    root = tmp_path_factory.mktemp("extract")
    return write_images(root / "images", classes=2, per_class=2), save_tiny_vae(root / "vae")


def test_extract_keeps_a_folder_holding_files(images_and_vae, tmp_path, capsys):
    images, vae = images_and_vae
    out = _user_folder(tmp_path / "out")
    _refused(*_extract(capsys, images, vae, out), out, "--out")
    assert _untouched(out)
    assert _extract(capsys, images, vae, out, "--overwrite")[0] == 0
    assert (out / "manifest.json").is_file() and (out / "thesis.tex").read_bytes() == MINE["thesis.tex"]
    # Its own folder is resumed, not refused; other settings there are refused, or replaced by --overwrite.
    assert _extract(capsys, images, vae, out)[0] == 0
    rc, err = _extract(capsys, images, vae, out, "--no-flips")
    assert rc == 2 and "--overwrite" in err and "flips" in err
    assert _extract(capsys, images, vae, out, "--no-flips", "--overwrite")[0] == 0
    assert '"flips": false' in (out / "manifest.json").read_text()


def test_extract_on_a_full_disk_names_out_and_leaves_no_temporary(images_and_vae, tmp_path, capsys, monkeypatch):
    images, vae = images_and_vae
    monkeypatch.setattr(np, "save", _full)
    rc, err = _extract(capsys, images, vae, tmp_path / "out")
    assert rc == 2 and err.count("\n") == 0 and f"cannot write {tmp_path / 'out'}: No space left" in err, err
    _no_temporaries(tmp_path / "out")


def _eval_ref(capsys, folder, out, *extra):
    return _dit(capsys, "eval", "--network", "digits", "--ref-from-images", folder, "--out", out,
                "--image-size", "16", "--device", "cpu", "--no-progress", *extra)


def test_eval_keeps_a_users_file(tmp_path, capsys):
    write_images(tmp_path / "images", classes=1, per_class=4)
    ref, js = tmp_path / "ref.npz", tmp_path / "m.json"
    ref.write_bytes(b"my reference")
    js.write_bytes(b"my metrics")
    _refused(*_eval_ref(capsys, tmp_path / "images", ref), ref, "--out")
    rc, err = _dit(capsys, "eval", "--network", "digits", "--samples", ref, "--ref", "digits", "--json", js)
    _refused(rc, err, js, "--json")
    assert ref.read_bytes() == b"my reference" and js.read_bytes() == b"my metrics"
    assert _eval_ref(capsys, tmp_path / "images", ref, "--overwrite")[0] == 0
    with np.load(ref) as z:
        assert "mu" in z.files


def test_eval_on_a_full_disk_names_out_and_leaves_no_temporary(tmp_path, capsys, monkeypatch):
    write_images(tmp_path / "images", classes=1, per_class=4)
    monkeypatch.setattr(np, "savez", _full)
    rc, err = _eval_ref(capsys, tmp_path / "images", tmp_path / "ref.npz")
    assert rc == 2 and err.count("\n") == 0 and f"cannot write {tmp_path / 'ref.npz'}: No space left" in err, err
    assert sorted(os.listdir(tmp_path)) == ["images"]
