"""Step time of a layout from the family's counts and a hardware profile.

Compute is the family's forward FLOPs (the same count as its `flops_fn`) times three, at the
profile's matmul rate and efficiency, plus the elementwise work at the profile's rate per op
class; checkpointing adds what it recomputes. Communication follows what the trainer runs:
FSDP2 all-gathers each block before its forward and again before its backward (once per step
under PP, which keeps the weights gathered) and reduce-scatters float32 gradients (once per step
when micro-batches accumulate); HSDP all-reduces the shards across replicas; DDP all-reduces
float32 gradients in 100 MB buckets; tensor parallelism all-reduces as often per block as the family
says (`tp_allreduces`); pipeline stages send the activations and their gradients once per
micro-batch. Where the device computes while it communicates (`overlap`), FSDP's and DDP's
collectives hide behind the compute of the other blocks and only the first gather and what
exceeds the compute show; tensor parallelism's all-reduces sit on the critical path everywhere.
GPipe and 1F1B idle (pp - 1) micro-batch slots per step, interleaved 1F1B half as many (on a CPU
whose cores the processes share, another process takes an idle stage's core).

An objective that calls the network more than once a step (`meanflow/costs.py`) adds each call's
forwards over its share of the rows, at its width's matmul rate (float32 at half the bf16 rate),
with its elementwise work; each call gathers every block once more under FSDP (in float32 where the
objective gathers float32), all-reduces once more per block under TP, and adds half a forward and
backward's host work (FSDP hooks, TP dispatch, launches).
"""

import math
from dataclasses import dataclass, fields

from dit_trainer.meanflow.costs import NO_EXTRA
from dit_trainer.plan.memory import _uses_fsdp, compiled_items, compiled_kept, eager, resid_bytes, stage_of

DDP_BUCKET_BYTES = 100 * 2**20  # the trainer's replicate(bucket_cap_mb=100)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step, by what takes them."""

    compute: float
    recompute: float
    comm: float  # communication not hidden behind compute
    bubble: float  # pipeline fill and drain
    optimizer: float  # AdamW, EMA, the gradient norm and the post-hoc EMA profiles
    overhead: float

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def parts(self) -> dict:
        """{part: seconds}."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Machine:
    """The devices a plan runs on."""

    world: int
    gpus_per_node: int
    hardware: object  # Hardware

    def link(self, span: int) -> float:
        """Bytes/s of a group of ranks `span` consecutive ranks wide."""
        hw = self.hardware
        return (hw.intra_node_gbs if span <= self.gpus_per_node else hw.inter_node_gbs) * 1e9

    @property
    def core_share(self) -> float:
        """How much slower each process runs where a node's processes share its cores."""
        cores = self.hardware.cores
        return max(1.0, min(self.world, self.gpus_per_node) / cores) if cores else 1.0


def _all_reduce(nbytes, n, bw, lat):
    return lat + 2 * (n - 1) / n * nbytes / bw if n > 1 else 0.0


def _gather(nbytes, n, bw, lat):
    """An all-gather or reduce-scatter whose full tensor is `nbytes`."""
    return lat + (n - 1) / n * nbytes / bw if n > 1 else 0.0


def _elementwise(costs, machine, numerics, tokens, blocks, tp, compiled):
    """Seconds of the blocks' elementwise work, forward and backward, over `tokens`."""
    hw = machine.hardware
    elementwise = 0.0
    for kind, count in costs.elementwise.items():
        if kind == "softmax" and numerics.fused_attention:
            continue  # inside the fused kernel
        elementwise += tokens * blocks * count.elements(tp) / hw.elementwise_rate(kind)
    if compiled:
        elementwise *= hw.compiled_elementwise
    return elementwise


def _forward_flops(costs, tp, tokens, blocks, first, last):
    """Forward FLOPs of one tensor-parallel rank's blocks and edges over `tokens`."""
    return tokens * (blocks * (costs.block_flops / tp + costs.block_flops_per_image / costs.tokens)
                     + (first + last) / 2 * costs.edge_flops)


def _compute(costs, layout, machine, numerics, tokens, blocks, first, last, objective=NO_EXTRA):
    """(forward+backward seconds, recompute seconds) of one rank's blocks and edges over `tokens`, with the
    objective's calls without gradient."""
    hw, tp, n, loss = machine.hardware, layout.tp, costs.tokens, objective.loss
    step_numerics, numerics, layout = numerics, numerics.of_call(loss), eager(layout, loss)
    mm_rate = hw.matmul_rate(tokens / layout.microbatches, numerics.act_bytes)
    # Forward FLOPs per token of q kᵀ and the weighted sum (less where token routing shortens blocks).
    attention = 4 * n * costs.hidden / tp * costs.attention_share
    fwd_flops = _forward_flops(costs, tp, tokens, blocks, first, last)
    elementwise = _elementwise(costs, machine, numerics, tokens, blocks, tp, layout.compile)
    extra_flops = 0.0 if numerics.fused_attention else tokens * blocks * attention / 2  # the backward's q kᵀ
    recompute = 0.0
    if layout.ac == "full":
        recompute = tokens * blocks * costs.block_flops / tp / mm_rate + elementwise / 3
    elif layout.ac == "selective":
        recompute = elementwise / 3 + (0.0 if numerics.fused_attention else tokens * blocks * attention / mm_rate)
    elif layout.compile and layout.budget < 1:
        # What the budget leaves out is recomputed: pointwise work, and q kᵀ once the scores go.
        kept = compiled_kept(costs, layout.budget, numerics.act_bytes, tp, numerics.fused_attention)
        items = compiled_items(costs, numerics.fused_attention)
        recompute = (len(items) - kept) / len(items) * elementwise / 3
        if not numerics.fused_attention and costs.scores in items[kept:]:
            recompute += tokens * blocks * attention / 2 / mm_rate
    share = machine.core_share
    step = loss.forwards * ((3 * fwd_flops + extra_flops) / mm_rate * share + elementwise * share)
    for call in objective.extra:
        # A forward over the call's rows: its matmuls at its width's rate, a third of the elementwise work.
        width, rows = step_numerics.of_call(call), call.share * tokens
        rate = hw.matmul_rate(rows / layout.microbatches, width.act_bytes)
        ops = _elementwise(costs, machine, width, rows, blocks, tp, layout.compile and not call.jvp) / 3
        step += call.forwards * (_forward_flops(costs, tp, rows, blocks, first, last) / rate + ops) * share
    return step, recompute * share


def step_time(costs, layout, machine: Machine, numerics, global_batch: int, profiles: int = 0,
              objective=NO_EXTRA) -> StepTime:
    """The predicted seconds of one optimizer step of `layout` (the slowest pipeline rank's), with `profiles`
    post-hoc EMA profiles (`train.phema_stds`) updated after it and the network calls `objective`
    (`meanflow.costs.ObjectiveCost`) makes."""
    hw = machine.hardware
    numerics = numerics.with_objective(objective)
    extra_calls = sum(c.calls for c in objective.extra)  # network calls per micro-batch beside the loss's
    lat = hw.link_latency_us * 1e-6
    if machine.core_share > 1 and hw.crowded_latency_us:
        # Processes outnumber the cores: a collective waits until its peers are scheduled too.
        lat = hw.crowded_latency_us * 1e-6 / machine.core_share
    tp, shard, rep, pp, m = layout.tp, layout.dp_shard, layout.dp_replicate, layout.pp, layout.microbatches
    tokens = global_batch // layout.dp * costs.tokens  # per rank per step
    tokens_mb = tokens // m
    a = numerics.act_bytes
    stages = [stage_of(costs, layout, r) for r in range(pp)]
    per_rank = [_compute(costs, layout, machine, numerics, tokens, *s, objective) for s in stages]
    compute, recompute = max(per_rank, key=lambda cr: cr[0] + cr[1])
    blocks = max(s[0] for s in stages)
    block_local = costs.block.local(tp)

    # Tensor parallel: on the critical path.
    tp_comm = 0.0
    if tp > 1:
        forward, backward = costs.tp_allreduces
        calls = forward * (1 + (layout.ac == "full")) + backward  # a recomputed forward all-reduces again
        per_call = _all_reduce(tokens_mb * costs.tp_allreduce.nbytes(a), tp, machine.link(tp), lat)
        tp_comm = blocks * m * calls * per_call
        for call in objective.extra:  # its forwards' all-reduces, over its rows
            rows = call.share * tokens_mb * costs.tp_allreduce.nbytes(numerics.of_call(call).act_bytes)
            tp_comm += blocks * m * call.calls * forward * _all_reduce(rows, tp, machine.link(tp), lat)
        # Each wrapped layer's DTensor dispatch, on the host, per forward+backward (+ a recomputed forward).
        tp_comm += blocks * m * costs.tp_modules * hw.tp_module_overhead_s * (1 + (layout.ac == "full") / 2)
        tp_comm += blocks * m * costs.tp_modules * hw.tp_module_overhead_s * extra_calls / 2

    # Data parallel: hidden behind compute where the device overlaps.
    dp_comm, first_gather = 0.0, 0.0
    pb = numerics.gather_bytes
    if _uses_fsdp(layout):
        gathered = blocks * block_local + _edges(costs, pp, "trainable")
        # Forward and backward of every micro-batch and each of its other calls, or once under PP.
        gathers = 1 if pp > 1 else (2 + extra_calls) * m
        bw = machine.link(tp * shard)
        gather = _gather(pb * gathered, shard, bw, lat * (blocks + 1))
        reduce = _gather(4 * gathered, shard, bw, lat * (blocks + 1))
        dp_comm = gathers * gather + reduce
        dp_comm += _all_reduce(4 * gathered / shard, rep, machine.link(tp * shard * rep), lat * (blocks + 1))
        first_gather = gather / (blocks + 1)
        if shard > 1 and costs.sharded_frozen_bytes:  # an online text encoder's weights, gathered once per step
            dp_comm += _gather(costs.sharded_frozen_bytes, shard, bw, lat)
    elif rep > 1:
        nbytes = 4 * (blocks * block_local + costs.first.trainable + costs.last.trainable)
        buckets = math.ceil(nbytes / DDP_BUCKET_BYTES)
        dp_comm = _all_reduce(nbytes, rep, machine.link(tp * rep), lat * buckets)
        first_gather = dp_comm / buckets

    # Pipeline: activations forward and gradients back, once per micro-batch.
    boundary = tokens_mb * costs.boundary.nbytes(a, 1, resid_bytes(layout, numerics))
    send = lat + boundary / machine.link(machine.world) if pp > 1 else 0.0
    p2p = 2 * send * ((pp - 1) if hw.overlap else (m + pp - 1))
    bubble = 0.0
    if pp > 1:
        bubble = (compute + recompute + tp_comm) * (pp - 1) / (m * layout.stages_per_rank)
        # Processes sharing cores hand an idle stage's core to another: at two per core nothing idles.
        bubble *= max(0.0, 2.0 - machine.core_share)

    if hw.overlap:
        dp_comm = max(0.0, dp_comm - (compute + recompute)) + first_gather
    optimizer = _optimizer(costs, layout, machine, blocks, profiles)
    # A call without gradient: half a forward and backward's host work.
    overhead = hw.step_overhead_s + m * hw.microbatch_overhead_s * (1 + extra_calls / 2)
    if _uses_fsdp(layout):
        overhead += blocks * m * hw.fsdp_block_overhead_s * (1 + extra_calls / 2)
    # On a CPU the collectives and the host work run on the shared cores too.
    share = machine.core_share
    return StepTime(compute, recompute, (tp_comm + dp_comm + p2p) * share, bubble, optimizer, overhead * share)


def _edges(costs, pp: int, count: str) -> float:
    """`count` of the embedders and head one rank holds: both on one stage, the larger under PP."""
    first, last = getattr(costs.first, count), getattr(costs.last, count)
    return first + last if pp == 1 else max(first, last)


# A post-hoc EMA profile's update per float32 weight, bound by memory bandwidth like AdamW (parallel/ema.py):
# on a GPU the step's skip mask stays on the device and the update is one lerp (read both, write the profile);
# on a CPU it is a multiply (read and write the profile) then an add (read both, write the profile).
PROFILE_BYTES_GPU, PROFILE_BYTES_CPU = 12, 20


def _optimizer(costs, layout, machine, blocks, profiles: int = 0) -> float:
    """AdamW, the EMA update, the gradient norm and `profiles` post-hoc EMA updates over this rank's shard
    of the weights."""
    hw = machine.hardware
    local = (blocks * costs.block.local(layout.tp) + _edges(costs, layout.pp, "trainable")) / layout.dp_shard
    tensors = blocks * costs.block.tensors + _edges(costs, layout.pp, "tensors")
    per_weight = PROFILE_BYTES_CPU if hw.device == "cpu" else PROFILE_BYTES_GPU
    phema = profiles * local * per_weight / (hw.memory_bandwidth_gbs * 1e9)
    # On a CPU the trainer's AdamW is fused in one process and a per-parameter loop in several.
    if hw.device == "cpu" and machine.world > 1 and hw.loop_optimizer_s_per_param:
        loop = local * hw.loop_optimizer_s_per_param + tensors * hw.loop_optimizer_s_per_tensor
        return (loop + phema) * machine.core_share
    return (local * hw.optimizer_s_per_param + phema) * machine.core_share
