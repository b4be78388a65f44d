"""The objective: what a model learns and how it is sampled, as one value built from the config.

The trainer, the pipeline's last stage and the sampler talk only to this interface, so Gaussian
diffusion (`diffusion/`) and interpolant transport (`transport/`) are interchangeable:

    draws = objective.draw(n, sample_shape, generator, device)   # all randomness of a step
    x_t, t = objective.model_input(x, draws)                      # what the network sees
    loss = objective.loss(model(x_t, t, y), x, draws).mean()      # per-sample, weights applied

`draw` takes every random value of a step for the whole global batch from the given generator
only; data-parallel ranks slice what it returns, so every layout and a resume see the same step.
"""

import importlib

import torch

from dit_trainer.errors import ConfigError


class Objective:
    """Base of every objective; see the module docstring for the contract."""

    name = ""
    samplers: tuple = ()
    default_sampler = ""

    def draw(self, n: int, sample_shape, generator: torch.Generator, device) -> dict:
        """Every per-sample random value of a step (leading dim n), from `generator` only."""
        raise NotImplementedError

    def model_input(self, x: torch.Tensor, draws: dict):
        """(x_t, t): the noised input and the time the network is conditioned on."""
        raise NotImplementedError

    def loss(self, output: torch.Tensor, x: torch.Tensor, draws: dict) -> torch.Tensor:
        """(n,) per-sample losses of the network's `output`, weights applied."""
        raise NotImplementedError

    def observe(self, draws: dict, losses: torch.Tensor) -> None:
        """Called with each step's per-sample losses (loss-aware time samplers learn from them)."""

    def state_dict(self) -> dict:
        """What a resume needs besides the generator (a loss-aware sampler's history)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`."""

    def check_sampler(self, sampler):
        """`sampler` or the default, refused with a one-line error if this objective lacks it."""
        sampler = sampler or self.default_sampler
        if sampler not in self.samplers:
            raise ConfigError(f"sampler {sampler!r} does not fit objective {self.name!r}; use one of {', '.join(self.samplers)}")
        return sampler

    def sample(self, model_fn, z, sampler=None, steps=None, model_kwargs=None, progress=False, **options):
        """The final sample from initial noise `z`, calling `model_fn(x, t, **model_kwargs)`."""
        raise NotImplementedError


_OBJECTIVES = {
    "diffusion": "dit_trainer.diffusion.objective:DiffusionObjective",
}


def register_objective(name: str, target: str) -> None:
    """Make `cfg.objective = name` build `module:Class` through its `from_config(cfg)`."""
    if name in _OBJECTIVES:
        raise ValueError(f"objective {name!r} is already registered")
    _OBJECTIVES[name] = target


def list_objectives() -> list:
    """Names `cfg.objective` may take."""
    return list(_OBJECTIVES)


def build_objective(cfg) -> Objective:
    """The objective `cfg.objective` names, built from the config."""
    name = getattr(cfg, "objective", "diffusion") or "diffusion"
    if name not in _OBJECTIVES:
        raise ConfigError(f"objective {name!r} is not one of {', '.join(_OBJECTIVES)}; set objective to one of them")
    module, attr = _OBJECTIVES[name].split(":")
    return getattr(importlib.import_module(module), attr).from_config(cfg)
