"""Peak memory of training-step variants only, each in a fresh process, side by side with the
original loop: the memory columns of `benchmarks/train_step.py` without its timing.

    python benchmarks/peak_memory.py --variants orig-bf16,bf16+compile,bf16+compile+budget0.45
    python benchmarks/peak_memory.py --emulated-bf16 --probe-steps 3 --jobs 3   # a CPU without native bf16

Variant names are train_step.py's (train_step_variants.py). A variant's peak memory is the VmHWM
of a new interpreter that builds it and runs `--probe-steps` steps, as train_step.py measures it
on a CPU (on CUDA train_step.py reads the allocator's peak instead; this script is for CPUs). Memory does not depend on speed, which
gives two things train_step.py cannot: `--jobs N` runs N probes at once, and `--emulated-bf16`
runs the bf16 variants in bf16 on a CPU without native bf16 (where the trainer itself would
compute in fp32), so that the activations are the sizes a native-bf16 machine holds; its bf16
matmuls are emulated, some minutes per DiT-S/2 batch-32 step, and no time is reported. Emulation
is not free in memory for the eager original loop: on an AVX2-only EPYC its DiT-S/2 batch-32 peak
was 3722 MiB after 3 steps against 3419 after 10 on a native-bf16 CPU, while the compiled trainer
matched (2534 against 2528). Compare emulated trainer rows with each other or with a native
baseline, not with an emulated `orig-bf16`. The original
loop's peak still grows over its first steps (at DiT-S/2 batch 32 on a native-bf16 CPU: 3281 MiB
after 2 steps, 3419 after 10), so fewer probe steps flatter it, not the trainer.
"""

import argparse
import concurrent.futures
import datetime
import os
import sys
from types import SimpleNamespace

import torch
from train_step import cpu_name, memory_in_fresh_process, table
from train_step_variants import EMULATED_BF16, parse_variant


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="orig-bf16,bf16+compile,bf16+compile+budget0.6,bf16+compile+budget0.45")
    ap.add_argument("--model", default="DiT-S/2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--probe-steps", type=int, default=10, help="steps per probe (train_step.py: warm-up + timed, 10)")
    ap.add_argument("--jobs", type=int, default=1, help="probes run at once (memory does not depend on speed)")
    ap.add_argument("--emulated-bf16", action="store_true",
                    help="bf16 variants compute in bf16 even without native bf16 (slow; memory only)")
    ap.add_argument("--depth", type=int, default=None)
    ap.add_argument("--hidden-size", type=int, default=None)
    ap.add_argument("--num-heads", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    probe_args = SimpleNamespace(**vars(args), input_size=32, in_channels=4, num_classes=1000, warmup=0,
                                 steps=args.probe_steps, model_option=None, device="cpu")
    if args.emulated_bf16:
        os.environ[EMULATED_BF16] = "1"  # read by train_step_variants.build_trainer in each probe
    variants = [parse_variant(n) for n in args.variants.split(",")]
    start = datetime.datetime.now()
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        mems = list(pool.map(lambda v: memory_in_fresh_process(probe_args, v), variants))
    base = next((m for m in mems if m["variant"].startswith("orig-")), mems[0])
    size = ", ".join(f"{k.replace('_', ' ')} {getattr(args, k)}" for k in ("depth", "hidden_size", "num_heads")
                     if getattr(args, k))
    print(f"# benchmarks/peak_memory.py  {start:%Y-%m-%d %H:%M}  torch {torch.__version__}  cpu "
          f"({cpu_name()})  {args.model}{' (' + size + ')' if size else ''}, batch {args.batch_size}, "
          f"{args.probe_steps} steps per fresh process, {args.jobs} at once"
          + ("; bf16 emulated (memory only)" if args.emulated_bf16 else ""))
    print(f"# peak mem = VmHWM of the process; it held {mems[0]['base_mib']:.0f} MiB after its imports")
    print(table(["variant", "peak mem MiB", f"mem vs {base['variant']}"],
                [[m["variant"], f"{m['peak_mib']:.0f}", f"{m['peak_mib'] / base['peak_mib']:.2f}x"] for m in mems]))


if __name__ == "__main__":
    sys.exit(main())
