"""Shared tiny models for the MindSpore alignment tests (run in the MindSpore env, see
scripts/run_mindspore_tests.sh). The PyTorch reference runs in the same process: torch 2.13 and
MindSpore 2.10 both work with numpy 1.26."""

import importlib.util

import numpy as np

if any(importlib.util.find_spec(m) is None for m in ("mindspore", "torch")):
    # Outside the MindSpore environment there is nothing to run here: see scripts/run_mindspore_tests.sh.
    collect_ignore_glob = ["test_*.py"]
else:
    import mindspore as ms
    import torch

# depth 2, hidden 64, 8x8 latents: big enough that every layer type matters, small enough for CPU.
TINY = {"input_size": 8, "patch_size": 2, "in_channels": 4, "hidden_size": 64, "depth": 2, "num_heads": 4,
        "num_classes": 10}
# For the 100-step runs: one block, hidden 32, 4x4 latents.
MICRO = {"input_size": 4, "patch_size": 2, "in_channels": 4, "hidden_size": 32, "depth": 1, "num_heads": 2,
         "num_classes": 4}


def engine_config(kw, **extra):
    """The flat RFC config of a MindSpore engine with the sizes of `kw`."""
    return {"backend": "mindspore", "model_name": "DiT-S/2", "input_size": kw["input_size"],
            "num_classes": kw["num_classes"], "mixed_precision": "fp32",
            "model": {"depth": kw["depth"], "hidden_size": kw["hidden_size"], "num_heads": kw["num_heads"]},
            **extra}


def torch_dit(kw, seed=0, perturb=0.05):
    """Our PyTorch DiT with its zero-initialised (adaLN-Zero) weights perturbed, so every path counts."""
    from dit_trainer.models.dit.model import DiT

    torch.manual_seed(seed)
    model = DiT(**kw)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(perturb * torch.randn_like(p))
    return model


def copy_into(ms_model, torch_model):
    """Converted weights (dit_trainer_mindspore.convert) of `torch_model` into `ms_model`."""
    from dit_trainer_mindspore.convert import torch_to_mindspore

    weights = torch_to_mindspore({k: v.numpy() for k, v in torch_model.state_dict().items()})
    for name, p in ms_model.parameters_and_names():
        p.set_data(ms.Tensor(weights[name]))


def rel(a, b):
    """||a - b|| / ||b||."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
