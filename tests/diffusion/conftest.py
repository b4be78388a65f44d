"""Toy models shared by the diffusion tests: cheap, deterministic functions of (x, t)."""

import math

import pytest
import torch


class ToyEpsModel(torch.nn.Module):
    """A 3x3 conv plus a timestep-dependent offset; 2*C output channels when sigma is learned.

    The variance half goes through tanh so it stays in [-1, 1], the range LEARNED_RANGE expects.
    """

    def __init__(self, channels=3, learn_sigma=True, seed=0):
        super().__init__()
        self.channels = channels
        self.learn_sigma = learn_sigma
        out = 2 * channels if learn_sigma else channels
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(out, channels, 3, 3, generator=g) * 0.2)
        self.seen_t = []

    def forward(self, x, t, y=None):
        self.seen_t.append(t.detach().clone())
        out = torch.nn.functional.conv2d(x, self.weight, padding=1)
        out = out + torch.sin(t.float() / 37.0).view(-1, 1, 1, 1)
        if y is not None:
            out = out + 0.01 * y.float().view(-1, 1, 1, 1)
        if self.learn_sigma:
            c = self.channels
            out = torch.cat([out[:, :c], torch.tanh(out[:, c:])], dim=1)
        return out


@pytest.fixture(autouse=True)
def _single_thread():
    """Run these tiny-tensor tests on one intra-op thread, restoring the setting afterwards.

    Thread start-up dominates ops this small, and under load on a 2-core box a 2-thread conv was
    ~100x slower than a single-threaded one.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def toy_model():
    """Factory: toy_model(channels=3, learn_sigma=True, seed=0) -> ToyEpsModel."""
    return ToyEpsModel


@pytest.fixture
def x_start():
    """A small batch in [-1, 1] that includes exact -1/+1 pixels (the decoder's edge bins)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.rand(4, 3, 8, 8, generator=g) * 2 - 1
    x[0, 0, 0, :3] = torch.tensor([-1.0, 1.0, 0.0])
    return x


@pytest.fixture
def ref_betas():
    """Independent float64 betas for T steps, written from the papers rather than the package."""

    def make(schedule, T=1000):
        if schedule == "linear":
            scale = 1000 / T
            return torch.linspace(scale * 1e-4, scale * 0.02, T, dtype=torch.float64)
        if schedule == "cosine":
            f = lambda s: math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
            return torch.tensor([min(1 - f((i + 1) / T) / f(i / T), 0.999) for i in range(T)], dtype=torch.float64)
        raise ValueError(schedule)

    return make
