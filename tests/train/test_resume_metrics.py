"""A run stopped between log steps and resumed logs the losses of an uninterrupted run: the
steps since the last metrics line travel in the trainer state (flags read at once, or a step late)."""

import math

import pytest
import torch
from tests.train.trainer_helpers import tiny_config, write_npy_latents

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import read_metrics


def _cfg(tmp_path, name, mode, sharded=False, steps=8):
    data = tmp_path / "latents"
    if not data.exists():
        write_npy_latents(data, n=8)
    return tiny_config(tmp_path / name, data={"path": str(data)},
                       train={"max_steps": steps, "global_batch_size": 4},
                       checkpoint={"save_steps": 1000, "sharded": sharded},
                       logging={"log_steps": 4, "progress": False, "tensorboard": False})


class _StopAt:
    """The trainer's loader, asking for a stop while the step that draws batch `i` (0-based) runs."""

    def __init__(self, trainer, i):
        self.trainer, self.loader, self.i, self.n = trainer, trainer.build_loader(), i, 0

    def __next__(self):
        if self.n == self.i:
            self.trainer.request_stop("SIGINT")
        self.n += 1
        return next(self.loader)

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)


def _trainer(cfg, mode):
    trainer = DiTTrainer(cfg)
    trainer.update.on_device = mode == "log"  # flags read a step late, as on an accelerator
    return trainer


def _losses(out):
    return [(r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl")]


@pytest.mark.parametrize("mode, sharded", [("step", False), ("log", False), ("step", True)])
def test_a_stop_between_log_steps_then_resume_logs_the_uninterrupted_losses(tmp_path, mode, sharded):
    _trainer(_cfg(tmp_path, "ref", mode), mode).train()
    stopped = _trainer(_cfg(tmp_path, "run", mode, sharded), mode)
    stopped.loader = _StopAt(stopped, 5)  # during step 6 (log mode honours it a step later)
    stopped.train()
    assert stopped.step in (6, 7)  # between the log steps 4 and 8
    assert stopped.trainer_state()["log_window"]["steps"] == stopped.step - 4
    _trainer(_cfg(tmp_path, "run", mode, sharded), mode).train()
    assert _losses(tmp_path / "run") == _losses(tmp_path / "ref")


def test_a_checkpoint_without_the_window_resumes_as_before(tmp_path):
    run = DiTTrainer(_cfg(tmp_path, "run", "step"))
    run.loader = _StopAt(run, 5)
    run.train()
    path = ckpt.latest_checkpoint(tmp_path / "run")
    state = ckpt.load_pt(path / "trainer_state.pt")
    del state["log_window"]  # what checkpoints written before it held
    torch.save(state, path / "trainer_state.pt")
    ckpt.write_manifest(path)
    DiTTrainer(_cfg(tmp_path, "run", "step")).train()
    # The line at step 8 averages the steps run after the resume only, as before.
    losses = _losses(tmp_path / "run")
    assert [s for s, _ in losses] == [4, 8] and math.isfinite(losses[-1][1])
