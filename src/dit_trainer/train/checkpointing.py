"""Saving and resuming a `DiTTrainer`, whatever its layout.

Unsharded runs (one process, DDP) write full files from rank 0; sharded ones (FSDP, TP, PP or
`checkpoint.sharded`) write DCP shards plus the full EMA that sampling reads. Either kind
resumes under any layout: shards reshard N -> M, full files are scattered into shards.
"""

import torch
import torch.distributed as dist

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.config import config_yaml
from dit_trainer.errors import CheckpointError


def barrier() -> None:
    """Wait for every rank (nothing on one process)."""
    if dist.is_initialized():
        dist.barrier()


def save(trainer):
    """Write the current step's checkpoint; returns its final path (all ranks call it)."""
    if not trainer.sharded:
        if not trainer.dims.is_main:
            return None
        files = {
            "model.safetensors": trainer._unwrapped().state_dict(),
            "ema.safetensors": trainer.ema.state_dict(),
            "optimizer.pt": trainer.optimizer.state_dict(),
            "trainer_state.pt": trainer.trainer_state(),
            "config.yaml": config_yaml(trainer.cfg),
        }
        return ckpt.save_checkpoint(trainer.cfg.output_dir, trainer.step, files, keep=trainer.cfg.checkpoint.save_total_limit)

    from dit_trainer.checkpoint import sharded

    from torch.distributed.checkpoint.api import CheckpointException

    cfg, step, main = trainer.cfg, trainer.step, trainer.dims.is_main
    root = ckpt.checkpoint_root(cfg.output_dir)
    tmp = root / f"step-{step:08d}.tmp"
    error = None
    try:
        if main:
            ckpt.begin_checkpoint(cfg.output_dir, step)
    except OSError as err:
        error = ckpt.write_failed(tmp, err)
    # Every rank learns whether the folder exists before writing into it (no rank may hang).
    if any_rank(trainer, error is not None):
        raise error or CheckpointError(f"cannot write checkpoint {tmp}: rank 0 could not create it")
    try:
        sharded.save_sharded(tmp / "dcp", trainer.model_parts, trainer.optimizer, trainer.ema, trainer.trainer_state())
        # Sampling and the converters read full weights; gathering them costs one all-gather per tensor.
        sharded.export_safetensors(tmp / "ema.safetensors", trainer.ema.state_dict(), trainer.model_parts, trainer.dims)
        if main:
            (tmp / "config.yaml").write_text(config_yaml(cfg))
            ckpt.write_manifest(tmp)
    except (OSError, RuntimeError, CheckpointException) as err:
        cause = err
        if isinstance(err, CheckpointException):
            failures = list(getattr(err, "failures", {}).values())
            cause = failures[0][0] if failures and isinstance(failures[0], tuple) else RuntimeError(str(err))
        error = ckpt.write_failed(tmp, cause) if main else CheckpointError(f"cannot write checkpoint {tmp}: {cause}")
    if any_rank(trainer, error is not None):
        if main:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        raise error or CheckpointError(f"cannot write checkpoint {tmp}: another rank failed to write its shards")
    if main:
        ckpt.commit_checkpoint(tmp, cfg.checkpoint.save_total_limit)
    barrier()
    return root / f"step-{step:08d}"


def any_rank(trainer, flag: bool) -> bool:
    """Whether `flag` is true on any rank (a collective under torchrun; `flag` itself on one process)."""
    if not dist.is_initialized():
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=trainer.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def load(trainer, path) -> None:
    """Resume `trainer` from a checkpoint folder: DCP shards under any layout, or full files."""
    try:
        _load(trainer, path)
        # The saved param_groups carry the writer's kernel choice (fused on one process); this
        # layout's parameters decide which kernel can run here.
        for group in trainer.optimizer.param_groups:
            group.update(trainer._optimizer_kernels)
    except CheckpointError:
        raise
    except (KeyError, ValueError, TypeError, RuntimeError, OSError) as err:
        # A file that parsed but holds the wrong things (a state dict of another model, say).
        text = str(err).strip().splitlines()
        raise CheckpointError(f"{path}: cannot be loaded ({type(err).__name__}: {text[-1] if text else ''})") from None


def _load(trainer, path) -> None:
    load_file = ckpt.load_safetensors
    if (path / "dcp").is_dir() or trainer.sharded:
        from dit_trainer.checkpoint import sharded

        if (path / "dcp").is_dir():
            state = sharded.load_sharded(path / "dcp", trainer.model_parts, trainer.optimizer, trainer.ema)
        else:
            sharded.load_full_into_sharded(path, trainer.model_parts, trainer.optimizer, trainer.ema)
            state = ckpt.load_pt(path / "trainer_state.pt")
        trainer.load_trainer_state(state)
        barrier()
        return
    model_file, ema_file = path / "model.safetensors", path / "ema.safetensors"
    ckpt.load_into(trainer._unwrapped(), load_file(model_file), model_file)
    trainer.ema.load_state_dict(load_file(ema_file))
    trainer.optimizer.load_state_dict(ckpt.load_pt(path / "optimizer.pt"))
    trainer.load_trainer_state(ckpt.load_pt(path / "trainer_state.pt"))
    barrier()


def ema_model(trainer):
    """A plain eval-mode model with the EMA weights on rank 0, None elsewhere (a collective)."""
    from dit_trainer.checkpoint.sharded import gather_full

    full = gather_full(trainer.ema.state_dict(), trainer.model_parts, trainer.dims)
    if not trainer.dims.is_main:
        return None
    # Building initialises weights from the global RNG, which the run's data order depends on.
    with torch.random.fork_rng(devices=[]):
        model = trainer.spec.build_model_fn(trainer.cfg)
    model.load_state_dict(full, strict=True)
    return model.to(trainer.device).eval().requires_grad_(False)
