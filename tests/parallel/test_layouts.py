"""Every layout trains the tiny DiT (and SiT, Large-DiT, PixArt) to the single-process losses and weights,
and DCP checkpoints written on 2 ranks resume on 1 and on 4 ranks (other layouts) to the uninterrupted run;
PixArt's caption dropout replaces the same rows on every layout."""

import shutil
from pathlib import Path

import pytest
import torch

from tests.parallel._common import (LAYOUTS_2, LAYOUTS_4, PIXART_SECTIONS, ROUTING, STEPS, deterministic,
                                    final_weights, launch, read_dropped, read_losses, reference_of)
from tests.parallel._common import train_one_process as _single_process

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).parent / "_worker.py"
# Step-5 checkpoints continued under other layouts: (layout, source run). 2-rank DCP shards, and
# the 1-process full files (optimizer keyed by position) under interleaved PP x TP.
RESUME_4 = [("fsdp_tp", "fsdp"), ("pp_fsdp", "tp"), ("hsdp", "pp_1f1b"), ("pp_interleaved_tp", "reference"),
            ("ldit_fsdp_tp", "ldit_tp")]
RESUME_1 = ["fsdp", "tp", "pp_gpipe", "ddp", "single_sharded"]


# Trained in the session's one 2-rank launch (conftest.py's two_rank_runs).
TWO_RANK_LAYOUTS = list(LAYOUTS_2)


def two_rank_args(out):
    """The session launch also shards a tiny T5 (test_text_encoder_sharded_over_fsdp reads what it wrote)."""
    from tests.text_encoders._shard_check import write_assets

    return ["--text-check", str(write_assets(out / "text-check-assets"))]


@pytest.fixture(scope="module")
def runs(two_rank_runs):
    out = two_rank_runs
    with deterministic():
        _single_process(out / "reference")
        # One process with DCP checkpoints: the parallel trainer without a mesh.
        _single_process(out / "single_sharded", checkpoint={"sharded": True})
        _single_process(out / "sit_reference", kind="sit")
        _single_process(out / "ldit_reference", kind="ldit")
        _single_process(out / "routed_reference", train=ROUTING)
        _single_process(out / "ldit_routed_reference", kind="ldit", train=ROUTING)
        _single_process(out / "pixart_reference", kind="pixart", **PIXART_SECTIONS)
    resume = ",".join(f"{name}={out / src / 'checkpoints' / 'step-00000005'}" for name, src in RESUME_4)
    launch(4, WORKER, "--out", out, "--layouts", ",".join(LAYOUTS_4), "--resume", resume)
    for src in RESUME_1:
        run = out / f"resume_single_{src}"
        (run / "checkpoints").mkdir(parents=True)
        shutil.copytree(out / src / "checkpoints" / "step-00000005", run / "checkpoints" / "step-00000005")
        _single_process(run)  # DCP shards of 2 ranks, loaded by one process
    run = out / "resume_single_pixart_fsdp"
    shutil.copytree(out / "pixart_fsdp" / "checkpoints" / "step-00000005", run / "checkpoints" / "step-00000005")
    _single_process(run, kind="pixart", **PIXART_SECTIONS)
    return out


def _assert_losses_match(got: dict, ref: dict, steps):
    assert sorted(got) == list(steps)
    for s in steps:
        assert abs(got[s] - ref[s]) <= 1e-5 * abs(ref[s]), f"step {s}: {got[s]} vs single-process {ref[s]}"


@pytest.mark.parametrize("layout", ["single_sharded", *LAYOUTS_2, *LAYOUTS_4])
def test_layout_matches_single_process(runs, layout):
    reference = runs / reference_of(layout)
    ref = read_losses(reference)
    _assert_losses_match(read_losses(runs / layout), ref, range(1, STEPS + 1))
    # Gradients are averaged, not summed, over data-parallel ranks (and the norm spans TP shards and PP stages).
    ref_norm = read_losses(reference, "grad_norm")
    _assert_losses_match(read_losses(runs / layout, "grad_norm"), ref_norm, range(1, STEPS + 1))
    ref_model, ref_ema = final_weights(reference)
    model, ema = final_weights(runs / layout)
    assert sorted(model) == sorted(ref_model) and sorted(ema) == sorted(ref_ema)
    for k in ref_model:  # qkv included: checkpoints hold the released [q | k | v] layout
        torch.testing.assert_close(model[k], ref_model[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"model {k}: {m}")
    for k in ref_ema:
        torch.testing.assert_close(ema[k], ref_ema[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"ema {k}: {m}")


@pytest.mark.parametrize("layout,source", RESUME_4)
def test_resume_on_four_ranks(runs, layout, source):
    ref = read_losses(runs / reference_of(layout))
    _assert_losses_match(read_losses(runs / f"resume_{layout}_{source}"), ref, range(6, STEPS + 1))


@pytest.mark.parametrize("source", RESUME_1)
def test_resume_two_ranks_on_one(runs, source):
    ref = read_losses(runs / "reference")
    _assert_losses_match(read_losses(runs / f"resume_single_{source}"), ref, range(6, STEPS + 1))


def test_pixart_two_ranks_resume_on_one(runs):
    ref = read_losses(runs / "pixart_reference")
    _assert_losses_match(read_losses(runs / "resume_single_pixart_fsdp"), ref, range(6, STEPS + 1))


@pytest.mark.parametrize("layout", ["pixart_fsdp", "pixart_tp"])
def test_caption_dropout_drops_the_same_rows(runs, layout):
    """The rows replaced by the null caption are the single process's, whichever rank holds them."""
    ref = read_dropped(runs / "pixart_reference")
    assert len(ref) == STEPS and 0 < sum(map(len, ref)) < STEPS * 8  # dropout at 0.5 drops some rows, not all
    assert read_dropped(runs / layout) == ref


@pytest.mark.parametrize("layout", ["pixart_fsdp", "pixart_tp"])
def test_validation_loss_matches_single_process(runs, layout):
    """The loss at fixed noise levels on the held-out captions, each rank measuring its share: one process's."""
    for key in ("val_loss", *(f"val_loss_t{j}" for j in range(8))):
        ref, got = read_losses(runs / "pixart_reference", key), read_losses(runs / layout, key)
        assert sorted(got) == sorted(ref) == [5, 10], key
        assert all(abs(got[s] - ref[s]) <= 1e-5 * abs(ref[s]) for s in ref), (key, got, ref)


def test_sharded_text_encoder_encodes_what_the_whole_one_does(runs):
    """Online captions under FSDP: the frozen T5 is sharded over the two ranks (each holds about half of it) and
    encodes what the whole encoder encodes, when one rank has more captions than the other and when one
    rank's share of a batch is already in the latent cache (its encoder calls join the other's)."""
    import json

    for rank in range(2):
        result = json.loads((runs / f"text-check-{rank}.json").read_text())
        assert result["encode_diff"] <= 1e-6 and result["rows"] == (40 if rank == 0 else 5), result
        assert result["local_params"] <= 0.6 * result["total_params"], result
        assert result["stage_sharded"] and result["stage_diff"] == 0 and result["stage_rows"] == 2, result
