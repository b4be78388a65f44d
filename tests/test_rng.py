"""seeded_global_rng: a seeded stream inside, the caller's global RNG state back outside."""

import torch

from dit_trainer.rng import seeded_global_rng


def test_inside_the_stream_of_the_seed_outside_the_callers():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with seeded_global_rng(7, "cpu"):
        inside = torch.randn(5)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(inside, torch.randn(5, generator=torch.Generator().manual_seed(7)))
    with seeded_global_rng(8, torch.device("cpu")):
        assert not torch.equal(torch.randn(5), inside)


def test_the_state_comes_back_when_the_block_raises():
    before = torch.get_rng_state()
    try:
        with seeded_global_rng(1, "cpu"):
            torch.randn(3)
            raise KeyError("stop")
    except KeyError:
        pass
    assert torch.equal(torch.get_rng_state(), before)
