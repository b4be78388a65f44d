"""DiT's block options (RMSNorm, SwiGLU, 2-D RoPE, per-head q/k norms, all on) train under tensor
parallelism and FSDP on gloo to the single-process losses, gradient norms and weights."""

import pytest
import torch

from tests.parallel._common import (BLOCK_OPTION_LAYOUTS, STEPS, TinyLatents, deterministic, final_weights,
                                    read_losses, tiny_config)

pytestmark = pytest.mark.distributed

# Trained in the session's one 2-rank launch (conftest.py's two_rank_runs).
TWO_RANK_LAYOUTS = list(BLOCK_OPTION_LAYOUTS)


@pytest.fixture(scope="module")
def runs(two_rank_runs):
    from dit_trainer.train import DiTTrainer

    out = two_rank_runs
    with deterministic():
        DiTTrainer(tiny_config(out / "blockopts_reference", kind="blockopts"), dataset=TinyLatents()).train()
    return out


@pytest.mark.parametrize("layout", list(BLOCK_OPTION_LAYOUTS))
def test_block_options_match_single_process(runs, layout):
    for key in ("loss", "grad_norm"):
        ref, got = read_losses(runs / "blockopts_reference", key), read_losses(runs / layout, key)
        assert sorted(got) == list(range(1, STEPS + 1))
        for s in got:
            assert abs(got[s] - ref[s]) <= 1e-5 * abs(ref[s]), f"{key} at step {s}: {got[s]} vs one process {ref[s]}"
    (ref_model, ref_ema), (model, ema) = final_weights(runs / "blockopts_reference"), final_weights(runs / layout)
    assert sorted(model) == sorted(ref_model) and "blocks.0.attn.q_norm.weight" in model
    for k in ref_model:  # the q/k norm weights included: their gradient sums every rank's heads
        torch.testing.assert_close(model[k], ref_model[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"model {k}: {m}")
    for k in ref_ema:
        torch.testing.assert_close(ema[k], ref_ema[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"ema {k}: {m}")
