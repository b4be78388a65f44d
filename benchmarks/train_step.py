"""Speed, MFU and peak memory of `DiTTrainer.train_step`, per precision/compile/AC variant, against
an fp32 baseline and a matmul peak measured in the same process.

    python benchmarks/train_step.py                          # DiT-S/2, 32x32x4 latents, batch 32: a row per change
    python benchmarks/train_step.py --model DiT-B/2 --batch-size 16
    python benchmarks/train_step.py --variants fp32,fp32+ac,bf16+compile+ac --device cuda
    python benchmarks/train_step.py --model DiT-B/2 --batch-size 64 --depth 4

1. Matmul peak: best time of square matmuls (n = 2048, 3072, 4096; 8192 too on CUDA) for fp32
   and bf16, in this process, with its thread count and TF32 setting.
2. FLOPs per image: `torch.utils.flop_counter.FlopCounterMode` around one forward+backward of the
   model at batch 2, divided by 2 (a DiT's FLOPs per image do not depend on the batch). Matmuls,
   convolutions and attention count; on CPU the flash-attention kernel is counted with PyTorch's
   own SDPA formulas, which it has no mapping for.
   These are model FLOPs: recomputation under activation checkpointing and the optimizer and EMA
   arithmetic are not counted, so MFU is the usual "useful work" ratio.
3. Each variant is a fresh `DiTTrainer` (AdamW, EMA, diffusion loss, label dropout) fed the same
   in-memory batch through `train_step((x, y))`: warm-up steps, then timed steps (s/step is the
   median, with the range). All variants run in this one process, one after another. The default
   5 warm-up steps matter on a CPU: a fresh trainer page-faults new memory every step until
   glibc's mmap threshold has grown past its activations' sizes, and the original loop needs about
   5 steps for that (the last lines print every variant's warm-up step times), so a short warm-up
   times part of the baseline's transient, which can only flatter every ratio to it.
4. Peak memory: on CUDA `torch.cuda.max_memory_allocated` (reset before each variant builds its
   trainer). On CPU the peak RSS of a process that already ran another variant says nothing, so
   each variant is re-run in a fresh process (`--only VARIANT`, as many steps as were timed and
   warmed up: the original loop's peak RSS still grows over its first steps) and its VmHWM is
   reported; the header gives what such a process holds after its imports, before building the trainer.

The rows, their modifiers and the baseline loop are described in train_step_variants.py.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch
import train_step_variants
from train_step_interleave import check_interleavable, paired_ratio, time_interleaved
from train_step_variants import (DTYPES, build_trainer, default_variants, make_batch, make_config, new_row,
                                 parse_variant, sync, undone_changes, warm_up)


# -- helpers -----------------------------------------------------------------------------------


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def proc_status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()



# -- 1. matmul peak --------------------------------------------------------------------------


def native_bf16(device) -> bool:
    """Whether bf16 matmuls have hardware support here: what the trainer asks before it autocasts."""
    from dit_trainer.train.choices import resolve_amp_dtype

    return resolve_amp_dtype("bf16", device) is not None


def matmul_peak(dtype, device, reps: int, sizes=None) -> tuple[float, int]:
    """Best TFLOP/s over square matmul sizes; returns (TFLOP/s, n of the best)."""
    sizes = sizes or (2048, 3072, 4096) + ((8192,) if device.type == "cuda" else ())
    inner = 20 if device.type == "cuda" else 1  # matmuls per timed call
    best, best_n = 0.0, 0
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        torch.mm(a, b)  # warm-up: kernel selection, page faults
        sync(device)
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                torch.mm(a, b)
            sync(device)
            tflops = inner * 2 * n**3 / (time.perf_counter() - t0) / 1e12
            if tflops > best:
                best, best_n = tflops, n
        del a, b
    return best, best_n


# -- 2. FLOPs per image ----------------------------------------------------------------------


def flops_per_image(args, device, batch: int) -> float:
    """FlopCounterMode over one forward+backward of the model at `batch` samples, / batch."""
    import torch.utils.flop_counter as fc

    from dit_trainer.config import config_from_dict
    from dit_trainer.models import get_spec

    aten = torch.ops.aten

    # PyTorch maps the CUDA attention kernels to its SDPA formulas but not the CPU flash kernel.
    def sdpa_cpu(q, k, v, *rest, **kw):
        return fc.sdpa_flop_count(q, k, v)

    def sdpa_cpu_backward(grad_out, q, k, v, *rest, **kw):
        return fc.sdpa_backward_flop_count(grad_out, q, k, v)

    extra = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu] = sdpa_cpu
        extra[aten._scaled_dot_product_flash_attention_for_cpu_backward] = sdpa_cpu_backward

    cfg = config_from_dict(make_config(args, parse_variant("fp32")))
    torch.manual_seed(0)
    model = get_spec(cfg.model.name).build_model_fn(cfg).to(device).train()
    x, y = (v[:batch] for v in make_batch(args, device))
    t = torch.randint(0, 1000, (batch,), device=device)
    with fc.FlopCounterMode(display=False, custom_mapping=extra) as counter:
        model(x, t, y).sum().backward()
    total = counter.get_total_flops()
    del model
    return total / batch


# -- 3./4. one variant ------------------------------------------------------------------------

def time_variant(args, variant: dict, device) -> dict:
    with undone_changes(variant):
        return _time_variant(args, variant, device)


def _time_variant(args, variant: dict, device) -> dict:
    gc.collect()
    torch._dynamo.reset()  # each compiled variant traces its own graphs, and its warm-up shows the cost
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    trainer = build_trainer(args, variant)
    batch = make_batch(args, device)
    row = new_row(variant, trainer, warm_up(args, variant, trainer, batch, device))
    times = row["times"]
    before = resource.getrusage(resource.RUSAGE_SELF)  # kernel time and page faults of the timed steps
    deferred = getattr(trainer, "deferred", None)
    if deferred is not None:
        # train.host_sync log (auto on a GPU): what train() runs; the host queues the steps without
        # waiting, so they are timed together, up to the log step that reads them.
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            trainer.deferred_step(batch)
        deferred.flush(trainer)
        sync(device)
        times += [(time.perf_counter() - t0) / args.steps] * args.steps
    for _ in range(args.steps if deferred is None else 0):
        sync(device)
        t0 = time.perf_counter()
        trainer.train_step(batch)  # returns .item() floats: the step is finished on return
        sync(device)
        times.append(time.perf_counter() - t0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    row["sys_s"] = (after.ru_stime - before.ru_stime) / args.steps
    row["minflt"] = (after.ru_minflt - before.ru_minflt) / args.steps
    if device.type == "cuda":
        row["peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    del trainer, batch
    gc.collect()
    return row


def probe_memory(args, variant: dict, device) -> dict:
    """Child of `--only`: peak RSS of a fresh process that builds the trainer and runs `--probe-steps`."""
    import dit_trainer.train  # noqa: F401  (the imports belong to the baseline, not the variant)

    batch = make_batch(args, device)
    base = proc_status_mib("VmRSS")
    with undone_changes(variant):
        trainer = build_trainer(args, variant)
        for _ in range(args.probe_steps):
            trainer.train_step(batch)
    return {"variant": variant["name"], "base_mib": base, "peak_mib": proc_status_mib("VmHWM")}


def memory_in_fresh_process(args, variant: dict) -> dict:
    return fresh_process(args, variant, "MEM", [])


def fresh_process(args, variant: dict, tag: str, extra: list) -> dict:
    """Run `--only VARIANT` (plus `extra`) in a new interpreter and return its `tag` line's JSON."""
    cmd = [sys.executable, os.path.abspath(__file__), "--only", variant["name"], *extra, "--model", args.model,
           "--batch-size", str(args.batch_size), "--input-size", str(args.input_size),
           "--in-channels", str(args.in_channels), "--num-classes", str(args.num_classes),
           "--device", args.device, "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--probe-steps", str(args.probe_steps)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    for key in ("depth", "hidden_size", "num_heads"):
        if getattr(args, key) is not None:
            cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    for item in args.model_option or []:
        cmd += ["--model-option", item]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    for line in proc.stdout.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])
    sys.exit(f"{tag} run of {variant['name']} in a fresh process failed:\n{(proc.stdout + proc.stderr)[-4000:]}")


# -- output ------------------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    right = [i > 0 for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if r else ":" + "-" * (w + 1) for w, r in zip(widths, right)) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def main():
    ap = argparse.ArgumentParser(description=__doc__ + "\n" + train_step_variants.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="DiT-S/2", help="registered model name (default: %(default)s)")
    ap.add_argument("--depth", type=int, default=None, help="override the model's depth")
    ap.add_argument("--hidden-size", type=int, default=None, help="override the model's hidden size")
    ap.add_argument("--num-heads", type=int, default=None, help="override the model's head count")
    ap.add_argument("--model-option", action="append", metavar="KEY=VALUE",
                    help="a family option of the model section, e.g. dim=384 for Large-DiT (repeatable)")
    ap.add_argument("--input-size", type=int, default=32, help="latent side (default: %(default)s)")
    ap.add_argument("--in-channels", type=int, default=4)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per variant (default: %(default)s)")
    ap.add_argument("--interleave", type=int, default=0, metavar="R",
                    help="build every variant first, then time R rounds of one step each, order rotated; speed "
                         "ratios are the median of per-round ratios (train_step_interleave.py); replaces --steps")
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed steps first (default: %(default)s; at least 2 with compile): on a CPU a fresh "
                         "process page-faults new memory every step until glibc's mmap threshold has grown, "
                         "about 5 steps for the original loop")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda (default: %(default)s)")
    ap.add_argument("--fp32", action="store_true", help="add the fp32 variant to the default list")
    ap.add_argument("--ac", action="store_true", help="add the bf16+compile+ac variant to the default list")
    ap.add_argument("--variants", default=None, help="comma-separated list instead, e.g. fp32,bf16,bf16+compile+ac")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--peak-reps", type=int, default=3, help="timed repetitions per matmul size")
    ap.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory runs on CPU")
    ap.add_argument("--only", default=None, help="run VARIANT's CPU memory probe in this process and print it")
    ap.add_argument("--probe-steps", type=int, default=None, help=argparse.SUPPRESS)  # default: warm-up + timed
    ap.add_argument("--time-only", action="store_true", help=argparse.SUPPRESS)  # with --only: time it, print ROW
    args = ap.parse_args()
    if args.probe_steps is None:
        # The original loop's peak RSS still grows over its first steps (heap fragmentation as the
        # mmap threshold rises), so the probe runs as many steps as the timing did.
        args.probe_steps = args.warmup + (args.interleave or args.steps)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.only and args.time_only:
        print("ROW " + json.dumps(time_variant(args, parse_variant(args.only), device)), flush=True)
        return
    if args.only:
        print("MEM " + json.dumps(probe_memory(args, parse_variant(args.only), device)), flush=True)
        return

    has_bf16 = native_bf16(device)
    names = (args.variants.split(",") if args.variants else default_variants(has_bf16, args.fp32, args.ac))
    variants = [parse_variant(n) for n in names]
    if args.interleave:
        check_interleavable(variants)  # before minutes of matmul peaks
    start = time.perf_counter()
    load_start = loadavg()

    dtypes = ["fp32", "bf16"] + sorted({v["precision"] for v in variants} - {"fp32", "bf16"})
    # Without native bf16 a 2048-sized bf16 matmul takes about a minute (seen: 1 GFLOP/s on an
    # AVX2-only CPU, 100x below fp32): one small size shows that, and nothing is divided by it.
    peaks = {d: matmul_peak(DTYPES[d], device, args.peak_reps, None if has_bf16 or d != "bf16" else (512,))
             for d in dtypes}
    # Every op of a DiT is per sample, so FLOPs/img do not depend on the batch (checked: DiT-S/2 counts
    # the same at 1, 2 and 32); counting at 2 saves a full-batch fp32 step on a CPU.
    flop_batch = min(args.batch_size, 2)
    flops_img = flops_per_image(args, device, flop_batch)
    # The originals first, while glibc's malloc is as a user has it: building a DiTTrainer on CPU
    # changes it for the rest of the process (train.keep_freed_memory), so +sysmalloc rows run in
    # a fresh process of their own.
    if args.interleave:
        rows = time_interleaved(args, variants, device)
    else:
        order = sorted(range(len(variants)), key=lambda i: not variants[i].get("original"))
        timed = {i: (fresh_process(args, variants[i], "ROW", ["--time-only"])
                     if variants[i].get("sysmalloc") and device.type == "cpu" else time_variant(args, variants[i], device))
                 for i in order}
        rows = [timed[i] for i in range(len(variants))]
    if device.type == "cpu" and not args.no_memory:
        for v, row in zip(variants, rows):
            mem = memory_in_fresh_process(args, v)
            row["peak_mib"], row["base_mib"] = mem["peak_mib"], mem["base_mib"]

    # -- print -----------------------------------------------------------------------------
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    size = [f"{label} {getattr(args, k)}" for k, label in (("depth", "depth"), ("hidden_size", "hidden"), ("num_heads", "heads"))
            if getattr(args, k)]
    print(f"# benchmarks/train_step.py  {datetime.datetime.now():%Y-%m-%d %H:%M}  torch {torch.__version__}  "
          f"device {device.type} ({dev_name})  {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads  "
          f"loadavg {load_start} (1/5/15 min)")
    print(f"# {args.model}{' (' + ', '.join(size) + ')' if size else ''}, {rows[0]['params'] / 1e6:.1f}M params, "
          f"{args.input_size}x{args.input_size}x{args.in_channels} latents, {args.num_classes} classes, batch {args.batch_size}; "
          f"DiTTrainer.train_step: diffusion loss, AdamW, EMA")
    print("# matmul peak (square n=" + "/".join(str(n) for n in ((2048, 3072, 4096) + ((8192,) if device.type == 'cuda' else ()))) +
          f", best of {args.peak_reps}): " + ", ".join(f"{d} {p:.3f} TFLOP/s (n={n})" for d, (p, n) in peaks.items()))
    if not has_bf16:
        print(f"# no native bf16 on this {device.type}: its bf16 matmul is emulated ({peaks['bf16'][0]:.4f} TFLOP/s at "
              f"n={peaks['bf16'][1]}), so the trainer's default mixed_precision bf16 computes in fp32 here "
              "(train/backends.py); the default list times the fp32 path and leaves orig-bf16 out, and no MFU is "
              "given against the bf16 peak")
    print(f"# model FLOPs/img {flops_img / 1e9:.2f} GFLOP: FlopCounterMode over 1 fwd+bwd of the model at batch {flop_batch}, / {flop_batch} "
          "(AC recompute, optimizer, EMA not counted)")
    mem_note = ("peak mem = torch.cuda.max_memory_allocated per variant" if device.type == "cuda" else
                f"peak mem = VmHWM of a fresh process running the variant for {args.probe_steps} steps "
                f"(it holds {rows[0].get('base_mib', float('nan')):.0f} MiB after imports)" if "peak_mib" in rows[0] else
                "peak mem not measured (--no-memory)")
    timing = (f"s/step = median over {args.interleave} interleaved rounds (one step of every variant per round, the "
              f"order rotated; every trainer built and warmed up {args.warmup} steps first, at least 2 with compile; the "
              "original loop runs with freed memory kept, as the trainers set it process-wide), speed = median of the "
              "per-round ratios" if args.interleave else
              f"s/step = median of {args.steps} timed steps after {args.warmup} warm-up (at least 2 with compile; "
              "where train.host_sync is log, as on a GPU, the mean of the steps timed together as train() runs them)")
    print(f"# {timing}; MFU = achieved / matmul peak of the compute dtype; {mem_note}")
    medians = {r["variant"]: statistics.median(r["times"]) for r in rows}
    mem = {r["variant"]: r["peak_mib"] for r in rows if "peak_mib" in r}
    baselines = [b for b in ("orig-fp32", "orig-bf16") if b in medians] or [rows[0]["variant"]]
    by_name = {r["variant"]: r for r in rows}
    out = []
    for r in rows:
        med = statistics.median(r["times"])
        tflops = flops_img * args.batch_size / med / 1e12
        out.append([
            r["variant"], r["compute"], f"{med:.3f}", f"{min(r['times']):.2f}-{max(r['times']):.2f}",
            f"{args.batch_size / med:.1f}", f"{tflops:.3f}", f"{100 * tflops / peaks[r['compute']][0]:.1f}%",
            f"{100 * tflops / peaks['bf16'][0]:.1f}%" if has_bf16 else "-",
            f"{r['peak_mib']:.0f}" if "peak_mib" in r else "-",
            *(f"{paired_ratio(by_name[b], r)[0] if args.interleave else medians[b] / med:.2f}x" for b in baselines),
            *(f"{r['peak_mib'] / mem[b]:.2f}x" if "peak_mib" in r and b in mem else "-" for b in baselines[-1:]),
        ])
    print(table(["variant", "compute", "s/step", "range s", "img/s", "TFLOP/s", "MFU", "MFU vs bf16 peak",
                 "peak mem MiB", *(f"speed vs {b}" for b in baselines), f"mem vs {baselines[-1]}"], out))
    print("# warm-up steps, s: " + "; ".join(f"{r['variant']} " + " ".join(f"{t:.2f}" for t in r["warm_times"])
                                            for r in rows))
    if args.interleave:
        print(f"# per-round speed ratio to {baselines[0]}, min-median-max: " + "; ".join(
            f"{r['variant']} " + "-".join(f"{x:.2f}" for x in sorted(paired_ratio(by_name[baselines[0]], r))) for r in rows))
    print("# per timed step, kernel CPU s and minor page faults (all threads): " +
          "; ".join(f"{r['variant']} {r['sys_s']:.2f} s, {r['minflt']:.0f}" for r in rows))
    print(f"# total {time.perf_counter() - start:.0f} s; loadavg at end {loadavg()}")


if __name__ == "__main__":
    main()
