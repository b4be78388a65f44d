"""benchmarks/time_to_quality.py's arithmetic, and every recipe it trains is a config `dit train` accepts."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ttq():
    # The script imports benchmarks/_common.py by its bare name, as `python benchmarks/...` runs it: the
    # benchmarks folder is on the path while it loads, and the bare `_common` is gone again after (the tests'
    # own helpers are imported as the tests package, tests.parallel._common, so the names cannot meet).
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("time_to_quality", ROOT / "benchmarks" / "time_to_quality.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
        sys.modules.pop("_common", None)


def test_time_to_reach_interpolates_between_measured_points(ttq):
    points = [(10.0, 40.0), (20.0, 20.0), (30.0, 10.0)]
    assert ttq.time_to_reach(points, 40.0) == 10.0
    assert ttq.time_to_reach(points, 30.0) == pytest.approx(15.0)
    assert ttq.time_to_reach(points, 15.0) == pytest.approx(25.0)
    assert ttq.time_to_reach(points, 5.0) is None


def test_probe_interleaves_rounds_and_takes_the_median_without_warm_up(ttq, monkeypatch, tmp_path):
    order, speed = [], {"dit": [9.0, 1.0, 2.0, 3.0], "sit": [9.0, 5.0, 5.0, 7.0]}
    def fake_train(folder, recipe, seed, steps, save_every, log_steps):
        order.append(recipe)
        return list(enumerate(speed[recipe]))
    monkeypatch.setattr(ttq, "train", fake_train)
    assert ttq.probe_speeds(tmp_path, ["dit", "sit"], seed=0, steps=40) == {"dit": 2.0, "sit": 5.0}
    assert order == ["dit", "sit", "sit", "dit"]


def test_report_names_the_speed_up_to_the_baseline_fid(ttq):
    base = {"seed": 1, "recipe": "dit", "s_per_step": 0.2, "budget_s": 40.0,
            "curve": [(100, 20.0, 30.0), (200, 40.0, 20.0)]}
    fast = {"seed": 1, "recipe": "dit+routing", "s_per_step": 0.1, "budget_s": 40.0,
            "curve": [(200, 10.0, 20.0), (400, 40.0, 12.0)]}
    text = ttq.report([base, fast], steps=200)
    row = next(line for line in text.splitlines() if line.startswith("| dit+routing"))
    assert "4.00x" in row and "12.00" in row


@pytest.mark.parametrize("recipe", ["dit", "sit", "dit+all", "sit+all"])
def test_every_recipe_key_is_a_config_key(ttq, recipe, tmp_path, capsys):
    from dit_trainer.cli import main

    config = ttq.write_config(tmp_path / "run", seed=0, steps=100, save_every=50, log_steps=50)
    overrides = [a for key, value in ttq.RECIPES[recipe].items() for a in (f"--{key}", str(value))]
    assert main(["train", "--config", str(config), *overrides, "--print-config"]) in (0, None)
    printed = capsys.readouterr().out
    for key, value in ttq.RECIPES[recipe].items():
        assert f"{key.split('.')[-1]}: {str(value).lower() if isinstance(value, bool) else value}" in printed, key
