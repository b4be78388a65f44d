"""The text `dit plan` prints: a header, the ranked table, why #1 beats #2, what does not fit."""

from dit_trainer.meanflow.costs import NO_EXTRA
from dit_trainer.plan.search import GIB, step_calls, why_first


def micro(layout) -> str:
    """Micro-batches as the config names them: `m8` (parallel.pp_microbatches) or `accum 2`."""
    if layout.pp > 1:
        return f"m{layout.microbatches}"
    return f"accum {layout.microbatches}" if layout.microbatches > 1 else "-"


def routed(cfg) -> str:
    """The header's note of the run's token routing (e.g. ", token routing keep 0.5 of blocks [2, -2)"), or ""."""
    t = cfg.train
    if t.routing_keep >= 1:
        return ""
    return f", token routing keep {t.routing_keep:g} of blocks [{t.routing_start}, {t.routing_end})"


def text_encoder(cfg, costs) -> str:
    """The header's note of an online text encoder (", text encoder T5 4.76B frozen parameters, ..."), or ""."""
    if not costs.sharded_frozen_params:
        return ""
    dtype = "bf16" if cfg.data.text_dtype == "auto" else cfg.data.text_dtype
    return (f", text encoder {costs.sharded_frozen_params / 1e9:.3g}B frozen parameters encoding online in {dtype} "
            "(sharded over dp_shard under FSDP)")


def objective_note(cfg) -> str:
    """The header's note of an objective that calls the network more than flow matching does (", objective
    meanflow: 6.15 forwards a sample per step (flow matching: 3)"), or ""."""
    calls = step_calls(cfg)
    if calls == NO_EXTRA:
        return ""
    return f", objective {cfg.objective}: {3 + calls.extra_forwards:.3g} forwards a sample per step (flow matching: 3)"


def header(request, costs, plans) -> str:
    """Model, batch, machine and what was searched."""
    cfg, hw = request.cfg, request.hardware
    params = costs.trainable + costs.frozen
    fitting = sum(p.fits for p in plans)
    nodes = -(-request.gpus // request.gpus_per_node)
    return (f"{costs.name}: {params / 1e9:.3g}B parameters, {costs.depth} blocks, {costs.tokens} tokens per image "
            f"({cfg.model.input_size}x{cfg.model.input_size} latents), global batch {cfg.train.global_batch_size}, "
            f"{cfg.train.mixed_precision}{routed(cfg)}{text_encoder(cfg, costs)}{objective_note(cfg)}\n"
            f"{request.gpus} x {hw.name} ({nodes} node{'s' * (nodes > 1)} of {request.gpus_per_node}), "
            f"{request.usable_bytes / GIB:.1f} GiB usable per rank; profile: {hw.source or hw.name}\n"
            f"{len(plans)} layouts priced, {fitting} fit")


def table(plans, top: int) -> str:
    """The first `top` plans as a markdown table."""
    lines = ["| # | layout | micro | AC/compile | peak GiB | state | act | comm | step s | img/s | fits |",
             "|--:|---|---|---|--:|--:|--:|--:|--:|--:|---|"]
    for i, plan in enumerate(plans[:top], 1):
        lay, peak = plan.layout, plan.peak
        state = (peak.params + peak.grads + peak.optimizer + peak.ema + peak.phema) / GIB
        lines.append(f"| {i} | {lay.parallelism()} | {micro(lay)} | {lay.memory_policy()} | {peak.total / GIB:.2f} | "
                     f"{state:.2f} | {(peak.activations + peak.casts) / GIB:.2f} | {peak.comm / GIB:.2f} | "
                     f"{plan.time.total:.3f} | {plan.images_per_s:.1f} | {'yes' if plan.fits else 'no'} |")
    return "\n".join(lines)


def distinct(plans) -> list:
    """The best plan of each layout that differs in more than its activation budget."""
    seen, out = set(), []
    for plan in plans:
        lay = plan.layout
        key = (lay.dp_replicate, lay.dp_shard, lay.tp, lay.pp, lay.schedule, lay.microbatches, lay.ac, lay.compile)
        if key not in seen:
            seen.add(key)
            out.append(plan)
    return out


def render(request, costs, plans, top: int = 10, unfit: int = 5) -> str:
    """Everything `dit plan` prints for these ranked plans."""
    fitting = distinct(p for p in plans if p.fits)
    out = [header(request, costs, plans), ""]
    if fitting:
        out += [table(fitting, top), ""]
        best = fitting[0]
        out.append("#1 step: " + ", ".join(f"{k} {v:.3g} s" for k, v in best.time.parts().items() if v > 0))
        if len(fitting) > 1:
            out.append(why_first(fitting[0], fitting[1]))
    else:
        out.append("no layout fits; the ones needing least memory:")
    # The fastest of those that overflow: what more memory (or a smaller batch) would buy.
    unfitting = [p for p in plans if not p.fits]
    rest = distinct(sorted(unfitting, key=lambda p: p.time.total))[:unfit]
    if rest:
        out += ["", f"do not fit ({len(unfitting)} of {len(plans)}; the fastest {len(rest)}):"]
        for plan in rest:
            out.append(f"  {plan.layout.parallelism()} {micro(plan.layout)} {plan.layout.memory_policy()}: "
                       f"{plan.overflow()}")
    return "\n".join(out)
