"""benchmarks/train_step.py: the interleaved mode pairs steps by round and refuses rows that
cannot share a process step by step."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "train_step.py"
TINY = ["--depth", "1", "--hidden-size", "64", "--num-heads", "2", "--input-size", "8", "--batch-size", "2",
        "--warmup", "1", "--peak-reps", "1", "--no-memory", "--threads", "1", "--device", "cpu"]


def _run(*argv):
    return subprocess.run([sys.executable, str(SCRIPT), *TINY, *argv], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def _rows(text):
    lines = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
             if line.startswith("|")]
    header = lines[0]
    return {r[0]: dict(zip(header, r)) for r in lines[2:]}


def test_interleaved_rounds_pair_each_variant_with_the_baseline():
    out = _run("--variants", "orig-fp32,fp32+loopadam,fp32", "--interleave", "3")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "median over 3 interleaved rounds" in out.stdout
    rows = _rows(out.stdout)
    assert set(rows) == {"orig-fp32", "fp32+loopadam", "fp32"}
    # Paired with itself every round: exactly 1, whatever the machine's drift.
    assert rows["orig-fp32"]["speed vs orig-fp32"] == "1.00x"
    line = next(x for x in out.stdout.splitlines() if x.startswith("# per-round speed ratio to orig-fp32"))
    spans = dict(re.findall(r"(\S+) (\d+\.\d+-\d+\.\d+-\d+\.\d+)", line))
    assert set(spans) == set(rows) and spans["orig-fp32"] == "1.00-1.00-1.00"
    for name in ("fp32+loopadam", "fp32"):
        lo, med, hi = map(float, spans[name].split("-"))
        assert lo <= med <= hi and f"{med:.2f}x" == rows[name]["speed vs orig-fp32"]


def test_interleave_refuses_two_compiled_variants_in_one_line():
    out = _run("--variants", "fp32+compile,fp32+compile+budget1", "--interleave", "2")
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--interleave" in lines[0] and "fp32+compile+budget1" in lines[0]
