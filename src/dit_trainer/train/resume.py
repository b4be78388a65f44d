"""What `dit train` does with what is already in `output_dir`.

Resuming takes the newest checkpoint that passes its manifest's checksums, loads, and holds only
finite weights; each one skipped is named in a warning together with the one used instead.
Starting fresh (`checkpoint.resume false`) over an old run is refused unless
`checkpoint.on_existing` says to archive the old run or overwrite it, so two runs never share
checkpoint rotation or `metrics.jsonl`. Optimizer values the user changed in the config since the
checkpoint (lr, betas, weight decay, eps, warmup) replace the restored ones, with a line saying so.
"""

import shutil
import sys
import time
import warnings
from pathlib import Path

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.parallel.utils import any_rank, barrier, from_main

ON_EXISTING = ("refuse", "archive", "overwrite")
# What a run writes into output_dir; `overwrite` removes exactly these.
RUN_FILES = ("checkpoints", "metrics.jsonl", "tensorboard", "samples", "config.yaml")


def warn(message: str) -> None:
    """A UserWarning (filters and pytest.warns see it) shown as one line `warning: ...` on stderr,
    not as Python's `file:line: UserWarning:` with the trainer's source line under it."""
    shown = warnings.formatwarning
    warnings.formatwarning = lambda text, *args, **kwargs: f"warning: {text}\n"
    try:
        warnings.warn(message, UserWarning, stacklevel=2)
    finally:
        warnings.formatwarning = shown


def has_run(output_dir) -> bool:
    """Whether `output_dir` holds checkpoints or metrics of an earlier run."""
    out = Path(output_dir)
    metrics = out / "metrics.jsonl"
    return bool(ckpt.list_checkpoints(out)) or (metrics.is_file() and metrics.stat().st_size > 0)


def prepare_fresh_start(cfg, is_main: bool) -> None:
    """`checkpoint.resume false`: refuse, archive or overwrite an earlier run in output_dir."""
    policy = cfg.checkpoint.on_existing
    if policy not in ON_EXISTING:
        raise ConfigError(f"checkpoint.on_existing {policy!r} is not one of {', '.join(ON_EXISTING)}")
    out = Path(cfg.output_dir)
    if not from_main(has_run(out)):
        return
    if policy == "refuse":
        last = ckpt.latest_checkpoint(out)
        held = f"checkpoints up to {last.name}" if last else "metrics.jsonl"
        raise CheckpointError(
            f"output_dir {out} already holds a run ({held}) and checkpoint.resume is false; pass "
            "--checkpoint.resume true to continue it, --checkpoint.on_existing archive to move it aside, "
            "--checkpoint.on_existing overwrite to delete it, or another output_dir")
    if is_main:
        if policy == "archive":
            dest = out.with_name(f"{out.name}.archived-{time.strftime('%Y%m%d-%H%M%S')}")
            n = 1
            while dest.exists():
                dest, n = dest.with_name(f"{dest.name.split('~')[0]}~{n}"), n + 1
            out.rename(dest)
            print(f"moved the earlier run in {out} to {dest}", file=sys.stderr)
        else:
            for name in RUN_FILES:
                path = out / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
            print(f"deleted the earlier run's checkpoints and metrics in {out}", file=sys.stderr)
    barrier()


def resume_latest(checkpointer, output_dir, is_main: bool, device):
    """Load the newest usable checkpoint of output_dir into `checkpointer`'s model, EMA and optimizer;
    returns (its path, its trainer state), or (None, None) when there is none."""
    candidates = ckpt.list_checkpoints(output_dir)
    skipped = []
    for path in reversed(candidates):
        problem = state = None
        if is_main:
            try:
                ckpt.verify_checkpoint(path)
            except CheckpointError as err:
                problem = str(err)
        problem = from_main(problem)
        if problem is None:
            try:
                state = checkpointer.load(path)
                error = None
            except CheckpointError as err:
                error = str(err)
            if any_rank(error is not None or not checkpointer.weights_finite(), device):
                problem = error or f"{path} holds non-finite weights"
        if problem is None:
            if skipped and is_main:
                warn(f"resuming from {path} instead of the newer {', '.join(p.name for p, _ in skipped)}")
            return path, state
        skipped.append((path, problem))
        if is_main:
            warn(f"skipping checkpoint {path.name}: {problem}")
    if skipped:
        raise CheckpointError(
            f"no usable checkpoint in {ckpt.checkpoint_root(output_dir)} (all {len(skipped)} failed; "
            f"the newest: {skipped[0][1]}); move them aside or start over with --checkpoint.resume false "
            "--checkpoint.on_existing archive")
    return None, None


def apply_config_changes(cfg, optimizer, lr_scheduler, path, is_main: bool) -> None:
    """Let optimizer values changed in `cfg` since `path` was written win over the restored ones."""
    from dit_trainer.config import load_config

    saved = path / "config.yaml"
    if not saved.is_file():
        return
    try:
        old = load_config(str(saved)).optim
    except Exception:  # a config of an older version: nothing to compare against
        return
    new = cfg.optim
    changed = [f"optim.{k} {getattr(old, k)} -> {getattr(new, k)}"
               for k in ("lr", "beta1", "beta2", "weight_decay", "eps", "warmup_steps", "max_grad_norm")
               if getattr(old, k) != getattr(new, k)]
    if not changed:
        return
    sched = lr_scheduler
    # The scheduler restored the old base lr; the lambda already uses the config's warmup.
    sched.base_lrs = [new.lr for _ in sched.base_lrs]
    for group, factor in zip(optimizer.param_groups, sched.lr_lambdas):
        group.update(initial_lr=new.lr, betas=(new.beta1, new.beta2), weight_decay=new.weight_decay, eps=new.eps)
        group["lr"] = new.lr * factor(sched.last_epoch)
    sched._last_lr = [g["lr"] for g in optimizer.param_groups]
    if is_main:
        print(f"resuming {path.name} with the config's {', '.join(changed)} (they replace the checkpoint's)", file=sys.stderr)
