"""Which device a command runs on."""

import torch


def resolve_device(name: str) -> torch.device:
    """"auto" picks CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
