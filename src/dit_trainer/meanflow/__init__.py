"""MeanFlow (Geng et al., 2025): one- and few-step generation by learning the average velocity u(z, r, t)
over an interval instead of the instantaneous one, through the MeanFlow identity
u = v - (t - r) du/dt, du/dt a Jacobian-vector product through the network.

`MeanFlowObjective` (`objective: meanflow`) trains DiT, SiT and Large-DiT with a second time input (the
interval h = t - r, `models/interval.py`), guidance folded into the target, and samples in 1..N steps.
Names load on first use, so reading the config's `meanflow:` section does not import torch.
"""

from dit_trainer.lazy import lazy_exports

_LAZY = {
    "MeanFlowConfig": "dit_trainer.meanflow.config",
    "check_meanflow": "dit_trainer.meanflow.config",
    "MeanFlowObjective": "dit_trainer.meanflow.objective",
    "sample_t_r": "dit_trainer.meanflow.timesteps",
    "guided_velocity": "dit_trainer.meanflow.target",
    "meanflow_loss": "dit_trainer.meanflow.target",
    "time_derivative": "dit_trainer.meanflow.jvp",
    "sample_meanflow": "dit_trainer.meanflow.sampler",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = sorted(_LAZY)
