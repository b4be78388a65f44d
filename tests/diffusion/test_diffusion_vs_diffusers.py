"""Cross-check against diffusers' DDPMScheduler / DDIMScheduler built on the same betas.

Conventions matched (diffusers <-> ours):
- ``trained_betas=`` gets the same float64 schedule; diffusers keeps it in float32, so agreement is
  to float32 round-off of the cumulative product (~1e-5 relative at worst), not bitwise.
- DDPM ``variance_type``: "fixed_small" is our sigma_small=True (posterior variance),
  "fixed_large" our default fixed variance (beta_t; only t=0 differs, where neither adds noise),
  "learned_range" our learn_sigma=True (same [-1, 1] interpolation of log-variances for t >= 1).
- ``clip_sample`` is our ``clip_denoised`` (both clamp the x_0 prediction to [-1, 1]).
- DDPM step noise: diffusers draws ``randn(shape, generator=g)``; we draw ``randn_like(x)`` from
  the global generator, so seeding both with the same value gives the same noise.
- DDIM: our "ddim25" respacing keeps timesteps {0, 40, ..., 960}, which is diffusers'
  ``timestep_spacing="leading"`` with ``steps_offset=0``. Our last step goes to alpha_bar = 1
  (x_0 itself), which is diffusers' ``set_alpha_to_one=True``; ``set_alpha_to_one=False`` would
  use alphas_cumprod[0] for that one step instead. We always re-derive eps from the clipped x_0,
  which is diffusers' ``use_clipped_model_output=True`` (identical when clipping is off).
"""

import pytest
import torch

from dit_trainer.diffusion import create_diffusion, get_named_beta_schedule

diffusers = pytest.importorskip("diffusers")

C = 3


def assert_rel_close(got, ref, tol):
    """Max-abs difference relative to the reference's largest magnitude, as the parity spec uses."""
    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    assert err < tol, f"relative max difference {err:.3e} >= {tol:.1e}"


def _ddpm(schedule, variance_type, clip):
    return diffusers.DDPMScheduler(
        num_train_timesteps=1000,
        trained_betas=get_named_beta_schedule(schedule, 1000),
        variance_type=variance_type,
        clip_sample=clip,
        prediction_type="epsilon",
    )


def _ddim(schedule, clip, steps):
    sched = diffusers.DDIMScheduler(
        num_train_timesteps=1000,
        trained_betas=get_named_beta_schedule(schedule, 1000),
        clip_sample=clip,
        set_alpha_to_one=True,
        steps_offset=0,
        timestep_spacing="leading",
        prediction_type="epsilon",
    )
    sched.set_timesteps(steps)
    return sched


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_forward_process_matches_add_noise(schedule, x_start):
    diffusion = create_diffusion("", noise_schedule=schedule)
    sched = _ddpm(schedule, "fixed_small", False)
    noise = torch.randn_like(x_start)
    t = torch.tensor([0, 7, 500, 999])
    assert_rel_close(diffusion.q_sample(x_start, t, noise=noise), sched.add_noise(x_start, noise, t), 1e-5)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
@pytest.mark.parametrize("variance_type", ["fixed_small", "fixed_large", "learned_range"])
@pytest.mark.parametrize("clip", [True, False])
def test_ddpm_posterior_step_matches_diffusers(schedule, variance_type, clip, toy_model, x_start):
    learn = variance_type == "learned_range"
    diffusion = create_diffusion(
        "", noise_schedule=schedule, learn_sigma=learn, sigma_small=variance_type == "fixed_small"
    )
    sched = _ddpm(schedule, variance_type, clip)
    model = toy_model(C, learn_sigma=learn)
    g = torch.Generator().manual_seed(0)
    for step in [0, 1, 10, 500, 999]:
        t = torch.full((x_start.shape[0],), step)
        x_t = diffusion.q_sample(x_start, t, noise=torch.randn(x_start.shape, generator=g))
        torch.manual_seed(100 + step)
        ours = diffusion.p_sample(model, x_t, t, clip_denoised=clip)
        with torch.no_grad():
            out = model(x_t, t)
        ref = sched.step(out, step, x_t, generator=torch.Generator().manual_seed(100 + step))
        assert_rel_close(ours["pred_xstart"], ref.pred_original_sample, 1e-4)
        assert_rel_close(ours["sample"], ref.prev_sample, 2e-4)
        if variance_type != "learned_range" and step > 0:
            # diffusers forms beta_t as 1 - ab_t / ab_{t-1} in float32; at t=1 that cancellation
            # alone costs ~5e-4 relative, hence the looser bound on the variance itself.
            pmv = diffusion.p_mean_variance(model, x_t, t, clip_denoised=clip)
            assert_rel_close(pmv["variance"][:, 0, 0, 0], sched._get_variance(step).expand(4).float(), 1e-3)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
@pytest.mark.parametrize("clip", [True, False])
def test_single_ddim_step_matches_diffusers(schedule, clip, toy_model, x_start):
    diffusion = create_diffusion("ddim25", noise_schedule=schedule, learn_sigma=False)
    sched = _ddim(schedule, clip, 25)
    model = toy_model(C, learn_sigma=False)
    for respaced_index, step in [(24, 960), (12, 480), (1, 40), (0, 0)]:
        t_orig = torch.full((4,), step)
        x_t = diffusion.q_sample(x_start, torch.full((4,), respaced_index))
        for eta in [0.0, 0.5]:
            torch.manual_seed(step)
            ours = diffusion.ddim_sample(model, x_t, torch.full((4,), respaced_index), clip_denoised=clip, eta=eta)
            torch.manual_seed(step)
            noise = torch.randn_like(x_t)
            with torch.no_grad():
                out = model(x_t, t_orig)
            ref = sched.step(out, step, x_t, eta=eta, use_clipped_model_output=True, variance_noise=noise)
            assert_rel_close(ours["sample"], ref.prev_sample, 1e-4)
    # The respaced model call saw the original timestep of every step above.
    assert {int(t[0]) for t in model.seen_t} == {960, 480, 40, 0}


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
@pytest.mark.parametrize("learn_sigma", [True, False])
def test_ddim_loop_matches_diffusers(schedule, learn_sigma, toy_model):
    diffusion = create_diffusion("ddim25", noise_schedule=schedule, learn_sigma=learn_sigma)
    sched = _ddim(schedule, True, 25)
    model = toy_model(C, learn_sigma=learn_sigma)
    noise = torch.randn(4, C, 8, 8, generator=torch.Generator().manual_seed(5))
    for eta in [0.0, 1.0]:
        torch.manual_seed(9)
        ours = diffusion.ddim_sample_loop(model, noise.shape, noise=noise, eta=eta)
        torch.manual_seed(9)
        x = noise
        for t in sched.timesteps:
            with torch.no_grad():
                out = model(x, t.repeat(4))[:, :C]  # DDIM ignores the variance half
            # Drawn every step, as ours does (the t=0 draw is masked out on our side).
            step_noise = torch.randn_like(x)
            step = sched.step(out, t, x, eta=eta, use_clipped_model_output=True, variance_noise=step_noise)
            x = step.prev_sample
        assert_rel_close(ours, x, 1e-4)
