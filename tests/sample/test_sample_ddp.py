"""`dit sample-ddp`: the same FID batch on 1 and 2 processes, resumable chunk by chunk."""

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from dit_trainer.checkpoint import save_checkpoint
from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.models import get_spec


def _files(seed=0):
    cfg = build_config({"model": {"name": "SiT-S/4", "input_size": 8, "in_channels": 1, "num_classes": 4,
                                      "depth": 1, "hidden_size": 32, "num_heads": 2, "learn_sigma": False},
                            "objective": "transport", "data": {"path": "digits"}})
    torch.manual_seed(seed)
    model = get_spec(cfg.model.name).build_model_fn(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return {"ema.safetensors": model.state_dict(), "model.safetensors": model.state_dict(),
            "config.yaml": yaml.safe_dump(cfg.to_dict(), sort_keys=False)}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("ddp") / "run", 1, _files())


ARGS = ["--num-samples", "10", "--batch-size", "3", "--sampler", "ode", "--ode-method", "euler", "--steps", "4",
        "--seed", "7", "--device", "cpu", "--no-progress"]


def test_one_process_then_resume(ckpt, tmp_path, monkeypatch, capsys):
    import dit_trainer.sample.fid_batch as writer

    out = tmp_path / "s.npz"
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(out), *ARGS]) == 0
    data = np.load(out)
    assert data["arr_0"].shape == (10, 8, 8, 3) and data["arr_0"].dtype == np.uint8
    settings = json.loads(str(data["settings"]))
    assert settings["sampler"] == "ode" and settings["ode_method"] == "euler" and settings["cfg_scale"] == 1.5
    assert (tmp_path / "s.png").is_file()  # 1.5 above: sample_ddp.py's default guidance, not sample.py's 4.0
    # The chunks served resuming only: the finished .npz holds them all.
    assert not (tmp_path / "s.npz.parts").exists()
    # An interrupted run (stopped after 2 of 4 chunks); the rerun samples the rest, to the same images.
    first = data["arr_0"].copy()
    save, saved = writer._save_chunk, []

    def stop_after_two(path, *chunk):
        if len(saved) == 2:
            raise KeyboardInterrupt
        saved.append(path.name)
        save(path, *chunk)

    monkeypatch.setattr(writer, "_save_chunk", stop_after_two)
    again = tmp_path / "again.npz"
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(again), *ARGS]) == 130  # Ctrl-C
    monkeypatch.setattr(writer, "_save_chunk", save)
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


def _interrupt(monkeypatch, argv, after=1):
    """Run sample-ddp with `argv` and stop it (Ctrl-C) after `after` chunks, as a killed FID run would be."""
    import dit_trainer.sample.fid_batch as writer

    save, saved = writer._save_chunk, []

    def stop(path, *chunk):
        if len(saved) == after:
            raise KeyboardInterrupt
        saved.append(path.name)
        save(path, *chunk)

    monkeypatch.setattr(writer, "_save_chunk", stop)
    assert main(["sample-ddp", *argv]) == 130
    monkeypatch.setattr(writer, "_save_chunk", save)


def test_resume_checks_the_checkpoint_a_run_folder_resolved_to(tmp_path, monkeypatch, capsys):
    # Sampling a live run: the run saves a newer checkpoint between the interrupted run and its rerun.
    monkeypatch.chdir(tmp_path)
    first = save_checkpoint(tmp_path / "run", 1, _files())
    _interrupt(monkeypatch, ["--ckpt", "./run", "--npz", "s.npz", *ARGS])
    assert json.loads((tmp_path / "s.npz.parts" / "settings.json").read_text())["ckpt"] == str(first.resolve())
    capsys.readouterr()
    assert main(["sample-ddp", "--ckpt", "run", "--npz", "s.npz", *ARGS, "--weights", "model"]) == 2
    assert "weights 'ema' then, 'model' now" in capsys.readouterr().err
    newer = save_checkpoint(tmp_path / "run", 2, _files(seed=1))
    assert main(["sample-ddp", "--ckpt", "run", "--npz", "s.npz", *ARGS]) == 2
    err = capsys.readouterr().err.strip()
    assert f"sampled from {first.resolve()}, but --ckpt run is now {newer.resolve()}" in err and "\n" not in err
    # The same checkpoint spelt otherwise (relative step folder, absolute) finishes the run, as one run would.
    assert main(["sample-ddp", "--ckpt", "run/checkpoints/step-00000001", "--npz", "s.npz", *ARGS]) == 0
    assert main(["sample-ddp", "--ckpt", str(first.resolve()), "--npz", "ref.npz", *ARGS]) == 0
    assert np.array_equal(np.load("s.npz")["arr_0"], np.load("ref.npz")["arr_0"])
    assert json.loads(str(np.load("s.npz")["settings"]))["ckpt"] == str(first.resolve())


def test_weights_model_of_a_sharded_checkpoint_samples_the_training_weights(tmp_path):
    from dit_trainer.checkpoint import begin_checkpoint, commit_checkpoint
    from dit_trainer.checkpoint.files import write_manifest
    from dit_trainer.checkpoint.sharded import save_sharded

    trained, averaged = _files(seed=1), _files(seed=2)
    full = save_checkpoint(tmp_path / "full", 1, {**averaged, "model.safetensors": trained["model.safetensors"]})
    # What a sharded run writes: dcp/ (model, EMA), ema.safetensors and config.yaml, no model.safetensors.
    model = get_spec("SiT-S/4").build_model_fn(build_config(yaml.safe_load(trained["config.yaml"])))
    model.load_state_dict(trained["model.safetensors"])
    tmp = begin_checkpoint(tmp_path / "sharded", 1)
    save_sharded(tmp / "dcp", model, ema=argparse.Namespace(state_dict=lambda: averaged["ema.safetensors"]))
    save_file(averaged["ema.safetensors"], str(tmp / "ema.safetensors"))
    (tmp / "config.yaml").write_text(trained["config.yaml"])
    write_manifest(tmp)
    commit_checkpoint(tmp)
    out = {}
    for name, ckpt, weights in [("full", full, "model"), ("sharded", tmp_path / "sharded", "model"),
                                ("ema", tmp_path / "sharded", "ema")]:
        assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(tmp_path / f"{name}.npz"), *ARGS,
                     "--weights", weights]) == 0
        out[name] = np.load(tmp_path / f"{name}.npz")["arr_0"]
    assert np.array_equal(out["sharded"], out["full"]) and not np.array_equal(out["sharded"], out["ema"])


def test_resume_refuses_a_checkpoint_written_again(tmp_path, monkeypatch, capsys):
    # A run restarted into the same output_dir writes step-00000001 again, with other weights.
    step = save_checkpoint(tmp_path / "run", 1, _files())
    argv = ["--ckpt", str(step), "--npz", str(tmp_path / "s.npz"), *ARGS]
    _interrupt(monkeypatch, argv)
    save_checkpoint(tmp_path / "run", 1, _files(seed=1))
    capsys.readouterr()
    assert main(["sample-ddp", *argv]) == 2
    assert "before it was rewritten (its manifest.json differs)" in capsys.readouterr().err


def _old_record(parts, ckpt):
    """A settings.json as dit-trainer wrote it before it recorded the resolved checkpoint and sampling flags."""
    parts.mkdir()
    (parts / "settings.json").write_text(json.dumps({"ckpt": str(ckpt), "model": "SiT-S/4", "sampler": "ode"}))


def test_chunks_of_the_old_record_format_are_refused_in_one_line(ckpt, tmp_path, capsys):
    _old_record(tmp_path / "s.npz.parts", ckpt)
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(tmp_path / "s.npz"), *ARGS]) == 2
    err = capsys.readouterr().err.strip()
    assert "by an older dit-trainer" in err and f"delete {tmp_path / 's.npz.parts'}" in err and "\n" not in err


@pytest.mark.distributed
def test_refused_resume_is_one_line_on_every_rank(ckpt, tmp_path):
    _old_record(tmp_path / "s.npz.parts", ckpt)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "dit_trainer",
           "sample-ddp", "--ckpt", str(ckpt), "--npz", str(tmp_path / "s.npz"), *ARGS]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    workers = [line for line in proc.stderr.splitlines() if "dit sample-ddp: error:" in line]
    # Both ranks decide together; torchrun may stop rank 1 once rank 0 has exited, but no rank waits on a dead peer.
    assert proc.returncode != 0 and 1 <= len(workers) <= 2, proc.stderr[-3000:]
    assert all("by an older dit-trainer" in line for line in workers)
    assert "[rank1]" not in proc.stderr and "Connection closed" not in proc.stderr, proc.stderr[-3000:]


def test_a_guide_weight_without_a_guide_is_refused_not_ignored(ckpt, tmp_path, capsys):
    out = tmp_path / "s.npz"
    assert main(["sample-ddp", "--ckpt", str(ckpt), "--npz", str(out), *ARGS, "--guide-scale", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dit sample-ddp: error: --guide-scale 2 needs a guide") and "\n" not in err
    assert not out.exists() and not (tmp_path / "s.npz.parts").exists()


def test_the_process_group_waits_the_runs_parallel_timeout(ckpt, tmp_path, monkeypatch):
    import datetime

    import dit_trainer.parallel.process_group as group
    from dit_trainer.sample import ddp

    args = argparse.Namespace(ckpt=str(ckpt), timeout=None)
    assert ddp._timeout(args) == datetime.timedelta(seconds=600)  # the run's parallel.timeout (its default here)
    slow = save_checkpoint(tmp_path / "slow", 1, {**_files(), "config.yaml": yaml.safe_dump(
        {**yaml.safe_load(_files()["config.yaml"]), "parallel": {"timeout": 5400.0}})})
    assert ddp._timeout(argparse.Namespace(ckpt=str(slow), timeout=None)) == datetime.timedelta(seconds=5400)
    assert ddp._timeout(argparse.Namespace(ckpt=str(slow), timeout=30.0)) == datetime.timedelta(seconds=30)
    joined = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(group, "init_process_group", lambda backend, timeout=None: joined.append(timeout))
    ddp._dist(datetime.timedelta(seconds=5400))  # torchrun's launch: the group gets the timeout
    assert joined == [datetime.timedelta(seconds=5400)]
