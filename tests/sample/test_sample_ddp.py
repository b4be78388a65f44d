"""`dit sample-ddp`: the same FID batch on 1 and 2 processes, resumable chunk by chunk."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from dit_trainer.checkpoint import save_checkpoint
from dit_trainer.cli import main
from dit_trainer.config import config_from_dict
from dit_trainer.models import get_spec
from dit_trainer.sample.ddp import chunk_labels


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    cfg = config_from_dict({"model": {"name": "SiT-S/4", "input_size": 8, "in_channels": 1, "num_classes": 4,
                                      "depth": 1, "hidden_size": 32, "num_heads": 2, "learn_sigma": False},
                            "objective": "transport", "data": {"path": "digits"}})
    torch.manual_seed(0)
    model = get_spec(cfg.model.name).build_model_fn(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    files = {"ema.safetensors": model.state_dict(), "model.safetensors": model.state_dict(),
             "config.yaml": yaml.safe_dump(cfg.to_dict(), sort_keys=False)}
    return save_checkpoint(tmp_path_factory.mktemp("ddp") / "run", 1, files)


ARGS = ["--num-samples", "10", "--batch-size", "3", "--sampler", "ode", "--ode-method", "euler", "--steps", "4",
        "--seed", "7", "--device", "cpu", "--no-progress"]


def test_labels_cover_classes_uniformly():
    labels = chunk_labels(40, 4, seed=3)
    assert np.bincount(labels).tolist() == [10, 10, 10, 10]
    assert not np.array_equal(labels, chunk_labels(40, 4, seed=4))


def test_one_process_then_resume(ckpt, tmp_path, monkeypatch, capsys):
    import dit_trainer.sample.ddp as ddp

    out = tmp_path / "s.npz"
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(out), *ARGS]) == 0
    data = np.load(out)
    assert data["arr_0"].shape == (10, 8, 8, 3) and data["arr_0"].dtype == np.uint8
    settings = json.loads(str(data["settings"]))
    assert settings["sampler"] == "ode" and settings["ode_method"] == "euler" and settings["cfg_scale"] == 4.0
    assert (tmp_path / "s.png").is_file()
    # The chunks served resuming only: the finished .npz holds them all.
    assert not (tmp_path / "s.npz.parts").exists()
    # An interrupted run (stopped after 2 of 4 chunks); the rerun samples the rest, to the same images.
    first = data["arr_0"].copy()
    save, saved = ddp._save_chunk, []

    def stop_after_two(path, images, labels):
        if len(saved) == 2:
            raise KeyboardInterrupt
        saved.append(path.name)
        save(path, images, labels)

    monkeypatch.setattr(ddp, "_save_chunk", stop_after_two)
    again = tmp_path / "again.npz"
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(again), *ARGS]) == 130  # Ctrl-C
    monkeypatch.setattr(ddp, "_save_chunk", save)
    assert sorted(p.name for p in (tmp_path / "again.npz.parts").glob("chunk-*")) == saved
    # Other settings over the same chunks are refused, not mixed in, and the error names what differs.
    capsys.readouterr()
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(again), *ARGS[:1], "14", *ARGS[2:]]) == 2
    err = capsys.readouterr().err
    assert "num_samples 10 then, 14 now" in err and "cfg_scale" not in err and "\n" not in err.strip()
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(again), *ARGS]) == 0
    assert np.array_equal(np.load(again)["arr_0"], first) and not (tmp_path / "again.npz.parts").exists()


@pytest.mark.distributed
def test_two_processes_write_what_one_does(ckpt, tmp_path):
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(one), *ARGS]) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "dit_trainer",
           "sample-ddp", "--ckpt", str(ckpt), "--npz", str(two), *ARGS]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    a, b = np.load(one), np.load(two)
    assert np.array_equal(a["arr_0"], b["arr_0"]) and np.array_equal(a["arr_1"], b["arr_1"])
