"""A samples or reference .npz whose array header or length is damaged: one line naming the file and
the array, exit 2, no traceback, before anything is measured."""

import io
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from tests.subprocess_env import subprocess_env
from tests.test_npy import malformed

from dit_trainer.cli import main

pytest.importorskip("sklearn")
pytest.importorskip("scipy")

IMAGES = np.random.default_rng(0).integers(0, 256, size=(6, 16, 16, 3), dtype=np.uint8)
CASES = malformed(IMAGES)


def _npz(path, members: dict):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name + ".npy", data)
    return path


def _saved(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _one_line(capsys, *names):
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("dit eval: error:"), err
    for name in names:
        assert name in err, (name, err)
    return err


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_samples_array_is_one_line(case, tmp_path, capsys, monkeypatch):
    samples = _npz(tmp_path / "samples.npz", {"arr_0": CASES[case]})
    measured = []
    monkeypatch.setattr("dit_trainer.evaluate.evaluator.load_network", lambda *a, **k: measured.append(a))
    assert main(["eval", "--network", "digits", "--samples", str(samples), "--ref", "digits", "--no-progress"]) == 2
    _one_line(capsys, str(samples), "arr_0")
    assert measured == []  # refused on its header, before the network is even loaded


@pytest.mark.parametrize("case", ["unknown-descr", "negative-dimension", "cut-before-brace", "data-short",
                                  "size-overflows"])
def test_a_damaged_reference_statistic_is_one_line(case, tmp_path, capsys):
    np.savez(tmp_path / "samples.npz", arr_0=IMAGES)
    arrays = {"mu": np.zeros(64), "sigma": np.eye(64), "mu_s": np.zeros(112), "sigma_s": np.eye(112),
              "network": np.asarray("digits")}
    members = {key: _saved(value) for key, value in arrays.items()}
    members["sigma"] = malformed(arrays["sigma"])[case]
    ref = _npz(tmp_path / "ref.npz", members)
    assert main(["eval", "--network", "digits", "--samples", str(tmp_path / "samples.npz"), "--ref", str(ref),
                 "--no-progress"]) == 2
    _one_line(capsys, str(ref), "sigma")


def test_the_command_exits_2_with_one_line_and_no_traceback(tmp_path):
    for case in ("unknown-descr", "negative-dimension", "cut-before-brace"):
        samples = _npz(tmp_path / f"{case}.npz", {"arr_0": CASES[case]})
        run = subprocess.run([sys.executable, "-m", "dit_trainer", "eval", "--network", "digits", "--samples",
                              str(samples), "--ref", "digits", "--no-progress"], capture_output=True, text=True,
                             env=subprocess_env(), timeout=300)
        err = run.stderr.strip()
        assert run.returncode == 2 and "\n" not in err and "Traceback" not in err, (case, err)
        assert str(samples) in err and "arr_0" in err
