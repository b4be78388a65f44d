"""`dit ema`: folders that sampling loads like any checkpoint, and a one-line error for every bad input."""

import shutil

import pytest
import torch
from safetensors.torch import load_file
from tests.train.trainer_helpers import run_config

from dit_trainer.checkpoint.files import verify_checkpoint
from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.phema import phema_folder
from dit_trainer.sample.loading import load_model
from dit_trainer.train import DiTTrainer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny run of 4 steps with snapshots at steps 2 and 4."""
    tmp = tmp_path_factory.mktemp("phema_cli")
    cfg = run_config(tmp, 4, train={"phema_stds": [0.05, 0.10], "phema_every": 2})
    DiTTrainer(build_config(cfg)).train()
    return tmp / "run"


def _error(capsys, *argv) -> str:
    assert main(["ema", *map(str, argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("dit ema: error: ")
    return err


def test_writes_checkpoint_folders_that_load_model_reads(run, tmp_path, capsys):
    assert main(["ema", str(run), "--std", "0.05", "0.07"]) == 0
    printed = capsys.readouterr().out.splitlines()
    folders = [phema_folder(run, 0.05, 4), phema_folder(run, 0.07, 4)]
    assert [line.split()[0] for line in printed] == [str(f) for f in folders]
    for folder in folders:
        verify_checkpoint(folder)  # the manifest lists and checks every file
        model, cfg = load_model(folder)
        weights = load_file(str(folder / "ema.safetensors"))
        assert all(v.dtype == torch.float32 for v in weights.values())
        assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())
        assert cfg.model.name == "DiT-S/2" and cfg.train.phema_stds == [0.05, 0.10]
    narrow, between = (load_file(str(f / "ema.safetensors")) for f in folders)
    assert not torch.equal(narrow["x_embedder.proj.weight"], between["x_embedder.proj.weight"])
    # --at an older snapshot and --out elsewhere.
    assert main(["ema", str(run), "--std", "0.1", "--at", "2", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "std0.100-step00000002" / "ema.safetensors").is_file()


def test_bad_inputs_are_one_line(run, tmp_path, capsys):
    assert "--std 0.3 has no power-function EMA" in _error(capsys, run, "--std", "0.3")
    assert "--std 0.0 has no power-function EMA" in _error(capsys, run, "--std", "0")
    err = _error(capsys, run, "--std", "0.05", "--at", "3")
    assert "--at 3" in err and "(2, 4)" in err
    assert "is not a folder" in _error(capsys, tmp_path / "missing", "--std", "0.05")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no post-hoc EMA snapshots" in _error(capsys, empty, "--std", "0.05")
    assert "train.phema_stds" in _error(capsys, empty, "--std", "0.05")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "nan"])
def test_a_damaged_snapshot_is_named(run, tmp_path, capsys, damage):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("std*"))
    snap = copy / "phema" / "snapshot-00000004.safetensors"
    data = snap.read_bytes()
    if damage == "truncated":
        snap.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        snap.write_bytes(b"\x07" * 64)
    else:
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(str(snap), "pt") as f:
            tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
        tensors["std0.050/x_embedder.proj.weight"][0, 0, 0, 0] = float("nan")
        save_file(tensors, str(snap), metadata=meta)
    err = _error(capsys, copy, "--std", "0.05")
    assert str(snap) in err and "not a usable post-hoc EMA snapshot" in err and "move it out" in err
    # Rebuilding at the older snapshot does not read the damaged one.
    assert main(["ema", str(copy), "--std", "0.05", "--at", "2"]) == 0


def test_an_out_that_cannot_be_written_is_one_line(run, tmp_path, capsys, monkeypatch):
    taken = tmp_path / "file"
    taken.write_text("mine")
    assert f"--out {taken} is a file" in _error(capsys, run, "--std", "0.05", "--out", taken)
    assert f"{taken} is a file, not a folder" in _error(capsys, run, "--std", "0.05", "--out", taken / "under")
    assert taken.read_text() == "mine"
    # Any other failure to write the folder (here a copy refused by the file system) is one line too.
    import errno
    import shutil as shutil_module

    def refuse(*args, **kwargs):
        raise OSError(errno.EINVAL, "Invalid argument", str(args[1]))

    monkeypatch.setattr(shutil_module, "copyfile", refuse)
    err = _error(capsys, run, "--std", "0.05", "--out", tmp_path / "out")
    assert "cannot write" in err and "Invalid argument" in err
    assert not list((tmp_path / "out").glob("*"))  # nothing half-written is left
