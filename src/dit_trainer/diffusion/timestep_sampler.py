"""Importance samplers over diffusion timesteps (uniform and loss-second-moment).

Randomness: with ``generator=None``, ``sample`` draws from numpy's global RNG exactly like
facebookresearch/DiT (so ``np.random.seed`` reproduces the reference's timesteps). A trainer that
needs bit-exact resume passes a ``torch.Generator`` instead; one 63-bit seed is then drawn from
that generator per call and fed to a fresh ``numpy.random.Generator``, so saving and restoring the
torch generator's state is all that resuming needs. The two paths draw from the same distribution
and return the same importance weights, but not the same indices.
"""

from abc import ABC, abstractmethod

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "ScheduleSampler",
    "UniformSampler",
    "LossAwareSampler",
    "LossSecondMomentResampler",
    "create_named_schedule_sampler",
]


def create_named_schedule_sampler(name, diffusion):
    """Build a timestep sampler by name: "uniform" or "loss-second-moment"."""
    if name == "uniform":
        return UniformSampler(diffusion)
    if name == "loss-second-moment":
        return LossSecondMomentResampler(diffusion)
    raise NotImplementedError(f"unknown schedule sampler: {name}")


def _numpy_rng_from_torch(generator):
    """A numpy Generator seeded by one draw from ``generator`` (advancing its state)."""
    seed = torch.randint(0, 2**63 - 1, (1,), generator=generator, dtype=torch.int64).item()
    return np.random.default_rng(seed)


class ScheduleSampler(ABC):
    """A distribution over timesteps; ``sample`` returns importance weights that keep the loss unbiased."""

    @abstractmethod
    def weights(self):
        """Unnormalised, positive numpy weights, one per diffusion step."""

    def sample(self, batch_size, device, generator=None):
        """Draw ``batch_size`` timesteps; returns (long timesteps, float32 weights) on ``device``."""
        w = self.weights()
        p = w / np.sum(w)
        if generator is None:
            indices_np = np.random.choice(len(p), size=(batch_size,), p=p)
        else:
            indices_np = _numpy_rng_from_torch(generator).choice(len(p), size=(batch_size,), p=p)
        indices = torch.from_numpy(indices_np).long().to(device)
        # 1 / (T p_t): the weight that makes the weighted mean an unbiased estimate of the uniform mean.
        weights_np = 1 / (len(p) * p[indices_np])
        weights = torch.from_numpy(weights_np).float().to(device)
        return indices, weights


class UniformSampler(ScheduleSampler):
    """Every timestep equally likely; all weights are one."""

    def __init__(self, diffusion):
        self.diffusion = diffusion
        self._weights = np.ones([diffusion.num_timesteps])

    def weights(self):
        """All ones."""
        return self._weights


class LossAwareSampler(ScheduleSampler):
    """A sampler whose weights are updated from observed per-timestep losses."""

    def update_with_local_losses(self, local_ts, local_losses):
        """Feed this rank's (timesteps, losses); gathers every rank's batch when torch.distributed is up."""
        if not (dist.is_available() and dist.is_initialized()):
            self.update_with_all_losses(
                [int(x) for x in local_ts.tolist()], [float(x) for x in local_losses.tolist()]
            )
            return
        world = dist.get_world_size()
        device = local_ts.device
        sizes = [torch.zeros(1, dtype=torch.int32, device=device) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([len(local_ts)], dtype=torch.int32, device=device))
        sizes = [int(s.item()) for s in sizes]
        max_bs = max(sizes)

        # all_gather needs equal shapes, so every rank pads its batch to the largest one.
        def padded(x):
            out = torch.zeros(max_bs, dtype=x.dtype, device=x.device)
            out[: len(x)] = x
            return out

        ts_batches = [torch.zeros(max_bs, dtype=local_ts.dtype, device=device) for _ in sizes]
        loss_batches = [torch.zeros(max_bs, dtype=local_losses.dtype, device=device) for _ in sizes]
        dist.all_gather(ts_batches, padded(local_ts))
        dist.all_gather(loss_batches, padded(local_losses))
        timesteps = [int(x) for batch, bs in zip(ts_batches, sizes) for x in batch[:bs].tolist()]
        losses = [float(x) for batch, bs in zip(loss_batches, sizes) for x in batch[:bs].tolist()]
        self.update_with_all_losses(timesteps, losses)

    @abstractmethod
    def update_with_all_losses(self, ts, losses):
        """Update from every rank's (timestep, loss) pairs; must be deterministic so ranks stay in sync."""


class LossSecondMomentResampler(LossAwareSampler):
    """Sample t with probability proportional to sqrt(E[loss_t^2]) over a short history, once warm."""

    def __init__(self, diffusion, history_per_term=10, uniform_prob=0.001):
        self.diffusion = diffusion
        self.history_per_term = history_per_term
        self.uniform_prob = uniform_prob
        self._loss_history = np.zeros([diffusion.num_timesteps, history_per_term], dtype=np.float64)
        # np.int is gone from numpy; int64 is what it meant on every platform DiT ran on.
        self._loss_counts = np.zeros([diffusion.num_timesteps], dtype=np.int64)

    def weights(self):
        """Uniform until every timestep has a full history, then RMS loss mixed with a uniform floor."""
        if not self._warmed_up():
            return np.ones([self.diffusion.num_timesteps], dtype=np.float64)
        weights = np.sqrt(np.mean(self._loss_history**2, axis=-1))
        weights /= np.sum(weights)
        # A small uniform share keeps every timestep reachable, bounding the importance weights.
        weights *= 1 - self.uniform_prob
        weights += self.uniform_prob / len(weights)
        return weights

    def update_with_all_losses(self, ts, losses):
        """Append each loss to its timestep's ring of the last ``history_per_term`` losses."""
        for t, loss in zip(ts, losses):
            if self._loss_counts[t] == self.history_per_term:
                self._loss_history[t, :-1] = self._loss_history[t, 1:]
                self._loss_history[t, -1] = loss
            else:
                self._loss_history[t, self._loss_counts[t]] = loss
                self._loss_counts[t] += 1

    def _warmed_up(self):
        """Whether every timestep has seen ``history_per_term`` losses."""
        return (self._loss_counts == self.history_per_term).all()

    def state_dict(self):
        """Loss history and counts as tensors (loadable with ``weights_only=True``) for exact resume."""
        return {
            "loss_history": torch.from_numpy(self._loss_history.copy()),
            "loss_counts": torch.from_numpy(self._loss_counts.copy()),
        }

    def load_state_dict(self, state):
        """Restore what ``state_dict`` returned (tensors or arrays)."""
        history, counts = state["loss_history"], state["loss_counts"]
        if isinstance(history, torch.Tensor):
            history, counts = history.cpu().numpy(), counts.cpu().numpy()
        assert np.shape(history) == self._loss_history.shape, "history shape does not match this sampler"
        self._loss_history = np.array(history, dtype=np.float64)
        self._loss_counts = np.array(counts, dtype=np.int64)
