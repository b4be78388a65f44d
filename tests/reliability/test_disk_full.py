"""A full disk, anywhere: one line naming the path (and the bytes a checkpoint needs), the .tmp gone,
the last checkpoint intact, a warning before a save the disk has no room for.

On a real 4 MB tmpfs where mounting works (root), else by raising the write's own error
(safetensors' "os error 28") at the write call."""

import contextlib
import errno
import os
import subprocess

import pytest
from safetensors import SafetensorError
from tests.train.trainer_helpers import run_config

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.errors import CheckpointError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import MetricsLogger


@contextlib.contextmanager
def small_disk(folder, size="4m"):
    """`folder` as a tmpfs of `size` (one tiny checkpoint is ~3 MB); yields whether it is one."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _cfg(tmp_path, out, steps):
    cfg = run_config(tmp_path, steps, keep=1)
    cfg["output_dir"] = str(out)
    return cfg


def _fill(folder):
    with open(folder / "filler", "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()


def test_disk_full_during_and_before_a_run(tmp_path, monkeypatch, capsys):
    disk = tmp_path / "disk"
    with small_disk(disk) as real:
        out = disk / "run"
        DiTTrainer(_cfg(tmp_path, out, 2)).train()
        if not real:  # the write call fails as safetensors fails on a full disk
            def full(*args, **kwargs):
                raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                                      "\"No space left on device\" })")
            monkeypatch.setattr(ckpt, "save_file", full)
        capsys.readouterr()
        with pytest.raises(CheckpointError) as err:
            DiTTrainer(_cfg(tmp_path, out, 4)).train()
        msg = str(err.value)
        assert "\n" not in msg and "No space left on device" in msg and "step-00000004.tmp" in msg
        assert "it needs about 3.0 MB" in msg and "previous checkpoint is kept" in msg
        if real:
            assert "the write will likely fail" in capsys.readouterr().err  # warned before writing
        assert not list((out / "checkpoints").glob("*.tmp"))
        assert [p.name for p in ckpt.list_checkpoints(out)] == ["step-00000002"]
        ckpt.verify_checkpoint(out / "checkpoints" / "step-00000002")
        if real:  # full before the run starts: the first write (config.yaml) is one line too
            monkeypatch.undo()
            _fill(disk)
            with pytest.raises(CheckpointError, match="No space left on device") as err:
                DiTTrainer(_cfg(tmp_path, out, 4)).train()
            assert "\n" not in str(err.value) and str(out) in str(err.value)
            ckpt.verify_checkpoint(out / "checkpoints" / "step-00000002")


def test_disk_full_writing_metrics_is_one_line(tmp_path, monkeypatch):
    DiTTrainer(run_config(tmp_path, 2, keep=0)).train()

    def full(self, step, values):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    monkeypatch.setattr(MetricsLogger, "log", full)
    with pytest.raises(CheckpointError) as err:
        DiTTrainer(run_config(tmp_path, 4, keep=0)).train()
    msg = str(err.value)
    assert "\n" not in msg and "metrics.jsonl: No space left on device" in msg and "step-00000002 is intact" in msg


def test_low_space_warns_before_the_save(tmp_path, monkeypatch, capsys):
    DiTTrainer(run_config(tmp_path, 2, keep=0)).train()
    monkeypatch.setattr("dit_trainer.fs.free_bytes", lambda path: 1000)
    capsys.readouterr()
    DiTTrainer(run_config(tmp_path, 4, keep=0)).train()  # the disk is not really full: the save works
    err = capsys.readouterr().err
    assert "1.0 kB free" in err and "a checkpoint takes about 3.0 MB" in err


def test_disk_full_under_any_command_is_one_line(tmp_path, monkeypatch, capsys):
    """A sample grid, an .npz or a converted folder that cannot be written: the CLI says which, in one line."""
    from dit_trainer.cli import main
    from dit_trainer.evaluate import evaluator

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "ref.npz"))

    monkeypatch.setattr(evaluator, "reference_from_images", full)
    (tmp_path / "images").mkdir()
    assert main(["eval", "--ref-from-images", str(tmp_path / "images"), "--out", str(tmp_path / "ref.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{tmp_path / 'ref.npz'}: No space left on device" in err
