"""Rank every layout of a world size by predicted step time among those that fit in memory."""

from dataclasses import dataclass, field

from dit_trainer.condition import dropout_prob
from dit_trainer.config import given_keys
from dit_trainer.devices import AUTO_COMPILE_MIN_STEPS, COMPILE_MIN_PARAMS
from dit_trainer.errors import ConfigError
from dit_trainer.meanflow.costs import objective_cost
from dit_trainer.models import get_spec
from dit_trainer.models.routing import TokenRouting
from dit_trainer.plan.hardware import load_hardware
from dit_trainer.plan.layouts import AC_POLICIES, Layout, candidate_layouts
from dit_trainer.plan.memory import Numerics, rank_memory
from dit_trainer.plan.timing import Machine, StepTime, step_time

GIB = 2**30


@dataclass(frozen=True)
class Plan:
    """One priced layout: per-pipeline-rank memory, the step's time and whether it fits."""

    layout: Layout
    memory: list  # RankMemory per pipeline rank
    time: StepTime
    global_batch: int
    usable_bytes: float

    @property
    def peak(self):
        """The pipeline rank with the most memory."""
        return max(self.memory, key=lambda m: m.total)

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.usable_bytes

    @property
    def images_per_s(self) -> float:
        return self.global_batch / self.time.total

    def overflow(self) -> str:
        """What does not fit, naming the largest part: `needs 95.2 GiB of 78 (activations 61.0 GiB)`."""
        peak = self.peak
        part, size = max(peak.parts().items(), key=lambda kv: kv[1])
        rank = f" on pp rank {peak.pp_rank}" if self.layout.pp > 1 else ""
        return (f"needs {peak.total / GIB:.1f} GiB of {self.usable_bytes / GIB:.1f}{rank} "
                f"({part} {size / GIB:.1f} GiB)")


@dataclass
class Request:
    """What to plan: the model config and the machine."""

    cfg: object  # Config
    gpus: int
    gpus_per_node: int
    hardware: object  # Hardware
    gpu_memory_gib: float = 0.0  # 0: the profile's
    pinned: set = field(default_factory=set)  # config keys the user set, which the search keeps

    @property
    def usable_bytes(self) -> float:
        memory = self.gpu_memory_gib or self.hardware.memory_gib
        if self.hardware.device == "cpu" and self.hardware.cores:
            memory = memory / max(1, min(self.gpus, self.gpus_per_node))  # the processes share the host
        return (memory - self.hardware.memory_reserved_gib) * GIB


def make_request(cfg, gpus: int, gpus_per_node: int = 0, hardware="h100", gpu_memory_gib: float = 0.0) -> Request:
    """A Request whose search keeps the AC and compile settings the user set in `cfg`."""
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus} must be at least 1")
    per_node = gpus_per_node or min(gpus, 8)
    if per_node < 1 or gpus % per_node and gpus > per_node:
        raise ConfigError(f"--gpus {gpus} is not a whole number of nodes of --gpus-per-node {per_node}")
    return Request(cfg, gpus, min(per_node, gpus), load_hardware(hardware), gpu_memory_gib, set(given_keys(cfg)))


def _choices(request, costs):
    cfg, pinned = request.cfg, request.pinned
    ac = (cfg.train.activation_checkpointing,) if "train.activation_checkpointing" in pinned else AC_POLICIES
    if cfg.train.compile in ("true", "false") and ("train.compile" in pinned or cfg.train.compile == "false"):
        compiled = (cfg.train.compile == "true",)
    elif cfg.train.max_steps < AUTO_COMPILE_MIN_STEPS or costs.trainable < COMPILE_MIN_PARAMS:
        compiled = (False,)  # what `train.compile auto` decides: the ~1 min compile would not repay
    else:
        compiled = (False, True)
    return ac, compiled


def model_costs(cfg):
    """The family's counts for `cfg`'s model, its blocks' work that of the tokens `train.routing_*` keeps."""
    spec = get_spec(cfg.model.name)
    if spec.costs_fn is None:
        raise ConfigError(f"model {spec.name} has no cost model (ModelSpec.costs_fn); set parallel.layout manual")
    costs = spec.costs_fn(cfg)
    if cfg.repa.enabled:
        from dit_trainer.repa.costs import with_alignment

        costs = with_alignment(costs, cfg)
    from dit_trainer.text_encoders.costs import with_text_encoder

    costs = with_text_encoder(costs, cfg)
    routing = TokenRouting.from_config(cfg.train, costs.depth, costs.tokens)
    return costs.routed(routing.tokens_per_block()) if routing else costs


def step_calls(cfg):
    """The network calls of `cfg`'s train step beyond a flow-matching one (`meanflow.costs.ObjectiveCost`)."""
    return objective_cost(cfg, dropout_prob(cfg, get_spec(cfg.model.name).condition))


def plan_layouts(request: Request) -> list:
    """Every candidate Plan, those that fit first, fastest first; then the rest by how little they need."""
    cfg = request.cfg
    costs = model_costs(cfg)
    numerics = Numerics.of(cfg.train.mixed_precision, request.hardware.device)
    machine = Machine(request.gpus, request.gpus_per_node, request.hardware)
    batch = cfg.train.global_batch_size
    ac, compiled = _choices(request, costs)
    objective = step_calls(cfg)
    plans = []
    # Token routing (train/preflight.py), REPA (repa/config.py) and a family without a stage split do not run pipelined;
    # an objective refuses the layouts its step cannot run (MeanFlow: PP, and TP, AC or DDP for some jvp paths).
    no_pp = cfg.train.routing_keep < 1 or cfg.repa.enabled or get_spec(cfg.model.name).pipelining_fn is None
    for layout in candidate_layouts(request.gpus, request.gpus_per_node, costs.depth, batch, costs.tp_divides,
                                    ac_choices=ac, compile_choices=compiled):
        if layout.pp > 1 and no_pp or not objective.runs(layout):
            continue
        if layout.compile and "train.activation_memory_budget" in request.pinned and layout.budget != 1.0:
            layout = Layout(**{**layout.__dict__, "budget": cfg.train.activation_memory_budget})
        profiles = len(cfg.train.phema_stds)
        plans.append(Plan(layout, rank_memory(costs, layout, batch, numerics, profiles, objective),
                          step_time(costs, layout, machine, numerics, batch, profiles, objective), batch,
                          request.usable_bytes))
    if not plans:
        raise ConfigError(f"no layout of {request.gpus} ranks splits train.global_batch_size {batch}; "
                          f"make it a multiple of {request.gpus}")
    return sorted(plans, key=_rank_key)


def _rank_key(plan: Plan):
    # Fitting plans by step time (ties: less memory, fewer moving parts); the rest by memory.
    lay = plan.layout
    simplicity = (lay.pp, lay.tp, lay.dp_replicate > 1, lay.ac != "none", lay.compile, lay.microbatches)
    if plan.fits:
        return (0, round(plan.time.total, 6), plan.peak.total, simplicity)
    return (1, plan.peak.total, plan.time.total, simplicity)


def why_first(first: Plan, second: Plan) -> str:
    """One line: where the first plan's step gains on the second's, and what it costs."""
    a, b = first.time.parts(), second.time.parts()
    diffs = sorted(((b[k] - a[k], k) for k in a), reverse=True)
    less = [f"{d:.3g} s less on {k}" for d, k in diffs if d > 1e-4][:2]
    more = [f"{-d:.3g} s more on {k}" for d, k in diffs if d < -1e-4][-1:]
    speed = first.images_per_s / second.images_per_s - 1
    mem = (first.peak.total - second.peak.total) / GIB
    return (f"#1 ({first.layout.parallelism()}, {first.layout.memory_policy()}) beats #2 "
            f"({second.layout.parallelism()}, {second.layout.memory_policy()}) by {100 * speed:.1f}% img/s: "
            f"{', '.join(less + more) or 'the same step'}; {abs(mem):.2f} GiB per rank {'more' if mem > 0 else 'less'}")
