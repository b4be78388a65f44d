"""Respacing: which steps are kept, the recomputed betas, and the timesteps the model sees."""

import numpy as np
import pytest
import torch

from dit_trainer.diffusion import create_diffusion, get_named_beta_schedule, space_timesteps

C = 3


def _evenly_spaced_sections(T, counts):
    """Independent spelling of the section rule: equal sections (remainder to the first ones),
    each with ``count`` steps at round(k * (size - 1) / (count - 1))."""
    n = len(counts)
    kept, start = [], 0
    for i, count in enumerate(counts):
        size = T // n + (1 if i < T % n else 0)
        kept += [start + (round(k * (size - 1) / (count - 1)) if count > 1 else 0) for k in range(count)]
        start += size
    return set(kept)


def test_space_timesteps_ddim():
    assert space_timesteps(1000, "ddim25") == set(range(0, 1000, 40))
    assert space_timesteps(1000, "ddim50") == set(range(0, 1000, 20))
    # The smallest stride giving exactly N steps wins: 333 gives 4 steps, 334 gives 3.
    assert space_timesteps(1000, "ddim3") == {0, 334, 668}
    with pytest.raises(ValueError):
        space_timesteps(10, "ddim7")


def test_space_timesteps_sections():
    s250 = space_timesteps(1000, "250")
    assert len(s250) == 250 and min(s250) == 0 and max(s250) == 999
    assert s250 == _evenly_spaced_sections(1000, [250])
    assert set(np.diff(sorted(s250))) <= {4, 5}

    s = space_timesteps(1000, "10,20,30")
    assert len(s) == 60 and s == _evenly_spaced_sections(1000, [10, 20, 30])
    # Sections are 334, 333 and 333 steps long; each starts at its first step and ends at its last.
    assert sorted(s)[:10] == list(range(0, 334, 37))
    assert {0, 333, 334, 666, 667, 999} <= s
    assert space_timesteps(1000, [10, 20, 30]) == s
    assert space_timesteps(100, "100") == set(range(100))
    with pytest.raises(ValueError):
        space_timesteps(10, "20")


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
@pytest.mark.parametrize("respacing", ["250", "ddim25", "10,20,30"])
def test_respaced_betas_reproduce_alphas_cumprod(schedule, respacing):
    base = create_diffusion("", noise_schedule=schedule)
    spaced = create_diffusion(respacing, noise_schedule=schedule)
    kept = sorted(space_timesteps(1000, respacing))
    assert spaced.timestep_map == kept and spaced.num_timesteps == len(kept)
    np.testing.assert_allclose(spaced.alphas_cumprod, base.alphas_cumprod[kept], rtol=1e-10)
    assert np.all(spaced.betas <= 1) and np.all(spaced.betas > 0)
    # Without respacing the betas are recomputed from alphas_cumprod (as the reference does), so
    # they equal the named schedule only up to float64 round-off.
    np.testing.assert_allclose(base.betas, get_named_beta_schedule(schedule, 1000), rtol=1e-9)


@pytest.mark.parametrize("respacing", ["250", "ddim25", "10,20,30"])
def test_model_sees_original_timesteps(respacing, toy_model, x_start):
    spaced = create_diffusion(respacing)
    kept = sorted(space_timesteps(1000, respacing))
    model = toy_model(C, learn_sigma=True)
    idx = torch.tensor([0, 1, spaced.num_timesteps // 2, spaced.num_timesteps - 1])
    spaced.p_mean_variance(model, spaced.q_sample(x_start, idx), idx)
    spaced.training_losses(model, x_start, idx)
    expected = torch.tensor([kept[i] for i in idx])
    assert len(model.seen_t) == 2
    for seen in model.seen_t:
        # Raw original timesteps: not respaced indices and not rescaled to [0, 1000).
        assert torch.equal(seen, expected) and seen.dtype == torch.long

    model.seen_t.clear()
    spaced.ddim_sample_loop(model, (1, C, 4, 4))
    assert [int(t[0]) for t in model.seen_t] == kept[::-1]


def test_respaced_q_sample_uses_kept_step(x_start):
    base = create_diffusion("")
    spaced = create_diffusion("ddim25")
    noise = torch.randn_like(x_start)
    a = spaced.q_sample(x_start, torch.tensor([3, 3, 3, 3]), noise=noise)
    b = base.q_sample(x_start, torch.tensor([120, 120, 120, 120]), noise=noise)
    torch.testing.assert_close(a, b)
