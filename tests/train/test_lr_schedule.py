"""optim.lr_schedule: warmup then constant (the releases' recipes, unchanged), or cosine / linear decay to
optim.min_lr at train.max_steps, over the whole run or its last optim.decay_steps; exact on resume."""

import math
import shutil

import pytest
import torch
from tests.train.trainer_helpers import tiny_config, write_npy_latents

from dit_trainer.config import OptimConfig, build_config
from dit_trainer.errors import ConfigError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.lr_schedule import lr_factor
from dit_trainer.train.metrics import read_metrics


def optim(**keys):
    return OptimConfig(**{"lr": 1e-3, **keys})


@pytest.mark.parametrize("warmup", [0, 1, 7])
def test_constant_is_the_warmup_the_trainer_always_had(warmup):
    for step in range(30):
        want = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        assert lr_factor(step, optim(warmup_steps=warmup), 20) == want


def test_cosine_falls_from_lr_after_warmup_to_min_lr_at_the_last_step():
    o = optim(warmup_steps=10, lr_schedule="cosine", min_lr=1e-4)
    assert lr_factor(9, o, 110) == 1.0
    assert lr_factor(10, o, 110) == 1.0  # the decay starts where warmup ends
    assert lr_factor(60, o, 110) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway: half-way between lr and min_lr
    assert lr_factor(35, o, 110) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_factor(110, o, 110) == pytest.approx(0.1)
    factors = [lr_factor(s, o, 110) for s in range(10, 111)]
    assert all(a > b for a, b in zip(factors, factors[1:]))


def test_linear_decay_over_the_last_steps_only():
    o = optim(warmup_steps=5, lr_schedule="linear", decay_steps=20)
    assert [lr_factor(s, o, 100) for s in (5, 50, 80)] == [1.0, 1.0, 1.0]
    assert lr_factor(90, o, 100) == pytest.approx(0.5)
    assert lr_factor(100, o, 100) == 0.0
    # a cooldown longer than the run after warmup starts where warmup ends
    assert lr_factor(5, optim(warmup_steps=5, lr_schedule="linear", decay_steps=500), 15) == 1.0
    assert lr_factor(10, optim(warmup_steps=5, lr_schedule="linear", decay_steps=500), 15) == pytest.approx(0.5)


@pytest.mark.parametrize("keys,match", [
    ({"lr_schedule": "step"}, "optim.lr_schedule 'step' is not one of constant|cosine|linear"),
    ({"lr_schedule": "cosine", "min_lr": 1e-3}, "optim.min_lr 0.001 is not below optim.lr"),
    ({"decay_steps": -1}, "optim.decay_steps is -1"),
    ({"decay_steps": 50}, "optim.decay_steps 50 shapes a decay, but optim.lr_schedule is constant"),
    ({"min_lr": 1e-5}, "optim.min_lr 1e-05 shapes a decay, but optim.lr_schedule is constant"),
])
def test_bad_schedules_are_one_line(keys, match):
    with pytest.raises(ConfigError, match=match):
        build_config({"output_dir": "unused", "optim": {"lr": 1e-3, **keys}})


def _config(out, data):
    return tiny_config(out, data={"path": str(data)}, train={"max_steps": 8, "global_batch_size": 4},
                       optim={"lr": 1e-3, "warmup_steps": 2, "lr_schedule": "cosine", "min_lr": 1e-5},
                       checkpoint={"save_steps": 4})


def test_a_run_steps_with_the_schedule_and_resumes_on_it_exactly(tmp_path):
    data = write_npy_latents(tmp_path / "latents", n=8)
    straight = DiTTrainer(_config(tmp_path / "a", data))
    straight.train()
    logged = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "a" / "metrics.jsonl")}
    o = straight.cfg.optim
    # a logged step s reports the scheduler's lr after its update: the one optimizer step s (0-based) uses
    assert [logged[s] for s in range(1, 9)] == pytest.approx([1e-3 * lr_factor(s, o, 8) for s in range(1, 9)])
    assert logged[8] < logged[4] < logged[2]
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-00000004", tmp_path / "b" / "checkpoints" / "step-00000004")
    resumed = DiTTrainer(_config(tmp_path / "b", data))
    resumed.train()
    for (k, v), (_, w) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(v, w), k


def test_a_resume_with_a_later_end_moves_the_decay_from_its_first_step(tmp_path, capsys):
    data = write_npy_latents(tmp_path / "latents", n=8)
    DiTTrainer(_config(tmp_path / "a", data)).train()  # decayed to min_lr at its step 8
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-00000008", tmp_path / "b" / "checkpoints" / "step-00000008")
    longer = build_config(_config(tmp_path / "b", data))
    longer.train.max_steps = 16
    trainer = DiTTrainer(longer)
    assert trainer.maybe_resume() is not None
    # The next optimizer step (0-based 8) runs at the longer run's rate, not at the checkpoint's min_lr.
    want = 1e-3 * lr_factor(8, longer.optim, 16)
    assert want > 0.5e-3
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(want)
    assert "train.max_steps 8 -> 16" in capsys.readouterr().err
