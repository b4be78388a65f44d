"""Peak memory of one rank for a layout, from the model family's counts (`ModelCosts`).

What the trainer holds, per rank: float32 weights, gradients, AdamW's two moments (and a step
count per tensor), the EMA and each post-hoc EMA profile (`train.phema_stds`), each divided like the weights (tensor parallelism splits the
family's `tp_split` part, FSDP shards everything over `dp_shard`); then, during the step, the
activations the blocks keep for the backward (times the micro-batches a pipeline schedule keeps
in flight), autocast's bf16 weight copies (without FSDP, whose gathered weights are bf16
already, unless the objective has FSDP gather float32), what FSDP gathers and reduces, and the
backward's transients. The peak is taken at the two ends of a backward pass: all activations and no
gradients yet, or the gradients and what a schedule still keeps in flight. An objective whose loss
runs through a JVP in float32 (`meanflow/costs.py`, `jvp: graph`) keeps float32 activations for its
primal and tangent passes; its calls without gradient keep nothing for the backward, but run beside
what the loss's forward keeps, each holding up to one block's forward over its rows (`calls_transient`).
"""

from dataclasses import dataclass, fields, replace

from dit_trainer.meanflow.costs import NO_EXTRA
from dit_trainer.models.costs import PerToken
from dit_trainer.parallel.pipeline_parallel import stage_ranges


@dataclass(frozen=True)
class Numerics:
    """The widths the step computes in."""

    act_bytes: int = 2  # activations: 2 under bf16/fp16 autocast, 4 in float32
    fused_attention: bool = True  # a fused SDPA kernel, not the CPU bf16 matmul attention
    float32_gathers: bool = False  # FSDP gathers float32 weights (an objective's float32 calls), autocast casts them

    @classmethod
    def of(cls, mixed_precision: str, device: str) -> "Numerics":
        """What `train.mixed_precision` computes in on `device` (cuda | cpu)."""
        half = mixed_precision in ("bf16", "fp16")
        return cls(2 if half else 4, fused_attention=device == "cuda" or not half)

    @property
    def gather_bytes(self) -> int:
        """Bytes a weight FSDP gathers: its param_dtype, train.mixed_precision's unless float32 is asked."""
        return 2 if self.act_bytes == 2 and not self.float32_gathers else 4

    def with_objective(self, objective) -> "Numerics":
        """These widths with the objective's (`meanflow.costs.ObjectiveCost`) FSDP gather dtype."""
        return replace(self, float32_gathers=True) if objective.float32_gathers else self

    def of_call(self, call) -> "Numerics":
        """The widths a network call (`meanflow.costs.Call`) computes in: float32 outside autocast (a fused
        SDPA kernel, as a float32 run's), and SDPA's math kernel inside a JVP (the one with a forward derivative)."""
        if not (call.float32 or call.jvp):
            return self
        fused = (call.float32 or self.fused_attention) and not call.jvp
        return replace(self, act_bytes=4 if call.float32 else self.act_bytes, fused_attention=fused)


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds at its peak, by what holds them."""

    pp_rank: int
    params: float
    grads: float  # 0 where the peak comes before the backward has allocated them
    optimizer: float
    ema: float
    phema: float  # the post-hoc EMA profiles: a copy of the weights each, kept like the EMA
    activations: float  # kept for the backward (in-flight micro-batches), recompute, backward transients
    casts: float  # autocast's bf16 copies of the weights, kept from forward to backward
    comm: float  # FSDP's gathered weights and buffers, pipeline outputs, DDP buckets

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "pp_rank")

    def parts(self) -> dict:
        """{part: bytes} without the rank."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "pp_rank"}


def compiled_items(costs, fused_attention: bool) -> tuple:
    """The family's compiled-block items; a fused attention kernel never materialises the scores."""
    return tuple(i for i in costs.compiled_items if not (fused_attention and i == costs.scores))


def compiled_kept(costs, budget: float, act_bytes: int, tp: int, fused_attention: bool = False) -> int:
    """How many of `compiled_items` a compiled block keeps at `train.activation_memory_budget`
    `budget`: in order, while they fit in budget x (all items)."""
    sizes = [item.nbytes(act_bytes, tp) for item in compiled_items(costs, fused_attention)]
    room, kept = budget * sum(sizes) + 1e-9, 0
    for size in sizes:
        if size > room:
            break
        room, kept = room - size, kept + 1
    return kept


def compiled_saved(costs, budget: float, act_bytes: int, tp: int, fused_attention: bool = False) -> PerToken:
    """What a compiled block keeps per token at `budget`: its input and the items it keeps."""
    kept = costs.compiled_input
    items = compiled_items(costs, fused_attention)
    for item in items[:compiled_kept(costs, budget, act_bytes, tp, fused_attention)]:
        kept = kept + item
    return kept


def saved_per_token(costs, layout, numerics: Numerics) -> PerToken:
    """What one block keeps per token for its backward under the layout's AC/compile policy."""
    if layout.ac == "none" and layout.compile:
        kept = compiled_saved(costs, layout.budget, numerics.act_bytes, layout.tp, numerics.fused_attention)
    else:
        kept = costs.saved[layout.ac]
    if numerics.fused_attention and layout.ac in ("none", "selective"):
        kept = kept + costs.fused_attention
    return kept


def in_flight(layout, pp_rank: int) -> tuple[float, float]:
    """(micro-batches whose activations a rank holds at once, how many when its gradients exist),
    in units of its whole stage (an interleaved rank's chunks are half of it)."""
    m, pp = layout.microbatches, layout.pp
    if pp == 1:
        return 1.0, (1.0 if m > 1 else 0.0)
    if layout.schedule == "gpipe":
        return float(m), float(m - 1)
    if layout.schedule == "1f1b":
        k = min(m, pp - pp_rank)
        return float(k), float(k if m > k else k - 1)
    # Interleaved 1F1B: (chunks - 1) x pp + 2 x (pp - 1 - rank) warm-up forwards, then one more.
    v = layout.stages_per_rank
    chunks = min(m * v, (v - 1) * pp + 2 * (pp - 1 - pp_rank) + 1)
    return chunks / v, (chunks if m * v > chunks else chunks - 1) / v


def stage_of(costs, layout, pp_rank: int) -> tuple[int, bool, bool]:
    """(blocks, holds the embedders, holds the head) of pipeline rank `pp_rank`."""
    v = layout.stages_per_rank
    n = layout.pp * v
    ids = [pp_rank + k * layout.pp for k in range(v)]
    ranges = stage_ranges(costs.depth, n, v) if layout.pp > 1 else [(0, costs.depth)]
    return sum(ranges[i][1] - ranges[i][0] for i in ids), 0 in ids, n - 1 in ids


def rank_memory(costs, layout, global_batch: int, numerics: Numerics, profiles: int = 0, objective=NO_EXTRA) -> list:
    """One `RankMemory` per pipeline rank (data- and tensor-parallel peers hold the same), with
    `profiles` post-hoc EMA profiles tracked and the step's network calls `objective` (`meanflow.costs`)."""
    return [_rank(costs, layout, global_batch, numerics.with_objective(objective), r, profiles, objective)
            for r in range(layout.pp)]


def eager(layout, call):
    """`layout` as `call` runs it: a JVP runs eager under train.compile (meanflow/jvp.py)."""
    return replace(layout, compile=False) if call.jvp and layout.compile else layout


def state_bytes(costs, layout, pp_rank: int = 0, profiles: int = 0) -> dict:
    """{params, grads, optimizer, ema, phema}: the float32 state one rank of `layout` holds after a
    step, with `profiles` post-hoc EMA profiles (each a ShardedEMA: every weight, frozen ones too)."""
    blocks, first, last = stage_of(costs, layout, pp_rank)
    edges = [part for part, held in ((costs.first, first), (costs.last, last)) if held]
    trainable = blocks * costs.block.local(layout.tp) + sum(p.trainable for p in edges)
    frozen = blocks * costs.block.frozen + sum(p.frozen for p in edges)
    tensors = blocks * costs.block.tensors + sum(p.tensors for p in edges)
    shard = layout.dp_shard
    params = 4 * (trainable + frozen) / shard
    return {"params": params, "grads": 4 * trainable / shard, "optimizer": 8 * trainable / shard + 4 * tensors,
            "ema": params, "phema": profiles * params}


def _uses_fsdp(layout) -> bool:
    # Replicas beside TP or PP run as HSDP with shards of one rank (parallel/parallelize.py).
    return layout.dp_shard > 1 or (layout.dp_replicate > 1 and (layout.tp > 1 or layout.pp > 1))


def resid_bytes(layout, numerics) -> int:
    """Width of the residual stream: FSDP's mixed precision casts each block's inputs to its gather dtype."""
    return 2 if numerics.gather_bytes == 2 and _uses_fsdp(layout) else 4


def calls_transient(costs, layout, numerics, tokens, calls) -> float:
    """The most one of `calls` (network calls without gradient, `meanflow.costs.Call`) holds at once over
    `tokens` of the micro-batch: one block's forward working set over its rows, at most what a block keeps
    for its backward (`saved["none"]`) at the call's widths, twice that inside a JVP (its tangent pass)."""
    most = 0.0
    for call in calls:
        width = numerics.of_call(call)
        kept = costs.saved["none"] + (costs.fused_attention if width.fused_attention else PerToken())
        scores = 0 if width.fused_attention else costs.scores.nbytes(width.act_bytes, layout.tp)
        size = call.share * tokens * (kept.nbytes(width.act_bytes, layout.tp, resid_bytes(layout, width)) + scores)
        most = max(most, size * (2 if call.jvp else 1))
    return most


def _rank(costs, layout, global_batch, numerics, pp_rank, profiles=0, objective=NO_EXTRA) -> RankMemory:
    # The loss's call sets the widths of what the backward keeps (float32 through a JVP outside autocast).
    loss, step_numerics = objective.loss, numerics
    layout, numerics = eager(layout, loss), numerics.of_call(loss)
    a, tp, r = numerics.act_bytes, layout.tp, resid_bytes(layout, numerics)
    blocks, first, last = stage_of(costs, layout, pp_rank)
    edges = [part for part, held in ((costs.first, first), (costs.last, last)) if held]
    state = state_bytes(costs, layout, pp_rank, profiles)
    block_local = costs.block.local(tp)
    trainable = blocks * block_local + sum(p.trainable for p in edges)
    edge_params = sum(p.trainable + p.frozen for p in edges)

    tokens = global_batch // layout.dp // layout.microbatches * costs.tokens
    saved = saved_per_token(costs, layout, numerics)
    block_mb = tokens * saved.nbytes(a, tp, r)
    per_mb = blocks * block_mb + (tokens * costs.edge_saved.nbytes(a, 1, r) if last else 0)
    per_mb *= loss.forwards  # a JVP with gradient keeps its tangent pass's activations beside the primal's
    scores = 0 if numerics.fused_attention else costs.scores.nbytes(a, tp)  # the matmul path's backward
    transient = tokens * (costs.transient.nbytes(a, tp, r) + scores)
    if _uses_fsdp(layout):
        # A block's backward leaves its unsharded gradient and the float32 reduce-scatter input,
        # which outweigh the activations it frees only at tiny batches.
        transient += max(0.0, (numerics.gather_bytes + 4) * block_local - block_mb)
    # The objective's calls without gradient run after the loss's forward, beside all it keeps, before the
    # backward: the larger of their working set and the backward's transients sits on top of the activations.
    transient = max(transient, calls_transient(costs, layout, step_numerics, tokens, objective.extra))
    # Autocast casts the matmul weights unless FSDP gathers them in the activations' dtype already.
    autocast = a == 2 and (not _uses_fsdp(layout) or numerics.float32_gathers)
    matmul_local = costs.block.matmul - costs.block.tp_split + costs.block.tp_split / tp
    recompute = 0.0
    if layout.ac != "none":
        full = costs.saved["none"] + (costs.fused_attention if numerics.fused_attention else PerToken())
        recompute = tokens * (full.nbytes(a, tp, r) - saved.nbytes(a, tp, r)) + (2 * matmul_local if autocast else 0)
    casts = 0.0
    if autocast and layout.ac == "none" and not layout.compile:
        casts = 2 * (blocks * matmul_local + sum(p.matmul for p in edges))

    # The peak is at one end of a backward: every in-flight activation and no gradient yet, or
    # the gradients and what the schedule still keeps in flight.
    k, k_with_grads = in_flight(layout, pp_rank)
    grads = state.pop("grads")
    if k * per_mb >= k_with_grads * per_mb + grads:
        grads, held = 0.0, k * per_mb
    else:
        held = k_with_grads * per_mb
    comm = _comm(costs, layout, numerics, blocks, block_local, edge_params, trainable, tokens, k, last)
    # An online text encoder: sharded like the model under FSDP (the blocks it gathers to encode are freed before the step).
    beside = costs.replicated_bytes + costs.sharded_frozen_bytes / layout.dp_shard
    return RankMemory(pp_rank, state["params"] + beside, grads, state["optimizer"], state["ema"],
                      state["phema"], held + recompute + transient, casts, comm)


def _comm(costs, layout, numerics, blocks, block_local, edge_params, trainable, tokens, k, last) -> float:
    """What the data- and pipeline-parallel machinery allocates on top of weights and activations."""
    pp = layout.pp
    fsdp = _uses_fsdp(layout)
    pb = numerics.gather_bytes  # FSDP's param_dtype: train.mixed_precision's, or float32 for the objective
    out = 0.0
    if fsdp:
        if pp > 1:
            # reshard_after_forward is off under PP: the stage's gathered weights stay for the step,
            # and micro-batches accumulate unsharded float32 gradients until the last one reduces.
            out += pb * (blocks * block_local + edge_params) + (4 * trainable if layout.microbatches > 1 else 0)
            out += (pb + 4) * block_local
        else:
            # The root (embedders, head) stays gathered; a block is gathered and the next prefetched.
            out += pb * edge_params + 2 * pb * block_local
            if layout.microbatches > 1:
                out += 4 * trainable
    elif layout.dp_replicate > 1:
        out += 4 * trainable  # DDP's gradient buckets
    if pp > 1 and not last:
        out += k * tokens * costs.boundary.nbytes(numerics.act_bytes, 1, resid_bytes(layout, numerics))  # stage outputs
    return out
