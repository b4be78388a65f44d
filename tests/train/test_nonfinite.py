"""A non-finite step: the error says which of loss and grad norm it was, metrics.jsonl stays strict
JSON (null for NaN), and a run that skipped steps says how many at its end."""

import json

import pytest
import torch
from tests.train.trainer_helpers import tiny_config, write_npy_latents

from dit_trainer.errors import DivergenceError
from dit_trainer.train import DiTTrainer


def _trainer(tmp_path, mode="step", **train):
    data = tmp_path / "latents"
    if not data.exists():
        write_npy_latents(data, n=8)
    cfg = tiny_config(tmp_path / mode, data={"path": str(data)},
                      train={"max_steps": 3, "global_batch_size": 4, **train})
    trainer = DiTTrainer(cfg)
    trainer.update.on_device = mode == "log"  # flags read a step late, as on an accelerator
    # A finite loss with an overflowing gradient, as --optim.lr 1e12 gave (loss 9.2e+22, grad norm inf).
    trainer.update.clip_fn = lambda max_norm: torch.tensor(float("inf"))
    return trainer


@pytest.mark.parametrize("mode,needle", [("step", "non-finite grad norm inf (loss "), ("log", "non-finite grad norm at")])
def test_error_names_the_grad_norm_not_the_finite_loss(tmp_path, mode, needle):
    with pytest.raises(DivergenceError) as err:
        _trainer(tmp_path, mode).train()
    assert needle in str(err.value) and "non-finite loss" not in str(err.value)


def test_skipped_steps_are_null_in_metrics_and_counted_at_the_end(tmp_path, capsys):
    _trainer(tmp_path, skip_nonfinite_steps=True).train()

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    lines = (tmp_path / "step" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=refuse) for line in lines]
    assert [r["loss"] for r in records] == [None, None, None] and records[-1]["skipped_steps"] == 3
    assert "3 of 3 steps were skipped" in capsys.readouterr().err
