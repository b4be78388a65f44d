"""What a trainer keeps besides weights and optimizer moments, and the data it steps through.

`collect`/`restore` are the trainer state a checkpoint carries: the step, the generator that draws
every step's randomness for the global batch, the RNGs, the schedule, the loader's position, the
update guard's counters and the objective's own state. Restoring all of it is what makes a resume
replay the uninterrupted run exactly.
"""

import torch

from dit_trainer.errors import DataError


def collect(trainer) -> dict:
    """The trainer's resumable state (a collective where the loader's is: every rank calls it)."""
    state = {
        "step": trainer.step,
        "generator": trainer.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "lr_scheduler": trainer.lr_scheduler.state_dict(),
        "data": trainer.loader.state_dict() if trainer.loader is not None else None,
        **trainer.update.state_dict(),
    }
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    state.update(trainer.objective.state_dict())
    if trainer.scaler:
        state["grad_scaler"] = trainer.scaler.state_dict()
    return state


def restore(trainer, state: dict) -> None:
    """Put back what `collect` returned."""
    trainer.step = int(state["step"])
    trainer.update.load_state_dict(state)
    trainer.generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    trainer.lr_scheduler.load_state_dict(state["lr_scheduler"])
    if state.get("data") is not None and trainer.loader is not None:
        trainer.loader.load_state_dict(state["data"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    trainer.objective.load_state_dict(state)
    if trainer.scaler and "grad_scaler" in state:
        trainer.scaler.load_state_dict(state["grad_scaler"])


def _hold_out(trainer):
    """The indices training reads (None: all) once `data.val_split` samples are held out for validation;
    the held-out ones go to `trainer.held_out_index`."""
    from dit_trainer.data import holdout

    cfg = trainer.cfg
    count = cfg.data.val_split
    if count is None:
        count = 0 if cfg.data.val_path else trainer.condition.default_val_split(len(trainer.dataset))
        if count:
            cfg.data.val_split = count  # config.yaml records the split, which a resume must keep
    trainer.held_out_index, kept = holdout.split(len(trainer.dataset), count)
    return kept


def build_loader(trainer):
    """The endless per-rank loader of global-batch shares of the trainer's dataset (built from the config if unset)."""
    from dit_trainer.data.loader import GlobalBatchSampler, StepLoader, build_dataset
    from dit_trainer.data.online.encoder import encoder_for

    cfg, dims = trainer.cfg, trainer.dims
    if trainer.dataset is None:
        trainer.dataset = build_dataset(cfg)
        trainer.condition.bind(trainer.dataset, trainer.device)
    if trainer.alignment is not None:
        trainer.alignment.check_data(trainer.dataset)
    shape = getattr(trainer.dataset, "latent_shape", None)
    if shape is not None and tuple(shape) != tuple(trainer.sample_shape):
        raise DataError(f"{cfg.data.path} holds {'x'.join(map(str, shape))} latents but the model takes "
                        f"{'x'.join(map(str, trainer.sample_shape))}; set model.in_channels/input_size to match "
                        "(input_size is the image size / the VAE's downsampling factor, 8 for the SD VAEs) or "
                        "re-extract the data")
    sampler = GlobalBatchSampler(len(trainer.dataset), cfg.train.global_batch_size, seed=cfg.train.seed,
                                 dp_rank=dims.dp_rank, dp_size=dims.dp_size, kept=_hold_out(trainer))
    # An image folder's VAE encodes on this device what its latent cache lacks.
    stage = encoder_for(trainer.dataset, trainer.device, dims, progress=dims.is_main and cfg.logging.progress)
    return StepLoader(trainer.dataset, sampler, num_workers=cfg.data.num_workers,
                      pin_memory=trainer.device.type == "cuda", stage=stage)
