"""benchmarks/gpu_check.sh: one line and exit 2 without a GPU; its summary reads what the
benchmark scripts really print (so a change of their tables shows up here, not on a GPU)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
HELPER = ROOT / "benchmarks" / "gpu_check.py"


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the script would run")
def test_without_gpu_one_line_and_exit_2():
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0]


def _benches(tmp, **runs):
    """Run each benchmark script NAME=[script, args...] at once (separate processes, so their start-ups
    overlap); write each one's output to NAME.log as gpu_check.sh does and return {NAME: output}."""
    procs = {name: subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / argv[0]), *argv[1:]],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for name, argv in runs.items()}
    outputs = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        (tmp / f"{name}.log").write_text(out)
        outputs[name] = out
    return outputs


def _cell(text, first, column):
    """A table cell found without gpu_check.py's parser: header row split, first data row."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    header = next(r for r in rows if r[0] == first)
    return rows[rows.index(header) + 2][header.index(column)]


def test_summary_of_real_outputs(tmp_path):
    # Tiny sizes on CPU, one thread each, the three at once: about 20 s of CPU in all.
    tiny = ["--depth", "1", "--steps", "1", "--warmup", "1"]
    logs = _benches(tmp_path,
                    train_b32=["train_step.py", "--hidden-size", "64", "--num-heads", "2", "--input-size", "8",
                               "--batch-size", "2", "--variants", "bf16", "--peak-reps", "1", "--peak-sizes", "1024", "--no-memory",
                               "--threads", "1", "--device", "cpu", *tiny],
                    sampling=["sampling.py", "--models", "DiT-S/2", "--batch-sizes", "1", "--steps", "2",
                              "--no-diffusers", "--no-compile", "--threads", "1"],
                    fsdp_1=["parallel.py", "--world-sizes", "1", "--layouts", "single", "--hidden", "64", "--heads",
                            "2", "--input", "8", "--batch", "4", *tiny])
    train, sampling, single = logs["train_b32"], logs["sampling"], logs["fsdp_1"]
    (tmp_path / "status").write_text("train_b32 ok\ntrain_b128 timeout (after 120s)\nsampling ok\nfsdp_1 ok\n")
    (tmp_path / "gpu").write_text("no GPU (test)")
    out = subprocess.run([sys.executable, str(HELPER), "summary", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 1  # a sub-run timed out
    text = out.stdout
    assert f"{_cell(train, 'variant', 'img/s')} img/s" in text
    assert re.search(r"MFU\s+" + re.escape(_cell(train, "variant", "MFU vs bf16 peak")), text)
    assert re.search(r"bf16 matmul peak: [\d.]+ TFLOP/s", text)
    assert f"{_cell(sampling, 'model', 'ours img/s')} img/s" in text
    assert "train_b128 timeout" in text and "FSDP2 scaling: no result" in text  # one rank count only
    assert single and "(train_b128): no result" in text and "SDPA: no result (not run)" in text
