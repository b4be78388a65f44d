"""`dit demo`: a short run writes the grid, the loss curve and the samples the acceptance check reads."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.demo import demo_config
from dit_trainer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_yaml_is_the_demo_config():
    shipped = build_config(ROOT / "configs" / "demo_digits.yaml")
    assert shipped == build_config(demo_config(shipped.output_dir))


def test_demo_short_run(tmp_path, capsys):
    torch.set_num_threads(1)
    assert main(["demo", "--steps", "20", "--out", str(tmp_path), "--per-class", "2", "--no-progress",
                 "--fid-samples", "30"]) == 0
    grid = Image.open(tmp_path / "samples.png")
    # 10 rows (one per digit) of 2 samples, 16 px each with 2 px padding, enlarged 4x.
    assert grid.size == (4 * (2 * 18 + 2), 4 * (10 * 18 + 2)) and grid.mode == "L"
    assert Image.open(tmp_path / "loss.png").size[0] > 100
    data = np.load(tmp_path / "samples.npz")  # the FID batch of dit sample-ddp, drawn as the run recommends
    assert {"arr_0", "arr_1", "settings"} <= set(data.files)
    assert data["arr_0"].shape == (30, 16, 16, 3) and data["arr_0"].dtype == np.uint8
    assert np.bincount(data["arr_1"]).tolist() == [3] * 10  # every class alike
    assert data["arr_0"].std() > 0 and np.array_equal(data["arr_0"][..., 0], data["arr_0"][..., 2])
    import json
    import re

    settings = json.loads(str(data["settings"]))
    # Drawn with the run's recommendation: the post-hoc EMA rebuilt at the end, the guide at the snapshot nearest
    # halfway (snapshots every 3 steps: 9).
    assert settings["ckpt"].endswith("phema/std0.050-step00000020") and settings["guide"].endswith("std0.100-step00000009")
    assert (settings["cfg_scale"], settings["guide_scale"], settings["steps"]) == (1.1, 2.0, 9)
    out = capsys.readouterr().out
    assert "trained 20 steps" in out and "samples.png" in out and "as the run recommends (cfg=1.1" in out
    # FID against the real digits of those samples: printed, and logged beside the loss.
    printed = re.search(r"FID against the real digits \(digit network, 30 samples at step 20\): ([0-9.]+)", out)
    logged = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "fid" in r]
    assert printed and [r["step"] for r in logged] == [20]
    assert float(printed.group(1)) == pytest.approx(logged[0]["fid"], abs=0.01) and logged[0]["fid"] > 0
    assert 0 <= logged[0]["recognised"] <= 1 and 0 <= logged[0]["recall"] <= 1
    # dit sample on the run takes the same recommendation by default.
    cfg = build_config(tmp_path / "config.yaml")
    assert cfg.sample.guide == "phema/std0.100@50%" and cfg.sample.ema_std == 0.05
    assert main(["sample", "--ckpt", str(tmp_path), "--class-labels", "3", "--out", str(tmp_path / "one.png"),
                 "--no-progress", "--device", "cpu"]) == 0


def test_demo_short_run_as_dit(tmp_path, capsys):
    torch.set_num_threads(1)
    assert main(["demo", "--steps", "10", "--out", str(tmp_path), "--per-class", "1", "--no-progress",
                 "--objective", "diffusion", "--fid-samples", "0"]) == 0
    cfg = build_config(tmp_path / "config.yaml")
    assert cfg.objective == "diffusion" and cfg.train.max_steps == 10
    data = np.load(tmp_path / "samples.npz")
    assert data["arr_0"].shape == (10, 16, 16, 3) and data["arr_0"].dtype == np.uint8


def test_demo_defaults_to_sit_and_each_objective_has_its_steps():
    assert build_config(demo_config()).objective == "transport"
    assert demo_config(objective="diffusion")["train"]["max_steps"] > demo_config()["train"]["max_steps"]
    with pytest.raises(ConfigError, match="demo objective"):
        demo_config(objective="flow")


def test_demo_rerun_into_a_finished_folder_names_its_flag(tmp_path, capsys):
    torch.set_num_threads(1)
    args = ["demo", "--steps", "4", "--out", str(tmp_path), "--per-class", "1", "--no-progress", "--fid-samples", "20"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "reached --steps 4; raise --steps to train further" in out and "train.max_steps" not in out
    assert "trained 4 steps" not in out and "finished run of 4 steps: no training, sampled it again" in out
    assert "at step 4):" in out  # the FID the finished run logged
    assert (tmp_path / "samples.png").is_file()


def test_demo_short_run_as_meanflow(tmp_path, capsys):
    """MeanFlow's demo samples in 1 and 2 steps from its post-hoc EMA and logs both scores."""
    import json

    torch.set_num_threads(1)
    assert main(["demo", "--steps", "4", "--out", str(tmp_path), "--per-class", "1", "--no-progress",
                 "--objective", "meanflow", "--fid-samples", "20"]) == 0
    cfg = build_config(tmp_path / "config.yaml")
    assert cfg.objective == "meanflow" and cfg.train.max_steps == 4 and cfg.sample.steps == 1
    for k in (1, 2):
        data = np.load(tmp_path / f"samples_{k}step.npz")
        assert data["arr_0"].shape == (20, 16, 16, 3) and np.bincount(data["arr_1"]).tolist() == [2] * 10
        assert json.loads(str(data["settings"]))["steps"] == k
    logged = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "fid" in r]
    assert [r["step"] for r in logged] == [4] and logged[0]["fid_2_steps"] > 0
    assert 0 <= logged[0]["recognised_2_steps"] <= 1
    out = capsys.readouterr().out
    assert "MeanFlow's sampler at 1 and 2 steps" in out and "at 2 steps: FID" in out
