"""What `dit train` does with an output_dir that already holds a run, and with faults while it runs:
resume false over an old run, changed optimizer values, metrics.jsonl after a kill, a finished run,
divergence, a full disk and an unwritable output_dir."""

import json
import os

import pytest
import torch
from tests.train.trainer_helpers import run_config

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.checkpoint import list_checkpoints
from dit_trainer.errors import CheckpointError, DivergenceError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import read_metrics


def _cfg(tmp_path, steps, **sections):
    return run_config(tmp_path, steps, keep=2, **sections)


def _steps(tmp_path):
    return [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]


def test_resume_false_over_old_run_refuses_and_deletes_nothing(tmp_path):
    DiTTrainer(_cfg(tmp_path, 6)).train()
    before = sorted(p.name for p in list_checkpoints(tmp_path / "run"))
    with pytest.raises(CheckpointError, match="already holds a run") as err:
        DiTTrainer(_cfg(tmp_path, 2, checkpoint={"resume": False})).train()
    assert "\n" not in str(err.value) and "on_existing" in str(err.value)
    assert sorted(p.name for p in list_checkpoints(tmp_path / "run")) == before


def test_resume_false_archive_keeps_new_runs_checkpoints(tmp_path):
    DiTTrainer(_cfg(tmp_path, 6)).train()  # old run: step-4, step-6 kept
    cfg = _cfg(tmp_path, 4, checkpoint={"resume": False, "on_existing": "archive", "save_steps": 2, "save_total_limit": 2})
    DiTTrainer(cfg).train()
    # Rotation must not prefer the old run's higher step numbers over the new run's checkpoints.
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-00000002", "step-00000004"]
    assert _steps(tmp_path) == [1, 2, 3, 4]  # no metrics of the old run
    archived = [p for p in tmp_path.iterdir() if p.name.startswith("run.archived-")]
    assert len(archived) == 1
    assert [p.name for p in list_checkpoints(archived[0])] == ["step-00000004", "step-00000006"]
    assert [r["step"] for r in read_metrics(archived[0] / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


def test_resume_false_overwrite(tmp_path):
    DiTTrainer(_cfg(tmp_path, 6)).train()
    DiTTrainer(_cfg(tmp_path, 2, checkpoint={"resume": False, "on_existing": "overwrite", "save_steps": 2})).train()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-00000002"]
    assert _steps(tmp_path) == [1, 2]


def test_changed_optimizer_values_win_on_resume(tmp_path, capsys):
    DiTTrainer(_cfg(tmp_path, 2, optim={"lr": 1e-3, "weight_decay": 0.0})).train()
    trainer = DiTTrainer(_cfg(tmp_path, 3, optim={"lr": 2e-4, "weight_decay": 0.05, "beta2": 0.99}))
    trainer.loader = trainer.build_loader()
    trainer.maybe_resume()
    group = trainer.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(2e-4) and group["weight_decay"] == 0.05 and group["betas"] == (0.9, 0.99)
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(2e-4)
    err = capsys.readouterr().err
    assert "optim.lr 0.001 -> 0.0002" in err and "optim.weight_decay" in err
    trainer.train()
    assert trainer.step == 3 and read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["lr"] == pytest.approx(2e-4)


def test_half_written_metrics_line_does_not_block_resume(tmp_path):
    DiTTrainer(_cfg(tmp_path, 2)).train()
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 0.9')  # killed mid-write
    DiTTrainer(_cfg(tmp_path, 4)).train()
    assert _steps(tmp_path) == [1, 2, 3, 4]


def test_kill_before_first_checkpoint_leaves_no_duplicate_steps(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 3)))
    DiTTrainer(_cfg(tmp_path, 4, checkpoint={"save_steps": 100})).train()
    assert _steps(tmp_path) == [1, 2, 3, 4]


def test_rerunning_a_finished_run_says_so(tmp_path, capsys):
    DiTTrainer(_cfg(tmp_path, 2)).train()
    capsys.readouterr()
    assert DiTTrainer(_cfg(tmp_path, 2)).train() == {}
    assert "is finished" in capsys.readouterr().out
    assert _steps(tmp_path) == [1, 2]


def test_nonfinite_loss_stops_before_the_update(tmp_path):
    trainer = DiTTrainer(_cfg(tmp_path, 4))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    x = torch.randn(4, 4, 8, 8)
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(DivergenceError, match="not applied") as err:
        trainer.train_step((x, torch.arange(4)))
    assert "\n" not in str(err.value) and trainer.step == 0
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in before.items())


def test_nonfinite_step_skipped_by_flag(tmp_path):
    trainer = DiTTrainer(_cfg(tmp_path, 4, train={"skip_nonfinite_steps": True}))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    x = torch.randn(4, 4, 8, 8)
    x[0, 0, 0, 0] = float("inf")
    out = trainer.train_step((x, torch.arange(4)))
    assert out["skipped"] and trainer.step == 1 and trainer.skipped_steps == 1
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in before.items())
    assert trainer.trainer_state()["skipped_steps"] == 1
    assert not trainer.train_step((torch.randn(4, 4, 8, 8), torch.arange(4))).get("skipped")


@pytest.mark.parametrize("fault", ["enospc", "torch_enforce"])
def test_disk_full_is_one_line_and_keeps_previous(tmp_path, monkeypatch, fault):
    DiTTrainer(_cfg(tmp_path, 2)).train()

    def full(*args, **kwargs):
        if fault == "enospc":
            raise OSError(28, os.strerror(28), str(tmp_path / "run" / "checkpoints" / "step-00000004.tmp" / "optimizer.pt"))
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0\n"
                           "PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(CheckpointError) as err:
        DiTTrainer(_cfg(tmp_path, 4)).train()
    msg = str(err.value)
    assert "\n" not in msg and "step-00000004.tmp" in msg
    assert ("No space left on device" if fault == "enospc" else "file write failed") in msg
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp"))
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-00000002"]
    ckpt.verify_checkpoint(tmp_path / "run" / "checkpoints" / "step-00000002")


def test_unwritable_output_dir_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    cfg = _cfg(tmp_path, 2)
    cfg["output_dir"] = str(tmp_path / "afile" / "run")  # a path under a file: cannot be created, even as root
    with pytest.raises(CheckpointError, match="afile/run is not writable") as err:
        DiTTrainer(cfg).train()
    assert "\n" not in str(err.value)


def test_disk_full_sharded_checkpoint(tmp_path, monkeypatch):
    from dit_trainer.checkpoint import sharded

    DiTTrainer(_cfg(tmp_path, 2, checkpoint={"save_steps": 2, "sharded": True})).train()

    def full(path, *args, **kwargs):
        raise OSError(28, os.strerror(28), str(path))

    monkeypatch.setattr(sharded, "export_safetensors", full)
    with pytest.raises(CheckpointError, match="No space left on device") as err:
        DiTTrainer(_cfg(tmp_path, 4, checkpoint={"save_steps": 2, "sharded": True})).train()
    assert "\n" not in str(err.value) and "step-00000004.tmp" in str(err.value)
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp"))
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-00000002"]


def test_cli_resume_false_over_old_run_is_one_line(tmp_path, capsys):
    import yaml

    from dit_trainer.cli import main

    DiTTrainer(_cfg(tmp_path, 2)).train()
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(_cfg(tmp_path, 2)))
    capsys.readouterr()
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--checkpoint.resume", "false"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dit train: error:") and "already holds a run" in err and "\n" not in err
    assert main(["train", "--config", str(tmp_path / "c.yaml")]) == 0
    assert "is finished" in capsys.readouterr().out
