"""The planner's predictions against measured steps: per-rank peak memory and step time of
layouts on 1, 2 and 4 gloo processes of this machine.

    python benchmarks/plan_check.py                          # measures the CPU profile first (~1 min)
    python benchmarks/plan_check.py --hardware cpu           # the shipped profile instead
    python benchmarks/plan_check.py --cases fsdp2_s,tp2_s    # some of them

Each case is a `DiTTrainer` on `torchrun --nproc_per_node N` as benchmarks/parallel.py launches
them (one launch per world size, several cases in turn, one thread per process): 2 untimed
steps, the median of `--steps` timed ones, then one step under step_memory.py's allocator count
(per rank: tensors alive at its start plus the profiler's running peak). The prediction is
`dit_trainer.plan`'s formula for the same layout: `memory.rank_memory` per pipeline rank and
`timing.step_time` with the hardware profile; the table shows, per case, the rank whose memory
is farthest from its pipeline rank's prediction. On a machine shared with other users each step
also records how long its main thread waited for a core (run_queue.py); the time compared is the
step less the share of it other users' load took, and a world size is launched again
(`--retries`) when that share exceeds 15%.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from dit_trainer.meanflow.demo import settings as demo_settings  # noqa: E402 (torch-free; after the path)

DIT_S = {"name": "DiT-S/2", "depth": 4}
DIT_B = {"name": "DiT-B/2", "depth": 2}
LDIT = {"name": "LargeDiT-600M/2", "dim": 256, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2}

# name: (processes, model, global batch, parallel section, train section)
CASES = {
    "single_s": (1, DIT_S, 8, {}, {}),
    "full_ac_s": (1, DIT_S, 8, {}, {"activation_checkpointing": "full"}),
    "selective_s": (1, DIT_S, 8, {}, {"activation_checkpointing": "selective"}),
    "budget_s": (1, {**DIT_S, "depth": 2}, 8, {}, {"compile": "true", "activation_memory_budget": 0.5}),
    "single_ldit": (1, LDIT, 8, {}, {}),
    "fsdp2_s": (2, DIT_S, 16, {"dp_shard": 2}, {}),
    "tp2_s": (2, DIT_S, 8, {"tp": 2, "dp_shard": 1}, {}),
    "pp2_1f1b_s": (2, DIT_S, 16, {"pp": 2, "dp_shard": 1, "pp_schedule": "1f1b", "pp_microbatches": 4}, {}),
    "pp2_gpipe_s": (2, DIT_S, 16, {"pp": 2, "dp_shard": 1, "pp_schedule": "gpipe", "pp_microbatches": 4}, {}),
    "fsdp2_sel_b": (2, DIT_B, 8, {"dp_shard": 2}, {"activation_checkpointing": "selective"}),
    "tp2_full_ldit": (2, LDIT, 8, {"tp": 2, "dp_shard": 1}, {"activation_checkpointing": "full"}),
    "fsdp2_tp2_s": (4, DIT_S, 16, {"dp_shard": 2, "tp": 2}, {}),
    "fsdp4_b": (4, DIT_B, 16, {"dp_shard": 4}, {}),
    "pp2_fsdp2_ldit": (4, LDIT, 16, {"pp": 2, "dp_shard": 2, "pp_schedule": "1f1b", "pp_microbatches": 2}, {}),
    # MeanFlow: the network calls its step makes beside the loss's (meanflow/costs.py), by the demo's du/dt
    # (a central difference along the predicted tangent, guided) and by the default JVP.
    "mf_single_s": (1, DIT_S, 8, {}, {}),
    "mf_jvp_s": (1, DIT_S, 8, {}, {}),
    "mf_fsdp2_s": (2, DIT_S, 16, {"dp_shard": 2}, {}),
}
_DEMO_MF = {k: v for k, v in demo_settings(0)["meanflow"].items() if k != "steps"}
# Cases trained with another objective than the default (flow matching): their config sections.
OBJECTIVES = {
    "mf_single_s": {"objective": "meanflow", "meanflow": _DEMO_MF},
    "mf_jvp_s": {"objective": "meanflow", "meanflow": {**_DEMO_MF, "jvp": "separate"}},
    "mf_fsdp2_s": {"objective": "meanflow", "meanflow": _DEMO_MF},
}


def case_config(name, out):
    """The trainer config of case `name` (bf16 autocast where the CPU has it, as the trainer decides)."""
    from dit_trainer.config import build_config

    _, model, batch, parallel, train = CASES[name]
    return build_config({
        "output_dir": os.path.join(out, name.replace("/", "_")),
        "model": {"input_size": 32, "in_channels": 4, "num_classes": 1000, **model},
        "data": {"num_workers": 0},
        "train": {"global_batch_size": batch, "device": "cpu", "compile": "false", "max_steps": 100, **train},
        "logging": {"tensorboard": False, "progress": False},
        "parallel": {"dp_shard": -1, **parallel},
        **OBJECTIVES.get(name, {}),
    })


def worker(args):
    import torch.distributed as dist
    from parallel import _Latents
    from run_queue import Waited
    from step_memory import step_peak

    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.train import DiTTrainer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    out = tempfile.mkdtemp(prefix="plan-check-")
    for name in args.cases.split(","):
        keep_freed_memory_on("cpu")  # as `dit train` on a CPU (the trainer leaves it to its caller)
        trainer = DiTTrainer(case_config(name, out), dataset=_Latents(4 * CASES[name][2], 4, 32))
        loader = trainer.build_loader()
        for _ in range(args.warmup):
            trainer.train_step(next(loader))
        times, waits = [], []
        for _ in range(args.steps):
            if world > 1:
                dist.barrier()
            with Waited() as w:
                trainer.train_step(next(loader))
                if world > 1:
                    dist.barrier()
            times.append(w.wall)
            waits.append(w.share)
        mine = {"pp_rank": trainer.dims.pp_rank, **step_peak(trainer, next(loader)),
                "median_s": statistics.median(times), "waited": statistics.median(waits)}
        every = [None] * world
        if world > 1:
            dist.all_gather_object(every, mine)
        else:
            every = [mine]
        if world == 1 or dist.get_rank() == 0:
            print("ROW " + json.dumps({"case": name, "ranks": every}), flush=True)
        del trainer, loader
        # The trainer sits in reference cycles: freed at the interpreter's exit instead, after the
        # process group is gone, its gloo sub-groups aborted one rank of PP x FSDP in ~1 launch of 4.
        gc.collect()
    if world > 1:
        dist.destroy_process_group()


def predict(name, hardware):
    """(layout, predicted bytes per pipeline rank, predicted step seconds, the core share) of case `name`."""
    import torch

    from dit_trainer.models import get_spec
    from dit_trainer.plan.layouts import Layout
    from dit_trainer.plan.memory import Numerics, rank_memory
    from dit_trainer.plan.search import step_calls
    from dit_trainer.plan.timing import Machine, step_time
    from dit_trainer.train.choices import resolve_amp_dtype

    world, _, batch, parallel, train = CASES[name]
    cfg = case_config(name, tempfile.gettempdir())
    costs = get_spec(cfg.model.name).costs_fn(cfg)
    amp = resolve_amp_dtype(cfg.train.mixed_precision, torch.device("cpu"))
    numerics = Numerics.of("bf16" if amp is not None else "fp32", "cpu")
    tp, pp = parallel.get("tp", 1), parallel.get("pp", 1)
    shard = world // (tp * pp * parallel.get("dp_replicate", 1))
    layout = Layout(parallel.get("dp_replicate", 1), shard, tp, pp, parallel.get("pp_schedule", "") if pp > 1 else "",
                    parallel.get("pp_microbatches", 1) if pp > 1 else train.get("grad_accum_steps", 1),
                    train.get("activation_checkpointing", "none"), train.get("compile") == "true",
                    float(train.get("activation_memory_budget", 1.0)))
    objective = step_calls(cfg)  # flow matching's: no calls beside the loss's
    memory = [r.total for r in rank_memory(costs, layout, batch, numerics, objective=objective)]
    machine = Machine(world, world, hardware)
    step = step_time(costs, layout, machine, numerics, batch, objective=objective).total
    return layout, memory, step, machine.core_share


def others_wait(row) -> float:
    """The share of a step other users' load made some rank wait, beyond what the launch's own
    processes (more of them than cores) make each other wait."""
    world, cores = CASES[row["case"]][0], os.cpu_count()
    own = 1 - min(1.0, cores / world)
    return max(0.0, max(r["waited"] for r in row["ranks"]) - own)


def launch(world, cases, passthrough):
    """Run the cases of one world size as parallel.py does: one process, or one torchrun launch."""
    launcher = [sys.executable] if world == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    f"--nproc_per_node={world}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([*launcher, __file__, "--worker", "--cases", ",".join(cases), *passthrough],
                          capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"{world}-process launch failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--hardware", default=None, help="a profile name or YAML (default: measure this machine first)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--retries", type=int, default=1,
                    help="launch a world size again when others' load made a case wait over 15%% of a step")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    import torch

    from dit_trainer.plan.hardware import load_hardware

    start = time.strftime("%Y-%m-%d %H:%M")
    loads = [os.getloadavg()[0]]
    if args.hardware:
        hardware = load_hardware(args.hardware)
    else:
        path = os.path.join(tempfile.mkdtemp(), "measured.yaml")
        subprocess.run([sys.executable, os.path.join(HERE, "hardware_profile.py"), "--out", path], check=True,
                       capture_output=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        hardware = load_hardware(path)
    names = args.cases.split(",")
    rows = []
    for world in sorted({CASES[n][0] for n in names}):
        cases = [n for n in names if CASES[n][0] == world]
        best = {}
        for _ in range(1 + args.retries):
            loads.append(os.getloadavg()[0])
            for row in launch(world, cases, ["--steps", str(args.steps), "--warmup", str(args.warmup)]):
                if row["case"] not in best or others_wait(row) < others_wait(best[row["case"]]):
                    best[row["case"]] = row
            # Launch again only while other users' load took a large share of some case's steps.
            if max(others_wait(r) for r in best.values()) < 0.15:
                break
        rows += [best[n] for n in cases]
    loads.append(os.getloadavg()[0])

    print(f"# benchmarks/plan_check.py  {start}  torch {torch.__version__}  cpu, {os.cpu_count()} cores, gloo, "
          f"one thread per process; load average {', '.join(f'{x:.2f}' for x in loads)} (start, each launch, end)")
    print(f"# hardware profile: {hardware.source}")
    print("# memory: predicted for the rank's pipeline stage; measured = tensors alive at the step's start + the "
          "CPU allocator's peak over the step (step_memory.py); the rank farthest from its prediction")
    print("# time: predicted for the cores shared by the launch's processes only; measured = median of "
          f"{args.steps} steps of the slowest rank, beside it the largest share of a step any rank's main thread "
          "waited on a run queue ('waited', run_queue.py); 'own' = the wait the launch's own processes cause "
          "(1 - cores / processes); the error is that of the median less the wait beyond 'own' (other users' load)")
    print("| case | ranks | model | batch | layout | AC/compile | pred MiB | meas MiB | mem err | pred s | "
          "meas s | waited | own | meas - others s | time err |")
    print("|---|--:|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    worst_mem = worst_time = 0.0
    for row in rows:
        name = row["case"]
        layout, memory, seconds, share = predict(name, hardware)
        errors = [(r["peak"] / memory[r["pp_rank"]] - 1, r) for r in row["ranks"]]
        err, rank = max(errors, key=lambda e: abs(e[0]))
        slow = max(row["ranks"], key=lambda r: r["median_s"])
        own = 1 - 1 / share
        # Ranks run in lock step: the one others' load delayed most delays the step.
        waited = max(r["waited"] for r in row["ranks"])
        mine = slow["median_s"] * (1 - others_wait(row))
        terr = mine / seconds - 1
        worst_mem, worst_time = max(worst_mem, abs(err)), max(worst_time, abs(terr))
        world, model, batch, _, _ = CASES[name]
        print(f"| {name} | {world} | {model['name']} ({model.get('depth') or model.get('n_layers')} blocks) | {batch} | "
              f"{layout.parallelism()}{f' m{layout.microbatches}' if layout.pp > 1 else ''} | {layout.memory_policy()} | "
              f"{memory[rank['pp_rank']] / 2**20:.0f} | {rank['peak'] / 2**20:.0f} | {100 * err:+.1f}% | "
              f"{seconds:.3f} | {slow['median_s']:.3f} | {100 * waited:.0f}% | {100 * own:.0f}% | "
              f"{mine:.3f} | {100 * terr:+.1f}% |")
    print(f"# largest error: memory {100 * worst_mem:.1f}%, time {100 * worst_time:.1f}% "
          "(the measured step less others' wait)")


if __name__ == "__main__":
    main()
