"""`create_diffusion`: the (respaced) Gaussian diffusion DiT trains and samples with, built as
facebookresearch/DiT's `diffusion/__init__.py` builds it."""

from dit_trainer.diffusion.gaussian_diffusion import LossType, ModelMeanType, ModelVarType
from dit_trainer.diffusion.respace import SpacedDiffusion, space_timesteps
from dit_trainer.diffusion.schedules import get_named_beta_schedule


def create_diffusion(
    timestep_respacing="",
    noise_schedule="linear",
    use_kl=False,
    sigma_small=False,
    predict_xstart=False,
    learn_sigma=True,
    rescale_learned_sigmas=False,
    diffusion_steps=1000,
):
    """Build the (respaced) diffusion DiT trains and samples with; "" or None keeps every step.

    ``timestep_respacing`` takes "250", "ddim25" or section lists like "10,20,30" (see
    ``space_timesteps``). Even without respacing the result is a SpacedDiffusion whose betas are
    recomputed from alphas_cumprod, exactly as in the reference, so the float64 round-off matches.
    """
    betas = get_named_beta_schedule(noise_schedule, diffusion_steps)
    if use_kl:
        loss_type = LossType.RESCALED_KL
    elif rescale_learned_sigmas:
        loss_type = LossType.RESCALED_MSE
    else:
        loss_type = LossType.MSE
    if timestep_respacing is None or timestep_respacing == "":
        timestep_respacing = [diffusion_steps]
    if learn_sigma:
        var_type = ModelVarType.LEARNED_RANGE
    elif sigma_small:
        var_type = ModelVarType.FIXED_SMALL
    else:
        var_type = ModelVarType.FIXED_LARGE
    return SpacedDiffusion(
        use_timesteps=space_timesteps(diffusion_steps, timestep_respacing),
        betas=betas,
        model_mean_type=ModelMeanType.START_X if predict_xstart else ModelMeanType.EPSILON,
        model_var_type=var_type,
        loss_type=loss_type,
    )
