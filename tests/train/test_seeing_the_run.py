"""Seeing a run: sample grids in TensorBoard, MFU and peak memory, an optional W&B sink, `dit plot`."""

import json
import sys
import types

import pytest
import torch
from tests.train.trainer_helpers import tiny_config, write_npy_latents

from dit_trainer.cli import main
from dit_trainer.models import get_spec
from dit_trainer.train import DiTTrainer
from dit_trainer.train.metrics import read_metrics
from dit_trainer.train.mfu import MFUMeter, measure_peak_tflops


def test_dit_flops_match_the_paper():
    # DiT-S/2 at 256x256 (32x32 latents): 6.06 GFLOPs forward in the paper's Table 4 (multiply-adds).
    model = get_spec("DiT-S/2").build_model_fn({"input_size": 32})
    flops = get_spec("DiT-S/2").flops_fn(model)
    assert flops / 3 / 2 == pytest.approx(6.06e9, rel=2e-3)


def test_mfu_meter_and_measured_peak():
    meter = MFUMeter(flops_per_image=1e12, world_size=2, peak_tflops=10.0)
    assert meter(4.0) == {"tflops": 2.0, "mfu": 0.2}
    assert measure_peak_tflops(torch.device("cpu"), seconds=0.01) > 0


def _run_with_grids(tmp_path, **logging):
    data = write_npy_latents(tmp_path / "latents", n=4, shape=(3, 8, 8))
    cfg = tiny_config(tmp_path / "run", data={"path": str(data)}, model={"in_channels": 3},
                      train={"max_steps": 2, "global_batch_size": 4},
                      logging={"image_steps": 2, "sample_steps": 2, "sample_classes": [1], **logging})
    DiTTrainer(cfg).train()
    return tmp_path / "run"


def test_grids_in_tensorboard_and_mfu_in_metrics(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = _run_with_grids(tmp_path, tensorboard=True, mfu=True, peak_tflops=1.0)
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0}).Reload()
    assert [e.step for e in events.Images("samples")] == [2]
    assert "train/mfu" in events.Tags()["scalars"]
    record = read_metrics(run / "metrics.jsonl")[-1]
    assert record["tflops"] > 0 and record["mfu"] == pytest.approx(record["tflops"] / 1.0)
    assert record["peak_mem_gb"] > 0
    assert "mfu " in capsys.readouterr().out


def test_wandb_sink_gets_scalars_and_grids(tmp_path, monkeypatch):
    logged, runs = [], []

    class Run:
        def log(self, values, step):
            logged.append((step, values))

        def finish(self):
            runs.append("finished")

    fake = types.SimpleNamespace(init=lambda **kw: runs.append(kw) or Run(), Image=lambda path: ("image", path))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = _run_with_grids(tmp_path, tensorboard=False, wandb=True, wandb_project="p")
    assert runs[0]["project"] == "p" and runs[0]["id"] == (run / "wandb_id.txt").read_text().strip()
    assert runs[-1] == "finished"
    assert any("train/loss" in values for _, values in logged)
    assert any(values.get("samples", ("",))[0] == "image" for _, values in logged)


def test_wandb_missing_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    data = write_npy_latents(tmp_path / "latents", n=4)
    cfg = tiny_config(tmp_path / "run", data={"path": str(data)}, train={"max_steps": 1, "global_batch_size": 4})
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--logging.wandb", "true"]) == 2
    assert "pip install 'dit-trainer[wandb]'" in capsys.readouterr().err


def test_dit_plot_writes_loss_png(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1 / s}) + "\n" for s in (1, 2, 3)))
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(tmp_path / "nothing")]) == 2
