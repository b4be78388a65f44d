"""What a compiled transformer block keeps for its backward, and what it recomputes, per
`train.activation_memory_budget`: memory accounting that needs no native bf16 and no GPU.

    python tools/profiling/saved_activations.py                          # DiT-S/2, batch 32, bf16, budgets 1..0.4
    python tools/profiling/saved_activations.py --model DiT-B/2 --batch-size 16 --list

The trainer compiles each block (`train.compile`) and, with a budget below 1, sets PyTorch's
`activation_memory_budget` while the block's graph is partitioned into forward and backward. This
script partitions one block the same way (inductor's decompositions and min-cut partitioner, under
the same autocast and symbolic sizes) but runs the two graphs eagerly, and prints per budget:
- the tensors the forward hands to the backward, with their dtype, shape and MiB at this batch
  (parameters and batch-independent tensors are left out: they are held anyway);
- the block's share of the step's saved activations, i.e. that per block times the depth;
- the FLOPs of forward plus backward against 3x the forward's (the model FLOPs that MFU counts):
  the excess is what the budget recomputes.
It runs the block once per budget (bf16 on a CPU without native bf16 is emulated and slow: about
40 s per budget at DiT-S/2 batch 32 on an AVX2-only CPU), and says nothing about time: where recompute is cheap in
FLOPs it can still cost time, which only `benchmarks/train_step.py` on the target hardware measures.
"""

import argparse
import datetime
import functools
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))


def block_and_inputs(args):
    """The model's first block and (x, c) at the run's shape, as the trainer's forward hands them over."""
    from dit_trainer.config import build_config
    from dit_trainer.models import get_spec

    model = {"name": args.model, "input_size": args.input_size, "in_channels": args.in_channels,
             "num_classes": args.num_classes}
    for key in ("depth", "hidden_size", "num_heads"):
        if getattr(args, key):
            model[key] = getattr(args, key)
    cfg = build_config({"output_dir": "unused", "model": model})
    spec = get_spec(cfg.model.name)
    torch.manual_seed(0)
    net = spec.build_model_fn(cfg)
    units = list(net.blocks.values()) if isinstance(net.blocks, torch.nn.ModuleDict) else list(net.blocks)
    captured = {}

    def grab(module, inputs, kwargs):
        captured.setdefault("args", inputs)
        captured.setdefault("kwargs", kwargs)

    hook = units[0].register_forward_pre_hook(grab, with_kwargs=True)
    b = args.batch_size
    x = torch.randn(b, cfg.model.in_channels, cfg.model.input_size, cfg.model.input_size)
    with torch.no_grad():
        net(x, torch.randint(0, 1000, (b,)), torch.randint(0, cfg.model.num_classes, (b,)))
    hook.remove()
    inputs = tuple(a.detach().clone().requires_grad_(a.is_floating_point()) if torch.is_tensor(a) else a
                   for a in captured["args"])
    return units[0], inputs, captured["kwargs"], len(units)


def partitioned(block, inputs, kwargs, budget: float, dtype):
    """Compile `block` as the trainer does, with a backend that records its forward/backward graphs."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config as functorch_config
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
                           decompositions=select_decomp_table())
    torch._dynamo.reset()
    compiled = torch.compile(block, backend=backend, dynamic=True)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32), \
            functorch_config.patch(activation_memory_budget=budget):
        out = compiled(*inputs, **kwargs)
    return graphs, out


def saved_tensors(backward_graph) -> list[tuple[str, torch.dtype, tuple, int]]:
    """(name, dtype, shape, bytes) of each batch-sized tensor the backward graph takes from the forward."""
    rows = []
    for node in backward_graph.graph.nodes:
        if node.op != "placeholder" or node.name.startswith("tangents"):
            continue
        val = node.meta.get("val")
        if not torch.is_tensor(val) or not any(isinstance(s, torch.SymInt) for s in val.shape):
            continue  # parameters, per-run constants and sizes: resident whatever the budget
        shape = tuple(int(s.node.hint) if isinstance(s, torch.SymInt) else int(s) for s in val.shape)
        rows.append((node.name, val.dtype, shape, math.prod(shape) * val.element_size()))
    return rows


def describe(rows, every: bool) -> str:
    """The kept tensors as dtype[shape], largest first; those under 1 MiB only counted unless `every`."""
    rows = sorted(rows, key=lambda r: -r[3])
    big = [r for r in rows if every or r[3] >= 2**20]
    text = ", ".join(f"{str(d).replace('torch.', '').replace('bfloat16', 'bf16').replace('float', 'f')}"
                     f"[{','.join(map(str, s))}]" for _, d, s, _ in big)
    return text + (f" + {len(rows) - len(big)} under 1 MiB" if len(rows) > len(big) else "")


def flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="DiT-S/2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--input-size", type=int, default=32)
    ap.add_argument("--in-channels", type=int, default=4)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--depth", type=int, default=None, help="override the model's depth (the x depth column uses it)")
    ap.add_argument("--hidden-size", type=int, default=None)
    ap.add_argument("--num-heads", type=int, default=None)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--budgets", default="1,0.8,0.7,0.6,0.5,0.45,0.4")
    ap.add_argument("--list", action="store_true", help="also list the kept tensors under 1 MiB")
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]

    block, inputs, kwargs, depth = block_and_inputs(args)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        forward_flops = flops(lambda: block(*inputs, **kwargs))
    print(f"# tools/profiling/saved_activations.py  {datetime.datetime.now():%Y-%m-%d %H:%M}\n# {args.model}, batch {args.batch_size}, {args.input_size}x{args.input_size}x{args.in_channels} latents, "
          f"{args.dtype + ' autocast' if args.dtype != 'fp32' else 'fp32'}, torch {torch.__version__}: one block, partitioned as train.compile does; "
          f"model FLOPs (3x forward) {3 * forward_flops / 1e9:.2f} GFLOP per block step; depth {depth}")
    print("| budget | tensors kept | MiB per block | MiB x depth | kept tensors | recomputed FLOPs |")
    print("|--:|--:|--:|--:|:--|--:|")
    for budget in (float(b) for b in args.budgets.split(",")):
        graphs, out = partitioned(block, inputs, kwargs, budget, dtype)
        rows = saved_tensors(graphs["backward"])
        grad = torch.randn_like(out)

        def step():
            torch.autograd.grad(out, [t for t in inputs if torch.is_tensor(t) and t.requires_grad], grad)

        # The compiled forward ran while compiling; a forward recomputes nothing, so its FLOPs are the eager one's.
        total = forward_flops + flops(step)
        per_block = sum(r[3] for r in rows) / 2**20
        names = describe(rows, every=args.list)
        print(f"| {budget:g} | {len(rows)} | {per_block:.1f} | {per_block * depth:.0f} | {names} | "
              f"{100 * (total - 3 * forward_flops) / (3 * forward_flops):+.1f}% |", flush=True)


if __name__ == "__main__":
    main()
