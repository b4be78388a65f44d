"""Post-hoc EMA under FSDP, TP and PP (2 gloo ranks) tracks the profiles of one process: the snapshots
hold the same weights (the frozen pos_embed exactly); 2-rank DCP shards resume on one process, and one
process's full files as two pipeline stages."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.parallel._common import deterministic, launch, train_one_process

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).parent / "_worker.py"
LAYOUTS = ("fsdp", "tp", "pp_1f1b")
PHEMA = {"phema_stds": [0.05, 0.10], "phema_dtype": "fp32"}  # snapshots at the checkpoints, steps 5 and 10


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("phema_layouts")
    with deterministic():
        train_one_process(out / "reference", train=PHEMA)
    # The 1-process full files (phema.safetensors) continued as pipeline stages, each taking its own.
    launch(2, WORKER, "--out", out, "--layouts", ",".join(LAYOUTS),
           "--resume", f"pp_1f1b={out / 'reference' / 'checkpoints' / 'step-00000005'}")
    resumed = out / "resumed_fsdp"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(out / "fsdp" / "checkpoints" / "step-00000005", resumed / "checkpoints" / "step-00000005")
    with deterministic():
        train_one_process(resumed, train=PHEMA)  # the 2-rank DCP shards, profiles included, on one process
    return out


def _assert_snapshots_match(run: Path, reference: Path, steps):
    for step in steps:
        name = f"phema/snapshot-{step:08d}.safetensors"
        got, want = load_file(str(run / name)), load_file(str(reference / name))
        assert sorted(got) == sorted(want)
        assert torch.equal(got["frozen/pos_embed"], want["frozen/pos_embed"])
        for key, value in want.items():  # qkv included: snapshots hold the released [q | k | v] layout
            torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5, msg=lambda m: f"{step} {key}: {m}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_profiles_under_a_layout_match_one_process(runs, layout):
    assert (runs / layout / "checkpoints" / "step-00000010" / "dcp").is_dir()
    _assert_snapshots_match(runs / layout, runs / "reference", (5, 10))


@pytest.mark.parametrize("run", ["resumed_fsdp", "resumed_pp_1f1b"])
def test_profiles_resume_under_another_layout(runs, run):
    assert not (runs / run / "phema" / "snapshot-00000005.safetensors").exists()
    _assert_snapshots_match(runs / run, runs / "reference", (10,))
