"""A run's `sample:` section works on any run of its config: `dit train --config configs/demo_digits.yaml` of
another length, then `dit sample-ddp --ckpt RUN` with nothing else: the post-hoc EMA folders it names (the main
model's at the last step, the guide's at the snapshot nearest half the run) are rebuilt from the run's snapshots
on demand, exactly as `dit ema` writes them, and kept."""

import contextlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from dit_trainer.cli import main

ROOT = Path(__file__).resolve().parents[2]
# The demo's config at a length of its own (5 steps, a snapshot every 2: half the run, 2.5, is no snapshot step),
# shrunk to a one-block model.
TINY = ["--train.max_steps", "5", "--train.phema_every", "2", "--model.depth", "1", "--model.hidden_size", "32",
        "--model.num_heads", "2", "--train.global_batch_size", "8", "--logging.progress", "false"]


def _sample(run, npz, capsys):
    code = main(["sample-ddp", "--ckpt", str(run), "--npz", str(npz), "--num-samples", "4", "--batch-size", "4",
                 "--device", "cpu", "--no-progress"])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """(run folder, its first samples .npz, what that sample-ddp printed on stderr): trained, then sampled once."""
    tmp = tmp_path_factory.mktemp("any_run")
    run = tmp / "run"
    assert main(["train", "--config", str(ROOT / "configs" / "demo_digits.yaml"), "--output_dir", str(run), *TINY]) == 0
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # a module-scoped fixture has no capsys
        code = main(["sample-ddp", "--ckpt", str(run), "--npz", str(tmp / "s.npz"), "--num-samples", "4",
                     "--batch-size", "4", "--device", "cpu", "--no-progress"])
    assert code == 0, err.getvalue()
    return run, tmp / "s.npz", err.getvalue()


def test_sample_ddp_takes_the_recommendation_with_no_other_command(sampled):
    run, npz, err = sampled
    with np.load(npz) as f:
        settings = json.loads(str(f["settings"]))
        assert f["arr_0"].shape == (4, 16, 16, 3)
    assert settings["ckpt"] == str(run.resolve() / "phema" / "std0.050-step00000005")
    assert settings["guide"] == str(run.resolve() / "phema" / "std0.100-step00000002")  # 2.5: 2 and 4 lie 0.5 and 1.5 off
    assert (settings["cfg_scale"], settings["guide_scale"], settings["steps"]) == (1.1, 2.0, 9)
    assert err.count("rebuilt the post-hoc EMA") == 2


def test_the_rebuilt_folders_are_what_dit_ema_writes(sampled, tmp_path):
    run = sampled[0]
    for std, step in ((0.05, 5), (0.1, 2)):
        assert main(["ema", str(run), "--std", str(std), "--at", str(step), "--out", str(tmp_path)]) == 0
        name = f"std{std:.3f}-step{step:08d}"
        for file in ("ema.safetensors", "phema.json", "config.yaml", "manifest.json"):
            assert (tmp_path / name / file).read_bytes() == (run / "phema" / name / file).read_bytes(), (name, file)


def test_a_rebuilt_folder_is_kept_until_its_snapshots_change(sampled, tmp_path, capsys):
    run = sampled[0]
    code, err = _sample(run, tmp_path / "again.npz", capsys)
    assert code == 0 and "rebuilt" not in err
    # A snapshot rewritten since (a run resumed from an earlier step writes its own): what was made from it is stale.
    snapshot = run / "phema" / "snapshot-00000004.safetensors"
    stat = snapshot.stat()
    os.utime(snapshot, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    code, err = _sample(run, tmp_path / "third.npz", capsys)
    assert code == 0 and err.count("rebuilt the post-hoc EMA") == 1 and "std0.050-step00000005" in err


@pytest.mark.distributed
def test_under_torchrun_rank_0_rebuilds_while_the_other_waits(sampled, tmp_path):
    import shutil
    import subprocess
    import sys

    run = tmp_path / "run"  # the run as trained: snapshots only, nothing rebuilt yet
    shutil.copytree(sampled[0], run, ignore=shutil.ignore_patterns("std*"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "dit_trainer",
           "sample-ddp", "--ckpt", str(run), "--npz", str(tmp_path / "two.npz"), "--num-samples", "4", "--batch-size",
           "2", "--device", "cpu", "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stderr.count("rebuilt the post-hoc EMA") == 2  # each folder once, by one rank
    one_process = tmp_path / "one.npz"
    assert main(["sample-ddp", "--ckpt", str(run), "--npz", str(one_process), "--num-samples", "4", "--batch-size",
                 "2", "--device", "cpu", "--no-progress"]) == 0
    with np.load(one_process) as one, np.load(tmp_path / "two.npz") as two:
        assert np.array_equal(one["arr_0"], two["arr_0"])
