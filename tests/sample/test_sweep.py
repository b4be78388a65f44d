"""The guidance sweep of `dit sample-ddp --guidance SPEC ... --ref REF`: one batch per setting, all measured
against one reference, one table; SPECs checked in one line before any sampling."""

import json
import math

import numpy as np
import pytest

from dit_trainer.cli import main
from dit_trainer.errors import ConfigError
from dit_trainer.sample.sweep import batch_path, parse_spec
from tests.sample.test_run_settings import run  # noqa: F401 (the fixture: a run with a guide at step 1)


def test_specs_are_flag_values():
    assert parse_spec("cfg=1.5,guide=300,w=2") == {"cfg_scale": 1.5, "guide": "300", "guide_scale": 2.0}
    assert parse_spec("interval=0.3:inf,ema=none,steps=12") == {"guidance_interval": [0.3, math.inf],
                                                               "ema_std": "none", "steps": 12}
    assert parse_spec("") == {}
    for bad, words in (("cfg", "is not KEY=VALUE"), ("scale=2", "is not KEY=VALUE"), ("cfg=high", "not a valid value"),
                       ("interval=0.3", "interval must be LO:HI")):
        with pytest.raises(ConfigError, match=f"^--guidance {bad!r}: .*{words}"):
            parse_spec(bad)
    assert batch_path("out/s.npz", "cfg=1.5,guide=300").name == "s-cfg=1.5_guide=300.npz"
    assert batch_path("out/s.npz", "").name == "s-recommended.npz"


def test_a_sweep_measures_each_setting_against_one_reference(run, tmp_path, capsys):  # noqa: F811
    folder, _, _ = run
    out, rows_file = tmp_path / "sweep.npz", tmp_path / "rows.json"
    argv = ["sample-ddp", "--ckpt", str(folder), "--npz", str(out), "--num-samples", "12", "--batch-size", "6",
            "--device", "cpu", "--no-progress", "--ref", "digits", "--network", "digits", "--json", str(rows_file),
            "--guidance", "cfg=1,w=1", "cfg=1", "cfg=2,w=1,interval=0.5:inf"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = json.loads(rows_file.read_text())
    assert [r["guidance"] for r in rows] == ["cfg=1", "cfg=1,guide=1,w=2.5",
                                             "cfg=2,interval=0.5:inf"]
    # The recommended autoguidance costs a guide pass per step; an interval skips the null-label pass outside it.
    assert rows[1]["nfe"] == 2 * rows[0]["nfe"] and rows[0]["nfe"] < rows[2]["nfe"] < 2 * rows[0]["nfe"]
    for r in rows:
        assert np.isfinite([r["fid"], r["precision"], r["recall"]]).all() and r["num_samples"] == 12
        assert r["guidance"] in printed
    first = np.load(batch_path(out, "cfg=1,w=1"))["arr_0"]
    assert not np.array_equal(first, np.load(batch_path(out, "cfg=1"))["arr_0"])
    # A second run reuses the finished batches and measures them again alike.
    assert main(argv) == 0
    assert json.loads(rows_file.read_text()) == rows


def test_guidance_without_a_reference_is_refused_in_one_line(run, tmp_path, capsys):  # noqa: F811
    folder, _, _ = run
    assert main(["sample-ddp", "--ckpt", str(folder), "--npz", str(tmp_path / "s.npz"), "--guidance", "cfg=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "add --ref REF" in err and "\n" not in err


def test_a_spec_weight_out_of_range_is_refused_before_any_sampling(run, tmp_path, capsys):  # noqa: F811
    folder, _, _ = run
    out = tmp_path / "s.npz"
    assert main(["sample-ddp", "--ckpt", str(folder), "--npz", str(out), "--device", "cpu", "--no-progress",
                 "--ref", "digits", "--network", "digits", "--guidance", "cfg=1", "w=0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--guide-scale is 0.5; it must be a number >= 1" in err and "\n" not in err
    assert not batch_path(out, "cfg=1").exists()


def test_a_bad_second_spec_is_refused_before_anything_is_sampled(run, tmp_path, capsys):  # noqa: F811
    folder, _, _ = run
    out = tmp_path / "s.npz"
    assert main(["sample-ddp", "--ckpt", str(folder), "--npz", str(out), "--num-samples", "4", "--batch-size", "4",
                 "--device", "cpu", "--no-progress", "--ref", "digits", "--network", "digits",
                 "--guidance", "cfg=1", "guide=999,w=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dit sample-ddp: error: --guidance 'guide=999,w=2': --guide 999: ") and "\n" not in err
    assert "step-00000999 does not exist" in err
    assert list(tmp_path.iterdir()) == []  # not the first SPEC's batch, its chunks, nor a table


def test_each_row_is_written_as_it_is_measured(run, tmp_path, capsys):  # noqa: F811
    folder, _, _ = run
    out = tmp_path / "s.npz"
    blocked = batch_path(out, "cfg=2")
    blocked.write_text("not a batch")  # the second SPEC's batch cannot be written: found only when it is sampled
    assert main(["sample-ddp", "--ckpt", str(folder), "--npz", str(out), "--num-samples", "6", "--batch-size", "6",
                 "--device", "cpu", "--no-progress", "--ref", "digits", "--network", "digits",
                 "--guidance", "cfg=1", "cfg=2"]) == 2
    assert "is not a batch this command wrote" in capsys.readouterr().err
    rows = json.loads((tmp_path / "s-sweep.json").read_text())  # beside --npz without --json
    assert [r["spec"] for r in rows] == ["cfg=1"] and np.isfinite(rows[0]["fid"]) and rows[0]["num_samples"] == 6
    assert blocked.read_text() == "not a batch"
