"""`eval.every`: FID of the EMA model against the training set's own statistics, logged during training."""

import json
from pathlib import Path

import numpy as np
import pytest

from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.demo import demo_config
from dit_trainer.errors import DitError
from dit_trainer.train import DiTTrainer

pytest.importorskip("scipy")


def _digits_config(out, steps, **eval_section):
    """The demo's model, 4 blocks narrowed to 64, batch 16: FID of 12 samples (3 sampler steps) every 2 steps."""
    cfg = demo_config(out, steps=steps)
    cfg["model"].update(hidden_size=64, depth=2)
    cfg["train"].update(global_batch_size=16)
    cfg["logging"].update(log_steps=2, progress=False)
    cfg["eval"] = {"every": 2, "num_samples": 12, "sample_batch_size": 5, "sample_steps": 3, **eval_section}
    return cfg


def _fid_records(out):
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "fid" in r]


def test_fid_is_logged_every_n_steps_against_the_cached_reference_and_resume_reuses_it(tmp_path):
    out = tmp_path / "run"
    last = DiTTrainer(build_config(_digits_config(out, 4))).train()
    fids = _fid_records(out)
    assert [r["step"] for r in fids] == [2, 4]
    assert all(r["fid"] > 0 and r["sfid"] > 0 and 1 <= r["inception_score"] <= 10 for r in fids)
    assert last["fid"] == fids[-1]["fid"]  # train() returns it with the step's other metrics
    ref = out / "eval" / "reference.npz"
    assert json.loads((out / "eval" / "reference.json").read_text())["data"] == "digits"
    with np.load(ref) as z:  # the digit network over all 1,797 real digits
        assert z["features"].shape == (1797, 64) and str(z["network"]) == "digits"
    stamp = ref.stat().st_mtime_ns
    # Resumed to step 6: the reference is read back, not fitted again; the new step is measured.
    DiTTrainer(build_config(_digits_config(out, 6))).train()
    assert [r["step"] for r in _fid_records(out)] == [2, 4, 6] and ref.stat().st_mtime_ns == stamp


def test_the_same_chunks_give_the_same_fid(tmp_path):
    # Labels and seeds belong to chunks, not to the measurement: the same weights measure the same.
    cfg = build_config(_digits_config(tmp_path / "run", 2))
    trainer = DiTTrainer(cfg)
    trainer.train()
    from dit_trainer.train.eval_during_training import TrainingFID

    fid = TrainingFID(cfg, trainer.device, trainer.dims)
    a = fid.measure(trainer.ema_model(), trainer.objective, 2)
    b = fid.measure(trainer.ema_model(), trainer.objective, 2)
    assert a["fid"] == b["fid"] == _fid_records(tmp_path / "run")[-1]["fid"]


def test_latent_data_is_measured_with_inception_whose_weights_are_fetched_before_step_one(tmp_path):
    from tests.train.trainer_helpers import run_config

    cfg = run_config(tmp_path, 2, eval={"every": 1, "num_samples": 4})
    # Offline (tests/conftest.py): the Inception weights cannot be fetched, so the run stops at once.
    with pytest.raises(DitError, match="cannot download") as err:
        DiTTrainer(build_config(cfg)).train()
    assert "\n" not in str(err.value) and not (tmp_path / "run" / "checkpoints").exists()


def test_latent_shards_reference_decodes_a_capped_random_subset(tmp_path, tiny_latent_shards):
    """Shards from dit extract, the digit network standing in for Inception: the reference is fitted on
    eval.ref_images decoded latents and named by what it depends on."""
    folder, vae = tiny_latent_shards
    cfg = {"output_dir": str(tmp_path / "run"), "model": {"name": "DiT-S/2", "depth": 1, "hidden_size": 32,
                                                         "num_heads": 2},
           "data": {"path": str(folder), "num_workers": 0},
           "train": {"max_steps": 1, "global_batch_size": 4, "device": "cpu", "mixed_precision": "fp32"},
           "logging": {"progress": False, "tensorboard": False, "log_steps": 1},
           "eval": {"every": 1, "num_samples": 4, "sample_steps": 2, "network": "digits", "ref_images": 6}}
    DiTTrainer(build_config(cfg)).train()
    record = json.loads((tmp_path / "run" / "eval" / "reference.json").read_text())
    assert record["ref_images"] == 6 and record["vae"] == str(vae) and record["network"] == "digits"
    with np.load(tmp_path / "run" / "eval" / "reference.npz") as z:
        assert z["features"].shape == (6, 64)
    assert [r["step"] for r in _fid_records(tmp_path / "run")] == [1]


def test_eval_keys_are_checked_in_one_line(tmp_path, capsys):
    for flag, value in (("--eval.every", "-1"), ("--eval.num_samples", "1"), ("--eval.network", "clip")):
        assert main(["train", "--data.path", "digits", "--output_dir", str(tmp_path), flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert flag[2:] in err and "\n" not in err


@pytest.mark.distributed
def test_two_ranks_measure_what_one_process_measures(tmp_path):
    """FSDP: each rank samples its chunks and rank 0 gathers the features; pipeline stages: rank 0 samples them
    all. Either way the same samples as one process, so the same FID up to the weights' round-off."""
    from tests.parallel._common import launch

    DiTTrainer(build_config(_digits_config(tmp_path / "one", 2))).train()
    one = _fid_records(tmp_path / "one")
    launch(2, Path(__file__).parent / "_eval_worker.py", tmp_path, "fsdp", "pp")
    for layout in ("fsdp", "pp"):
        two = _fid_records(tmp_path / layout)
        assert [r["step"] for r in two] == [2], layout
        assert two[0]["fid"] == pytest.approx(one[0]["fid"], rel=1e-4), layout
        assert two[0]["inception_score"] == pytest.approx(one[0]["inception_score"], rel=1e-4), layout


def test_autoguidance_during_training_waits_for_its_guide_step(tmp_path, capsys):
    # The guide is step 2 of this run (kept by keep_steps): the measurement at step 2 comes before its save,
    # so it is skipped in one line; step 4 is measured with autoguidance, and differs from an unguided one.
    out = tmp_path / "run"
    cfg = _digits_config(out, 4, guide="2", guide_scale=3.0)
    cfg["checkpoint"].update(save_steps=4, save_total_limit=1, keep_steps=[2])
    DiTTrainer(build_config(cfg)).train()
    assert "FID skipped: eval.guide 2 is a later step of this run" in capsys.readouterr().out
    assert [r["step"] for r in _fid_records(out)] == [4]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]
    guided = _fid_records(out)[0]["fid"]
    plain_cfg = build_config(_digits_config(tmp_path / "plain", 4))
    trainer = DiTTrainer(build_config(cfg))  # resumes the finished run: the same EMA weights
    trainer.maybe_resume()
    from dit_trainer.train.eval_during_training import TrainingFID

    plain = TrainingFID(plain_cfg, trainer.device, trainer.dims).measure(trainer.ema_model(), trainer.objective, 4)
    assert np.isfinite(guided) and plain["fid"] != guided


def test_a_guide_step_that_is_past_and_gone_is_an_error_not_a_skip(tmp_path):
    from types import SimpleNamespace

    from dit_trainer.train.eval_during_training import TrainingFID

    cfg = build_config(_digits_config(tmp_path / "run", 8, guide="50%", guide_scale=2.0))
    assert 4 in cfg.checkpoint.keep_steps  # half of 8, kept from the start
    fid = SimpleNamespace(cfg=cfg, _guide=None, device="cpu")  # guide() reads no more of the measurer than these
    assert TrainingFID.guide(fid, None, 4) == "missing"  # step 4 is measured before it is saved: skipped
    with pytest.raises(DitError, match=r"^eval.guide 50%: \S+step-00000004 does not exist although step 4 is past"):
        TrainingFID.guide(fid, None, 6)
