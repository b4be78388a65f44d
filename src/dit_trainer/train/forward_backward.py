"""The loss of one step's share of the global batch, with its gradients: `ForwardBackward`.

A train step is `loss = objective.losses(model_fn, x, draws).mean()` (by default `x_t, t =
objective.model_input(x, draws)`, `objective.loss(model_fn(x_t, t), x, draws)`; `model_fn` a `StepModel`
calling `model(x_t, t, **cond)` with the condition's keyword arguments, dropout applied (`y` and
`force_drop_ids` for class labels), under the run's autocast), backward; split into micro-batches with
`train.grad_accum_steps`, or run by the pipeline schedule, which carries `x` and the draws to the
last stage as its target (the last stage computes the single-process loss per micro-batch).
"""

import contextlib

import torch
from torch._functorch import config as functorch_config

from dit_trainer.errors import ConfigError
from dit_trainer.parallel.pipeline_parallel import TargetPacking, pipeline_step
from dit_trainer.train.step_model import StepModel


class ForwardBackward:
    """Forward and backward of one step under the run's autocast and activation budget."""

    def __init__(self, objective, dims, device, amp_dtype, memory_budget: float, grad_accum_steps: int, scaler):
        self.objective, self.dims, self.device, self.amp_dtype = objective, dims, device, amp_dtype
        self.memory_budget, self.grad_accum_steps, self.scaler = memory_budget, grad_accum_steps, scaler
        self.model_parts = []
        self.pipeline = None  # (schedule, has_first_stage, has_last_stage) under pipeline parallelism
        self._packing = None

    def attach(self, model_parts, pipeline=None) -> None:
        """The parallelized model parts this rank runs (and its pipeline schedule, if any)."""
        self.model_parts = list(model_parts)
        self.pipeline = pipeline

    def forward_context(self):
        """Autocast to the run's mixed-precision dtype, and the compiled blocks' activation budget."""
        stack = contextlib.ExitStack()
        if self.amp_dtype:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.amp_dtype))
        if self.memory_budget < 1:
            # Read when a block's graph is compiled, i.e. inside its first calls: the partitioner
            # then recomputes the activations that cost least to recompute (pointwise ones first).
            stack.enter_context(functorch_config.patch(activation_memory_budget=self.memory_budget))
        return stack

    def loss_and_grads(self, x, cond, draws, route=None, held=None) -> torch.Tensor:
        """The step's mean loss (on the device), gradients accumulated into the parameters; `cond`: the
        model's keyword arguments (`Condition.drop` applied), each (B, ...); `route`: the token routing
        of this rank's images (models.routing.TokenRoute) or None; `held`: the condition before dropout
        (a step_model.HeldCondition), for an objective that calls the network with other masks."""
        for part in self.model_parts:
            part.train()
        if self.pipeline:
            return self._pipelined(x, cond, draws)  # preflight refuses routing under PP
        return self._accumulated(x, cond, draws, route, held)

    def _accumulated(self, x, cond, draws, route=None, held=None):
        (model,) = self.model_parts
        local = x.shape[0]
        accum = self.grad_accum_steps
        if local % accum:
            raise ConfigError(f"per-rank batch {local} is not divisible by train.grad_accum_steps {accum}")
        loss_sum = torch.zeros((), device=self.device)
        for m in range(accum):
            sl = slice(m * local // accum, (m + 1) * local // accum)
            part = {k: v[sl] for k, v in draws.items()}
            with self._no_sync(m < accum - 1):
                # Autocast only the network; the objective's arithmetic around it stays in float32.
                # Only a routed run passes `route`: a registered model need not know the keyword.
                routed = {} if route is None else {"route": route.part(sl)}
                if getattr(self.objective, "wants_features", False):
                    routed["repa"] = True  # (output, projected tokens) for REPA's term
                # The objective calls the network (once, or for MeanFlow's JVP more often) through this.
                model_fn = StepModel(model, {k: v[sl] for k, v in cond.items()}, self.forward_context, routed,
                                     None if held is None else held.part(sl))
                losses = self.objective.losses(model_fn, x[sl], part)
                self.objective.observe(part, losses.detach())
                loss = losses.mean() / accum
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
        return loss_sum

    def _pipelined(self, x, cond, draws):
        """Forward-backward through the pipeline; the clean input and draws travel as the target, the
        condition's values (in order) are the first stage's inputs after x_t and t."""
        x_t, t = self.objective.model_input(x, draws)
        carried = {"x": x, **draws}
        self._packing = TargetPacking(carried)
        schedule, first, last = self.pipeline
        with self.forward_context():
            return pipeline_step(schedule, first, last, self.dims, (x_t, t, *cond.values()), self._packing.pack(carried))

    def pipeline_loss(self, output, target):
        """The schedule's loss, on the last stage per micro-batch: the single-process loss of its output."""
        carried = self._packing.unpack(target)
        x = carried.pop("x")
        return self.objective.loss(output.float(), x, carried).mean()

    def _no_sync(self, skip: bool):
        """Hold back FSDP's gradient reduction for all but the last micro-batch."""
        if not skip:
            return contextlib.nullcontext()
        mods = [m for part in self.model_parts for m in part.modules() if hasattr(m, "set_requires_gradient_sync")]

        @contextlib.contextmanager
        def ctx():
            for m in mods:
                m.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                for m in mods:
                    m.set_requires_gradient_sync(True)

        return ctx()
