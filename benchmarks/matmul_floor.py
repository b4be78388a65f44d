"""How much of a training step is matmul, and how fast could the step be if nothing else took time.

    python benchmarks/matmul_floor.py                      # DiT-S/2, batch 32, the default compiled bf16 step
    python benchmarks/matmul_floor.py --variant bf16 --rounds 4
    python benchmarks/matmul_floor.py --kernels 12           # and the step's slowest fused C++ kernels

1. One step of the variant (after warm-up) runs under PyTorch's profiler, which records every
   matmul it makes (aten mm, addmm, bmm, baddbmm) with its operands' shapes, strides and dtypes
   and its time inside the step.
2. Each distinct matmul is then run alone, on fresh operands laid out the same way (a transposed
   view stays one), and timed (median of --reps). The "floor" is the sum over the step's matmuls
   of the faster of each one's two times (in the step, alone): what the step would take if norms,
   activations, softmax, the loss, the optimizer and EMA were free and every matmul ran as fast as
   it was seen to run in this run.
3. The original loop (`orig-bf16`, or `orig-fp32` for an fp32 variant; train_step_variants.py) and
   the variant are timed side by side for --rounds rounds (one step each per round), so the last
   lines can say, in this run's numbers, the most any trainer could be ahead of the original loop
   on this machine (original / floor) and what a target ratio leaves for everything but the matmuls.
   As in train_step.py --interleave, the original loop runs with freed memory kept (the trainer
   sets it for the whole process), which can only make it faster.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step_interleave import paired_ratio, time_interleaved_keeping_trainers  # noqa: E402
from train_step_variants import make_batch, parse_variant, undone_changes  # noqa: E402

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def profiled_step(trainer, batch):
    """The events of one profiled step and its time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        trainer.train_step(batch)
        step_s = time.perf_counter() - t0
    return prof.events(), step_s


def tally(keyed_events):
    """key -> [count, total seconds] over (key, profiler event) pairs."""
    found = {}
    for key, e in keyed_events:
        entry = found.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += e.cpu_time_total / 1e6
    return found


def matmul_key(e):
    """(name, shapes, strides, dtypes) of a matmul event's operands (a call with out= records the output after them)."""
    arity = 3 if e.name in ("aten::addmm", "aten::baddbmm") else 2
    return (e.name, *(tuple(tuple(x) for x in xs[:arity]) for xs in (e.structured_input_shapes,
                                                                 e.structured_input_strides)),
            tuple(e.input_dtypes[:arity]))


def matmul_events(events):
    """(name, shapes, strides, dtypes) -> [count, total seconds in the step] of a step's matmuls."""
    return tally((matmul_key(e), e) for e in events if e.name in MATMULS)


def fused_kernels(events):
    """name -> [count, total seconds] of the C++ kernels inductor generated, as recorded with
    `torch._inductor.config.cpp.enable_kernel_profile` (named `graph_<n>_cpp_fused_<ops>_<k>`)."""
    return tally((e.name, e) for e in events if e.name.startswith("graph_") and "_cpp_fused_" in e.name)


def print_kernels(kernels: dict, top: int, step_s: float) -> None:
    """The `top` fused kernels by time per step, and what all of them take."""
    total = sum(t for _, t in kernels.values())
    print("| fused kernel | per step | ms each | ms per step |")
    print("|:--|--:|--:|--:|")
    for name, (count, secs) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| {name} | {count} | {1e3 * secs / count:.2f} | {1e3 * secs:.1f} |")
    print(f"# fused kernels: {len(kernels)} distinct, {total:.2f} s of the profiled step's {step_s:.2f} s")


DTYPES = {"float": torch.float32, "c10::BFloat16": torch.bfloat16, "c10::Half": torch.float16, "double": torch.float64}


def operand(shape, stride, dtype_name: str):
    """A fresh tensor with the recorded shape, strides (a transposed weight stays transposed) and dtype."""
    dtype = DTYPES.get(dtype_name, torch.float32)
    return torch.empty_strided(shape, stride, dtype=dtype).copy_(torch.randn(shape))


def operands(name: str, shapes, strides=None, dtypes=None):
    """The recorded matmul on fresh operands of the same layout; (callable, FLOPs)."""
    strides = strides or [torch.empty(s).stride() for s in shapes]
    dtypes = dtypes or ["float"] * len(shapes)
    tensors = [operand(*x) for x in zip(shapes, strides, dtypes)]
    if name in ("aten::addmm", "aten::baddbmm"):
        bias, a, b = tensors
        fn = torch.addmm if name == "aten::addmm" else torch.baddbmm
        call = lambda: fn(bias, a, b)  # noqa: E731
    else:
        a, b = tensors
        call = lambda: torch.matmul(a, b)  # noqa: E731
    batch = a.shape[0] if a.dim() == 3 else 1
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    return call, 2 * batch * m * k * n


def describe(shape, stride) -> str:
    """`[m, n]`, with a T where the operand is a transposed view (its last dimension not the dense one)."""
    transposed = len(shape) >= 2 and stride[-1] != 1 and shape[-1] > 1
    return f"{list(shape)}{'T' if transposed else ''}"


def time_alone(call, reps: int) -> float:
    """Median seconds of `call` after two warm-up calls."""
    call(), call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="DiT-S/2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--input-size", type=int, default=32)
    ap.add_argument("--in-channels", type=int, default=4)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--depth", type=int, default=None)
    ap.add_argument("--hidden-size", type=int, default=None)
    ap.add_argument("--num-heads", type=int, default=None)
    ap.add_argument("--variant", default="bf16+compile", help="a train_step.py variant (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=6, help="side-by-side rounds with the original loop")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=9, help="timed runs of each distinct matmul alone")
    ap.add_argument("--target", type=float, default=1.5, help="a speed ratio to the original loop to budget for")
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="also list the N slowest of the C++ kernels inductor generated for the step (compiled variants; "
                         "turns on inductor's kernel profiling for the whole run)")
    args = ap.parse_args()
    if torch.cuda.is_available():
        raise SystemExit("matmul_floor.py times CPU steps with the CPU profiler; on a GPU use gpu_check.sh")
    # What train_step_variants reads from train_step.py's arguments; --rounds are its interleaved rounds.
    args.device, args.model_option, args.interleave = "cpu", None, args.rounds
    device = torch.device(args.device)
    variant = parse_variant(args.variant)
    if variant.get("original"):
        raise SystemExit(f"--variant {args.variant}: give one of the trainer's variants; the original loop is timed anyway")
    original = "orig-fp32" if variant["precision"] == "fp32" else "orig-bf16"

    if args.kernels:
        import torch._inductor.config as inductor_config

        # A compile-time switch: each generated kernel then records itself in the profiler.
        inductor_config.cpp.enable_kernel_profile = True
    start = time.perf_counter()
    # The original loop and the variant side by side, as train_step.py --interleave times them
    # (which refuses what cannot share a process, such as +sysmalloc).
    (orig_row, row), (orig_trainer, trainer) = time_interleaved_keeping_trainers(
        args, [parse_variant(original), variant], device)
    del orig_trainer
    with undone_changes(variant):
        events, profiled_s = profiled_step(trainer, make_batch(args, device))
    found, kernels = matmul_events(events), fused_kernels(events)
    dtype = trainer.amp_dtype or torch.float32
    del trainer

    rows, floor_s, alone_s, instep_s, flops = [], 0.0, 0.0, 0.0, 0
    for (name, shapes, strides, dtypes), (count, total) in sorted(found.items(), key=lambda kv: -kv[1][1]):
        call, f = operands(name, shapes, strides, dtypes)
        alone = time_alone(call, args.reps)
        # A shared machine's speed drifts between the step and the replay: each matmul counts at
        # the faster of the two times seen, so the floor stays below what this run observed.
        floor_s += count * min(alone, total / count)
        instep_s += total
        alone_s += count * alone
        flops += count * f
        rows.append((name[6:], " x ".join(describe(*x) for x in zip(shapes, strides)), count, 1e3 * total / count,
                     1e3 * alone, f / alone / 1e12))
    orig_s, ours_s = statistics.median(orig_row["times"]), statistics.median(row["times"])
    ratio, lowest, highest = paired_ratio(orig_row, row)

    print(f"# benchmarks/matmul_floor.py  {datetime.datetime.now():%Y-%m-%d %H:%M}  torch {torch.__version__}  "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} threads")
    print(f"# {args.model}, batch {args.batch_size}, {args.input_size}x{args.input_size}x{args.in_channels} latents; "
          f"variant {args.variant}, matmuls in {str(dtype).replace('torch.', '')}; one profiled step took {profiled_s:.2f} s")
    print("| op | operand shapes | per step | ms in the step | ms alone | TFLOP/s alone |")
    print("|:--|:--|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.3f} |")
    print(f"# matmuls per step: {flops / 1e9:.1f} GFLOP; {instep_s:.2f} s inside the profiled step, "
          f"{alone_s:.2f} s alone; the faster of the two for each: {floor_s:.2f} s ({flops / floor_s / 1e12:.3f} TFLOP/s), the floor")
    print(f"# side by side, {args.rounds} rounds: {original} {orig_s:.2f} s/step, {args.variant} {ours_s:.2f} s/step, "
          f"ratio median {ratio:.2f}x (rounds {lowest:.2f}-{highest:.2f})")
    print(f"# the most any step of this model could be ahead of {original} here: {orig_s / floor_s:.2f}x "
          f"({orig_s:.2f} / {floor_s:.2f} s)")
    budget = orig_s / args.target
    print(f"# {args.target:g}x {original} needs {budget:.2f} s/step, which leaves {budget - floor_s:.2f} s over the floor "
          f"for everything else; {args.variant} takes {ours_s - floor_s:.2f} s over it (in the profiled step: "
          f"{instep_s:.2f} s of matmuls, {profiled_s - instep_s:.2f} s of the rest)")
    if args.kernels:
        print_kernels(kernels, args.kernels, profiled_s)
    print(f"# total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
