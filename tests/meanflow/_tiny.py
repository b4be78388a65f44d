"""A tiny MeanFlow model and the model_fn a train step hands the objective, shared by the tests here."""

import math

import torch

from dit_trainer.config import build_config
from dit_trainer.models import get_spec
from dit_trainer.train.step_model import StepModel

MODEL = {"name": "SiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 10, "learn_sigma": False,
         "depth": 2, "hidden_size": 32, "num_heads": 2}


def tiny_config(name="SiT-S/2", **meanflow):
    """A Config of the tiny model trained with MeanFlow (`meanflow` keys over the defaults)."""
    return build_config({"objective": "meanflow", "model": {**MODEL, "name": name}, "meanflow": meanflow})


@torch.no_grad()
def randomised(model, seed=0):
    """`model` with O(1)-output random weights everywhere (zero inits, the interval's included, would hide terms)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name != "pos_embed":
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel() if p.dim() > 1 else 10))
    return model


def tiny_model(cfg=None, seed=0):
    """The tiny model of `cfg` with random weights, in train mode (as a train step calls it)."""
    cfg = cfg or tiny_config()
    return randomised(get_spec(cfg.model.name).build_model_fn(cfg), seed).train()


def batch(n=6, seed=1):
    """(x, y, drop): data-like x, labels and a label-dropout mask with one dropped sample."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, 8, 8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    drop = torch.zeros(n, dtype=torch.long)
    drop[-1] = 1
    return x, y, drop


def step_model(model, y, drop):
    """The trainer's model_fn for this micro-batch (no autocast: fp32)."""
    import contextlib

    from dit_trainer.condition.label import ClassCondition
    from dit_trainer.train.step_model import HeldCondition

    held = HeldCondition(ClassCondition(model.num_classes), {"y": y}, drop)
    return StepModel(model, held.condition.drop(held.kwargs, drop), contextlib.nullcontext, held=held)
