"""scripts/demo_check.py: verdicts and report, the demo and the digit check stubbed (the real run takes minutes)."""

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "demo_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("demo_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stub(module, monkeypatch, share, demo_rc=0):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        if "demo" in cmd:
            return subprocess.CompletedProcess(cmd, demo_rc, "trained 1600 steps in 150 s\n", "")
        line = f"overall share labelled as their own class: {share:.3f} (need >= 0.00)\n"
        return subprocess.CompletedProcess(cmd, 0, line, "")

    monkeypatch.setattr(module.subprocess, "run", fake_run)
    return calls


@pytest.mark.parametrize("share,expected", [(0.99, 0), (0.96, 1)])
def test_verdict_follows_the_share(tmp_path, monkeypatch, capsys, share, expected):
    module = _load()
    calls = _stub(module, monkeypatch, share)
    assert module.main(["--out", str(tmp_path / "run"), "--seed", "3"]) == expected
    out = capsys.readouterr().out
    # The demo ran in the fresh folder with the seed asked for, then the check read that folder.
    demo = calls[0]
    assert demo[demo.index("--out") + 1] == str(tmp_path / "run") and demo[demo.index("--seed") + 1] == "3"
    assert calls[1][-3] == str(tmp_path / "run")
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
