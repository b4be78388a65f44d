"""Images/s of DDIM-25 sampling with classifier-free guidance 4.0: our sampler
(`dit_trainer.sample.sample_latents`) vs diffusers' `DiTPipeline` on the same exported weights,
in one process, same dtype, latents only (the VAE decode is left out of both); then ours again
with its forward compiled (`dit sample --compile`, what `auto` picks for FID-sized runs), timed
after the first call, which compiles (its seconds are printed).

    python benchmarks/sampling.py                       # DiT-S/2 batch 4, DiT-B/2 batch 2, fp32, CPU
    python benchmarks/sampling.py --device cuda --batch-sizes 64,32 --dtype bf16
"""

import argparse
import os
import platform
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
    from dit_trainer.convert.diffusers_names import to_diffusers
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
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
