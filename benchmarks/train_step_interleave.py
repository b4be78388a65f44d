"""`train_step.py --interleave R`: every variant's trainer is built and warmed up, then R rounds
each run one step of every variant, the order rotated by one each round.

On a shared VM the speed of the whole machine drifts by +-20% within minutes, more than some of
the differences the rows are meant to show, and variants timed one after another each see a
different part of that drift. Steps of the same round see the same machine, so the per-round
ratio of two variants' step times cancels the drift; its median over the rounds is the paired
ratio that `train_step.py` prints in this mode.

The rows live side by side in one process, so the mode refuses what would make them interfere:
more than one compiled variant (dynamo's cache is keyed by the block's code and does not guard
global settings such as the activation budget, so a second variant could run the first one's
graphs) and `+sysmalloc` (malloc's setting is process-wide, and the first trainer built sets it for
all: here the original loop runs with freed memory kept too, which can only make it faster).
"""

import gc
import resource
import statistics
import time

import torch
from train_step_variants import build_trainer, make_batch, new_row, undone_changes, warm_up


def check_interleavable(variants: list[dict]) -> None:
    """Exit with one line if the variants cannot share a process step by step."""
    compiled = [v["name"] for v in variants if v["compile"]]
    if len(compiled) > 1:
        raise SystemExit(f"--interleave: at most one compiled variant (got {', '.join(compiled)}); "
                         "run the others in separate runs")
    if any(v.get("sysmalloc") for v in variants):
        raise SystemExit("--interleave: +sysmalloc needs a process of its own; leave it out of --variants")


def time_interleaved(args, variants: list[dict], device) -> list[dict]:
    """Rows as time_variant gives them; a row's `times` are its step times in round order."""
    rows, trainers = time_interleaved_keeping_trainers(args, variants, device)
    del trainers
    gc.collect()
    return rows


def time_interleaved_keeping_trainers(args, variants: list[dict], device) -> tuple[list[dict], list]:
    """time_interleaved's rows and the warmed-up trainers they timed, for a caller that measures more."""
    check_interleavable(variants)
    gc.collect()
    torch._dynamo.reset()
    batch = make_batch(args, device)
    trainers, rows = [], []
    for v in variants:
        with undone_changes(v):
            trainer = build_trainer(args, v)
            warm = warm_up(args, v, trainer, batch, device)
        trainers.append(trainer)
        rows.append({**new_row(v, trainer, warm), "sys_s": 0.0, "minflt": 0.0})
    n = len(variants)
    for k in range(args.interleave):
        for j in range(n):
            i = (j + k) % n
            with undone_changes(variants[i]):
                before = resource.getrusage(resource.RUSAGE_SELF)
                t0 = time.perf_counter()
                trainers[i].train_step(batch)  # returns .item() floats: the step is finished on return
                rows[i]["times"].append(time.perf_counter() - t0)
                after = resource.getrusage(resource.RUSAGE_SELF)
            rows[i]["sys_s"] += (after.ru_stime - before.ru_stime) / args.interleave
            rows[i]["minflt"] += (after.ru_minflt - before.ru_minflt) / args.interleave
    return rows, trainers


def paired_ratio(base: dict, row: dict) -> tuple[float, float, float]:
    """(median, min, max) over rounds of base's step time / row's step time in the same round."""
    ratios = [b / t for b, t in zip(base["times"], row["times"])]
    return statistics.median(ratios), min(ratios), max(ratios)
