"""Measure this machine as a hardware profile for `dit plan --hardware FILE.yaml`.

    python benchmarks/hardware_profile.py                    # prints the YAML
    python benchmarks/hardware_profile.py --out src/dit_trainer/plan/profiles/cpu.yaml

On a CPU it measures what the planner prices, per process with one thread (as the benchmarks
launch them), each timing less the time its thread waited for a core (run_queue.py), so that the
profile holds the rates of cores of one's own on a shared machine: the bf16 matmul rate at a
square size and at DiT blocks' shapes (their ratio is the matmul efficiency), forward+backward
elements/s of each elementwise op class, what compiling a block's pointwise chain leaves of its
time, AdamW + EMA + gradient norm per parameter (fused, and the per-parameter loop that several
gloo processes use), the trainer's per-step and per-micro-batch host work, gloo's all-reduce /
all-gather / reduce-scatter bandwidth and latency between two processes (and the latency with twice
as many processes as cores), and what FSDP's hooks and DTensor's dispatch cost on the host per block
(a tiny DiT's steps under FSDP and TP on two processes against one).
The median of a few repetitions each, over three passes (the square matmul's peak: the fastest);
check `cat /proc/loadavg` first: a busy neighbour slows them all.
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def _timings(fn, reps):
    """Seconds of `reps` calls after one warm-up, each less the time it waited for a core."""
    from run_queue import Waited

    fn()
    times = []
    for _ in range(reps):
        with Waited() as w:
            fn()
        times.append(w.wall - w.waited)
    return times


def best(fn, reps=5):
    """The fastest of `reps` calls: for the peak that MFU is quoted against."""
    return min(_timings(fn, reps))


def typical(fn, reps=5):
    """The median of `reps` calls. The planner predicts a typical step (plan_check compares a median
    step), so every rate it prices is a median too: priced at the fastest of a few calls, one-process
    steps read 3-25% faster than they ran."""
    return statistics.median(_timings(fn, reps))


def _block_matmuls(m, d, dtype):
    """FLOP/s of a linear layer's forward and two backward matmuls, m tokens by d -> 4d."""
    import torch

    x, w, g = torch.randn(m, d, dtype=dtype), torch.randn(4 * d, d, dtype=dtype), torch.randn(m, 4 * d, dtype=dtype)

    def train():
        x @ w.t(), g @ w, g.t() @ x

    return 3 * 2 * m * d * 4 * d / typical(train, 5)


def matmul_rates(dtype):
    """(square-matmul FLOP/s, DiT-shaped matmuls' FLOP/s at many tokens, tokens at half that rate)."""
    import torch

    n = 2048
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    peak = 2 * n**3 / best(lambda: a @ b, 7)
    many, few = 4096, 256
    large = statistics.median(_block_matmuls(many, d, dtype) for d in (256, 384, 768, 1152))
    small = statistics.median(_block_matmuls(few, d, dtype) for d in (256, 384, 768, 1152))
    # rate(m) = top * m / (m + half), through both points.
    half = max(0.0, few * many * (large - small) / (small * many - large * few))
    return peak, large * (many + half) / many, half


def copy_bandwidth():
    """Bytes/s read plus written by a 256 MiB float32 copy."""
    import torch

    a, b = torch.empty(2**26), torch.randn(2**26)
    return 2 * a.nbytes / typical(lambda: a.copy_(b), 5)


def elementwise_rates():
    """Forward+backward elements/s of each op class the planner counts (models/costs.py)."""
    import torch
    import torch.nn.functional as F

    m, d = 4096, 384
    bf16 = torch.bfloat16

    def rate(make, fn, elements):
        x = make()

        def run():
            fn(x).float().sum().backward()

        return elements / typical(run, 7)

    def leaf(*shape, dtype=torch.float32):
        return lambda: torch.randn(*shape, dtype=dtype).requires_grad_()

    s, t = torch.randn(m, d), torch.randn(m, d)
    # The pointwise ops of a block: modulation, gates and residual adds (float32), casts to bf16.
    pointwise = rate(leaf(m, d), lambda x: (x * s + t).to(bf16) * 2, 4 * m * d)
    norm = rate(leaf(m, d), lambda x: F.layer_norm(x, (d,)), m * d)
    act = rate(leaf(m, 4 * d, dtype=bf16), lambda x: F.gelu(x, approximate="tanh"), m * 4 * d)
    softmax = rate(leaf(16 * 6 * 256, 256, dtype=bf16), lambda x: torch.softmax(x, -1), 16 * 6 * 256 * 256)
    return {"pointwise": pointwise, "norm": norm, "act": act, "softmax": softmax}


def compiled_share():
    """Compiled over eager time of a block's pointwise chain (modulate, GELU, gate, residual), fwd+bwd."""
    import torch
    import torch.nn.functional as F

    m, d = 4096, 384

    def chain(x, scale, shift, gate):
        h = F.layer_norm(x, (d,)) * (1 + scale) + shift
        return x + gate * F.gelu(h, approximate="tanh")

    args = [torch.randn(m, d, requires_grad=True)] + [torch.randn(1, d, requires_grad=True) for _ in range(3)]
    compiled = torch.compile(chain, dynamic=False)

    def run(fn):
        return lambda: fn(*args).sum().backward()

    run(compiled)()  # compiles
    return typical(run(compiled), 5) / typical(run(chain), 5)


def optimizer_costs():
    """(fused s/param, loop s/param, loop s/tensor) of AdamW + EMA + gradient norm, the trainer's update."""
    import torch

    def per_step(count, size, fused):
        params = [torch.nn.Parameter(torch.randn(size)) for _ in range(count)]
        for p in params:
            p.grad = torch.randn(size)
        opt = torch.optim.AdamW(params, fused=fused or None, foreach=False if not fused else None)
        ema = [p.detach().clone() for p in params]

        def step():
            torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
            opt.step()
            torch._foreach_mul_(ema, 0.999)
            torch._foreach_add_(ema, [p.detach() for p in params], alpha=0.001)

        return typical(step, 5)

    total = 4_000_000
    fused = per_step(40, total // 40, True) / total
    few, many = per_step(20, total // 20, False), per_step(400, total // 400, False)
    per_tensor = max(0.0, (many - few) / 380)
    return fused, max(0.0, (few - 20 * per_tensor) / total), per_tensor


def step_overhead():
    """(per step, per micro-batch) seconds of trainer steps whose model does almost nothing:
    draws, loss, host work, from steps of 1 and of 4 accumulated micro-batches."""
    import torch

    from dit_trainer.config import build_config
    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.train import DiTTrainer

    def seconds(accum):
        cfg = build_config({"output_dir": tempfile.mkdtemp(), "model": {"name": "DiT-S/2", "input_size": 4,
                                "depth": 1, "hidden_size": 8, "num_heads": 1, "num_classes": 10},
                                "train": {"global_batch_size": 4, "device": "cpu", "compile": "false",
                                          "grad_accum_steps": accum},
                                "logging": {"tensorboard": False, "progress": False}})
        keep_freed_memory_on("cpu")  # as `dit train` on a CPU (the trainer leaves it to its caller)
        trainer = DiTTrainer(cfg, dataset=[(torch.randn(4, 4, 4), torch.tensor(1))] * 4)
        batch = (torch.randn(4, 4, 4, 4), torch.tensor([1, 2, 3, 4]))
        return typical(lambda: trainer.train_step(batch), 7)

    one, four = seconds(1), seconds(4)
    micro = max(0.0, (four - one) / 3)
    return max(0.0, one - micro), micro


def _gloo_worker(rank, world, path, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    out = {}
    for size in (4096, 16 * 2**20):
        n = size // 4
        x = torch.randn(n)
        full = torch.empty(n * world)
        shard = torch.empty(n)
        ops = {"all_reduce": lambda: dist.all_reduce(x),
               "all_gather": lambda: dist.all_gather_into_tensor(full, x),
               "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full)}
        for name, op in ops.items():
            dist.barrier()
            out[(name, size)] = typical(op, 5)
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


TINY = {"name": "DiT-S/2", "input_size": 4, "depth": 4, "hidden_size": 16, "num_heads": 2, "num_classes": 10}


def tiny_step(parallel: dict, per_rank: int = 4) -> float:
    """Seconds of a trainer step of a 4-block DiT too small to compute anything, under `parallel`:
    what the wrappers (FSDP's hooks, DTensor's dispatch) and the host work cost besides arithmetic."""
    import torch

    from dit_trainer.config import build_config
    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.train import DiTTrainer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp = world // parallel.get("tp", 1)
    cfg = build_config({"output_dir": tempfile.mkdtemp(), "model": TINY,
                            "train": {"global_batch_size": per_rank * dp, "device": "cpu", "compile": "false"},
                            "logging": {"tensorboard": False, "progress": False},
                            "parallel": {"dp_shard": -1, **parallel}})
    keep_freed_memory_on("cpu")  # as `dit train` on a CPU (the trainer leaves it to its caller)
    trainer = DiTTrainer(cfg, dataset=[(torch.randn(4, 4, 4), torch.tensor(1))] * 8)
    batch = (torch.randn(per_rank, 4, 4, 4), torch.randint(0, 10, (per_rank,)))
    return typical(lambda: trainer.train_step(batch), 7)


def _wrapper_worker(rank, world, port, queue):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    out = {"fsdp": tiny_step({"dp_shard": world}), "tp": tiny_step({"tp": world, "dp_shard": 1})}
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def wrapper_costs(latency: float, world=2):
    """(FSDP host seconds per block per forward+backward, a tensor-parallel layer's per forward+backward),
    from tiny DiT steps on `world` processes against one, less the collectives' latency."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = spawned(_wrapper_worker, world, port)
    single = tiny_step({})
    blocks = TINY["depth"]
    # A block gathers its weights forward and backward and reduce-scatters its gradients; DiT's
    # block wraps 4 layers for TP, which all-reduce 4 times between them.
    fsdp = max(0.0, (out["fsdp"] - single) / blocks - 3 * latency)
    tp = max(0.0, (out["tp"] - single) / (4 * blocks) - latency)
    return fsdp, tp


def spawned(worker, world: int, rendezvous):
    """What rank 0 of `world` spawned `worker(rank, world, rendezvous, queue)` processes puts in the queue."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, rendezvous, queue)) for r in range(world)]
    for p in procs:
        p.start()
    out = queue.get()
    for p in procs:
        p.join()
    return out


def gloo_links(world=2):
    """(bus bandwidth bytes/s, latency s) of gloo collectives between `world` local processes."""
    out = spawned(_gloo_worker, world, tempfile.mktemp())
    big = 16 * 2**20
    factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world,
              "reduce_scatter": (world - 1) / world}
    # all_gather and reduce_scatter move the full tensor (world x the input) through the ring.
    full = {"all_reduce": big, "all_gather": big * world, "reduce_scatter": big * world}
    latency = statistics.median(out[(k, 4096)] for k in factor)
    bus = statistics.median(factor[k] * full[k] / max(out[(k, big)] - latency, 1e-9) for k in factor)
    return bus, latency


def measure(dtype, cores: int, no_compile: bool) -> dict:
    """One pass over every probe: the raw rates and seconds the profile's fields come from."""
    peak, model_rate, half = matmul_rates(dtype)
    fused, loop_param, loop_tensor = optimizer_costs()
    overhead, micro = step_overhead()
    bus, latency = gloo_links()
    fsdp_block, tp_module = wrapper_costs(latency)
    # More processes than cores: a collective also waits for its peers to be scheduled.
    crowded = gloo_links(2 * cores)[1] if cores < 4 else latency
    return {"peak": peak, "model_rate": model_rate, "half": half, "elementwise": elementwise_rates(),
            "fused": fused, "loop_param": loop_param, "loop_tensor": loop_tensor, "overhead": overhead,
            "micro": micro, "share": 0.6 if no_compile else compiled_share(), "bus": bus, "latency": latency,
            "fsdp_block": fsdp_block, "tp_module": tp_module, "crowded": crowded, "copy": copy_bandwidth()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write the YAML here (default: print it)")
    ap.add_argument("--name", default="cpu")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled-chain measurement (keeps 0.6)")
    ap.add_argument("--rounds", type=int, default=3, help="passes over every probe; each field is their median")
    args = ap.parse_args()
    import torch

    from dit_trainer.plan.hardware import Hardware
    from dit_trainer.train.choices import resolve_amp_dtype

    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    cores = os.cpu_count()
    dtype = resolve_amp_dtype("bf16", torch.device("cpu")) or torch.float32
    # The machine's speed drifts by 10-15% over minutes on a shared host: each field is the median
    # of `rounds` passes over every probe, so one slow minute moves no field on its own.
    rounds = [measure(dtype, cores, args.no_compile) for _ in range(args.rounds)]
    m = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if k != "elementwise"}
    elementwise = {k: statistics.median(r["elementwise"][k] for r in rounds) for k in rounds[0]["elementwise"]}
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    profile = Hardware(
        name=args.name, device="cpu", bf16_tflops=round(m["peak"] / 1e12, 4),
        matmul_efficiency=round(m["model_rate"] / m["peak"], 3), matmul_half_tokens=round(m["half"], 1),
        memory_gib=round(total_gib, 1), memory_reserved_gib=0.0,
        memory_bandwidth_gbs=round(m["copy"] / 1e9, 2),
        elementwise_gelem_s={k: round(v / 1e9, 4) for k, v in elementwise.items()},
        compiled_elementwise=round(m["share"], 3), optimizer_s_per_param=float(f"{m['fused']:.3g}"),
        loop_optimizer_s_per_tensor=float(f"{m['loop_tensor']:.3g}"),
        loop_optimizer_s_per_param=float(f"{m['loop_param']:.3g}"),
        intra_node_gbs=round(m["bus"] / 1e9, 3), inter_node_gbs=round(m["bus"] / 1e9, 3),
        link_latency_us=round(m["latency"] * 1e6, 1), crowded_latency_us=round(m["crowded"] * 1e6, 1),
        tp_module_overhead_s=float(f"{m['tp_module']:.3g}"), fsdp_block_overhead_s=float(f"{m['fsdp_block']:.3g}"),
        step_overhead_s=round(m["overhead"], 4),
        microbatch_overhead_s=round(m["micro"], 4), overlap=False,
        cores=cores,
        source=f"benchmarks/hardware_profile.py {when}, torch {torch.__version__}, {cores} cores, "
               f"{'bf16' if dtype == torch.bfloat16 else 'fp32'} matmuls, one thread per process, load {load:.2f}, "
               f"median of {args.rounds} rounds")
    text = (f"# Measured by `python benchmarks/hardware_profile.py` on {when} (load average {load:.2f} before),\n"
            "# each timing less the time its thread waited for a core. Per process with one thread;\n"
            "# `cores` processes share the node.\n" + profile.to_yaml())
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}")
    print(text, end="")


if __name__ == "__main__":
    main()
