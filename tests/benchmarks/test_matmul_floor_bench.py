"""benchmarks/matmul_floor.py: the profiled step's matmuls are the model's linear layers, their
FLOPs add up, and the last lines are consistent with the numbers above them."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from matmul_floor import describe, fused_kernels, operand, operands, print_kernels  # noqa: E402


def test_operands_count_flops_of_each_matmul_kind():
    import torch

    # The second operand recorded as a transposed view (strides (1, 5)) is rebuilt as one.
    call, flops = operands("aten::addmm", ((6,), (4, 5), (5, 6)), ((1,), (5, 1), (1, 5)), ["float"] * 3)
    assert call().shape == (4, 6) and flops == 2 * 4 * 5 * 6
    call, flops = operands("aten::bmm", ((3, 4, 5), (3, 5, 2)), None, ["c10::BFloat16"] * 2)
    out = call()
    assert out.shape == (3, 4, 2) and out.dtype == torch.bfloat16 and flops == 2 * 3 * 4 * 5 * 2
    assert operand((5, 6), (1, 5), "float").stride() == (1, 5)
    assert describe((5, 6), (1, 5)) == "[5, 6]T" and describe((4, 5), (5, 1)) == "[4, 5]"


def test_floor_table_and_budget_lines_agree():
    depth, hidden, batch, tokens = 2, 64, 2, 16
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "matmul_floor.py"), "--depth", str(depth),
                          "--hidden-size", str(hidden), "--num-heads", "2", "--input-size", "8", "--batch-size",
                          str(batch), "--variant", "fp32", "--rounds", "2", "--warmup", "1", "--reps", "2"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| op")]
    # Every block's fc1 runs forward as addmm over the batch's tokens: (batch*tokens, hidden) x (hidden, 4*hidden).
    fc1 = [r for r in rows if r[0] == "addmm" and f"[{batch * tokens}, {hidden}] x [{hidden}, {4 * hidden}]" in r[1]]
    assert len(fc1) == 1 and int(fc1[0][2]) == depth
    floor_s = sum(int(r[2]) * min(float(r[3]), float(r[4])) for r in rows) / 1e3
    line = next(x for x in out.stdout.splitlines() if x.startswith("# matmuls per step"))
    printed_floor = float(re.search(r"the faster of the two for each: ([\d.]+) s", line).group(1))
    alone = float(re.search(r"([\d.]+) s alone", line).group(1))
    assert abs(printed_floor - floor_s) <= 0.01 + 0.05 * floor_s  # the table's ms are rounded
    assert printed_floor <= alone
    side = next(x for x in out.stdout.splitlines() if x.startswith("# side by side"))
    orig_s = float(re.search(r"orig-fp32 ([\d.]+) s/step", side).group(1))
    most = next(x for x in out.stdout.splitlines() if x.startswith("# the most any step"))
    ratio, num, den = map(float, re.search(r"here: ([\d.]+)x \(([\d.]+) / ([\d.]+) s\)", most).groups())
    assert num == orig_s and den == printed_floor and ratio > 0


def test_fused_kernels_sum_inductor_kernels_only(capsys):
    from types import SimpleNamespace

    def event(name, us):
        return SimpleNamespace(name=name, cpu_time_total=us)

    events = [event("graph_1_cpp_fused_gelu_1", 5000), event("graph_1_cpp_fused_gelu_1", 7000),
              event("graph_0_cpp_fused_softmax_3", 2000), event("aten::mm", 90000),
              event("## Call CompiledFxGraph fxyz", 100000)]
    kernels = fused_kernels(events)
    assert kernels == {"graph_1_cpp_fused_gelu_1": [2, 0.012], "graph_0_cpp_fused_softmax_3": [1, 0.002]}
    print_kernels(kernels, 1, 0.5)
    out = capsys.readouterr().out
    assert "| graph_1_cpp_fused_gelu_1 | 2 | 6.00 | 12.0 |" in out and "softmax" not in out
    assert "2 distinct, 0.01 s of the profiled step's 0.50 s" in out
