"""The training-time grid of a model conditioned on rows of keyword arguments (prompts' or held-out
captions' encodings): `sample_conditioned` draws them, guided against the condition's unconditional
rows (the encoding of ""), as `dit sample --prompt` does."""

from dit_trainer.sample.decode import load_decoder, to_images
from dit_trainer.sample.images import save_grid


def rows_grid(model, objective, condition, cond: dict, cfg, path, device="cpu", per_row=None, steps=None,
              cfg_scale=None):
    """A grid from `model`, one row of `logging.samples_per_class` samples per row of `cond` (each (n, ...)),
    written to `path`; the same seed every time, as the class grid, and the run's RNGs untouched."""
    from dit_trainer.sample.sampling import sample_conditioned

    log = cfg.logging
    per_row = int(per_row or log.samples_per_class)
    repeated = {k: v.repeat_interleave(per_row, dim=0).to(device) for k, v in cond.items()}
    samples = sample_conditioned(model, objective, condition, repeated,
                                 cfg_scale=log.sample_cfg_scale if cfg_scale is None else cfg_scale,
                                 steps=int(steps or log.sample_steps), seed=cfg.train.seed, device=device)
    images = to_images(samples, *load_decoder(cfg, device=device), strict=False)
    return save_grid(images, path, nrow=per_row)
