"""`AlignedObjective`: any objective with REPA's alignment term added to its per-sample loss.

The network's output is then (prediction, projected tokens); the encoder's targets ride in the
step's draws under `TARGET`, sliced with them into micro-batches. Everything else (draws, model
input, sampling, state) is the wrapped objective's, so REPA adds no randomness to a step.
"""

import torch

from dit_trainer.objective import Objective
from dit_trainer.repa.projector import alignment_loss

TARGET = "repa_target"  # the draws' key of the encoder's (B, N, D) patch tokens
# The trainer state's key of the unlogged losses: [alignment sum, micro-batches, denoising sum].
WINDOW = "repa_loss_window"


class AlignedObjective(Objective):
    """`base`'s loss + `coefficient` x REPA's per-image alignment loss; the rest is `base`'s."""

    wants_features = True  # the loop asks the model for its projected tokens too

    def __init__(self, base, coefficient: float):
        self.base, self.coefficient = base, float(coefficient)
        self.name, self.samplers, self.default_sampler = base.name, base.samplers, base.default_sampler
        self._denoising = None
        self._sums, self._count = None, 0  # float64 (alignment, denoising) sums of micro-batch means

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
        """The base objective's state and the two losses' window since the last read (their means over
        the ranks: a collective, as every rank saves)."""
        window = None
        if self._count:
            total = self._sums.detach().clone()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                # TP/PP peers hold their replica's value: the world's mean is the data-parallel mean.
                torch.distributed.all_reduce(total)
                total /= torch.distributed.get_world_size()
            align, denoising = total.tolist()
            window = [align, self._count, denoising]
        return {**self.base.state_dict(), WINDOW: window}

    def load_state_dict(self, state):
        """Restore the base objective's state and the losses' window (a window saved without its denoising
        sum restarts empty: its denoising mean is unknown)."""
        self.base.load_state_dict(state)
        window = state.get(WINDOW)
        self._sums, self._count = None, 0
        if window is not None and len(window) >= 3:
            self._sums = torch.tensor([window[0], window[2]], dtype=torch.float64)
            self._count = int(window[1])

    def validation_times(self, k: int):
        """The base objective's fixed levels."""
        return self.base.validation_times(k)

    def draws_at(self, t, noise):
        """The base objective's draws at `t` (REPA adds no randomness)."""
        return self.base.draws_at(t, noise)

    def validation_loss(self, output, x, draws):
        """The base objective's loss: a validation calls the network without the projector."""
        return self.base.validation_loss(output, x, draws)

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
        # Each term's own mean, so that the logged denoising loss is measured, not the total's remainder.
        means = torch.stack([align.detach().mean(), self._denoising.mean()]).double()
        self._sums = means if self._sums is None else self._sums.to(means.device) + means
        self._count += 1
        return denoising + self.coefficient * align

    def observe(self, draws, losses):
        """A loss-aware t sampler sees the denoising loss only (the alignment term does not depend on t alone)."""
        self.base.observe(draws, self._denoising if self._denoising is not None else losses)

    def read_alignment(self, dims) -> dict:
        """{"repa_loss", "denoising_loss"}: each term's mean over ranks and micro-batches since the last
        read (their total, weighted, is the logged loss, up to float32 rounding and skipped steps); resets."""
        if not self._count:
            return {}
        align, denoising = dims.all_reduce_mean(self._sums / self._count).tolist()
        self._sums, self._count = None, 0
        return {"repa_loss": align, "denoising_loss": denoising}


def aligned(objective, cfg):
    """`objective`, with REPA's term added when `cfg.repa.enabled`."""
    r = getattr(cfg, "repa", None)
    return AlignedObjective(objective, r.coefficient) if r is not None and r.enabled else objective


def as_float(output):
    """The network's output in float32: a tensor, or each part of (prediction, projected tokens)."""
    return output.float() if isinstance(output, torch.Tensor) else tuple(o.float() for o in output)
