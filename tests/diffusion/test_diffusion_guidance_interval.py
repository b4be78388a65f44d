"""The guidance interval of the diffusion objective: guide only a band of normalised times
s = 1 - t/(T-1) (0 noise, 1 data), as transport does in its own t; none by default."""

import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.models.dit import DiT
from dit_trainer.objective import build_objective

TINY = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=2, num_classes=5)


def _objective(**diffusion):
    return build_objective(build_config({"diffusion": {"num_timesteps": 1000, **diffusion},
                                             "model": {"learn_sigma": True}}))


class _Counting(DiT):
    """A tiny learned-sigma DiT that records the batch size of every forward pass."""

    def __init__(self):
        torch.manual_seed(0)
        super().__init__(**TINY, learn_sigma=True)
        for p in self.parameters():  # adaLN-zero leaves a fresh DiT's output at 0: give it some
            torch.nn.init.normal_(p, std=0.05)
        self.batches = []

    def forward(self, x, t, y, **kwargs):
        self.batches.append(len(x))
        return super().forward(x, t, y, **kwargs)


def _batch():
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    return torch.cat([x, x]), torch.tensor([1, 2, 5, 5])


def test_normalised_time_runs_from_noise_to_data():
    s = _objective().normalised_time(torch.tensor([999, 0, 333]))
    assert s.tolist() == pytest.approx([0.0, 1.0, 1 - 333 / 999])


def test_outside_the_interval_the_unconditional_pass_is_skipped():
    model, (x, y) = _Counting().eval(), _batch()
    fn = _objective().guided_model_fn(model, 4.0, interval=(0.2, 0.6))
    with torch.no_grad():
        outside = fn(x, torch.full((4,), 100), y)  # s = 0.9
        assert model.batches == [2]  # the conditional half only
        cond = model(x[:2], torch.full((2,), 100), y[:2])
    assert torch.equal(outside, torch.cat([cond, cond]))


def test_inside_the_interval_equals_full_guidance():
    model, (x, y) = _Counting().eval(), _batch()
    fn = _objective().guided_model_fn(model, 4.0, interval=(0.2, 0.6))
    t = torch.full((4,), 600)  # s = 0.4
    with torch.no_grad():
        inside = fn(x, t, y)
        full = model.forward_with_cfg(x, t, y, 4.0)
    assert torch.equal(inside, full) and not torch.equal(full[:2], full[:2, :4].repeat(1, 2, 1, 1))


def test_the_config_key_is_the_default_and_none_guides_every_step():
    assert _objective(guidance_interval=[0.1, 0.7]).guidance_interval() == (0.1, 0.7)
    assert _objective().guidance_interval() is None
    assert _objective().guidance_interval((0.3, 0.5)) == (0.3, 0.5)
    with pytest.raises(ConfigError, match=r"^diffusion.guidance_interval must be two numbers \[lo, hi\], got 0.5$"):
        _objective().guidance_interval(0.5, "diffusion.guidance_interval")
    # No interval: the release's forward_with_cfg, the same numbers every step.
    model, (x, y) = _Counting().eval(), _batch()
    t = torch.full((4,), 100)
    with torch.no_grad():
        assert torch.equal(_objective().guided_model_fn(model, 4.0)(x, t, y), model.forward_with_cfg(x, t, y, 4.0))


def test_a_diffusion_sample_guided_only_in_a_band_differs_from_full_guidance():
    from dit_trainer.sample.sampling import sample_latents

    model = _Counting().eval()
    objective = _objective()
    full = sample_latents(model, objective, [1, 2], steps=4, seed=3)
    calls_full = list(model.batches)
    model.batches.clear()
    banded = sample_latents(model, objective, [1, 2], steps=4, seed=3, guidance_interval=(0.5, 1.0))
    assert calls_full == [4] * 4 and sorted(model.batches) == [2, 2, 4, 4]
    assert torch.equal(sample_latents(model, objective, [1, 2], steps=4, seed=3, guidance_interval=(0, 1)), full)
    assert not torch.equal(banded, full)
