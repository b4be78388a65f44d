"""The objectives' training options (shaped timestep densities, min-SNR, the direction term) under
FSDP and TP on gloo, and MeanFlow's du/dt paths under DDP (two steps and more), FSDP and (the central
difference) TP, and PixArt as MeanFlow and with REPA under FSDP and TP: every step's loss and gradient norm
(and REPA's alignment loss) equal one process's."""

import pytest
from tests.parallel._common import (LAYOUTS_OPTIONS, OPTIONS, STEPS, deterministic, kind_of, read_losses,
                                    train_one_process)

pytestmark = pytest.mark.distributed

# Trained in the session's one 2-rank launch (conftest.py's two_rank_runs).
TWO_RANK_LAYOUTS = list(LAYOUTS_OPTIONS)


@pytest.fixture(scope="module")
def runs(two_rank_runs):
    out = two_rank_runs
    with deterministic():
        for opt, (kind, sections) in OPTIONS.items():
            train_one_process(out / f"opt-{opt}_reference", kind=kind, **sections)
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS_OPTIONS))
def test_option_matches_single_process(runs, layout):
    reference = runs / f"{layout.split('_')[0]}_reference"
    assert kind_of(layout) in ("dit", "sit", "mf", "pixart")
    keys = ("loss", "grad_norm") + (("repa_loss",) if layout.startswith("opt-repa") else ())
    for key in keys:
        ref, got = read_losses(reference, key), read_losses(runs / layout, key)
        assert sorted(got) == list(range(1, STEPS + 1))
        for s in got:
            assert abs(got[s] - ref[s]) <= 1e-5 * abs(ref[s]), f"{key} step {s}: {got[s]} vs single-process {ref[s]}"


def test_options_change_the_loss(runs):
    """Each option's run differs from the plain run of its model: the option reached the objective."""
    for kind in ("dit", "sit", "mf", "pixart"):
        train_one_process(runs / f"plain_{kind}", kind=kind)
    for opt, (kind, _) in OPTIONS.items():
        assert read_losses(runs / f"opt-{opt}_reference")[1] != read_losses(runs / f"plain_{kind}")[1], opt
