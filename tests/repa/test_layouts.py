"""REPA under FSDP and tensor parallelism on gloo (2 processes) trains to the one-process losses,
alignment losses, gradient norms and weights (< 1e-5): the projector is sharded with the model and
the encoder runs whole on each rank."""

from pathlib import Path

import pytest
import torch
from tests.parallel._common import deterministic, final_weights, launch, read_losses
from tests.repa._tiny import digits_config

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).parent / "_parallel_worker.py"
STEPS = 6
LAYOUTS = {"fsdp": {"dp_shard": 2}, "tp": {"tp": 2, "dp_shard": 1}}


def layout_config(out, parallel=None):
    """The digits REPA run every layout trains; a clip norm that never clips logs each step's grad norm."""
    return digits_config(out, steps=STEPS, model={"depth": 3}, repa={"encoder_depth": 2},
                         optim={"max_grad_norm": 1e6}, checkpoint={"save_steps": STEPS},
                         parallel=dict(parallel or {}))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from dit_trainer.train import DiTTrainer

    out = tmp_path_factory.mktemp("repa_layouts")
    with deterministic():
        DiTTrainer(layout_config(out / "reference")).train()
    launch(2, WORKER, "--out", out, "--layouts", ",".join(LAYOUTS))
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_equals_one_process(runs, layout):
    for key in ("loss", "repa_loss", "grad_norm"):
        ref, got = read_losses(runs / "reference", key), read_losses(runs / layout, key)
        assert sorted(got) == list(range(1, STEPS + 1)), key
        for s in got:
            assert abs(got[s] - ref[s]) <= 1e-5 * max(abs(ref[s]), 1e-3), f"{key} at step {s}: {got[s]} vs {ref[s]}"
    (ref_model, ref_ema), (model, ema) = final_weights(runs / "reference", STEPS), final_weights(runs / layout, STEPS)
    assert sorted(model) == sorted(ref_model) and "repa_projector.4.weight" in model
    for k in ref_model:
        torch.testing.assert_close(model[k], ref_model[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"model {k}: {m}")
    for k in ref_ema:
        torch.testing.assert_close(ema[k], ref_ema[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"ema {k}: {m}")
