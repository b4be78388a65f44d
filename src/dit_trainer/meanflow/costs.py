"""What a MeanFlow step runs beyond a flow-matching one, for the layout planner (`dit plan`, `parallel.layout
auto`); torch-free.

A flow-matching or diffusion step is one forward and backward of the network under the run's autocast
(`NO_EXTRA`). A MeanFlow step (`MeanFlowObjective.losses`) makes more network calls, each described by a
`Call`: the share of the step's rows it runs on, its work in forwards over them, whether it runs in float32
(amp=False) and whether it goes through torch.func.jvp. With `jvp: separate` or `difference` the loss's
forward and backward are flow matching's, then, without gradient:

- when guided (`config.guided`), the unconditional velocity, and with kappa != 0 the conditional one, on the
  rows whose t lies in [guidance_t_start, guidance_t_end] and whose label (or caption) the step keeps, under
  the run's autocast;
- on the rows with r != t: with `tangent: predicted` the network's own velocity, then du/dt, both in
  float32: one JVP (a primal and a tangent pass: two forwards in one call) or a central difference (two
  calls).

With `jvp: graph` the loss's prediction is the JVP's, with gradient, on every row in float32: twice a flow
step's forward and backward; the guided calls as above, and a predicted tangent on every row.

Under FSDP with bf16 or fp16 a MeanFlow run gathers its weights in float32 (`Objective.float32_calls`,
`train.choices.gathered_dtype`). The shares are expectations over the config's (t, r) densities, as
`meanflow/timesteps.py` draws them. The calls without gradient keep nothing for the backward; the planner's
memory counts the largest one's working set, one block's forward over its rows, beside what the loss keeps
(`plan.memory.calls_transient`). Not counted: the one row a call makes when its mask selects none, and the
time forward-mode AD's dual tensors cost beyond two forwards.
"""

import math
from dataclasses import dataclass

from dit_trainer.meanflow.config import guided


@dataclass(frozen=True)
class Call:
    """Network calls of one step on a share of its rows."""

    share: float  # of the step's rows (each micro-batch's) they run on
    forwards: float = 1.0  # work in forward passes over those rows (a JVP's primal and tangent: 2)
    calls: int = 1  # network calls: FSDP gathers every block once per call
    float32: bool = False  # outside the run's autocast (amp=False): at the float32 matmul rate
    grad: bool = False  # with a backward through them (the loss's prediction)
    jvp: bool = False  # inside torch.func.jvp: eager under train.compile, attention by SDPA's math kernel


@dataclass(frozen=True)
class ObjectiveCost:
    """The network calls of one train step per micro-batch: the loss's, with gradient, and the others."""

    loss: Call = Call(1.0, grad=True)  # priced as a flow step's forward and backward times `forwards`
    extra: tuple = ()  # Calls without gradient
    float32_gathers: bool = False  # FSDP gathers float32 weights whatever train.mixed_precision says
    pipelined: bool = True  # runs under pipeline parallelism
    tensor_parallel: bool = True  # runs under tensor parallelism
    checkpointed: bool = True  # runs with activation checkpointing
    ddp: bool = True  # runs under DDP (replicas without shards)

    @property
    def extra_forwards(self) -> float:
        """Forwards per row a step runs beyond a flow step's forward and backward (3 forwards)."""
        loss = 3 * (self.loss.share * self.loss.forwards - 1)
        return loss + sum(c.share * c.forwards for c in self.extra)

    def runs(self, layout) -> bool:
        """Whether a step of this objective runs under `layout` (pp, tp, ac, dp_replicate, dp_shard)."""
        return ((self.pipelined or layout.pp == 1) and (self.tensor_parallel or layout.tp == 1)
                and (self.checkpointed or layout.ac == "none")
                and (self.ddp or not (layout.dp_replicate > 1 and layout.dp_shard == 1)))


NO_EXTRA = ObjectiveCost()


def _below(x: float, mean: float, std: float) -> float:
    """P(T <= x) for T = sigmoid(mean + std N(0, 1))."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    return 0.5 * (1 + math.erf((math.log(x / (1 - x)) - mean) / (std * math.sqrt(2))))


def _r_density(m) -> tuple:
    return (m.logit_mean if m.r_logit_mean is None else m.r_logit_mean,
            m.logit_std if m.r_logit_std is None else m.r_logit_std)


def t_share(m, lo: float, hi: float) -> float:
    """The share of rows whose t lies in [lo, hi]: v0's t is the larger of a t and an r draw, v1's a t draw."""
    r_mean, r_std = _r_density(m)

    def below(x):
        f = _below(x, m.logit_mean, m.logit_std)
        return f * _below(x, r_mean, r_std) if m.tr_sampler == "v0" else f

    return max(0.0, below(hi) - below(lo))


def moving_share(m) -> float:
    """The share of rows with r != t: `ratio` under v0; under v1, which takes min(t, r) after the mask,
    `ratio` times the chance that the r draw falls below the t draw."""
    if m.tr_sampler == "v0":
        return float(m.ratio)
    r_mean, r_std = _r_density(m)
    gap = (m.logit_mean - r_mean) / math.sqrt(2 * (m.logit_std ** 2 + r_std ** 2))
    return m.ratio * 0.5 * (1 + math.erf(gap))


def meanflow_cost(m, dropout: float) -> ObjectiveCost:
    """The calls of a MeanFlow step of section `m` (a MeanFlowConfig), `dropout` the share of labels or
    captions the step drops (the unconditional rows, which learn the plain velocity)."""
    calls = []
    if guided(m):
        share = t_share(m, m.guidance_t_start, m.guidance_t_end) * (1 - dropout)
        calls.append(Call(share, calls=2 if m.kappa else 1, forwards=2 if m.kappa else 1))
    graph = m.jvp == "graph"
    moving = 1.0 if graph else moving_share(m)
    if m.tangent == "predicted":
        calls.append(Call(moving, float32=True))
    if m.jvp == "separate":
        calls.append(Call(moving, forwards=2, float32=True, jvp=True))
    elif m.jvp == "difference":
        calls.append(Call(moving, forwards=2, calls=2, float32=True))
    loss = Call(1.0, forwards=2, float32=True, grad=True, jvp=True) if graph else NO_EXTRA.loss
    # Refused in meanflow/config.py and train/preflight.py: the planner offers none of these layouts.
    return ObjectiveCost(loss, tuple(c for c in calls if c.share > 0), float32_gathers=True, pipelined=False,
                         tensor_parallel=m.jvp == "difference", checkpointed=not graph, ddp=not graph)


def objective_cost(cfg, dropout: float = 0.0) -> ObjectiveCost:
    """What `cfg.objective`'s step runs per micro-batch: `NO_EXTRA` for flow matching and diffusion."""
    if getattr(cfg, "objective", None) != "meanflow":
        return NO_EXTRA
    return meanflow_cost(cfg.meanflow, dropout)
