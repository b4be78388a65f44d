"""dit eval says what the stages that grow with the sample count will hold, and refuses in one line,
naming --no-pr, when they cannot fit; --no-pr skips precision/recall."""

import json
import subprocess
import sys

import numpy as np
import pytest

from dit_trainer.cli import main
from dit_trainer.errors import ResourceError
from dit_trainer.evaluate import memory
from dit_trainer.evaluate.precision_recall import workspace_bytes

pytest.importorskip("sklearn")
pytest.importorskip("scipy")


@pytest.fixture
def samples(tmp_path):
    from dit_trainer.evaluate.digits_net import real_digits_uint8

    path = tmp_path / "samples.npz"
    np.savez(path, arr_0=real_digits_uint8(np.arange(0, 1797, 7)))
    return path


def _eval(samples, *flags):
    return main(["eval", "--network", "digits", "--samples", str(samples), "--ref", "digits", "--device", "cpu",
                 "--json", str(samples.with_suffix(".json")), "--overwrite", *flags])


def test_eval_says_what_it_will_need_before_measuring(samples, capsys):
    assert _eval(samples) == 0
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("dit eval: 257 samples:"))
    assert "features and their statistics about" in line and "precision/recall about" in line
    assert "available" in line


def test_precision_recall_that_cannot_fit_is_refused_in_one_line_naming_no_pr(samples, capsys, monkeypatch):
    need = memory.feature_bytes(257, (64, 112, 10))
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": need + 1000)
    assert _eval(samples, "--no-progress") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("dit eval: error:") and str(samples) in err and "--no-pr" in err
    assert not samples.with_suffix(".json").exists()
    # The same memory is enough without precision/recall.
    assert _eval(samples, "--no-progress", "--no-pr") == 0
    out = capsys.readouterr().out
    assert "Precision/Recall: skipped (--no-pr)" in out
    result = json.loads(samples.with_suffix(".json").read_text())
    assert result["precision"] is None and result["pr_skipped"] == "--no-pr" and result["fid"] > 0


def test_features_that_cannot_fit_are_refused_in_one_line(samples, capsys, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 1000)
    assert _eval(samples, "--no-progress", "--no-pr") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert "the features of 257 samples" in err and "evaluate fewer samples" in err


def test_precision_recall_memory_does_not_grow_with_the_sample_count(monkeypatch):
    small, large = (memory.pr_bytes(10_000, n, 2048) for n in (50_000, 1_000_000))
    assert large - small < 950_000 * 8  # a radius and a flag per point: the blocks stay 10,000²
    assert small > workspace_bytes(10_000, 10_000, "fp16", masks=True, dim=2048)
    # On a GPU both feature sets are copied there in float32.
    assert memory.pr_bytes(10_000, 50_000, 2048, device="cuda") >= small + 60_000 * 2048 * 4
    dims = (2048, 2023, 1008)
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": memory.feature_bytes(50_000, dims) + small // 2)
    with pytest.raises(ResourceError, match="--no-pr"):
        memory.check_eval_memory("s.npz", 50_000, dims, 10_000, "cpu")
    assert "precision/recall skipped" in memory.check_eval_memory("s.npz", 50_000, dims, None, "cpu")


_PEAK = """
import json, sys, torch
from dit_trainer.evaluate.memory import pr_bytes
from dit_trainer.evaluate.precision_recall import precision_recall
n_ref, n_sam, dim, dtype = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
g = torch.Generator().manual_seed(0)
ref, sam = torch.randn(n_ref, dim, generator=g).numpy(), torch.randn(n_sam, dim, generator=g).numpy()
precision_recall(ref[:50], sam[:50], dtype=dtype)  # torch's kernels and threads, there after the features' network
status = lambda key: next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size (VmHWM) restarts from the current one
before = status("VmRSS:")
precision_recall(ref, sam, dtype=dtype)
print(json.dumps({"grown": status("VmHWM:") - before, "estimate": pr_bytes(n_ref, n_sam, dim, dtype=dtype)}))
"""


@pytest.mark.parametrize("n_ref,n_sam,dim,dtype", [(1000, 1000, 2048, "fp16"), (2000, 1500, 512, "fp32")])
def test_precision_recall_estimate_bounds_the_measured_peak(n_ref, n_sam, dim, dtype):
    # The peak resident memory a fresh process grows by while precision/recall runs, blocks' temporaries
    # included: the estimate is at least that, and not far above it.
    run = subprocess.run([sys.executable, "-c", _PEAK, str(n_ref), str(n_sam), str(dim), dtype], capture_output=True,
                         text=True, check=True)
    m = json.loads(run.stdout)
    assert m["grown"] > 16 * 2**20, m  # above the noise
    assert m["grown"] <= m["estimate"] <= 2 * m["grown"], m


def test_available_memory_honours_an_address_space_cap():
    code = """
import resource, json
resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, resource.RLIM_INFINITY))
from dit_trainer.evaluate.memory import available_bytes
print(json.dumps(available_bytes('cpu')))
"""
    got = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0 < got < 6 * 2**30


def test_no_pr_leaves_the_reference_images_unmeasured(tmp_path, tiny_net, make_images, monkeypatch):
    from dit_trainer.evaluate import evaluator
    from dit_trainer.evaluate.features import extract_features
    from dit_trainer.evaluate.stats import ReferenceStats

    fit = ReferenceStats.from_features(extract_features(tiny_net, make_images(40, seed=1), progress=False))
    np.savez(tmp_path / "ref.npz", mu=fit.mu, sigma=fit.sigma, mu_s=fit.mu_s, sigma_s=fit.sigma_s,
             arr_0=make_images(30, seed=2), network=np.asarray("tiny"))
    np.savez(tmp_path / "samples.npz", arr_0=make_images(25, seed=3))
    measured = []
    real = evaluator.measure_npz
    monkeypatch.setattr(evaluator, "measure_npz", lambda path, *a, **k: measured.append(path) or real(path, *a, **k))
    m = evaluator.evaluate(tmp_path / "samples.npz", tmp_path / "ref.npz", network=tiny_net, device="cpu",
                           progress=False, pr=False)
    assert measured == [tmp_path / "samples.npz"]
    assert m["precision"] is None and m["num_reference_features"] is None and m["fid"] > 0
    with_pr = evaluator.evaluate(tmp_path / "samples.npz", tmp_path / "ref.npz", network=tiny_net, device="cpu",
                                 progress=False)
    assert measured[1:] == [tmp_path / "ref.npz", tmp_path / "samples.npz"] and with_pr["fid"] == m["fid"]
    assert with_pr["precision"] is not None


def test_no_pr_measures_fewer_samples_than_precision_recall_needs(tmp_path, capsys):
    from dit_trainer.evaluate.digits_net import real_digits_uint8

    few = tmp_path / "few.npz"
    np.savez(few, arr_0=real_digits_uint8(np.arange(3)))
    assert _eval(few, "--no-progress") == 2
    assert "precision/recall with k=3 need at least 4" in capsys.readouterr().err
    assert _eval(few, "--no-progress", "--no-pr") == 0
    assert json.loads(few.with_suffix(".json").read_text())["num_samples"] == 3
