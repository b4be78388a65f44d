"""Timestep samplers: uniform, loss-second-moment importance sampling, RNG control, all-gather."""

import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dit_trainer.diffusion import create_diffusion
from dit_trainer.diffusion.timestep_sampler import (
    LossSecondMomentResampler,
    UniformSampler,
    create_named_schedule_sampler,
)


def _toy(T):
    return SimpleNamespace(num_timesteps=T)


def test_named_samplers():
    diffusion = create_diffusion("")
    assert isinstance(create_named_schedule_sampler("uniform", diffusion), UniformSampler)
    lsm = create_named_schedule_sampler("loss-second-moment", diffusion)
    assert isinstance(lsm, LossSecondMomentResampler)
    assert lsm.history_per_term == 10 and lsm.uniform_prob == 0.001
    with pytest.raises(NotImplementedError):
        create_named_schedule_sampler("nope", diffusion)


def test_uniform_sampler():
    sampler = UniformSampler(_toy(1000))
    np.testing.assert_array_equal(sampler.weights(), np.ones(1000))
    t, w = sampler.sample(4096, "cpu", generator=torch.Generator().manual_seed(0))
    assert t.dtype == torch.long and w.dtype == torch.float32 and t.shape == w.shape == (4096,)
    assert 0 <= t.min() and t.max() < 1000 and len(t.unique()) > 900
    assert torch.all(w == 1)


def test_default_rng_is_numpy_global_like_the_reference():
    sampler = UniformSampler(_toy(100))
    np.random.seed(0)
    t, _ = sampler.sample(16, "cpu")
    np.random.seed(0)
    expected = np.random.choice(100, size=(16,), p=np.full(100, 0.01))
    np.testing.assert_array_equal(t.numpy(), expected)


def test_torch_generator_makes_sampling_resumable():
    sampler = UniformSampler(_toy(1000))
    g = torch.Generator().manual_seed(123)
    first, _ = sampler.sample(8, "cpu", generator=g)
    saved = g.get_state()
    second, _ = sampler.sample(8, "cpu", generator=g)
    g2 = torch.Generator()
    g2.set_state(saved)
    resumed, _ = sampler.sample(8, "cpu", generator=g2)
    assert torch.equal(second, resumed) and not torch.equal(first, second)
    # The numpy global RNG is left untouched on this path.
    np.random.seed(5)
    untouched = np.random.rand()
    np.random.seed(5)
    sampler.sample(8, "cpu", generator=g)
    assert np.random.rand() == untouched


def test_loss_second_moment_warmup_and_history():
    sampler = LossSecondMomentResampler(_toy(3), history_per_term=2)
    sampler.update_with_all_losses([0, 0, 1, 1, 2], [1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(sampler.weights(), np.ones(3))  # t=2 has one loss only
    sampler.update_with_all_losses([2, 0], [6.0, 7.0])  # t=0 now holds [2, 7]: oldest dropped
    np.testing.assert_array_equal(sampler._loss_history, [[2.0, 7.0], [3.0, 4.0], [5.0, 6.0]])


def test_loss_second_moment_sampling_probabilities():
    T = 4
    sampler = LossSecondMomentResampler(_toy(T), history_per_term=3, uniform_prob=0.001)
    history = np.array([[1.0, 1.0, 1.0], [2.0, 0.0, 2.0], [3.0, 4.0, 5.0], [0.5, 0.5, 0.5]])
    for _ in range(2):  # more than the history holds, to exercise the shift
        for t in range(T):
            sampler.update_with_all_losses([t] * 3, list(history[t]))
    rms = np.sqrt((history**2).mean(axis=1))
    expected = rms / rms.sum() * (1 - 0.001) + 0.001 / T
    np.testing.assert_allclose(sampler.weights(), expected, rtol=1e-12)

    n = 200_000
    t, w = sampler.sample(n, "cpu", generator=torch.Generator().manual_seed(0))
    freq = np.bincount(t.numpy(), minlength=T) / n
    np.testing.assert_allclose(freq, expected, atol=4e-3)
    # Importance weights 1 / (T p_t) keep the weighted loss an unbiased estimate of the uniform mean.
    np.testing.assert_allclose(w.numpy(), 1 / (T * expected[t.numpy()]), rtol=1e-6)


def test_local_losses_without_distributed_match_all_losses():
    a = LossSecondMomentResampler(_toy(5), history_per_term=2)
    b = LossSecondMomentResampler(_toy(5), history_per_term=2)
    ts, losses = torch.tensor([0, 4, 4, 2]), torch.tensor([0.5, 1.5, 2.5, 3.5])
    a.update_with_local_losses(ts, losses)
    b.update_with_all_losses([0, 4, 4, 2], [0.5, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(a._loss_history, b._loss_history)
    np.testing.assert_array_equal(a._loss_counts, b._loss_counts)


def test_state_dict_roundtrip_is_weights_only_loadable():
    a = LossSecondMomentResampler(_toy(3), history_per_term=2)
    a.update_with_all_losses([0, 1, 2, 0], [1.0, 2.0, 3.0, 4.0])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = LossSecondMomentResampler(_toy(3), history_per_term=2)
    b.load_state_dict(torch.load(buf, weights_only=True))
    np.testing.assert_array_equal(a._loss_history, b._loss_history)
    np.testing.assert_array_equal(a._loss_counts, b._loss_counts)


def _gather_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        sampler = LossSecondMomentResampler(_toy(4), history_per_term=2)
        # Unequal batch sizes per rank exercise the padding before all_gather.
        if rank == 0:
            ts, losses = torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0, 3.0])
        else:
            ts, losses = torch.tensor([3]), torch.tensor([4.0])
        sampler.update_with_local_losses(ts, losses)
        np.save(f"{out_dir}/history{rank}.npy", sampler._loss_history)
        np.save(f"{out_dir}/counts{rank}.npy", sampler._loss_counts)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_update_with_local_losses_all_gathers(tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed unavailable")
    torch.multiprocessing.spawn(
        _gather_worker, args=(2, str(tmp_path / "rdzv"), str(tmp_path)), nprocs=2, join=True
    )
    for rank in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / f"counts{rank}.npy"), [1, 1, 1, 1])
        np.testing.assert_array_equal(np.load(tmp_path / f"history{rank}.npy")[:, 0], [1.0, 2.0, 3.0, 4.0])
