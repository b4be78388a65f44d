"""The guarded update: where a bad step is masked on the device and its flags read a step later (an
accelerator with the fused AdamW), training computes what reading them at once computes: the same
losses and weights, a divergence raised with the weights of the step before it, skipped steps
counted, a stop request honoured a step later. On a CPU the fused AdamW takes the same mask, so
the late path runs here with `update.on_device` set."""

import pytest
import torch
from tests.train.trainer_helpers import tiny_config, write_npy_latents

from dit_trainer.errors import DivergenceError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.update import masks_on_device
from dit_trainer.train.metrics import read_metrics


def _cfg(tmp_path, name, mode, steps=6, **train):
    data = tmp_path / "latents"
    if not data.exists():
        write_npy_latents(data, n=8)
    return tiny_config(tmp_path / name, data={"path": str(data)},
                       train={"max_steps": steps, "global_batch_size": 4, **train},
                       optim={"max_grad_norm": 1.0}, logging={"log_steps": 2, "progress": False, "tensorboard": False})


class _Batches:
    """A loader of fixed batches; `on_next(i)` runs before the i-th (0-based) is handed out."""

    def __init__(self, batches, on_next=None):
        self.batches, self.i, self.on_next = batches, 0, on_next

    def __next__(self):
        if self.on_next:
            self.on_next(self.i)
        self.i += 1
        return self.batches[self.i - 1]

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _batches(n, bad=None, value=float("nan")):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x = torch.randn(4, 4, 8, 8, generator=g)
        if i == bad:
            x[1, 0, 0, 0] = value
        out.append((x, torch.arange(4)))
    return out


def _run(cfg, batches, mode, on_next=None):
    trainer = DiTTrainer(cfg)
    trainer.update.on_device = mode == "log"
    trainer.loader = _Batches(batches, on_next)
    return trainer, trainer.train


def test_flags_are_read_late_only_where_the_device_can_mask_a_step(tmp_path):
    trainer = DiTTrainer(_cfg(tmp_path, "a", "step"))
    assert trainer.update.on_device is False  # a CPU: the host reads them at once

    class Loop:
        param_groups = [{"fused": None}]

    assert not masks_on_device(torch.device("cuda"), Loop(), None)
    assert masks_on_device(torch.device("cuda"), trainer.optimizer, None)
    assert not masks_on_device(torch.device("cuda"), trainer.optimizer, scaler=object())


def test_log_mode_logs_the_losses_and_trains_the_weights_of_step_mode(tmp_path):
    batches = _batches(6)
    runs = {}
    for mode in ("step", "log"):
        trainer, train = _run(_cfg(tmp_path, mode, mode), batches, mode)
        train()
        runs[mode] = trainer, read_metrics(tmp_path / mode / "metrics.jsonl")
    (a, ma), (b, mb) = runs["step"], runs["log"]
    assert [r["step"] for r in ma] == [r["step"] for r in mb] == [2, 4, 6]
    for ra, rb in zip(ma, mb):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-6)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-6)
    for (k, pa), pb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(pa, pb), k
    for (k, ea), eb in zip(a.ema.named_parameters(), dict(b.ema.named_parameters()).values()):
        torch.testing.assert_close(eb, ea, rtol=1e-6, atol=1e-7, msg=k)


def test_log_mode_divergence_raises_with_the_weights_before_the_bad_step(tmp_path):
    batches = _batches(6, bad=2)
    reference, train = _run(_cfg(tmp_path, "ref", "step", steps=2), batches, "step")
    train()
    trainer, train = _run(_cfg(tmp_path, "log", "log"), batches, "log")
    with pytest.raises(DivergenceError, match="at step 3; the update was not applied") as err:
        train()
    assert "\n" not in str(err.value)
    # Step 4 ran its forward and backward before step 3's flags were read; neither update was applied.
    for (k, pa), pb in zip(reference.model.state_dict().items(), trainer.model.state_dict().values()):
        assert torch.equal(pa, pb), k


def test_log_mode_skips_a_bad_step_like_step_mode(tmp_path):
    batches = _batches(5, bad=1, value=float("inf"))
    runs = {}
    for mode in ("step", "log"):
        trainer, train = _run(_cfg(tmp_path, mode, mode, steps=5, skip_nonfinite_steps=True), batches, mode)
        train()
        runs[mode] = trainer, read_metrics(tmp_path / mode / "metrics.jsonl")
    (a, ma), (b, mb) = runs["step"], runs["log"]
    assert a.skipped_steps == b.skipped_steps == 1
    assert mb[-1]["skipped_steps"] == 1
    for ra, rb in zip(ma, mb):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-6)
    for (k, pa), pb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(pa, pb), k


# Signalled during step 3: step mode stops after it; log mode reads step 3's flags during step 4
# (a log step here, where it would also have read them).
@pytest.mark.parametrize("mode, stops_after", [("step", 3), ("log", 4)])
def test_a_stop_request_saves_and_stops(tmp_path, mode, stops_after):
    holder = {}

    def signal_during_step_3(i):
        if i == 2:
            holder["trainer"].request_stop("SIGTERM")

    trainer, train = _run(_cfg(tmp_path, mode, mode, steps=6), _batches(6), mode, signal_during_step_3)
    holder["trainer"] = trainer
    train()
    assert trainer.step == stops_after
    saved = sorted(p.name for p in (tmp_path / mode / "checkpoints").iterdir())
    assert saved[-1] == f"step-{stops_after:08d}"
