"""Helper of gpu_check.sh: `probe` (is there a CUDA GPU? one line either way) and `summary LOGDIR`
(the compact table gathered from the logs of train_step.py, sampling.py and parallel.py).

    python benchmarks/gpu_check.py probe          # "NAME|COUNT|torch X|CUDA Y" or one line on stderr, exit 2
    python benchmarks/gpu_check.py sdpa           # which attention kernel DiT-XL/2's bf16 SDPA runs
    python benchmarks/gpu_check.py jvp-attention  # which SDPA kernels take a JVP (MeanFlow's), and how fast
    python benchmarks/gpu_check.py summary LOGDIR # reads LOGDIR/{train_b32,train_b128,sampling,fsdp_*,sdpa,compile_cache}.log
"""

import datetime
import re
import sys
from pathlib import Path


def probe() -> int:
    """Print the GPU's name and count; without a usable CUDA device, one line on stderr and exit 2."""
    try:
        import torch
    except ImportError as err:
        print(f"gpu_check: torch is not importable ({err}); install the project's environment first", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        why = "a CPU-only build" if torch.version.cuda is None else "no CUDA device visible (driver, CUDA_VISIBLE_DEVICES?)"
        print(f"gpu_check: no CUDA GPU: torch {torch.__version__} has {why}; run this on a GPU machine",
              file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name(0)}|{torch.cuda.device_count()}|torch {torch.__version__}|CUDA {torch.version.cuda}")
    return 0


def sdpa() -> int:
    """Print the kernel the default SDPA dispatch runs for DiT-XL/2's attention (bf16, as under
    autocast) and whether the flash backend alone accepts it: the model does not pin a backend."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    # DiT-XL/2 at 256 px: 256 tokens, 16 heads of 72, batch 32.
    q, k, v = (torch.randn(32, 16, 256, 72, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()  # warm-up
    # The dispatcher's choice shows as the aten op SDPA calls (CPU activity records the ops).
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
        torch.cuda.synchronize()
    ops = {e.key for e in prof.key_averages()}
    backends = {"aten::_scaled_dot_product_flash_attention": "flash",
                "aten::_scaled_dot_product_cudnn_attention": "cudnn",
                "aten::_scaled_dot_product_efficient_attention": "mem-efficient",
                "aten::_scaled_dot_product_attention_math": "math"}
    kinds = [kind for op, kind in backends.items() if op in ops]
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
        flash = "yes"
    except RuntimeError as err:
        flash = f"no ({str(err).splitlines()[0][:80]})"
    print(f"SDPA default dispatch, bf16 (32,16,256,72): {'/'.join(kinds) or 'unknown'}; flash backend usable: {flash}")
    return 0


def jvp_attention() -> int:
    """For each SDPA kernel: whether torch.func.jvp goes through it (MeanFlow's du/dt) at DiT-XL/2's shapes,
    fp32 as the JVP runs and bf16, and the median time of one JVP; models/attention.py's FORWARD_AD_BACKENDS
    should hold the fastest that does."""
    import statistics
    import time

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, tq, tk, tv = (torch.randn(32, 16, 256, 72, device="cuda", dtype=dtype) for _ in range(6))
        cells = []
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.MATH):
            try:
                with sdpa_kernel(backend):
                    times = []
                    for _ in range(6):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        torch.func.jvp(attend, (q, k, v), (tq, tk, tv))
                        torch.cuda.synchronize()
                        times.append(time.perf_counter() - t0)
                cells.append(f"{backend.name.lower()} {statistics.median(times[1:]) * 1e3:.2f} ms")
            except (RuntimeError, NotImplementedError) as err:
                cells.append(f"{backend.name.lower()} no ({str(err).splitlines()[0][:60]})")
        print(f"JVP through SDPA, {str(dtype).removeprefix('torch.')} (32,16,256,72): " + "; ".join(cells))
    return 0


def table_rows(text: str, first_header: str) -> list[dict]:
    """Rows of the markdown table whose header starts with `first_header`, as header -> cell dicts."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells and cells[0] == first_header:
            rows = []
            for row in lines[i + 2:]:  # skip the |---| rule
                values = [c.strip() for c in row.strip("|").split("|")]
                if len(values) != len(cells):
                    break
                rows.append(dict(zip(cells, values)))
            return rows
    return []


def _read(logs: Path, name: str) -> str:
    path = logs / f"{name}.log"
    return path.read_text(errors="replace") if path.is_file() else ""


def _status(logs: Path) -> dict:
    """name -> 'ok' | 'timeout' | 'failed (rc N)' | 'skipped (...)' from the status file gpu_check.sh writes."""
    out = {}
    path = logs / "status"
    for line in (path.read_text().splitlines() if path.is_file() else []):
        name, _, what = line.partition(" ")
        out[name] = what
    return out


def train_lines(logs: Path, name: str, status: str) -> list[str]:
    """One line per variant of a train_step.py log: img/s, MFU vs the measured bf16 peak, peak memory."""
    text = _read(logs, name)
    rows = table_rows(text, "variant")
    if not rows:
        return [f"train ({name}): no result ({status})"]
    head = re.search(r"^# ([^\s,]+).*, (\d+x\d+x\d+) latents.*batch (\d+);", text, re.M)
    model, latents, batch = head.groups() if head else ("?", "?", "?")
    return [f"train {model} {latents} {r['variant']:<16} batch {batch:>4}: {r['img/s']:>8} img/s  "
            f"MFU {r['MFU vs bf16 peak']:>6} of bf16 peak  peak mem {r['peak mem MiB']:>6} MiB" for r in rows]


def bf16_peak(logs: Path) -> str:
    """The bf16 matmul peak train_step.py measured (the MFU denominator)."""
    for name in ("train_b128", "train_b32"):
        m = re.search(r"bf16 ([\d.]+) TFLOP/s \(n=(\d+)\)", _read(logs, name))
        if m:
            return f"{float(m.group(1)):.4g} TFLOP/s (square matmul n={m.group(2)}, measured in {name})"
    return "not measured"


def sampling_line(logs: Path, status: str) -> str:
    """Our sampler's img/s from a sampling.py log."""
    text = _read(logs, "sampling")
    rows = table_rows(text, "model")
    if not rows:
        return f"sampling: no result ({status})"
    head = re.search(r"(DDIM-\d+, CFG [\d.]+), .* latents, (\w+),", text)
    what = " ".join(head.groups()) if head else "DDIM"
    r = rows[0]
    return f"sampling {what} {r['model']} batch {r['batch']}: {r['ours img/s']} img/s (latents, no VAE decode)"


def _parallel(path: Path) -> list:
    """(ranks, img/s, global batch, precision, state MiB/rank) of each row of a parallel.py log."""
    text = path.read_text(errors="replace")
    head = re.search(r"global batch (\d+), (\w+)", text)
    batch, precision = head.groups() if head else ("?", "?")
    return [(int(r["ranks"]), float(r["img/s"]), batch, precision, r["state MiB/rank (max)"])
            for r in table_rows(text, "layout")]


def fsdp_line(logs: Path, statuses: dict) -> str:
    """FSDP img/s on N GPUs against 1 GPU (same images per GPU), from parallel.py logs."""
    single = _parallel(logs / "fsdp_1.log") if (logs / "fsdp_1.log").is_file() else []
    multi = [row for path in sorted(logs.glob("fsdp_*.log")) if path.stem != "fsdp_1" for row in _parallel(path)]
    if not single or not multi:
        why = "; ".join(f"{k} {v}" for k, v in statuses.items() if k.startswith("fsdp")) or "not run"
        return f"FSDP2 scaling: no result ({why})"
    _, one, batch, precision, _ = single[0]
    parts = [f"1 GPU {one:.1f} img/s (batch {batch})"]
    for n, ips, batch, _, state in multi:
        parts.append(f"{n} GPUs {ips:.1f} img/s (batch {batch}) = {ips / one:.2f}x, {100 * ips / one / n:.0f}% of linear, "
                     f"state {state} MiB/rank")
    return f"FSDP2 scaling ({precision}): " + "; ".join(parts)


def summary(logs: Path) -> int:
    """Print the compact summary; exit 1 when a sub-run failed or timed out."""
    statuses = _status(logs)
    gpu = (logs / "gpu").read_text().strip() if (logs / "gpu").is_file() else "unknown GPU"
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"== gpu_check summary  {now:%Y-%m-%d %H:%M} UTC  {gpu} ==")
    print(f"bf16 matmul peak: {bf16_peak(logs)}; TF32 on (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, trainer sets allow_tf32)")
    for name in ("train_b32", "train_b128"):
        for line in train_lines(logs, name, statuses.get(name, "not run")):
            print(line)
    attention = [line for line in _read(logs, "sdpa").splitlines() if line.startswith("SDPA")]
    print(attention[0] if attention else f"SDPA: no result ({statuses.get('sdpa', 'not run')})")
    print(sampling_line(logs, statuses.get("sampling", "not run")))
    print(fsdp_line(logs, statuses))
    cache = [line for line in _read(logs, "compile_cache").splitlines() if line.startswith("compile cache")]
    print(cache[-1] if cache else f"compile cache: no result ({statuses.get('compile_cache', 'not run')})")
    bad = {k: v for k, v in statuses.items() if v != "ok" and not v.startswith("skipped")}
    skipped = {k: v for k, v in statuses.items() if v.startswith("skipped")}
    print("status: " + ("all sub-runs ok" if not bad else "; ".join(f"{k} {v}" for k, v in bad.items()))
          + ("; " + "; ".join(f"{k} {v}" for k, v in skipped.items()) if skipped else "") + f"; logs in {logs}")
    return 1 if bad else 0


def main(argv) -> int:
    if argv[:1] == ["probe"]:
        return probe()
    if argv[:1] == ["jvp-attention"]:
        return jvp_attention()
    if argv[:1] == ["sdpa"]:
        return sdpa()
    if len(argv) == 2 and argv[0] == "summary":
        return summary(Path(argv[1]))
    print("usage: gpu_check.py probe | sdpa | summary LOGDIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
