"""`dit sample --npz` and `dit sample-ddp --npz` replace nothing they did not write: a user's file survives
byte for byte, a finished batch of the same settings is done, more samples are refused, and a second
writer of one --npz at once is one line."""

import fcntl
import os

import numpy as np
import pytest
import torch
import yaml

from dit_trainer.checkpoint import save_checkpoint
from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.models import get_spec

FLAGS = ["--num-samples", "4", "--batch-size", "2", "--sampler", "ddim", "--steps", "2", "--cfg-scale", "1",
         "--device", "cpu", "--no-progress"]
COMMANDS = ("sample", "sample-ddp")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A 1-block pixel DiT of the digits' shape, saved as a checkpoint folder."""
    cfg = build_config({"data": {"path": "digits"}, "model": {
        "name": "DiT-S/4", "input_size": 8, "in_channels": 1, "num_classes": 10, "depth": 1, "hidden_size": 32,
        "num_heads": 2}})
    torch.manual_seed(1)
    weights = get_spec(cfg.model.name).build_model_fn(cfg).state_dict()
    config = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    folder = tmp_path_factory.mktemp("targets") / "run"
    return str(save_checkpoint(folder, 1, {"ema.safetensors": weights, "model.safetensors": weights,
                                           "config.yaml": config}))


def _run(command, ckpt, npz, *extra):
    return main([command, "--ckpt", ckpt, "--npz", str(npz), *FLAGS, *extra])


def _one_line(capsys):
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_users_file_at_the_npz_survives_byte_for_byte(command, ckpt, tmp_path, capsys):
    npz = tmp_path / "mine.npz"
    np.savez(npz, embeddings=np.arange(6.0))  # another program's .npz, no settings record
    before = npz.read_bytes()
    assert _run(command, ckpt, npz) == 2
    err = _one_line(capsys)
    assert f"--npz {npz} already exists and is not a batch this command wrote; pass --overwrite" in err
    assert npz.read_bytes() == before and not (tmp_path / "mine.npz.parts").exists()
    assert _run(command, ckpt, npz, "--overwrite") == 0
    assert np.load(npz)["arr_0"].shape == (4, 8, 8, 3)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_users_picture_where_the_preview_goes_survives(command, ckpt, tmp_path, capsys):
    png = tmp_path / "s.png"
    png.write_bytes(b"my holiday picture")
    assert _run(command, ckpt, tmp_path / "s.npz") == 2
    assert f"{png} (where the --npz preview goes) already exists; pass --overwrite" in _one_line(capsys)
    assert png.read_bytes() == b"my holiday picture" and not (tmp_path / "s.npz").exists()


def test_a_finished_batch_is_done_and_more_samples_are_refused(ckpt, tmp_path, capsys, monkeypatch):
    npz = tmp_path / "s.npz"
    assert _run("sample-ddp", ckpt, npz) == 0
    before = npz.read_bytes()
    capsys.readouterr()

    def no_sampling(*args, **kwargs):
        raise AssertionError("a finished batch was sampled again")

    monkeypatch.setattr("dit_trainer.sample.sampling.sample_latents", no_sampling)
    for command in COMMANDS:  # either command's batch is the other's
        assert _run(command, ckpt, npz) == 0
        assert f"{npz} already holds the 4 samples of these settings; nothing to do" in capsys.readouterr().out
    # More samples would relabel every chunk (labels depend on --num-samples): refused, not extended.
    assert main(["sample-ddp", "--ckpt", ckpt, "--npz", str(npz), *FLAGS[2:], "--num-samples", "6"]) == 2
    err = _one_line(capsys)
    assert "holds a finished batch of other settings (num_samples 4 then, 6 now)" in err
    assert "more samples are not appended" in err and "--overwrite" in err
    assert npz.read_bytes() == before and not (tmp_path / "s.npz.parts").exists()


def test_a_second_writer_of_one_npz_is_one_line(ckpt, tmp_path, capsys):
    npz = tmp_path / "s.npz"
    parts = tmp_path / "s.npz.parts"
    parts.mkdir()
    # Another sample-ddp holding the writer's lock (flock: another open file conflicts even in one process).
    fd = os.open(parts / ".writer.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert _run("sample-ddp", ckpt, npz) == 2
        err = _one_line(capsys)
        assert f"--npz {npz} is being written by another dit sample or sample-ddp right now" in err
        assert not list(parts.glob("chunk-*")) and not npz.exists()
    finally:
        os.close(fd)
    assert _run("sample-ddp", ckpt, npz) == 0 and not parts.exists()  # the holder gone, the rerun works


def test_a_users_picture_at_out_survives_until_overwrite(ckpt, tmp_path, capsys, monkeypatch):
    png = tmp_path / "photo.png"
    png.write_bytes(b"my holiday picture")
    grid = ["sample", "--ckpt", ckpt, "--out", str(png), "--class-labels", "3", *FLAGS[4:]]
    assert main(grid) == 2
    assert f"--out {png} already exists; pass another --out or --overwrite to replace it" in _one_line(capsys)
    assert png.read_bytes() == b"my holiday picture"
    # Without --out the grid goes to samples.png in the working folder: the same rule holds there.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "samples.png").write_bytes(b"older grid")
    assert main(grid[:3] + grid[5:]) == 2
    assert "--out samples.png already exists" in _one_line(capsys)
    assert (tmp_path / "samples.png").read_bytes() == b"older grid"
    assert main([*grid, "--overwrite"]) == 0
    from PIL import Image

    assert Image.open(png).size[0] > 8 and not list(tmp_path.glob("*.tmp*"))
