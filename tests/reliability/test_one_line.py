"""Every traceback the probe found is one line with exit 2, before any work is lost; values that
were accepted although wrong are refused; a second Ctrl-C and a stopped demo end as they should."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest
import yaml
from tests.data.test_shards import make_shards
from tests.reliability.helpers import train
from tests.train.trainer_helpers import run_config

from dit_trainer.cli import main
from dit_trainer.train.signals import StopSignals


def _dit(capsys, *argv):
    """(exit code, stderr) of `dit ARGV` in this process."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err.strip()


def _one_line(rc, err, needle):
    assert rc == 2 and err.count("\n") == 0 and "Traceback" not in err and needle in err, err


def _config(tmp_path, **sections):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(run_config(tmp_path, 2, keep=0, **sections)))
    return path


@pytest.mark.parametrize("flags,needle", [
    (["--train.seed", "99999999999999999999"], "train.seed is 99999999999999999999"),
    (["--output_dir", ""], "output_dir is empty"),
    (["--checkpoint.on_existing", "delete"], "checkpoint.on_existing 'delete' is not one of"),
    (["--train.grad_accum_steps", "3", "--train.global_batch_size", "4"], "train.grad_accum_steps 3"),
])
def test_train_values(tmp_path, capsys, flags, needle):
    _one_line(*_dit(capsys, "train", "--config", _config(tmp_path), *flags), needle)
    assert not (tmp_path / "run").exists()  # refused before anything was written (config.yaml too)


def test_random_bytes_as_config(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_bytes(bytes([0xF0, 0x28, 0x8C, 0x28]) * 64)
    _one_line(*_dit(capsys, "train", "--config", path), "is not text")


def test_metrics_that_is_a_folder(tmp_path, capsys):
    (tmp_path / "run" / "metrics.jsonl").mkdir(parents=True)
    _one_line(*_dit(capsys, "train", "--config", _config(tmp_path)), "metrics.jsonl (the run's metrics) is a folder")


def test_shard_manifest_with_a_word_for_image_size(tmp_path, capsys):
    make_shards(tmp_path / "shards")
    manifest = tmp_path / "shards" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "image_size": "big"}))
    cfg = run_config(tmp_path, 2, keep=0)
    cfg["data"]["path"] = str(tmp_path / "shards")
    for key in ("in_channels", "input_size", "num_classes"):  # the shards' manifest says them
        del cfg["model"][key]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    _one_line(*_dit(capsys, "train", "--config", tmp_path / "c.yaml"), "image_size 'big' is not a positive integer")


@pytest.mark.parametrize("out,needle", [
    ("x.txt", "the ending .txt is not one of .png"), (".", "is a folder; name a file in it"),
    ("c.yaml/x.png", "c.yaml is a file, not a folder"),
])
def test_sample_out_is_checked_before_sampling(tmp_path, capsys, monkeypatch, out, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("")
    # The checkpoint does not even exist: the --out error comes first, before minutes of sampling.
    _one_line(*_dit(capsys, "sample", "--ckpt", "nothing-here", "--out", out), needle)
    _one_line(*_dit(capsys, "sample-ddp", "--ckpt", "nothing-here", "--npz", "samples.txt"), "the ending .txt")


def test_convert_to_a_file_or_onto_its_source(tmp_path, capsys):
    train(tmp_path, 2)
    run, file = tmp_path / "run", tmp_path / "file.txt"
    file.write_text("mine")
    _one_line(*_dit(capsys, "convert", "--from", "ours", run, "--to", "ours", file), "is a file; pass a folder")
    _one_line(*_dit(capsys, "convert", "--from", "ours", run, "--to", "ours", run), "is SRC")
    _one_line(*_dit(capsys, "convert", "--from", "ours", run, "--to", "ours", run / "export"), "overlaps SRC")
    assert file.read_text() == "mine" and not (run / "ema.safetensors").exists()


def test_eval_object_statistics_and_zero_batch(tmp_path, capsys):
    samples, ref = tmp_path / "s.npz", tmp_path / "ref.npz"
    np.savez(samples, arr_0=np.zeros((12, 8, 8, 3), np.uint8))
    np.savez(ref, mu=np.zeros(4, dtype=object), sigma=np.zeros((4, 4)), mu_s=np.zeros(4), sigma_s=np.zeros((4, 4)))
    _one_line(*_dit(capsys, "eval", "--samples", samples, "--ref", ref, "--network", "digits"),
              "holds Python objects (object), which are never unpickled")
    _one_line(*_dit(capsys, "eval", "--samples", samples, "--ref", "digits", "--network", "digits", "--batch-size", "0"),
              "--batch-size is 0")


def test_two_ctrl_c_arriving_together_stop_at_once():
    """Both signals land while the main thread is inside one long C call: Python runs the handler once."""
    import hashlib

    data = bytes(300_000_000)  # one digest takes longer than the gap between the two signals

    def send_two():
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        with StopSignals() as stop:
            threading.Thread(target=send_two, daemon=True).start()
            for _ in range(400):
                hashlib.sha256(data).digest()  # holds no Python bytecode between the two signals
                if stop.requested:
                    time.sleep(0.5)  # a single Ctrl-C would end here, after the step
                    break


def test_stopped_demo_exits_saying_how_to_resume(tmp_path, capsys, monkeypatch):
    from dit_trainer.train import DiTTrainer

    queue_step = DiTTrainer.queue_step

    def sigterm_at_step_3(self, batch):
        if self.step == 2:
            self.request_stop("SIGTERM")  # what the SIGTERM handler does
        return queue_step(self, batch)

    monkeypatch.setattr(DiTTrainer, "queue_step", sigterm_at_step_3)
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), "--steps", "60", "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0 and "stopped at step 3 of 60" in printed and "rerun the same dit demo command" in printed
    assert (out / "checkpoints" / "step-00000003").is_dir() and not (out / "samples.png").exists()
