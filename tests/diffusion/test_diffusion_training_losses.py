"""training_losses: loss composition, the stop-gradient on the VB term, and the loss-type variants."""

import pytest
import torch

from dit_trainer.diffusion import create_diffusion
from dit_trainer.diffusion.utils import mean_flat

C = 3


def _leaf_output(batch=4, channels=2 * C, seed=0):
    g = torch.Generator().manual_seed(seed)
    eps = torch.randn(batch, C, 8, 8, generator=g)
    var = torch.rand(batch, channels - C, 8, 8, generator=g) * 2 - 1
    return torch.cat([eps, var], dim=1).requires_grad_(True)


def test_vb_gradient_does_not_reach_the_mean(x_start):
    diffusion = create_diffusion("")
    out = _leaf_output()
    t = torch.tensor([0, 10, 500, 999])
    losses = diffusion.training_losses(lambda x, t: out, x_start, t)
    assert set(losses) == {"loss", "mse", "vb"}
    assert torch.equal(losses["loss"], losses["mse"] + losses["vb"])

    (g_vb,) = torch.autograd.grad(losses["vb"].sum(), out, retain_graph=True)
    assert torch.all(g_vb[:, :C] == 0), "the VB term must not train the mean (eps) half"
    assert g_vb[:, C:].abs().sum() > 0, "the VB term must train the variance half"

    (g_mse,) = torch.autograd.grad(losses["mse"].sum(), out, retain_graph=True)
    assert g_mse[:, :C].abs().sum() > 0 and torch.all(g_mse[:, C:] == 0)

    (g_loss,) = torch.autograd.grad(losses["loss"].sum(), out)
    torch.testing.assert_close(g_loss, g_vb + g_mse)


def test_mse_is_eps_regression(x_start, toy_model):
    diffusion = create_diffusion("")
    model = toy_model(C, learn_sigma=True)
    t = torch.tensor([1, 2, 3, 4])
    noise = torch.randn_like(x_start)
    losses = diffusion.training_losses(model, x_start, t, noise=noise)
    x_t = diffusion.q_sample(x_start, t, noise=noise)
    expected = ((model(x_t, t)[:, :C] - noise) ** 2).mean(dim=(1, 2, 3))
    torch.testing.assert_close(losses["mse"], expected)
    assert losses["loss"].shape == (4,)


def test_fixed_sigma_has_mse_only(x_start, toy_model):
    diffusion = create_diffusion("", learn_sigma=False)
    losses = diffusion.training_losses(toy_model(C, learn_sigma=False), x_start, torch.tensor([0, 1, 2, 3]))
    assert set(losses) == {"loss", "mse"} and torch.equal(losses["loss"], losses["mse"])


def test_predict_xstart_target(x_start):
    diffusion = create_diffusion("", predict_xstart=True, learn_sigma=False)
    zeros = torch.zeros_like(x_start)
    losses = diffusion.training_losses(lambda x, t: zeros, x_start, torch.tensor([5, 6, 7, 8]))
    torch.testing.assert_close(losses["mse"], mean_flat(x_start**2))


def test_rescaled_mse_scales_vb_by_steps_over_1000(x_start):
    out = _leaf_output()
    t = torch.tensor([0, 10, 100, 249])
    noise = torch.randn_like(x_start)
    plain = create_diffusion("250").training_losses(lambda x, t: out, x_start, t, noise=noise)
    rescaled = create_diffusion("250", rescale_learned_sigmas=True).training_losses(
        lambda x, t: out, x_start, t, noise=noise
    )
    torch.testing.assert_close(rescaled["vb"], plain["vb"] * 0.25)
    torch.testing.assert_close(rescaled["mse"], plain["mse"])


def test_kl_loss_is_scaled_bound(x_start):
    out = _leaf_output()
    t = torch.tensor([0, 10, 100, 249])
    noise = torch.randn_like(x_start)
    kl = create_diffusion("250", use_kl=True).training_losses(lambda x, t: out, x_start, t, noise=noise)
    assert set(kl) == {"loss"}
    # RESCALED_KL feeds the model's mean too (no detach) and multiplies by the number of steps.
    ref = create_diffusion("250")
    x_t = ref.q_sample(x_start, t, noise=noise)
    vb = ref._vb_terms_bpd(lambda x, t: out, x_start, x_t, t, clip_denoised=False)["output"]
    torch.testing.assert_close(kl["loss"], vb * 250)
    (g,) = torch.autograd.grad(kl["loss"].sum(), out)
    assert g[:, :C].abs().sum() > 0


def test_model_kwargs_and_default_noise_are_used(x_start, toy_model):
    diffusion = create_diffusion("")
    model = toy_model(C, learn_sigma=True)
    t = torch.tensor([3, 3, 3, 3])
    y = torch.tensor([0, 1, 2, 3])
    torch.manual_seed(0)
    a = diffusion.training_losses(model, x_start, t, model_kwargs={"y": y})
    torch.manual_seed(0)
    b = diffusion.training_losses(model, x_start, t, model_kwargs={"y": y})
    torch.manual_seed(0)
    c = diffusion.training_losses(model, x_start, t)
    assert torch.equal(a["loss"], b["loss"]) and not torch.equal(a["mse"], c["mse"])


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_losses_are_finite_over_all_timesteps(schedule, toy_model):
    diffusion = create_diffusion("", noise_schedule=schedule)
    x = torch.rand(1000, 1, 2, 2) * 2 - 1
    losses = diffusion.training_losses(toy_model(1, learn_sigma=True), x, torch.arange(1000))
    assert all(torch.isfinite(v).all() for v in losses.values())
