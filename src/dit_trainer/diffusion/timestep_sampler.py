"""Samplers over diffusion timesteps: importance samplers (uniform, loss-second-moment) and shaped
densities (logit-normal, lognormal).

Randomness: with ``generator=None``, ``sample`` draws from numpy's global RNG exactly like
facebookresearch/DiT (so ``np.random.seed`` reproduces the reference's timesteps). A trainer that
needs bit-exact resume passes a ``torch.Generator`` instead; one 63-bit seed is then drawn from
that generator per call and fed to a fresh ``numpy.random.Generator``, so saving and restoring the
torch generator's state is all that resuming needs. The two paths draw from the same distribution
and return the same importance weights, but not the same indices.

The shaped densities change which noise levels training sees on purpose (Esser et al. 2024; FasterDiT,
Yao et al. 2024), so their weights are all one. They draw from torch: the caller's generator, or
torch's global RNG without one.
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
    "LogitNormalSampler",
    "LogNormalSNRSampler",
    "create_named_schedule_sampler",
]


def create_named_schedule_sampler(name, diffusion, mean=0.0, std=1.0):
    """Build a timestep sampler by name: "uniform", "loss-second-moment", "logit-normal" or "lognormal"
    (`mean` and `std` shape the last two)."""
    if name == "uniform":
        return UniformSampler(diffusion)
    if name == "loss-second-moment":
        return LossSecondMomentResampler(diffusion)
    if name == "logit-normal":
        return LogitNormalSampler(diffusion, mean, std)
    if name == "lognormal":
        return LogNormalSNRSampler(diffusion, mean, std)
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


class _NormalShapedSampler(ScheduleSampler):
    """Step i is drawn when z = mean + std * N(0, 1) falls in (lower[i], upper[i]]; weights all one."""

    def __init__(self, diffusion, mean=0.0, std=1.0):
        if not std > 0:
            raise ValueError(f"the std of a normal-shaped timestep sampler must be positive, got {std!r}")
        self.diffusion, self.mean, self.std = diffusion, float(mean), float(std)
        self.upper = torch.as_tensor(self._upper_bounds(diffusion.num_timesteps), dtype=torch.float64)

    def _upper_bounds(self, num_steps):
        """(num_steps - 1,) increasing z bounds: step i takes z up to bound i, the last step the rest."""
        raise NotImplementedError

    def weights(self):
        """The exact probability of each step under this density (what ``sample`` draws from)."""
        edges = torch.cat([torch.tensor([-np.inf], dtype=torch.float64), self.upper,
                           torch.tensor([np.inf], dtype=torch.float64)])
        cdf = torch.special.ndtr((edges - self.mean) / self.std)
        return (cdf[1:] - cdf[:-1]).numpy()

    def sample(self, batch_size, device, generator=None):
        """``batch_size`` steps from this density and all-one weights, from ``generator`` (torch's RNG if None)."""
        n = torch.randn((batch_size,), generator=generator, device=device)
        z = self.mean + self.std * n.double()
        t = torch.searchsorted(self.upper.to(z.device), z)
        return t.long(), torch.ones(batch_size, dtype=torch.float32, device=device)


class LogitNormalSampler(_NormalShapedSampler):
    """SD3's logit-normal on the step axis: step floor(T * sigmoid(z)), so mean > 0 favours noisier steps."""

    def _upper_bounds(self, num_steps):
        """logit(i / T) for i = 1 .. T-1: sigmoid(z) below i / T lands in a step under i."""
        u = np.arange(1, num_steps, dtype=np.float64) / num_steps
        return np.log(u) - np.log1p(-u)


class LogNormalSNRSampler(_NormalShapedSampler):
    """FasterDiT's lognorm(m, s) by noise level: the step whose log SNR is nearest -2z, the log SNR
    ((1 - u) / u)^2 of a rectified flow at u = sigmoid(z); mean > 0 favours noisier steps."""

    def _upper_bounds(self, num_steps):
        """The z at the midpoints between neighbouring steps' log SNR (which falls with the step)."""
        acp = np.asarray(self.diffusion.alphas_cumprod, dtype=np.float64)
        log_snr = np.log(acp) - np.log1p(-acp)
        return -(log_snr[:-1] + log_snr[1:]) / 4
