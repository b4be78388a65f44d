"""Min-SNR-γ weighting of the diffusion loss: the formula, what it leaves alone, and a run that learns."""

import numpy as np
import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.objective import build_objective


def _objective(learn_sigma=True, **diffusion):
    return build_objective(build_config({"diffusion": diffusion, "model": {"learn_sigma": learn_sigma}}))


def _model(x_t, t, learn_sigma):
    # A fixed function of (x_t, t) with the learned-sigma layout (mean, variance in [-1, 1]).
    mean = x_t * 0.3 + t.float()[:, None, None, None] / 1000
    return torch.cat([mean, torch.tanh(x_t)], dim=1) if learn_sigma else mean


@pytest.mark.parametrize("predict_xstart", [False, True])
@pytest.mark.parametrize("learn_sigma", [True, False])
@pytest.mark.parametrize("gamma", [5.0, 1.0])
def test_min_snr_weighs_only_the_mse_term(predict_xstart, learn_sigma, gamma):
    common = {"predict_xstart": predict_xstart, "timestep_sampler": "uniform"}
    plain = _objective(learn_sigma, **common)
    weighted = _objective(learn_sigma, loss_weighting="min-snr", min_snr_gamma=gamma, **common)
    x = torch.randn(8, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    draws = weighted.draw(8, x.shape[1:], torch.Generator().manual_seed(1), "cpu")
    draws["t"] = torch.tensor([0, 5, 50, 150, 300, 500, 800, 999])  # both sides of SNR = gamma
    x_t, t = weighted.model_input(x, draws)
    output = _model(x_t, t, learn_sigma)
    terms = plain.diffusion.training_losses(lambda *a, **k: output, x, draws["t"], noise=draws["noise"])
    # The weight computed here from the schedule, not from the package's table.
    acp = torch.as_tensor(np.cumprod(1 - np.linspace(1e-4, 0.02, 1000)), dtype=torch.float64)[draws["t"]]
    snr = acp / (1 - acp)
    w = torch.clamp(snr, max=gamma) if predict_xstart else torch.clamp(snr, max=gamma) / snr
    want = w.float() * terms["mse"] + (terms["vb"] if learn_sigma else 0)
    torch.testing.assert_close(weighted.loss(output, x, draws), want, rtol=1e-6, atol=0)
    assert torch.equal(plain.loss(output, x, draws), terms["loss"])  # off: the release's loss, bit for bit
    high, low = snr > gamma, snr < gamma
    if predict_xstart:  # the clean-data loss is capped where SNR passes gamma, kept (times SNR) below
        assert torch.allclose(w[high], torch.full_like(w[high], gamma)) and torch.equal(w[low], snr[low])
    else:  # the noise loss is scaled down where SNR passes gamma, untouched below
        assert (w[high] < 1).all() and torch.equal(w[low], torch.ones_like(w[low]))


def test_min_snr_with_the_bound_loss_or_a_bad_gamma_is_one_line():
    with pytest.raises(ConfigError, match="use_kl") as err:
        _objective(use_kl=True, loss_weighting="min-snr")
    assert "\n" not in str(err.value)
    for key, value in (("min_snr_gamma", 0.0), ("loss_weighting", "snr")):
        with pytest.raises(ConfigError, match=f"diffusion.{key}"):
            _objective(**{"loss_weighting": "min-snr", key: value})


def test_a_tiny_run_learns_with_min_snr(tiny_train_losses):
    losses = tiny_train_losses(40, diffusion={"loss_weighting": "min-snr"})
    assert sum(losses[-8:]) / 8 < 0.8 * sum(losses[:8]) / 8, losses
