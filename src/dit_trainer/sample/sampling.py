"""Conditional sampling from any objective, with classifier-free guidance.

Sampling follows facebookresearch/DiT's sample.py: EMA weights, classifier-free guidance on a
doubled batch (labels then null labels; captions then the null caption or a negative prompt) through
`model.forward_with_cfg`; the loop itself is the objective's (DDPM/DDIM for diffusion, ODE/SDE for
transport). `sample_conditioned` takes any condition's rows; `sample_latents` class labels, and
`sample.prompts.sample_prompts` prompts. The training-time grid is drawn
from here too, with what the trainer passes (EMA model, objective, classes), never the trainer.
"""

import copy

import torch

from dit_trainer.class_names import dataset_class_names, resolve_labels
from dit_trainer.errors import ConfigError
from dit_trainer.rng import seeded_global_rng
from dit_trainer.sample.decode import load_decoder, to_images
from dit_trainer.sample.images import save_grid

# The classes facebookresearch/DiT's sample.py draws by default.
IMAGENET_DEMO_LABELS = [207, 360, 387, 974, 88, 979, 417, 279]


def has_null_class(model) -> bool:
    """Whether the model learned the null label that classifier-free guidance needs."""
    table = getattr(getattr(model, "y_embedder", None), "embedding_table", None)
    return table is None or table.num_embeddings > model.num_classes


def as_objective(objective_or_cfg, model):
    """The objective to sample with: an `Objective` as is, or built from a config.

    A `Config`, a `DiffusionConfig` or None (the defaults) is accepted; the model's own
    `learn_sigma` decides whether a learned sigma is there to read.
    """
    from dit_trainer.config import Config, DiffusionConfig, build_config
    from dit_trainer.objective import Objective, build_objective

    if isinstance(objective_or_cfg, Objective):
        return objective_or_cfg
    if objective_or_cfg is None or isinstance(objective_or_cfg, DiffusionConfig):
        cfg = Config(objective="diffusion", diffusion=objective_or_cfg or DiffusionConfig())
    else:
        cfg = copy.deepcopy(build_config(objective_or_cfg))
    cfg.model.learn_sigma = bool(getattr(model, "learn_sigma", cfg.model.learn_sigma))
    return build_objective(cfg)


def guided_model_fn(model, y, guidance, objective=None, counter=None):
    """(model_fn, model_kwargs, doubled): the model guided as `guidance` (a `sample.guidance.Guidance`) says,
    for class labels `y`.

    With classifier-free guidance the batch holds the labels then as many null labels; `doubled` says so.
    A guidance interval needs `objective` (its noise levels); `counter` (a dict) counts network evaluations."""
    from dit_trainer.condition.label import ClassCondition
    from dit_trainer.sample.guidance import guided_model_fn as guided

    y = torch.as_tensor(y)
    if guidance.doubled and not has_null_class(model):
        raise ConfigError("this model was trained without label dropout, so it has no null class; use --cfg-scale 1 "
                          "(autoguidance, --guide, needs none)")
    fn = guided(model, guidance, objective, counter)
    if not guidance.doubled:
        return fn, {"y": y}, False
    condition = ClassCondition(model.num_classes)
    return fn, condition.guidance_kwargs({"y": y}, condition.unconditional(len(y), y.device)), True


def _refuse_labels_for_text(model) -> None:
    keys = tuple(getattr(model, "condition_keys", ("y",)))
    if keys != ("y",):  # a caption-conditioned family: its rows come from prompts, not class labels
        raise ConfigError(f"this model is text-conditioned (it takes {', '.join(keys)}), not class-conditional; "
                          "sample it from prompts (--prompt or --prompts, sample_prompts) instead of class labels")


@torch.no_grad()
def sample_latents(model, objective_or_cfg, labels, cfg_scale=4.0, sampler=None, steps=50, seed=0,
                   device="cpu", cfg_channels=None, progress=False, compile=False, guide=None, guide_scale=1.0,
                   guidance_interval=None, counter=None, **options):
    """Samples in the model's space (latents, or pixels) for class `labels`: float N×C×H×W.

    `objective_or_cfg` is an `Objective` or a config to build one from; `sampler` defaults to the
    objective's (DDIM for diffusion). Guidance (`sample.guidance`): `cfg_scale` classifier-free,
    `guide` (a model of the same latent shape, classes and objective) with `guide_scale` autoguidance,
    `guidance_interval=(sigma_lo, sigma_hi)` the noise levels to guide in; `counter` (a dict) gets the
    network evaluations per sample ("nfe"). `options` go to the objective's sampler (`clip_denoised`
    for diffusion, solver settings for transport). `compile` compiles the model's forward in place
    first (once per model; see `dit_trainer.sample.compile`). A text-conditioned model samples from
    prompts instead (`sample.prompts.sample_prompts`).
    """
    from dit_trainer.condition.label import ClassCondition

    _refuse_labels_for_text(model)
    y = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    if len(y) == 0:
        raise ConfigError("no class labels to sample; pass --class-labels or --class-names")
    if int(y.min()) < 0 or int(y.max()) >= model.num_classes:
        raise ConfigError(f"class labels must lie in 0..{model.num_classes - 1}, got {y.tolist()}")
    condition = ClassCondition(model.num_classes)
    device = torch.device(device)
    return sample_conditioned(model, objective_or_cfg, condition, {"y": y.to(device)}, cfg_scale=cfg_scale,
                              sampler=sampler, steps=steps, seed=seed, device=device, cfg_channels=cfg_channels,
                              progress=progress, compile=compile, guide=guide, guide_scale=guide_scale,
                              guidance_interval=guidance_interval, counter=counter, **options)


@torch.no_grad()
def sample_conditioned(model, objective_or_cfg, condition, cond, uncond=None, cfg_scale=4.0, sampler=None, steps=50,
                       seed=0, device="cpu", cfg_channels=None, progress=False, compile=False, guide=None,
                       guide_scale=1.0, guidance_interval=None, counter=None, **options):
    """Samples for the rows of `cond`, the model's condition keywords on `device` (each (n, ...): class labels
    `y`, or a caption's `text_embeds`, `text_mask`, ...), as `condition` (a `dit_trainer.condition.Condition`)
    makes them: float n×C×H×W in the model's space.

    Classifier-free guidance mixes in the unconditional rows `uncond` (default: `condition.unconditional(n)`,
    the null label or the null caption; a negative prompt's rows in its place), batched as
    `condition.guidance_kwargs` doubles them; autoguidance's `guide` gets the conditional rows. The
    starting noise is the CPU generator of `seed`'s first draw, whatever the condition; the other
    arguments are `sample_latents`'."""
    from dit_trainer.config.checks import guidance_interval as checked_interval
    from dit_trainer.sample.guidance import Guidance, guided_model_fn as guided

    device = torch.device(device)
    objective = as_objective(objective_or_cfg, model)
    n = len(next(iter(cond.values())))
    if not objective.guided_sampling:
        if guide is not None and float(guide_scale) != 1:
            raise ConfigError(f"objective {objective.name} samples unguided: its guidance is trained in "
                              "(meanflow.omega, meanflow.kappa); sample with no guide")
        # The scale is the network's input where it takes one (improved MeanFlow's), else it must be 1.
        cond, cfg_scale = {**cond, **objective.scale_inputs(cfg_scale, n, device)}, 1.0
    if compile:
        from dit_trainer.sample.compile import compile_model

        compile_model(model)
        if isinstance(guide, torch.nn.Module):
            compile_model(guide)
    channels, size = model.in_channels, model.input_size
    generator = torch.Generator().manual_seed(int(seed))  # CPU: the same images on every device
    z = torch.randn((n, channels, size, size), generator=generator).to(device)
    step_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    guidance = Guidance(float(cfg_scale), guide, float(guide_scale),
                        checked_interval(guidance_interval, "guidance_interval"), cfg_channels)
    if guidance.doubled and not has_null_class(model):
        raise ConfigError("this model was trained without label dropout, so it has no null class; use --cfg-scale 1 "
                          "(autoguidance, --guide, needs none)")
    fn = guided(model, guidance, objective, counter)
    kwargs = cond
    if guidance.doubled:
        kwargs = condition.guidance_kwargs(cond, condition.unconditional(n, device) if uncond is None else uncond)
        z = torch.cat([z, z])
    was_training = model.training
    model.eval()  # in train mode the label embedder would drop labels at random
    guide_was_training = bool(getattr(guide, "training", False))
    if guide_was_training:
        guide.eval()
    try:
        # The diffusion loops draw their per-step noise from the global RNG: a seeded fork gives them
        # a stream of their own and hands the caller's (the trainer's resumable RNG state) back untouched.
        with seeded_global_rng(step_seed, device):
            out = objective.sample(fn, z, sampler=sampler, steps=steps, model_kwargs=kwargs, progress=progress, **options)
    finally:
        model.train(was_training)
        if guide_was_training:
            guide.train()
    return out[:n].float()


def default_classes(num_classes: int, count: int = 10) -> list:
    """Up to `count` class ids spread evenly over 0..num_classes-1."""
    k = max(1, min(count, num_classes))
    return sorted({round(i * (num_classes - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


def sample_grid(model, objective, cfg, path, device="cpu", classes=None, per_class=None, steps=None, cfg_scale=None):
    """A grid from `model` (the EMA weights during training), one row per class, written to `path`.

    The same seed every time shows the model's progress on fixed noise; sampling uses its own
    generator and a forked global RNG, so a training run's randomness is untouched.
    """
    log = cfg.logging
    if classes is None:
        classes = log.sample_classes or default_classes(model.num_classes)
    classes = resolve_labels(classes, dataset_class_names(cfg, model.num_classes), model.num_classes)
    per_class = int(per_class or log.samples_per_class)
    scale = log.sample_cfg_scale if cfg_scale is None else cfg_scale
    if cfg_scale is None and not getattr(objective, "guided_sampling", True):
        scale = objective.trained_scale  # guidance trained in (MeanFlow): the grid's default scale does not apply
    if not has_null_class(model):
        scale = 1.0  # guidance needs the null class that label dropout trains
    samples = sample_latents(model, objective, [c for c in classes for _ in range(per_class)], cfg_scale=scale,
                             steps=int(steps or log.sample_steps), seed=cfg.train.seed, device=device)
    images = to_images(samples, *load_decoder(cfg, device=device), strict=False)
    return save_grid(images, path, nrow=per_class)
