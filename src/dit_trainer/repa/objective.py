"""`AlignedObjective`: any objective with REPA's alignment term added to its per-sample loss.

The network's output is then (prediction, projected tokens); the encoder's targets ride in the
step's draws under `TARGET`, sliced with them into micro-batches. Everything else (draws, model
input, sampling, state) is the wrapped objective's, so REPA adds no randomness to a step.
"""

import torch

from dit_trainer.objective import Objective
from dit_trainer.repa.projector import alignment_loss

TARGET = "repa_target"  # the draws' key of the encoder's (B, N, D) patch tokens
WINDOW = "repa_loss_window"  # the trainer state's key of the unlogged alignment losses: [sum, micro-batches]


class AlignedObjective(Objective):
    """`base`'s loss + `coefficient` x REPA's per-image alignment loss; the rest is `base`'s."""

    wants_features = True  # the loop asks the model for its projected tokens too

    def __init__(self, base, coefficient: float):
        self.base, self.coefficient = base, float(coefficient)
        self.name, self.samplers, self.default_sampler = base.name, base.samplers, base.default_sampler
        self._denoising = None
        self._sum, self._count = None, 0

    def __getattr__(self, name):
        # Only what this class lacks: draws, model_input, sampling, state, ...
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def draw(self, n, sample_shape, generator, device):
        """The base objective's draws: REPA adds no randomness."""
        return self.base.draw(n, sample_shape, generator, device)

    def model_input(self, x, draws):
        """The base objective's (x_t, t)."""
        return self.base.model_input(x, draws)

    def state_dict(self):
        """The base objective's state and the alignment loss's window since the last read (its mean over
        the ranks: a collective, as every rank saves)."""
        window = None
        if self._count:
            total = self._sum.detach().clone()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                # TP/PP peers hold their replica's value: the world's mean is the data-parallel mean.
                torch.distributed.all_reduce(total)
                total /= torch.distributed.get_world_size()
            window = [float(total), self._count]
        return {**self.base.state_dict(), WINDOW: window}

    def load_state_dict(self, state):
        """Restore the base objective's state and the alignment loss's window."""
        self.base.load_state_dict(state)
        window = state.get(WINDOW)
        self._sum, self._count = None, 0
        if window is not None:
            self._sum, self._count = torch.tensor(window[0], dtype=torch.float64), int(window[1])

    def check_sampler(self, sampler):
        """The base objective's samplers."""
        return self.base.check_sampler(sampler)

    def sampler_option_names(self, sampler) -> tuple:
        """The base objective's sampler options."""
        return self.base.sampler_option_names(sampler)

    def noise_level(self, t):
        """The base objective's noise level."""
        return self.base.noise_level(t)

    def sample(self, model_fn, z, sampler=None, steps=None, model_kwargs=None, progress=False, **options):
        """Sampling is the base objective's (the sampled model has no projector)."""
        return self.base.sample(model_fn, z, sampler, steps, model_kwargs, progress, **options)

    def loss(self, output, x, draws):
        """(n,) per-sample loss: the base objective's on the prediction, plus the weighted alignment term."""
        prediction, projected = output
        denoising = self.base.loss(prediction, x, draws)
        align = alignment_loss(projected, draws[TARGET])
        self._denoising = denoising.detach()
        mean = align.detach().mean().double()
        self._sum = mean if self._sum is None else self._sum.to(mean.device) + mean
        self._count += 1
        return denoising + self.coefficient * align

    def observe(self, draws, losses):
        """A loss-aware t sampler sees the denoising loss only (the alignment term does not depend on t alone)."""
        self.base.observe(draws, self._denoising if self._denoising is not None else losses)

    def read_alignment(self, dims, loss=None) -> dict:
        """{"repa_loss": the mean alignment loss over ranks and micro-batches since the last read, and with
        `loss` (the logged total) "denoising_loss": the rest of it}; resets."""
        if not self._count:
            return {}
        mean = dims.all_reduce_mean(self._sum / self._count).item()
        self._sum, self._count = None, 0
        out = {"repa_loss": mean}
        if loss is not None:
            out["denoising_loss"] = loss - self.coefficient * mean
        return out


def aligned(objective, cfg):
    """`objective`, with REPA's term added when `cfg.repa.enabled`."""
    r = getattr(cfg, "repa", None)
    return AlignedObjective(objective, r.coefficient) if r is not None and r.enabled else objective


def as_float(output):
    """The network's output in float32: a tensor, or each part of (prediction, projected tokens)."""
    return output.float() if isinstance(output, torch.Tensor) else tuple(o.float() for o in output)
