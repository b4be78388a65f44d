"""What a MeanFlow step costs: `DiTTrainer.train_step` with objective meanflow (both JVP paths, with and without
guidance folded into the target) beside the same model's flow-matching step (objective transport), fed the
same in-memory batches, alternating step by step in one process; on a GPU each variant's peak memory too.

    python benchmarks/meanflow_step.py                      # the digits demo's model and batch (CPU)
    python benchmarks/meanflow_step.py --device cuda --model SiT-XL/2 --input-size 32 --in-channels 4 \
        --num-classes 1000 --batch-size 32 --mixed-precision bf16       # what gpu_check.sh runs
    python benchmarks/meanflow_step.py --check-compile      # also: compiled steps equal eager ones

Variants: `flow` (SiT's velocity loss), `mf separate` / `mf graph` (meanflow.jvp; guidance at the official
omega 1, kappa 0.5: two more forwards under no_grad), `unguided` the same without guidance (omega 1, kappa 0),
`omega 2` with guidance of kappa 0 (one more forward: only the unconditional velocity). A name ending in
`width N` builds the demo's network at width N (`demo difference width 128`: the MeanFlow demo's).
`--check-compile` trains two MeanFlow steps eager and compiled (train.compile true) and prints both losses
and gradient norms (the first compiled step costs about a minute on two CPU cores).
"""

import argparse
import statistics
import sys
import tempfile
import time

import torch

from _common import machine, peak_mib, sync, table
from dit_trainer.meanflow.demo import settings as demo_settings

VARIANTS = {
    "flow": ("transport", {}),
    "mf separate": ("meanflow", {"jvp": "separate"}),
    "mf graph": ("meanflow", {"jvp": "graph"}),
    "mf difference": ("meanflow", {"jvp": "difference"}),
    "mf separate unguided": ("meanflow", {"jvp": "separate", "kappa": 0.0}),
    "mf graph unguided": ("meanflow", {"jvp": "graph", "kappa": 0.0}),
    # kappa 0: only the unconditional velocity is needed, one forward under no_grad
    "mf separate omega 2": ("meanflow", {"jvp": "separate", "omega": 2.0, "kappa": 0.0}),
    "mf graph omega 2": ("meanflow", {"jvp": "graph", "omega": 2.0, "kappa": 0.0}),
}
# The digits demo's own settings (meanflow/demo.py), by each of the three du/dt paths.
_DEMO = {k: v for k, v in demo_settings(0)["meanflow"].items() if k != "steps"}
VARIANTS.update({f"demo {path}": ("meanflow", {**_DEMO, "jvp": path}) for path in ("separate", "graph", "difference")})
# The demo takes du/dt along the network's own velocity (meanflow.tangent predicted, one forward more): the
# paper's tangent, the sample's velocity, beside it.
VARIANTS.update({f"demo {path} sample tangent": ("meanflow", {**_DEMO, "jvp": path, "tangent": "sample"})
                 for path in ("separate", "difference")})


def _variant(name):
    """(objective, meanflow section, width) of a variant name; "... width N" gives the demo's network width N."""
    base, _, width = name.partition(" width ")
    objective, meanflow = VARIANTS[base]
    return objective, meanflow, int(width) if width else None


def _config(args, out, objective, meanflow, width=None, **train):
    model = {"name": args.model, "input_size": args.input_size, "in_channels": args.in_channels,
             "num_classes": args.num_classes, "learn_sigma": False}
    if args.model == "demo":  # the digits SiT demo's DiT-S/4-shaped network (the MeanFlow demo's is width 128)
        model.update(name="SiT-S/4", depth=4, hidden_size=width or 192, num_heads=4)
    return {"output_dir": out, "objective": objective, "meanflow": meanflow, "model": model,
            "data": {"num_workers": 0}, "optim": {"max_grad_norm": 1e6},
            "train": {"global_batch_size": args.batch_size, "device": args.device, "compile": "false",
                      "mixed_precision": args.mixed_precision, "seed": 0, **train},
            "checkpoint": {"resume": False}, "logging": {"progress": False, "tensorboard": False}}


def _batches(args):
    g = torch.Generator().manual_seed(0)
    shape = (args.batch_size, args.in_channels, args.input_size, args.input_size)
    return [(torch.randn(shape, generator=g), torch.randint(0, args.num_classes, (args.batch_size,), generator=g))
            for _ in range(2)]


def check_compile(args, tmp) -> None:
    """Two MeanFlow steps eager and compiled from one seed: their losses and gradient norms."""
    from dit_trainer.train import DiTTrainer

    batches = _batches(args)
    seen = {}
    for mode in ("false", "true"):
        trainer = DiTTrainer(_config(args, f"{tmp}/compile-{mode}", "meanflow", {}, compile=mode))
        seen[mode] = [trainer.train_step(batches[i]) for i in range(2)]
    for i in range(2):
        e, c = seen["false"][i], seen["true"][i]
        same = all(abs(c[k] - e[k]) <= 1e-5 * abs(e[k]) for k in ("loss", "grad_norm"))
        print(f"# compile check, step {i + 1}: loss {e['loss']:.7f} eager, {c['loss']:.7f} compiled; grad norm "
              f"{e['grad_norm']:.7f} eager, {c['grad_norm']:.7f} compiled: {'equal' if same else 'DIFFERENT'} (1e-5)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="a registered name, or demo (the digits demo's network)")
    ap.add_argument("--input-size", type=int, default=16)
    ap.add_argument("--in-channels", type=int, default=1)
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mixed-precision", default="fp32")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS)
                    + " (each may end in 'width N': the demo's network at width N)")
    ap.add_argument("--check-compile", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from dit_trainer.train import DiTTrainer

    device = torch.device(args.device)
    batches = _batches(args)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        trainers, peaks = {}, {}
        for i, name in enumerate(names):
            objective, meanflow, width = _variant(name)
            trainers[name] = DiTTrainer(_config(args, f"{tmp}/{i}", objective, meanflow, width))
        times = {name: [] for name in names}
        for step in range(args.warmup + args.steps):
            for name, trainer in trainers.items():  # alternating: the machine's drift hits every variant alike
                if device.type == "cuda" and step == args.warmup:
                    torch.cuda.reset_peak_memory_stats(device)
                sync(device)
                t0 = time.perf_counter()
                trainer.train_step(batches[step % 2])
                sync(device)
                if step >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
                if device.type == "cuda" and step == args.warmup:
                    peaks[name] = peak_mib(device)
        base = statistics.median(times[names[0]])
        print(f"# {machine(device)}; torch {torch.__version__}")
        print(f"# {args.model} on {args.input_size}x{args.input_size}x{args.in_channels}, batch {args.batch_size}, "
              f"{args.mixed_precision}; median of {args.steps} steps after {args.warmup} warm-up, variants alternating")
        print(f"# command: python benchmarks/meanflow_step.py {' '.join(sys.argv[1:] if argv is None else argv)}")
        rows = [[name, f"{statistics.median(times[name]):.4f}", f"{statistics.median(times[name]) / base:.2f}x",
                 f"{peaks[name]:.0f}" if name in peaks else "n/a"] for name in names]
        print(table(["variant", "s/step", f"vs {names[0]}", "peak MiB (GPU)"], rows))
        if args.check_compile:
            check_compile(args, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
