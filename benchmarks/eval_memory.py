"""Wall time and peak RSS of `dit eval --network digits` by sample count, this tree beside an earlier revision.

    python benchmarks/eval_memory.py [--sizes 10000,50000,200000] [--before REV] [--cap-gib 12]

Each size gets a samples .npz of 64×64 uint8 digits (scikit-learn's, scaled up, with noise, in a
seeded random order), measured against `--ref digits` by this tree's `dit eval` and by the same
command run from a `git worktree` of `--before`, each in a child process. The children run under
an address-space cap (`--cap-gib`, RLIMIT_AS) so that a run needing more memory than the machine
can spare fails with its own error instead of waking the OOM killer on a shared machine. Peak RSS
is the child's own (wait4's ru_maxrss). Prints the header, a markdown table, the metrics of both
sides where both finished, and the peak RSS at each size as a multiple of the smallest size's.
"""

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
IMAGE = 64


def machine_line() -> str:
    """CPU model, CPU count and load average."""
    name = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{name}, {os.cpu_count()} CPUs, loadavg {load} (1/5/15 min)"


def write_samples(path: Path, n: int, seed: int = 0, chunk: int = 10_000) -> None:
    """An .npz whose arr_0 is n×64×64 uint8 digits, written chunk by chunk (200,000 are 819 MB)."""
    from sklearn.datasets import load_digits

    digits = load_digits().images.astype(np.int16) * 15  # 0..16 -> 0..240
    scale = IMAGE // digits.shape[1]
    base = digits.repeat(scale, axis=1).repeat(scale, axis=2)
    rng = np.random.default_rng(seed)
    header = {"descr": "|u1", "fortran_order": False, "shape": (n, IMAGE, IMAGE)}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as z, \
            z.open("arr_0.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, header)
        for start in range(0, n, chunk):
            count = min(chunk, n - start)
            images = base[rng.integers(0, len(base), count)]
            images += rng.integers(-12, 13, size=images.shape, dtype=np.int16)
            f.write(np.clip(images, 0, 255).astype(np.uint8).tobytes())


def run_eval(src: Path, samples: Path, out_json: Path, cap_bytes: int, timeout: float) -> dict:
    """Run `dit eval` from `src` in a child under the cap; wall seconds, peak RSS (MiB), exit code, metrics."""
    env = dict(os.environ, PYTHONPATH=str(src))
    cmd = [sys.executable, "-m", "dit_trainer", "eval", "--network", "digits", "--samples", str(samples),
           "--ref", "digits", "--no-progress", "--overwrite", "--json", str(out_json)]

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    if out_json.exists():
        out_json.unlink()
    start = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=cap,
                             cwd=tempfile.gettempdir())
    try:
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
    # communicate() reaped the child; its rusage is the only one RUSAGE_CHILDREN gained since.
    wall = time.perf_counter() - start
    lines = err.decode(errors="replace").strip().splitlines()
    result = {"wall": wall, "rc": child.returncode, "last": lines[-1] if lines else "",
              "stderr": lines, "metrics": json.loads(out_json.read_text()) if out_json.exists() else None}
    return result


def measure(src: Path, samples: Path, out_json: Path, cap_bytes: int, timeout: float) -> dict:
    """run_eval with the child's own peak RSS, read through a one-child helper process."""
    # RUSAGE_CHILDREN keeps a maximum over every child ever reaped, so each run happens inside a
    # fresh helper process whose only child it is.
    helper = subprocess.run(
        [sys.executable, __file__, "--_child", json.dumps([str(src), str(samples), str(out_json), cap_bytes, timeout])],
        stdout=subprocess.PIPE, check=True)
    return json.loads(helper.stdout)


def _child(arg: str) -> None:
    src, samples, out_json, cap_bytes, timeout = json.loads(arg)
    result = run_eval(Path(src), Path(samples), Path(out_json), int(cap_bytes), float(timeout))
    result["peak_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps(result))


def outcome(r: dict, cap_gib: float) -> tuple:
    """(wall, peak RSS) cells of a run: numbers, or why it failed."""
    if r["rc"] == 0:
        return f"{r['wall']:.0f} s", f"{r['peak_mib'] / 1024:.2f} GiB"
    text = " ".join(r["stderr"][-3:])
    why = ("out of memory under the {:g} GiB cap".format(cap_gib)
           if "memory" in text.lower() or "alloc" in text.lower() else f"exit {r['rc']}: {r['last'][:60]}")
    return f"failed after {r['wall']:.0f} s", f"{why} (peak {r['peak_mib'] / 1024:.2f} GiB)"


def worktree(rev: str, where: Path) -> Path:
    """A detached git worktree of `rev` at `where`; its src/ folder."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return where / "src"


def main() -> int:
    """Run the benchmark and print its table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10000,50000,200000", help="sample counts, comma-separated")
    p.add_argument("--before", default="11c5cf4",
                   help="git revision of the 'before' side (default: the last one with the 10,000 × N "
                        "precision/recall)")
    p.add_argument("--cap-gib", type=float, default=12.0, help="address-space cap of every child (GiB)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a child is killed")
    p.add_argument("--workdir", default=None, help="where the samples and the worktree go (default: a temp folder)")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        _child(args._child)
        return 0
    from _common import table  # benchmarks/ is on sys.path when run as a script; it imports torch
    sizes = [int(s) for s in args.sizes.split(",")]
    cap = int(args.cap_gib * 2**30)
    print(f"# dit eval --network digits: memory and time by sample count ({datetime.date.today().isoformat()})")
    print(f"machine: {machine_line()}")
    print(f"command: python benchmarks/eval_memory.py --sizes {args.sizes} --before {args.before} "
          f"--cap-gib {args.cap_gib:g}")
    print(f"each run: dit eval --network digits --samples S.npz --ref digits --no-progress (64×64 uint8 digits), "
          f"RLIMIT_AS {args.cap_gib:g} GiB")
    rows, runs = [], {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        old_src = worktree(args.before, tmp / "before")
        try:
            for n in sizes:
                samples = tmp / f"samples_{n}.npz"
                write_samples(samples, n)
                before = measure(old_src, samples, tmp / "before.json", cap, args.timeout)
                after = measure(ROOT / "src", samples, tmp / "after.json", cap, args.timeout)
                samples.unlink()
                runs[n] = (before, after)
                rows.append([f"{n:,}", *outcome(before, args.cap_gib), *outcome(after, args.cap_gib)])
                print(f"  {n:,}: before rc {before['rc']} {before['wall']:.0f} s, after rc {after['rc']} "
                      f"{after['wall']:.0f} s", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "before")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print()
    print(table(["samples", f"before ({args.before}): wall", "before: peak RSS", "after: wall", "after: peak RSS"],
                rows))
    print()
    for n, (before, after) in runs.items():
        m = after["metrics"]
        if m is None:
            continue
        line = f"{n:,}: after precision {m['precision']:.4f} recall {m['recall']:.4f} FID {m['fid']:.4f}"
        if before["metrics"] is not None:
            b = before["metrics"]
            same = all(b[k] == m[k] for k in ("precision", "recall", "fid", "sfid", "inception_score"))
            line += f"; before {b['precision']:.4f} / {b['recall']:.4f}: {'identical' if same else 'DIFFERENT'}"
        print(line)
    for n, pair in runs.items():
        for side, r in zip(("before", "after"), pair):
            if r["rc"] != 0:
                print(f"{n:,} {side}: exit {r['rc']}: {r['last'][:200]}")
    base = runs[sizes[0]][1]
    if base["rc"] == 0:
        ratios = [f"{n:,}: {runs[n][1]['peak_mib'] / base['peak_mib']:.2f}x" for n in sizes[1:] if runs[n][1]["rc"] == 0]
        print(f"after, peak RSS relative to {sizes[0]:,} samples: {', '.join(ratios) or 'n/a'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
