"""scripts/demo/demo_check.py: its scoring of real digits, and its verdicts and report with the demo
and the scoring stubbed (the real run takes minutes)."""

import importlib.util
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "demo" / "demo_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("demo_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stub(module, monkeypatch, share, demo_rc=0):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, demo_rc, "trained 1600 steps in 150 s\n", "")

    def fake_score(folder):
        calls.append(["score", str(folder)])
        return share

    monkeypatch.setattr(module.subprocess, "run", fake_run)
    monkeypatch.setattr(module, "score", fake_score)
    return calls


def test_scores_real_digits_by_their_labels(tmp_path, capsys):
    pytest.importorskip("sklearn")
    from dit_trainer.data import DigitsDataset

    module = _load()
    ds = DigitsDataset(16)
    idx = np.arange(0, 1797, 9)
    images, labels = ds.images[idx].numpy(), ds.labels.numpy()[idx]
    from dit_trainer.sample import save_npz

    save_npz(tmp_path / "samples.npz", images, labels)  # as the demo writes it
    assert module.main(["--score", str(tmp_path), "--min", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "held-out" in out and "met" in out
    # The same images asked for as the next digit: the classifier must disagree with nearly all.
    save_npz(tmp_path / "samples.npz", images, (labels + 1) % 10)
    assert module.score(tmp_path) < 0.1
    assert module.main(["--score", str(tmp_path)]) == 1
    assert module.main(["--score", str(tmp_path), "--min", "0"]) == 0
    assert module.main(["--score", str(tmp_path / "nowhere")]) == 2


@pytest.mark.parametrize("share,expected", [(0.99, 0), (0.96, 1)])
def test_verdict_follows_the_share(tmp_path, monkeypatch, capsys, share, expected):
    module = _load()
    calls = _stub(module, monkeypatch, share)
    assert module.main(["--out", str(tmp_path / "run"), "--seed", "3"]) == expected
    out = capsys.readouterr().out
    # The demo ran in the fresh folder with the seed asked for, then that folder was scored.
    demo = calls[0]
    assert demo[demo.index("--out") + 1] == str(tmp_path / "run") and demo[demo.index("--seed") + 1] == "3"
    assert calls[1] == ["score", str(tmp_path / "run")]
    assert f"recognised:  {share:.1%}" in out and ("MISSED" in out) == (expected == 1)
    assert "loadavg:" in out and f"{os.cpu_count()} cores" in out and "batch 64" in out and "fp32" in out


def test_time_goal_is_checked(tmp_path, monkeypatch, capsys):
    module = _load()
    _stub(module, monkeypatch, 1.0)
    assert module.main(["--out", str(tmp_path / "run"), "--max-seconds", "0", "--steps", "7"]) == 1
    out = capsys.readouterr().out
    assert "goal <= 0 s  MISSED" in out and "7 steps, batch 64" in out


def test_failed_demo_and_existing_folder_are_errors(tmp_path, monkeypatch, capsys):
    module = _load()
    _stub(module, monkeypatch, 1.0, demo_rc=1)
    assert module.main(["--out", str(tmp_path / "run")]) == 2
    tmp_path.joinpath("old").mkdir()
    assert module.main(["--out", str(tmp_path / "old")]) == 2
    assert "exists" in capsys.readouterr().err
