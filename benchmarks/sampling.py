"""Images/s of DDIM-25 sampling with classifier-free guidance 4.0: our sampler
(`dit_trainer.sample.sample_latents`) vs diffusers' `DiTPipeline` on the same exported weights,
in one process, same dtype, latents only (the VAE decode is left out of both); then ours again
with its forward compiled (`dit sample --compile`, what `auto` picks for FID-sized runs), timed
after the first call, which compiles (its seconds are printed).

`--malloc` adds, on CPU, our eager sampler with glibc's malloc as it comes and with
`host_memory.keep_freed_memory` (what `dit sample` applies on CPU unless `--keep-freed-memory
false`), each in a fresh process (the setting is process-wide): img/s, kernel CPU seconds and minor
page faults per sampling run, peak RSS.

    python benchmarks/sampling.py                       # DiT-S/2 batch 4, DiT-B/2 batch 2, fp32, CPU
    python benchmarks/sampling.py --no-diffusers --no-compile --models DiT-S/2 --batch-sizes 32 --malloc
    python benchmarks/sampling.py --device cuda --batch-sizes 64,32 --dtype bf16
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


class _NoDecode(torch.nn.Module):
    """Stands in for the VAE so that diffusers' pipeline returns its latents undecoded."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(scaling_factor=1.0)
        self.register_buffer("anchor", torch.zeros(1))  # gives the pipeline a device and dtype to read

    @property
    def device(self):
        return self.anchor.device

    @property
    def dtype(self):
        return self.anchor.dtype

    def decode(self, latents):
        return SimpleNamespace(sample=latents)


def _export(name, out, seed=0):
    """A random DiT of size `name` (32x32x4 latents, 1000 classes) exported as a diffusers transformer."""
    from dit_trainer.convert import Bundle
    from dit_trainer.convert.hf_diffusers import WEIGHTS
    from dit_trainer.convert.layout import to_diffusers
    from dit_trainer.convert.pipeline_folder import transformer_config, write_json
    from safetensors.torch import save_file

    cfg = {"name": name, "input_size": 32, "in_channels": 4, "num_classes": 1000}
    model = _random_dit(name, seed)
    bundle = Bundle(state_dict=model.state_dict(), model=cfg)
    write_json(os.path.join(out, "config.json"), transformer_config(bundle.model, "DiTTransformer2DModel"))
    save_file({k: v.contiguous().clone() for k, v in to_diffusers(bundle.state_dict).items()},
              os.path.join(out, WEIGHTS))
    return cfg, model


def _timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _random_dit(name, seed=0):
    """A DiT of size `name` (32x32x4 latents, 1000 classes) with random weights everywhere."""
    from dit_trainer.convert.model_config import build_dit

    torch.manual_seed(seed)
    model = build_dit({"name": name, "input_size": 32, "in_channels": 4, "num_classes": 1000})
    with torch.no_grad():
        for k, p in model.named_parameters():
            if k != "pos_embed":
                p.normal_(0, 0.02)
    return model


def bench(name, batch, steps, dtype, device, reps, with_diffusers=True, compile=True):
    """Images/s of ours, diffusers' and ours with `--compile` (and the compile's seconds) for one model size."""
    from dit_trainer.sample import sample_latents

    if with_diffusers:
        from diffusers import DDIMScheduler, DiTPipeline, DiTTransformer2DModel

        from dit_trainer.convert.pipeline_folder import scheduler_config

        with tempfile.TemporaryDirectory() as tmp:
            cfg, model = _export(name, tmp)
            transformer = DiTTransformer2DModel.from_pretrained(tmp)
        sched = DDIMScheduler.from_config({k: v for k, v in scheduler_config({}).items() if not k.startswith("_")})
        pipe = DiTPipeline(transformer=transformer.to(device, dtype), vae=_NoDecode(), scheduler=sched)
        pipe.set_progress_bar_config(disable=True)
    else:
        model = _random_dit(name)  # no export: `--no-diffusers` runs where diffusers is not installed
    model = model.to(device, dtype).eval()
    labels = [(207 + 13 * i) % 1000 for i in range(batch)]

    def ours(n_steps=steps, compile=False):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            sample_latents(model, None, labels, cfg_scale=4.0, sampler="ddim", steps=n_steps, seed=0, device=device,
                           compile=compile)

    def theirs(n_steps=steps):
        pipe(class_labels=labels, guidance_scale=4.0, num_inference_steps=n_steps,
             generator=torch.Generator().manual_seed(0), output_type="pt")

    ours(2)  # warm-up: kernels, allocator, lazy init
    t_ours = min(_timed(ours, device) for _ in range(reps))
    out = {"ours": batch / t_ours}
    if with_diffusers:
        theirs(2)
        out["theirs"] = batch / min(_timed(theirs, device) for _ in range(reps))
    if compile:
        # Last, since it compiles the model's forward in place; its first call is the compile.
        out["compile_s"] = _timed(lambda: ours(2, compile=True), device)
        out["compiled"] = batch / min(_timed(ours, device) for _ in range(reps))
    return out


def malloc_child(args) -> None:
    """`--malloc-child MODE`: time our eager sampler for the one model/batch given; print a MALLOC line."""
    from dit_trainer.host_memory import keep_freed_memory

    if args.malloc_child == "keep":
        assert keep_freed_memory(), "keep_freed_memory had no effect (not glibc?)"
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    batch = int(args.batch_sizes.split(",")[0])
    model = _random_dit(args.models.split(",")[0]).to(device, dtype).eval()
    labels = [(207 + 13 * i) % 1000 for i in range(batch)]
    from dit_trainer.sample import sample_latents

    def ours(n_steps=args.steps):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            sample_latents(model, None, labels, cfg_scale=4.0, sampler="ddim", steps=n_steps, seed=0, device=device)

    ours(2)  # warm-up, as in the main table
    best = None
    for _ in range(args.reps):
        before = resource.getrusage(resource.RUSAGE_SELF)
        t = _timed(ours, device)
        after = resource.getrusage(resource.RUSAGE_SELF)
        run = (t, after.ru_stime - before.ru_stime, after.ru_minflt - before.ru_minflt)
        best = run if best is None or t < best[0] else best
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    print("MALLOC " + json.dumps({"img_s": batch / best[0], "sys_s": best[1], "faults": best[2], "peak_mib": hwm}))


def malloc_table(args) -> None:
    """Our eager sampler with glibc's default malloc and with freed memory kept, each in a fresh process."""
    print("| model | batch | malloc | img/s | kernel CPU s per run | minor faults per run | peak RSS MiB | vs glibc default |")
    print("|---|--:|---|--:|--:|--:|--:|--:|")
    for name, batch in zip(args.models.split(","), args.batch_sizes.split(",")):
        rows = {}
        for mode in ("default", "keep"):
            cmd = [sys.executable, os.path.abspath(__file__), "--malloc-child", mode, "--models", name,
                   "--batch-sizes", batch, "--steps", str(args.steps), "--dtype", args.dtype, "--device", args.device,
                   "--reps", str(args.reps)] + (["--threads", str(args.threads)] if args.threads else [])
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("MALLOC ")), None)
            if line is None:
                sys.exit(f"--malloc run ({mode}) failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
            rows[mode] = r = json.loads(line[len("MALLOC "):])
            label = "glibc default" if mode == "default" else "keep_freed_memory"
            print(f"| {name} | {batch} | {label} | {r['img_s']:.3g} | {r['sys_s']:.2f} | {r['faults']:,} | "
                  f"{r['peak_mib']:.0f} | {r['img_s'] / rows['default']['img_s']:.2f}x |", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="DiT-S/2,DiT-B/2")
    p.add_argument("--batch-sizes", default="4,2", help="one per model (CPU defaults fit 2 cores in a few minutes)")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-diffusers", action="store_true", help="time our sampler only (no diffusers needed)")
    p.add_argument("--no-compile", action="store_true", help="leave out the compiled row (`dit sample --compile true`)")
    p.add_argument("--malloc", action="store_true",
                   help="CPU: also time ours with glibc's default malloc and with freed memory kept, in fresh processes")
    p.add_argument("--malloc-child", choices=("default", "keep"), default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.malloc_child:
        malloc_child(args)
        return 0
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    models = args.models.split(",")
    batches = [int(b) for b in args.batch_sizes.split(",")]
    if args.no_diffusers:
        theirs_version = "not timed"
    else:
        import diffusers

        theirs_version = diffusers.__version__
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    gpu = f"{torch.cuda.get_device_name(device)}, " if device.type == "cuda" else ""
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} torch {torch.__version__} diffusers {theirs_version} {gpu}"
          f"{platform.processor() or platform.machine()} {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
          f"load {load:.1f}; DDIM-{args.steps}, CFG 4.0, 32x32x4 latents, {args.dtype}, {args.device}, no VAE decode")
    print("| model | batch | ours img/s | diffusers DiTPipeline img/s | ours / diffusers "
          "| ours compiled img/s | compiled / diffusers | compile s |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for name, batch in zip(models, batches):
        r = bench(name, batch, args.steps, dtype, device, args.reps, with_diffusers=not args.no_diffusers,
                  compile=not args.no_compile)
        theirs, compiled = r.get("theirs"), r.get("compiled")
        cells = [name, batch, f"{r['ours']:.3g}", f"{theirs:.3g}" if theirs else "-",
                 f"{r['ours'] / theirs:.2f}x" if theirs else "-", f"{compiled:.3g}" if compiled else "-",
                 f"{compiled / theirs:.2f}x" if compiled and theirs else "-",
                 f"{r['compile_s']:.0f}" if compiled else "-"]
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    if args.malloc and args.device == "cpu":
        # Fresh processes, and after the table above, which ran with glibc's malloc untouched.
        print(f"\n# our eager sampler, DDIM-{args.steps}, best of {args.reps} runs after a 2-step warm-up, each "
              "malloc mode in a fresh process (host_memory.keep_freed_memory is process-wide)")
        malloc_table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
