"""A seeded fork of torch's global RNG, for code that draws from it (the diffusion loops' per-step noise).

A leaf module: it imports torch only, so sampling and the objectives can share it without a cycle.
"""

import contextlib

import torch


@contextlib.contextmanager
def seeded_global_rng(seed: int, device):
    """Within the block the global CPU RNG (and `device`'s CUDA generator) start from `seed`; both are restored after."""
    device = torch.device(device)
    # Only the generator of the device in use is forked and seeded: other GPUs' streams stay the caller's.
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(int(seed))
        for index in cuda:
            torch.cuda.default_generators[index].manual_seed(int(seed))
        yield
