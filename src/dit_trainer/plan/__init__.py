"""The layout planner: `dit plan` and `parallel.layout auto`.

Prices every layout of a model on a machine (per-rank peak memory and step time, from the model
family's `ModelSpec.costs_fn` and a hardware profile) and ranks them. Names load on first use, so
registering `dit plan` does not import torch.
"""

from dit_trainer.lazy import lazy_exports

_LAZY = {
    "apply_auto_layout": "dit_trainer.plan.auto",
    "Plan": "dit_trainer.plan.search",
    "Request": "dit_trainer.plan.search",
    "make_request": "dit_trainer.plan.search",
    "plan_layouts": "dit_trainer.plan.search",
    "Layout": "dit_trainer.plan.layouts",
    "Hardware": "dit_trainer.plan.hardware",
    "load_hardware": "dit_trainer.plan.hardware",
    "rank_memory": "dit_trainer.plan.memory",
    "step_time": "dit_trainer.plan.timing",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
