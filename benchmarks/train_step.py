"""Speed, MFU and peak memory of `DiTTrainer.train_step`, per precision/compile/AC variant, side by
side with facebookresearch/DiT's training loop and a matmul peak measured in the same process.

    python benchmarks/train_step.py                          # DiT-S/2, 32x32x4 latents, batch 32
    python benchmarks/train_step.py --fp32 --ac              # adds fp32 and bf16+compile+ac
    python benchmarks/train_step.py --variants orig-fp32,fp32,bf16+compile+ac --device cuda --steps 20
    python benchmarks/train_step.py --model DiT-B/2 --depth 4 --batch-size 16 --json out.json

1. Matmul peak: best time of square matmuls (n = 2048, 3072, 4096; 8192 too on CUDA) for fp32
   and bf16, in this process, with its thread count and TF32 setting.
2. FLOPs per image: `torch.utils.flop_counter.FlopCounterMode` around one forward+backward of the
   model at batch 2, divided by 2 (every op of a DiT is per sample). Matmuls, convolutions and
   attention count; recomputation under activation checkpointing and the optimizer and EMA
   arithmetic do not, so MFU is the usual "useful work" ratio.
3. Each variant is a fresh trainer fed the same in-memory batch: `--warmup` untimed steps (at least
   2 with compile; their times are printed), then `--steps` steps timed together, run as `train()`
   runs them (`run_steps`). All variants run in this one process, one after another.
4. Peak memory: on CUDA `torch.cuda.max_memory_allocated` (reset before each variant builds its
   trainer). On CPU a process's peak RSS only grows, so each variant is re-run for as many steps in
   a fresh process (`--only VARIANT`) and its VmHWM is reported.

Variants: `orig-fp32` and `orig-bf16` are the baseline, facebookresearch/DiT's train.py step as it
writes it (plain model, `training_losses` drawing t and noise inside, AdamW, EMA by a loop over named
parameters), the second under one `torch.autocast(bfloat16)` around the forward and loss, as a user
would add it. Any other variant is a `DiTTrainer`: a precision (fp32 | bf16 | fp16) with optional
`+compile` (`train.compile`), `+ac`/`+sac` (`train.activation_checkpointing full/selective`) and
`+budgetX` (`train.activation_memory_budget X`) and `+routeX` (token routing, `train.routing_keep X` over
the default span of blocks; its TFLOP/s and MFU count the FLOPs the routed blocks compute, so its img/s
beside the unrouted row is the speed-up). Without native bf16 the trainer computes bf16 in
fp32, so the default list is the fp32 path and no MFU is given against the emulated bf16 peak.
"""

import argparse
import datetime
import gc
import json
import os
import subprocess
import sys
import time

import torch
from _common import machine, peak_mib, sync, table, vm_mib

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
MODIFIERS = ("compile", "ac", "sac", "budgetX", "routeX")


# -- the rows ----------------------------------------------------------------------------------


def default_variants(has_bf16: bool, fp32: bool, ac: bool) -> list[str]:
    """The rows a plain run prints: the baselines, then the trainer eager and compiled."""
    if not has_bf16:
        return ["orig-fp32", "fp32", "fp32+compile"] + ["fp32+compile+ac"] * ac
    return ["orig-fp32", "orig-bf16", "bf16", "bf16+compile"] + ["fp32"] * fp32 + ["bf16+compile+ac"] * ac


def parse_variant(name: str) -> dict:
    """A variant name as the precision and compile/AC settings it stands for."""
    if name in ("orig-fp32", "orig-bf16"):
        return {"name": name, "precision": name[5:], "compile": False, "ac": False, "original": True}
    precision, *mods = name.split("+")
    budgets = [m[len("budget"):] for m in mods if m.startswith("budget")]
    routes = [m[len("route"):] for m in mods if m.startswith("route")]
    mods = [m for m in mods if not m.startswith(("budget", "route"))]
    if (precision not in DTYPES or any(m not in MODIFIERS for m in mods) or ("ac" in mods and "sac" in mods)
            or len(budgets) > 1 or len(routes) > 1 or not all(_is_fraction(b) for b in budgets + routes)):
        raise SystemExit(f"bad variant {name!r}: want orig-fp32, orig-bf16 or fp32|bf16|fp16 optionally followed by +"
                         + ", +".join(MODIFIERS))
    return {"name": name, "precision": precision, "compile": "compile" in mods,
            "ac": "full" if "ac" in mods else "selective" if "sac" in mods else False,
            "budget": float(budgets[0]) if budgets else None, "route": float(routes[0]) if routes else None}


def _is_fraction(text: str) -> bool:
    try:
        return 0 < float(text) <= 1
    except ValueError:
        return False


def make_config(args, variant: dict) -> dict:
    """The trainer config a variant stands for, at the run's model size and batch."""
    model = {"name": args.model, "input_size": args.input_size, "in_channels": args.in_channels,
             "num_classes": args.num_classes}
    for key in ("depth", "hidden_size", "num_heads"):
        if getattr(args, key) is not None:
            model[key] = getattr(args, key)
    for item in args.model_option or []:
        key, _, value = item.partition("=")
        model[key] = value
    budget = {"activation_memory_budget": variant["budget"]} if variant.get("budget") else {}
    if variant.get("route"):
        budget["routing_keep"] = variant["route"]
    return {
        "output_dir": os.path.join(os.environ.get("TMPDIR", "/tmp"), "dit-bench-train-step"),
        "model": model,
        "data": {"num_workers": 0},
        "train": {"global_batch_size": args.batch_size, "device": args.device, "mixed_precision": variant["precision"],
                  "compile": variant["compile"], "activation_checkpointing": variant["ac"] or "none", **budget},
        "logging": {"progress": False, "tensorboard": False},
    }


def make_batch(args, device):
    """One fixed batch of random latents and labels on `device`."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, args.in_channels, args.input_size, args.input_size, generator=g)
    y = torch.randint(0, args.num_classes, (args.batch_size,), generator=g)
    return x.to(device), y.to(device)


def build_model(args, variant: dict, device):
    """The registered model at the run's size, seeded, on `device`."""
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec

    cfg = build_config(make_config(args, variant))
    torch.manual_seed(0)
    return get_spec(cfg.model.name).build_model_fn(cfg).to(device)


class OriginalLoop:
    """facebookresearch/DiT's train.py step: the baseline every variant is compared with."""

    def __init__(self, args, variant, device):
        import copy

        from dit_trainer.diffusion import create_diffusion

        self.model = build_model(args, variant, device)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self.diffusion = create_diffusion(timestep_respacing="")
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0)
        self.device = device
        self.amp_dtype = torch.bfloat16 if variant["precision"] == "bf16" else None

    @torch.no_grad()
    def update_ema(self, decay=0.9999):
        """The release's EMA: a loop over named parameters."""
        ema_params = dict(self.ema.named_parameters())
        for name, param in self.model.named_parameters():
            ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)

    def train_step(self, batch):
        """One step as the release's loop runs it; returns the loss as a float."""
        x, y = batch
        self.model.train()
        t = torch.randint(0, self.diffusion.num_timesteps, (x.shape[0],), device=self.device)
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            loss = self.diffusion.training_losses(self.model, x, t, dict(y=y))["loss"].mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.update_ema()
        return {"loss": loss.item()}


def build_trainer(args, variant):
    """The baseline loop or a `DiTTrainer` for the variant."""
    if variant.get("original"):
        return OriginalLoop(args, variant, torch.device(args.device))
    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.train import DiTTrainer

    keep_freed_memory_on(args.device)  # as `dit train` does on a CPU (process-wide: after the baselines)
    return DiTTrainer(make_config(args, variant))


# -- measuring -----------------------------------------------------------------------------------


def run_steps(trainer, batch, n: int) -> None:
    """Run `n` training steps on `batch` as `train()` runs them, and return once the device has finished them."""
    # As train(): the host queues the steps (reading each step's checks at once only where the device
    # cannot mask a bad update), and the metrics read at a log step waits for them all.
    if not hasattr(trainer, "queue_step"):  # the original loop: each step returns floats, so it is finished
        for _ in range(n):
            trainer.train_step(batch)
        return
    for _ in range(n):
        trainer.queue_step(batch)
    trainer.update.read_losses()
    sync(batch[0].device)


def native_bf16(device) -> bool:
    """Whether bf16 matmuls have hardware support here: what the trainer asks before it autocasts."""
    from dit_trainer.train.choices import resolve_amp_dtype

    return resolve_amp_dtype("bf16", device) is not None


def peak_sizes(device, given=None) -> tuple:
    """The square matmul sizes the peak is measured at: `given` (comma-separated), else 2048..4096 (8192 on CUDA)."""
    if given:
        return tuple(int(n) for n in given.split(","))
    return (2048, 3072, 4096) + ((8192,) if device.type == "cuda" else ())


def matmul_peak(dtype, device, reps: int, sizes) -> tuple[float, int]:
    """Best TFLOP/s over square matmul sizes; returns (TFLOP/s, n of the best)."""
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


def flops_per_image(args, device, batch: int) -> float:
    """FlopCounterMode over one forward+backward of the model at `batch` samples, / batch."""
    import torch.utils.flop_counter as fc

    aten = torch.ops.aten
    # PyTorch maps the CUDA attention kernels to its SDPA formulas but not the CPU flash kernel.
    extra = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu] = lambda q, k, v, *a, **kw: fc.sdpa_flop_count(q, k, v)
        extra[aten._scaled_dot_product_flash_attention_for_cpu_backward] = (
            lambda grad_out, q, k, v, *a, **kw: fc.sdpa_backward_flop_count(grad_out, q, k, v))
    model = build_model(args, parse_variant("fp32"), device).train()
    x, y = (v[:batch] for v in make_batch(args, device))
    t = torch.randint(0, 1000, (batch,), device=device)
    with fc.FlopCounterMode(display=False, custom_mapping=extra) as counter:
        model(x, t, y).sum().backward()
    return counter.get_total_flops() / batch


def computed_share(args, variant: dict) -> float:
    """The share of the full model's FLOPs a variant computes: below 1 under token routing."""
    if not variant.get("route"):
        return 1.0
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec
    from dit_trainer.models.routing import TokenRouting

    cfg = build_config(make_config(args, variant))
    spec = get_spec(cfg.model.name)
    with torch.device("meta"):
        model = spec.build_model_fn(cfg)
    routed = TokenRouting.for_model(cfg.train, model).tokens_per_block()
    return spec.flops_fn(model, tokens_per_block=routed) / spec.flops_fn(model)


def warmup_steps(args, variant: dict) -> int:
    """Untimed steps first: at least 2 with compile, which happens in them."""
    return max(args.warmup, 2) if variant["compile"] else args.warmup


def time_variant(args, variant: dict, device) -> dict:
    """Build the variant's trainer, warm it up, time `--steps` steps; its row."""
    gc.collect()
    torch._dynamo.reset()  # each compiled variant traces its own graphs, and its warm-up shows the cost
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    trainer = build_trainer(args, variant)
    batch = make_batch(args, device)
    warm = []
    for _ in range(warmup_steps(args, variant)):
        t0 = time.perf_counter()
        run_steps(trainer, batch, 1)
        warm.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    run_steps(trainer, batch, args.steps)
    row = {"variant": variant["name"], "s_per_step": (time.perf_counter() - t0) / args.steps, "warm_times": warm,
           # bf16 falls back to fp32 without native support
           "compute": DTYPE_NAMES.get(trainer.amp_dtype, "fp32"),
           "params": sum(p.numel() for p in trainer.model.parameters())}
    if device.type == "cuda":
        row["peak_mib"] = peak_mib(device)
    del trainer, batch
    gc.collect()
    return row


def probe_memory(args, variant: dict, device) -> dict:
    """Child of `--only`: peak RSS of a fresh process that builds the trainer and runs the steps timed."""
    import dit_trainer.train  # noqa: F401  (the imports belong to the baseline, not the variant)

    batch = make_batch(args, device)
    base = vm_mib("VmRSS")
    run_steps(build_trainer(args, variant), batch, warmup_steps(args, variant) + args.steps)
    return {"variant": variant["name"], "base_mib": base, "peak_mib": peak_mib(device)}


def memory_in_fresh_process(args, variant: dict) -> dict:
    """Run `--only VARIANT` in a new interpreter and return its MEM line's JSON."""
    cmd = [sys.executable, os.path.abspath(__file__), "--only", variant["name"], "--model", args.model,
           "--batch-size", str(args.batch_size), "--input-size", str(args.input_size),
           "--in-channels", str(args.in_channels), "--num-classes", str(args.num_classes),
           "--device", args.device, "--warmup", str(args.warmup), "--steps", str(args.steps)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    for key in ("depth", "hidden_size", "num_heads"):
        if getattr(args, key) is not None:
            cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    for item in args.model_option or []:
        cmd += ["--model-option", item]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    for line in proc.stdout.splitlines():
        if line.startswith("MEM "):
            return json.loads(line[len("MEM "):])
    sys.exit(f"memory run of {variant['name']} in a fresh process failed:\n{(proc.stdout + proc.stderr)[-4000:]}")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line; --device auto resolved."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed steps first (default: %(default)s; at least 2 with compile): on a CPU a fresh "
                         "process page-faults new memory over its first steps")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda (default: %(default)s)")
    ap.add_argument("--fp32", action="store_true", help="add the fp32 variant to the default list")
    ap.add_argument("--ac", action="store_true", help="add the bf16+compile+ac variant to the default list")
    ap.add_argument("--variants", default=None, help="comma-separated list instead, e.g. orig-fp32,bf16,bf16+compile+ac")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--peak-reps", type=int, default=3, help="timed repetitions per matmul size")
    ap.add_argument("--peak-sizes", default=None, help="comma-separated square matmul sizes of the peak (default "
                                                      "2048,3072,4096, and 8192 on CUDA; smaller ones measure a lower peak)")
    ap.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory runs on CPU")
    ap.add_argument("--json", metavar="PATH", default=None, help="also write the numbers to PATH as JSON")
    ap.add_argument("--only", default=None, help=argparse.SUPPRESS)  # the CPU memory probe's child
    args = ap.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv=None):
    """Measure every variant and print the header and table (and write --json)."""
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.only:
        print("MEM " + json.dumps(probe_memory(args, parse_variant(args.only), device)), flush=True)
        return
    has_bf16 = native_bf16(device)
    names = args.variants.split(",") if args.variants else default_variants(has_bf16, args.fp32, args.ac)
    variants = [parse_variant(n) for n in names]
    start, header = time.perf_counter(), machine(device)

    dtypes = ["fp32", "bf16"] + sorted({v["precision"] for v in variants} - {"fp32", "bf16"})
    # Without native bf16 a 2048-sized bf16 matmul takes about a minute (emulated, ~100x below
    # fp32): one small size shows that, and nothing is divided by it.
    peaks = {d: matmul_peak(DTYPES[d], device, args.peak_reps, peak_sizes(device, args.peak_sizes) if has_bf16 or d != "bf16" else (512,))
             for d in dtypes}
    flop_batch = min(args.batch_size, 2)
    flops_img = flops_per_image(args, device, flop_batch)
    # The baselines first: our variants, as `dit train` on a CPU, change glibc's malloc settings for
    # the whole process (host_memory.py), which a user's own loop would not have.
    order = sorted(range(len(variants)), key=lambda i: not variants[i].get("original"))
    timed = {i: time_variant(args, variants[i], device) for i in order}
    rows = [timed[i] for i in range(len(variants))]
    if device.type == "cpu" and not args.no_memory:
        for v, row in zip(variants, rows):
            mem = memory_in_fresh_process(args, v)
            row["peak_mib"], row["base_mib"] = mem["peak_mib"], mem["base_mib"]
    for v, r in zip(variants, rows):
        r["img_per_s"] = args.batch_size / r["s_per_step"]
        r["tflops"] = flops_img * computed_share(args, v) * r["img_per_s"] / 1e12
        r["mfu"] = r["tflops"] / peaks[r["compute"]][0]
        r["mfu_vs_bf16_peak"] = r["tflops"] / peaks["bf16"][0] if has_bf16 else None

    size = [f"{label} {getattr(args, k)}" for k, label in (("depth", "depth"), ("hidden_size", "hidden"),
                                                          ("num_heads", "heads")) if getattr(args, k)]
    print(f"# benchmarks/train_step.py  {datetime.datetime.now():%Y-%m-%d %H:%M}  torch {torch.__version__}  {header}")
    print(f"# {args.model}{' (' + ', '.join(size) + ')' if size else ''}, {rows[0]['params'] / 1e6:.1f}M params, "
          f"{args.input_size}x{args.input_size}x{args.in_channels} latents, {args.num_classes} classes, "
          f"batch {args.batch_size}; DiTTrainer.train_step: diffusion loss, AdamW, EMA")
    print(f"# matmul peak (square n={'/'.join(map(str, peak_sizes(device, args.peak_sizes)))}, best of {args.peak_reps}): "
          + ", ".join(f"{d} {p:.3f} TFLOP/s (n={n})" for d, (p, n) in peaks.items()))
    if not has_bf16:
        print(f"# no native bf16 on this {device.type}: its bf16 matmul is emulated ({peaks['bf16'][0]:.4f} TFLOP/s at "
              f"n={peaks['bf16'][1]}), so the trainer's bf16 computes in fp32 here; no MFU against the bf16 peak")
    print(f"# model FLOPs/img {flops_img / 1e9:.2f} GFLOP: FlopCounterMode over 1 fwd+bwd of the model at batch "
          f"{flop_batch}, / {flop_batch} (AC recompute, optimizer, EMA not counted)")
    mem_note = ("peak mem = torch.cuda.max_memory_allocated per variant" if device.type == "cuda" else
                "peak mem = VmHWM of a fresh process running the variant's warm-up and timed steps "
                f"(it holds {rows[0]['base_mib']:.0f} MiB after imports)" if "peak_mib" in rows[0] else
                "peak mem not measured (--no-memory)")
    print(f"# s/step = {args.steps} steps timed together after {args.warmup} warm-up (at least 2 with compile), "
          f"run as train() runs them; MFU = achieved / matmul peak of the compute dtype; {mem_note}")
    by_name = {r["variant"]: r for r in rows}
    baselines = [b for b in ("orig-fp32", "orig-bf16") if b in by_name] or [rows[0]["variant"]]
    out = []
    for r in rows:
        mem = r.get("peak_mib")
        base_mem = by_name[baselines[-1]].get("peak_mib")
        out.append([r["variant"], r["compute"], f"{r['s_per_step']:.3f}", f"{r['img_per_s']:.1f}", f"{r['tflops']:.3f}",
                    f"{100 * r['mfu']:.1f}%", f"{100 * r['mfu_vs_bf16_peak']:.1f}%" if has_bf16 else "-",
                    f"{mem:.0f}" if mem is not None else "-",
                    *(f"{by_name[b]['s_per_step'] / r['s_per_step']:.2f}x" for b in baselines),
                    f"{mem / base_mem:.2f}x" if mem is not None and base_mem else "-"])
    print(table(["variant", "compute", "s/step", "img/s", "TFLOP/s", "MFU", "MFU vs bf16 peak", "peak mem MiB",
                 *(f"speed vs {b}" for b in baselines), f"mem vs {baselines[-1]}"], out))
    print("# warm-up steps, s: " + "; ".join(f"{r['variant']} " + " ".join(f"{t:.2f}" for t in r["warm_times"])
                                            for r in rows))
    print(f"# total {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "batch_size": args.batch_size, "device": device.type,
                       "flops_per_image": flops_img, "matmul_peak_tflops": {d: p for d, (p, _) in peaks.items()},
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
