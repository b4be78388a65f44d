"""Validation as text-to-image training does it, for any objective and condition: held-out samples read
once, the loss at fixed noise levels on them, and the rows the validation grid and FID over prompts draw.

- Held-out data: `data.val_path` (data of its own, in any layout `data.path` takes), or `data.val_split`
  samples of the training data that training never reads (`data.holdout`; a text-conditioned model holds
  out 64 by default, a class-conditional one none, so its logs stay as they were). Read once, at the
  start, as training reads them at epoch 0 (flips and posterior noise of that epoch), and kept on the CPU.
- The loss at fixed noise levels (Esser et al. 2024, SD3, section 5.3.2: 8 equally spaced t, as torchtitan's
  Flux validator): each held-out sample with one fixed noise at each of the 8 levels the objective names
  (`Objective.validation_times`: noise fractions 0, 1/8, ..., 7/8), the network's plain output scored by
  `Objective.validation_loss` with unit weights. Nothing is random, so the number moves with the weights
  alone: comparable across steps, resumes and layouts. Logged as `val_loss` (the mean over the levels)
  and `val_loss_t0` .. `val_loss_t7` (the data's end to the noisiest), every `eval.val_every` steps.
- The grid's rows: the prompts of `logging.validation_prompts` (a text file) encoded once, else the first held-out
  captions (a condition with `grid_from_rows`); class-conditional grids stay the class labels'.
"""

import dataclasses
from typing import Optional

import torch

from dit_trainer.errors import ConfigError, DataError

VAL_LEVELS = 8
NOISE_SEED = 0x5EED
GRID_ROWS = 8  # held-out captions the grid draws when no prompts are given
READ_BATCH = 64


@dataclasses.dataclass
class HeldOut:
    """Held-out samples as the model sees them: `x` (V, C, H, W) float32 latents (normalised as training
    normalises them), `cond` {key: (V, ...)} the condition's keyword arguments, on the CPU; `captions`
    the caption texts where the data keeps them (CLIP score), `source` what they are, for messages."""

    x: torch.Tensor
    cond: dict
    source: str
    captions: Optional[list] = None

    def __len__(self) -> int:
        return len(self.x)

    def take(self, index) -> tuple:
        """(x, cond) of rows `index`."""
        index = torch.as_tensor(index, dtype=torch.long)
        return self.x[index], {k: v[index] for k, v in self.cond.items()}


def read_rows(dataset, indices, stage, condition, latent_stats, device, source: str) -> HeldOut:
    """Items `indices` of `dataset` as training reads them at epoch 0 (through the loader's `stage`, an image
    folder's cache encoder, where it has one): every rank calls it (the stage's encoders may be collectives)."""
    from torch.utils.data import default_collate

    from dit_trainer.vae.latent_stats import normalize

    epoch = getattr(dataset, "epoch", None)
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(0)
    xs, conds = [], []
    try:
        for start in range(0, len(indices), READ_BATCH):
            idx = [int(i) for i in indices[start:start + READ_BATCH]]
            raw = dataset.__getitems__(idx) if hasattr(dataset, "__getitems__") else [dataset[i] for i in idx]
            batch = stage(raw) if stage is not None else default_collate(raw)
            x = batch["x"] if isinstance(batch, dict) else batch[0]
            xs.append(normalize(x.to(device, dtype=torch.float32), latent_stats).cpu())
            conds.append(condition.inputs(batch, "cpu"))
    finally:
        if epoch is not None:
            dataset.set_epoch(epoch)
    cond = {k: torch.cat([c[k] for c in conds]) for k in conds[0]}
    captions = getattr(dataset, "captions", None)
    return HeldOut(torch.cat(xs), cond, source, [captions[int(i)] for i in indices] if captions else None)


def _val_dataset(trainer):
    """The dataset `data.val_path` names, checked against the training data's shape and text encoder."""
    from dit_trainer.data.loader import build_dataset

    cfg = trainer.cfg
    data = dataclasses.replace(cfg.data, path=cfg.data.val_path)
    dataset = build_dataset(dataclasses.replace(cfg, data=data))
    shape = getattr(dataset, "latent_shape", None)
    if shape is not None and tuple(shape) != tuple(trainer.sample_shape):
        raise DataError(f"data.val_path {cfg.data.val_path} holds {'x'.join(map(str, shape))} latents but the model "
                        f"takes {'x'.join(map(str, trainer.sample_shape))}; validate on data of the training data's shape")
    mine, theirs = getattr(dataset, "text_encoder", None), getattr(trainer.dataset, "text_encoder", None)
    if mine != theirs:
        raise DataError(f"data.val_path {cfg.data.val_path} holds captions encoded by {mine} but training reads "
                        f"{theirs}'s; encode both with one text encoder")
    return dataset


def held_out_for(trainer) -> Optional[HeldOut]:
    """The run's held-out samples (every rank reads them), or None when it holds none out."""
    from dit_trainer.data.online.encoder import encoder_for

    cfg = trainer.cfg
    if cfg.data.val_path:
        dataset = _val_dataset(trainer)
        stage = encoder_for(dataset, trainer.device, trainer.dims, progress=False)
        held = read_rows(dataset, range(len(dataset)), stage, trainer.condition, trainer.latent_stats, trainer.device,
                         f"data.val_path {cfg.data.val_path}")
        if stage is not None:
            stage.flush()  # what it encoded stays in that data's cache for the next run
        return held
    index = getattr(trainer, "held_out_index", None)
    if index is None or not len(index):
        return None
    stage = getattr(trainer.loader, "stage", None)
    return read_rows(trainer.dataset, index, stage, trainer.condition, trainer.latent_stats, trainer.device,
                     f"{len(index)} samples held out of data.path (data.val_split)")


class ValidationLoss:
    """The loss at `VAL_LEVELS` fixed noise levels over the held-out samples: `due(step)`, `measure(model)`."""

    def __init__(self, held: HeldOut, objective, dims, device, forward_context, batch_size: int, every: int):
        self.objective, self.dims, self.device, self.forward_context = objective, dims, device, forward_context
        self.every, self.batch_size, self.count = int(every), max(1, int(batch_size)), len(held)
        try:
            self.times = objective.validation_times(VAL_LEVELS)
        except NotImplementedError as err:
            raise ConfigError(f"eval.val_every: {err}; set eval.val_every 0") from None
        # Every rank takes an equal share (the last padded with weight-0 rows), so each runs the same forwards.
        share = -(-self.count // dims.dp_size)
        index = torch.arange(dims.dp_rank * share, (dims.dp_rank + 1) * share)
        self.weight = (index < self.count).double()
        index = index.clamp(max=self.count - 1)
        # One noise per held-out sample, drawn for all of them in row order: the same on every layout.
        noise = torch.randn(held.x.shape, generator=torch.Generator().manual_seed(NOISE_SEED))
        self.x, self.cond = held.take(index)
        self.noise = noise[index]

    def due(self, step: int) -> bool:
        """Whether `step` is a validation step."""
        return bool(self.every) and step % self.every == 0

    @torch.no_grad()
    def measure(self, model) -> dict:
        """{"val_loss", "val_loss_t0", ...}: the held-out mean loss per level and over them; every rank calls it."""
        from dit_trainer.repa.objective import as_float

        objective, device = self.objective, self.device
        sums = torch.zeros(len(self.times), dtype=torch.float64)
        was_training = model.training
        model.eval()  # no label dropout; the condition's rows as they are
        try:
            for start in range(0, len(self.x), self.batch_size):
                sl = slice(start, start + self.batch_size)
                x, noise = self.x[sl].to(device), self.noise[sl].to(device)
                cond = {k: v[sl].to(device) for k, v in self.cond.items()}
                for j, t in enumerate(self.times):
                    draws = objective.draws_at(t.repeat(len(x)), noise)
                    x_t, t_model = objective.model_input(x, draws)
                    with self.forward_context():
                        out = model(x_t, t_model, **cond)
                    losses = objective.validation_loss(as_float(out), x, draws)
                    sums[j] += (losses.double().cpu() * self.weight[sl]).sum()
        finally:
            model.train(was_training)
        # Summed in rank order in float64: the same total for every layout up to the forwards' round-off.
        gathered = self.dims.all_gather_dp(sums.to(device)).cpu().view(-1, len(self.times)).sum(0)
        per_level = gathered / self.count
        return {"val_loss": float(per_level.mean()), **{f"val_loss_t{j}": float(v) for j, v in enumerate(per_level)}}


def grid_rows(cfg, condition, held: Optional[HeldOut], device, main: bool):
    """The grid's rows (the model's keyword arguments) on rank 0: `logging.validation_prompts` encoded by the
    text encoder, else the first held-out rows; None for a class-conditional grid (its labels) and elsewhere."""
    prompts = cfg.logging.validation_prompts
    if prompts and not hasattr(condition, "from_prompts"):
        raise ConfigError(f"logging.validation_prompts is for text-conditioned models, and {cfg.model.name} takes "
                          f"{condition.name} labels; list classes in logging.sample_classes instead")
    if not condition.grid_from_rows:
        return None
    if not prompts and held is None and cfg.logging.image_steps:
        raise ConfigError(f"logging.image_steps {cfg.logging.image_steps}: the grid of a text-conditioned model draws "
                          "logging.validation_prompts or held-out captions, and the run has neither; list prompts "
                          "or hold captions out (data.val_split, data.val_path)")
    if not main:
        return None
    if not prompts:
        return held.take(range(min(GRID_ROWS, len(held))))[1] if held is not None else None
    if not cfg.logging.image_steps:
        return None  # loading the text encoder for a grid nobody draws
    import types

    from dit_trainer.sample.prompt_text import read_prompts
    from dit_trainer.sample.prompts import micro_conditions, run_text_encoder

    prompts = read_prompts(prompts, "logging.validation_prompts")
    # Encoded once, by an encoder of its own on this rank (the training data's may be sharded or absent).
    encoder = run_text_encoder(cfg, device=device)
    shape = types.SimpleNamespace(condition_keys=condition.keys, input_size=cfg.model.input_size)
    rows = condition.from_prompts(encoder, prompts, "cpu", **micro_conditions(shape, len(prompts), cfg.data.image_size))
    del encoder
    return rows


class Validation:
    """What a run validates with: its held-out samples, their loss (None when off), the grid's rows (rank 0),
    and the prompt set FID samples (the held-out rows where the condition grids from rows)."""

    def __init__(self, held=None, loss=None, rows=None, prompt_set=None):
        self.held, self.loss, self.rows, self.prompt_set = held, loss, rows, prompt_set

    @classmethod
    def for_run(cls, trainer) -> "Validation":
        """Read the held-out samples (every rank), and check what `eval.val_every`, the grid and FID ask of them."""
        cfg, dims = trainer.cfg, trainer.dims
        held = held_out_for(trainer)
        every = cfg.eval.val_every
        if every is None:  # auto: at every checkpoint, where there is held-out data
            every = cfg.checkpoint.save_steps if held is not None else 0
        if every and held is None:
            raise ConfigError(f"eval.val_every {every}: the validation loss needs held-out data, and the run holds none; "
                              "set data.val_split (samples of data.path training leaves out) or data.val_path")
        if every and dims.pp_enabled:
            raise ConfigError(f"eval.val_every {every}: the validation loss runs the whole model, which pipeline "
                              "parallelism splits; set eval.val_every 0 or parallel.pp 1")
        loss = None
        if every:
            batch = cfg.train.global_batch_size // dims.dp_size
            try:
                loss = ValidationLoss(held, trainer.objective, dims, trainer.device,
                                      trainer.forward_backward.forward_context, batch, every)
            except ConfigError:
                if cfg.eval.val_every is not None:
                    raise
                every = 0  # the default cadence of an objective without fixed levels: no validation loss
        rows = grid_rows(cfg, trainer.condition, held, trainer.device, dims.is_main)
        if held is not None and dims.is_main:
            print(f"validation: {held.source}"
                  + (f"; loss at {VAL_LEVELS} fixed noise levels every {every} steps" if every else ""), flush=True)
        return cls(held, loss, rows, held if trainer.condition.grid_from_rows else None)

    def due(self, step: int) -> bool:
        """Whether the validation loss is measured at `step`."""
        return self.loss is not None and self.loss.due(step)

    def measure(self, model) -> dict:
        """The validation loss of `model` (every rank calls it)."""
        return self.loss.measure(model)


def draw_grid(trainer, model, path, **kwargs):
    """The trainer's sample grid from `model` (rank 0's EMA model): its validation rows where it has them,
    else the class grid of `logging.sample_classes`."""
    validation = getattr(trainer, "validation", None)
    rows = validation.rows if validation is not None else None
    if rows is None and trainer.condition.grid_from_rows:
        raise ConfigError(f"{trainer.cfg.model.name} is text-conditioned: its grid draws logging.validation_prompts "
                          "(with logging.image_steps) or held-out captions, which train() reads when it starts, and "
                          "there are none")
    if rows is None:
        from dit_trainer.sample import sample_grid

        return sample_grid(model, trainer.objective, trainer.cfg, path, device=trainer.device, **kwargs)
    from dit_trainer.sample.rows import rows_grid

    return rows_grid(model, trainer.objective, trainer.condition, rows, trainer.cfg, path, device=trainer.device,
                     per_row=kwargs.get("per_class"), steps=kwargs.get("steps"), cfg_scale=kwargs.get("cfg_scale"))
