"""The layouts the planner considers for a world size: degrees, pipeline schedule, micro-batches,
activation checkpointing and compile, and how one is written into a config."""

from dataclasses import dataclass

from dit_trainer.parallel.pipeline_parallel import SCHEDULES

AC_POLICIES = ("none", "selective", "full")
BUDGETS = (1.0, 0.8, 0.5)  # train.activation_memory_budget of compiled blocks without AC


@dataclass(frozen=True)
class Layout:
    """One way to run a step: `microbatches` is parallel.pp_microbatches under pp, else train.grad_accum_steps."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    schedule: str = ""  # gpipe | 1f1b | interleaved1f1b when pp > 1
    microbatches: int = 1
    ac: str = "none"
    compile: bool = False
    budget: float = 1.0

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def stages_per_rank(self) -> int:
        return 2 if self.schedule == "interleaved1f1b" else 1

    def parallelism(self) -> str:
        """dp_replicate x dp_shard x tp x pp, named: `hsdp 2x4 · tp 2`, `single`."""
        parts = []
        if self.dp_shard > 1 and self.dp_replicate > 1:
            parts.append(f"hsdp {self.dp_replicate}x{self.dp_shard}")
        elif self.dp_shard > 1:
            parts.append(f"fsdp {self.dp_shard}")
        elif self.dp_replicate > 1:
            parts.append(f"{'ddp' if self.tp == self.pp == 1 else 'replicas'} {self.dp_replicate}")
        if self.tp > 1:
            parts.append(f"tp {self.tp}")
        if self.pp > 1:
            parts.append(f"pp {self.pp} {self.schedule}")
        return " · ".join(parts) or "single"

    def memory_policy(self) -> str:
        """How the step keeps activations: `none`, `full`, `selective`, `compile`, `compile@0.5`."""
        if self.ac != "none":
            return f"{self.ac}{'+compile' if self.compile else ''}"
        if self.compile:
            return "compile" if self.budget >= 1 else f"compile@{self.budget:g}"
        return "none"

    def apply(self, cfg) -> None:
        """Write this layout into `cfg` (parallel degrees, schedule, micro-batches, AC, compile, budget)."""
        par, train = cfg.parallel, cfg.train
        par.dp_replicate, par.dp_shard, par.tp, par.pp = self.dp_replicate, self.dp_shard, self.tp, self.pp
        if self.pp > 1:
            par.pp_schedule, par.pp_microbatches = self.schedule, self.microbatches
            train.grad_accum_steps = 1
        else:
            train.grad_accum_steps = self.microbatches
        train.activation_checkpointing = self.ac
        train.compile = "true" if self.compile else "false"
        if self.compile and self.ac == "none":
            train.activation_memory_budget = self.budget


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two_dividing(n: int, start: int = 1) -> list[int]:
    out, k = [], start
    while k <= n:
        if n % k == 0:
            out.append(k)
        k *= 2
    return out


def candidate_layouts(world: int, gpus_per_node: int, depth: int, global_batch: int, tp_divides=(),
                      ac_choices=AC_POLICIES, compile_choices=(False, True), schedules=SCHEDULES):
    """Every layout of `world` ranks worth pricing: tp within a node dividing the model's head counts
    and widths, pp up to the depth, any split of the rest into replicas x shards, micro-batches that
    divide the per-rank batch, each AC policy and compile choice."""
    for tp in _divisors(world):
        if tp > gpus_per_node or any(n % tp for n in tp_divides):
            continue
        for pp in _divisors(world // tp):
            dp = world // (tp * pp)
            if global_batch % dp:
                continue
            local = global_batch // dp
            for dp_shard in _divisors(dp):
                for schedule, micro in _pipelines(pp, depth, local, schedules):
                    for ac in ac_choices:
                        for compiled in compile_choices:
                            for budget in (BUDGETS if compiled and ac == "none" else (1.0,)):
                                yield Layout(dp // dp_shard, dp_shard, tp, pp, schedule, micro, ac, compiled, budget)


def _pipelines(pp: int, depth: int, local: int, schedules):
    if pp == 1:
        for accum in _powers_of_two_dividing(local):
            yield "", accum
        return
    for schedule in schedules:
        per_rank = 2 if schedule == "interleaved1f1b" else 1
        if pp * per_rank > depth:
            continue
        # At least one micro-batch per stage; powers of two and multiples of pp (interleaving needs those).
        for m in _divisors(local):
            if m >= pp and (m % pp == 0 or (m & (m - 1) == 0 and per_rank == 1)):
                yield schedule, m
