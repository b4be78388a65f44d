"""Sampling from rows of a condition's keyword arguments (captions' encodings), with classifier-free
guidance through the condition value: the training-time prompt grid and FID over held-out captions.

One small function, `sample_rows`, so that these share `dit sample --prompt`'s arithmetic once they
point at its sampler: the conditional rows and the condition's null rows in one doubled batch
through `model.forward_with_cfg`, the loop the objective's, noise drawn from the seed on the CPU.
"""

import torch

from dit_trainer.rng import seeded_global_rng
from dit_trainer.sample.decode import load_decoder, to_images
from dit_trainer.sample.images import save_grid


def _rows(cond: dict) -> int:
    counts = {len(v) for v in cond.values()}
    if len(counts) != 1:
        raise ValueError(f"the condition's rows differ in length: {sorted(counts)}")
    return counts.pop()


@torch.no_grad()
def sample_rows(model, objective, condition, cond: dict, cfg_scale: float = 4.0, sampler=None, steps=50, seed: int = 0,
                device="cpu"):
    """Samples in the model's space, float N×C×H×W, for the N rows of `cond` (the model's keyword arguments,
    e.g. `condition.from_prompts(...)` or held-out captions' tensors); `cfg_scale` > 1 guides against the
    condition's unconditional rows (`condition.unconditional`: the encoding of "")."""
    device = torch.device(device)
    n = _rows(cond)
    kwargs = {k: v.to(device) for k, v in cond.items()}
    generator = torch.Generator().manual_seed(int(seed))  # CPU: the same images on every device
    z = torch.randn((n, model.in_channels, model.input_size, model.input_size), generator=generator).to(device)
    step_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    fn = model
    if float(cfg_scale) != 1.0:
        kwargs = condition.guidance_kwargs(kwargs, condition.unconditional(n, device))
        z = torch.cat([z, z])

        def fn(x, t, **kw):
            return model.forward_with_cfg(x, t, float(cfg_scale), **kw)

    was_training = model.training
    model.eval()
    try:
        # The diffusion loops draw per-step noise from the global RNG: a seeded fork leaves the caller's alone.
        with seeded_global_rng(step_seed, device):
            out = objective.sample(fn, z, sampler=sampler, steps=steps, model_kwargs=kwargs)
    finally:
        model.train(was_training)
    return out[:n].float()


def rows_grid(model, objective, condition, cond: dict, cfg, path, device="cpu", per_row=None, steps=None,
              cfg_scale=None):
    """A grid from `model`, one row of `logging.samples_per_class` samples per row of `cond`, written to
    `path` (the same seed every time, as the class grid)."""
    log = cfg.logging
    per_row = int(per_row or log.samples_per_class)
    repeated = {k: v.repeat_interleave(per_row, dim=0) for k, v in cond.items()}
    samples = sample_rows(model, objective, condition, repeated,
                          cfg_scale=log.sample_cfg_scale if cfg_scale is None else cfg_scale,
                          steps=int(steps or log.sample_steps), seed=cfg.train.seed, device=device)
    images = to_images(samples, *load_decoder(cfg, device=device), strict=False)
    return save_grid(images, path, nrow=per_row)
