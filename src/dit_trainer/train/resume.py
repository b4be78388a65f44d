"""What `dit train` does with what is already in `output_dir`.

Resuming takes the newest checkpoint that passes its manifest's checksums, is of this model,
loads, holds only finite weights and a sane trainer state; each one skipped is named in a warning
together with the one used instead. `checkpoint.resume_from` is checked alike (a failure is an
error: it was asked for by name). The checkpoints newer than the one resumed from move aside into
`checkpoints/abandoned-TIME/`, so the next rerun continues this branch and nothing is deleted.
A checkpoint of another model, objective, seed or latent statistics is refused with a one-line error.
Starting fresh (`checkpoint.resume false`) over an old run is refused unless
`checkpoint.on_existing` says to archive the old run or overwrite it, so two runs never share
checkpoint rotation or `metrics.jsonl`. Optimizer values the user changed in the config since the
checkpoint (lr, betas, weight decay, eps, warmup) replace the restored ones, with a line saying so.

Everything resuming decides lives here; `checkpoint.Checkpointer.load` loads a chosen folder under
any layout, and `checkpoint.files` verifies one against its manifest.
"""

import shutil
import sys
import time
import warnings
from pathlib import Path

import yaml

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.fs import check_regular
from dit_trainer.parallel.utils import any_rank, barrier, from_main
from dit_trainer.train.compile_cache import RUN_FOLDER_NAME as COMPILE_CACHE_NAME
from dit_trainer.train.heartbeat import HEARTBEAT_DIR
from dit_trainer.train.run_lock import LOCK_NAME

# What a run writes into output_dir; `overwrite` removes exactly these.
RUN_FILES = ("checkpoints", "metrics.jsonl", "tensorboard", "samples", "config.yaml", "phema")


def resume_or_start(checkpointer, cfg, is_main: bool, device, apply, optimizer, lr_scheduler):
    """Load `checkpoint.resume_from`, else the newest usable checkpoint of `output_dir` when resuming
    is on (both verified alike; newer checkpoints move aside) and `apply` its trainer state; returns
    its path, or None. With resuming off, an earlier run in `output_dir` is refused, archived or
    overwritten (`checkpoint.on_existing`)."""
    if cfg.checkpoint.resume_from:
        path = resolve_resume_from(cfg)
        resume_from(checkpointer, cfg, path, is_main, device, apply)
    elif not cfg.checkpoint.resume:
        prepare_fresh_start(cfg, is_main)
        return None
    else:
        path = resume_latest(checkpointer, cfg, is_main, device, apply)
        if path is None:
            return None
    apply_config_changes(cfg, optimizer, lr_scheduler, path, is_main)
    return path


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
    policy = cfg.checkpoint.on_existing  # one of refuse, archive, overwrite (config/checks.py)
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
            out = out.resolve()  # `runs/x/` or `x/..` name the folder too
            dest = out.with_name(f"{out.name}.archived-{time.strftime('%Y%m%d-%H%M%S')}")
            n = 1
            while dest.exists():
                dest, n = dest.with_name(f"{dest.name.split('~')[0]}~{n}"), n + 1
            dest.mkdir()
            # Everything but the lock this run holds, which must stay where a second run looks for it, the
            # heartbeat files its ranks are rewriting (train/heartbeat.py), and the compile cache, no part of
            # a run's history (keyed by model, so never stale).
            for child in out.iterdir():
                if child.name not in (LOCK_NAME, HEARTBEAT_DIR, COMPILE_CACHE_NAME):
                    child.rename(dest / child.name)
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


# A step past this is no count a run reaches: the trainer state was forged or damaged.
MAX_STEP = 10**12


def state_problem(state, path):
    """Why a loaded trainer state cannot be resumed from (a damaged or forged one), or None: its step
    must be a count from 0, the one its `step-XXXXXXXX` folder names."""
    step = state.get("step") if isinstance(state, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        return f"{path}/trainer_state.pt holds step {step!r}, not a step count: the checkpoint is damaged"
    if ckpt.CKPT_RE.match(path.name) and ckpt.step_of(path) != step:
        return f"{path}/trainer_state.pt holds step {step}, not the {ckpt.step_of(path)} its folder names: the checkpoint is damaged"
    return None


def try_checkpoint(checkpointer, path, cfg, is_main: bool, device, apply):
    """Verify and load checkpoint `path` as every resume does: the manifest's checksums (rank 0), the same
    model and objective (a ConfigError: another model is no fallback), a load, finite weights and a sane
    trainer state, which `apply(state)` restores. Returns (trainer state, None), or (None, why it cannot be used)."""
    problem = state = None
    if is_main:
        try:
            ckpt.verify_checkpoint(path)
        except CheckpointError as err:
            problem = str(err)
    problem = from_main(problem)
    if problem is not None:
        return None, problem
    saved = check_same_model(cfg, path)
    try:
        state = checkpointer.load(path)
        error = state_problem(state, path)
        data = state.get("data")
        if error is None and isinstance(data, dict) and "global_batch_size" not in data:
            # Written before positions were kept in samples: the batch index counts batches of the saved size.
            data["global_batch_size"] = ((saved or {}).get("train") or {}).get("global_batch_size")
        if error is None:
            apply(state)
    except CheckpointError as err:
        error = str(err)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
        error = f"{path}/trainer_state.pt holds no usable trainer state ({type(err).__name__}): the checkpoint is damaged"
    if any_rank(error is not None or not checkpointer.weights_finite(), device):
        return None, error or f"{path} holds non-finite weights"
    return state, None


def _resumed(checkpointer, output_dir, path, state, is_main: bool) -> None:
    """After a load: rotation keeps `path`, and the checkpoints newer than it move aside (a branch)."""
    checkpointer.mark_good(path)
    if is_main:
        moved = move_aside_newer(output_dir, int(state["step"]))
        if moved is not None:
            names = ", ".join(sorted(p.name for p in moved.iterdir() if ckpt.CKPT_RE.match(p.name)))
            warn(f"moved the checkpoints newer than step {state['step']} ({names}) to {moved}: this run continues "
                 f"from {path.name}, and so will the next rerun")
    barrier()


def resume_latest(checkpointer, cfg, is_main: bool, device, apply):
    """Load the newest usable checkpoint of output_dir into `checkpointer`'s model, EMA and optimizer and
    `apply` its trainer state; returns its path, or None when there is none."""
    output_dir = cfg.output_dir
    candidates = ckpt.list_checkpoints(output_dir)
    skipped = []
    for path in reversed(candidates):
        state, problem = try_checkpoint(checkpointer, path, cfg, is_main, device, apply)
        if problem is None:
            if skipped and is_main:
                warn(f"resuming from {path} instead of the newer {', '.join(p.name for p, _ in skipped)}")
            _resumed(checkpointer, output_dir, path, state, is_main)
            return path
        skipped.append((path, problem))
        if is_main:
            warn(f"skipping checkpoint {path.name}: {problem}")
    if skipped:
        raise CheckpointError(
            f"no usable checkpoint in {ckpt.checkpoint_root(output_dir)} (all {len(skipped)} failed; "
            f"the newest: {skipped[0][1]}); move them aside or start over with --checkpoint.resume false "
            "--checkpoint.on_existing archive")
    return None


def resume_from(checkpointer, cfg, path, is_main: bool, device, apply) -> None:
    """Load `checkpoint.resume_from` (folder `path`) and `apply` its trainer state, checked as plain resume
    checks; a checkpoint that fails is a one-line error (it was asked for by name)."""
    state, problem = try_checkpoint(checkpointer, path, cfg, is_main, device, apply)
    if problem is not None:
        raise CheckpointError(f"checkpoint.resume_from {path}: {problem}; pass another checkpoint "
                              "(nothing was changed in output_dir)")
    _resumed(checkpointer, cfg.output_dir, path, state, is_main)


def apply_config_changes(cfg, optimizer, lr_scheduler, path, is_main: bool) -> None:
    """Let optimizer values changed in `cfg` since `path` was written win over the restored ones."""
    from dit_trainer.config import build_config

    saved = path / "config.yaml"
    if not saved.is_file():
        return
    try:
        old_cfg = build_config(str(saved))
    except Exception:  # a config of an older version: nothing to compare against
        return
    if is_main and old_cfg.train.global_batch_size != cfg.train.global_batch_size:
        print(f"resuming {path.name} with train.global_batch_size {old_cfg.train.global_batch_size} -> "
              f"{cfg.train.global_batch_size}: the data continues at the sample the run stopped at; the step count, "
              "learning-rate schedule and save steps go on counting steps", file=sys.stderr)
    if is_main and old_cfg.train.seed != cfg.train.seed:
        print(f"resuming {path.name} with train.seed {old_cfg.train.seed} -> {cfg.train.seed} "
              "(checkpoint.allow_new_seed): the data order follows the new seed from the saved sample on",
              file=sys.stderr)
    old, new = old_cfg.optim, cfg.optim
    changed = [f"optim.{k} {getattr(old, k)} -> {getattr(new, k)}"
               for k in ("lr", "beta1", "beta2", "weight_decay", "eps", "warmup_steps", "lr_schedule", "decay_steps",
                         "min_lr", "max_grad_norm")
               if getattr(old, k) != getattr(new, k)]
    if new.lr_schedule != "constant" and old_cfg.train.max_steps != cfg.train.max_steps:
        # The decay ends at train.max_steps: the restored rate was the old end's.
        changed.append(f"train.max_steps {old_cfg.train.max_steps} -> {cfg.train.max_steps} (where the decay ends)")
    if not changed:
        return
    sched = lr_scheduler
    # The scheduler restored the old base lr and rate; the lambda already uses the config's schedule.
    sched.base_lrs = [new.lr for _ in sched.base_lrs]
    for group, factor in zip(optimizer.param_groups, sched.lr_lambdas):
        group.update(initial_lr=new.lr, betas=(new.beta1, new.beta2), weight_decay=new.weight_decay, eps=new.eps)
        group["lr"] = new.lr * factor(sched.last_epoch)
    sched._last_lr = [g["lr"] for g in optimizer.param_groups]
    if is_main:
        print(f"resuming {path.name} with the config's {', '.join(changed)} (they replace the checkpoint's)", file=sys.stderr)


# What decides the weights' shapes: a checkpoint of another model cannot be resumed into this one.
_MODEL_KEYS = ("name", "input_size", "in_channels", "num_classes", "learn_sigma")
# What decides the target the model learns, per objective (learn_sigma is one of the model keys).
_OBJECTIVE_KEYS = {
    "diffusion": ("diffusion.noise_schedule", "diffusion.num_timesteps", "diffusion.predict_xstart"),
    "transport": ("transport.path_type", "transport.prediction"),
}


def resolve_resume_from(cfg) -> Path:
    """The checkpoint folder `checkpoint.resume_from` names: a path, or a step number or a bare
    `step-XXXXXXXX` name of `output_dir`'s checkpoints."""
    value = str(cfg.checkpoint.resume_from).strip()
    root = ckpt.checkpoint_root(cfg.output_dir)
    path = root / f"step-{int(value):08d}" if value.isdigit() else Path(value).expanduser()
    if not path.is_dir() and ckpt.CKPT_RE.match(value):
        path = root / value  # the name `dit train` prints, without its folder
    if not path.is_dir():
        steps = [str(int(ckpt.CKPT_RE.match(p.name).group(1))) for p in ckpt.list_checkpoints(cfg.output_dir)]
        held = f"it holds steps {', '.join(steps)}" if steps else "it holds no checkpoint"
        raise ConfigError(
            f"checkpoint.resume_from {value!r}: {path} is not a checkpoint folder ({root}: {held}); pass one "
            f"of those step numbers or a step-XXXXXXXX folder"
        )
    return path


def check_same_model(cfg, path):
    """A one-line error when checkpoint `path` holds another model than `cfg` builds, one trained with
    another objective (what its output means), or with another seed (its data order); returns the
    checkpoint's config as a dict (None when it has none to read)."""
    saved = Path(path) / "config.yaml"
    try:
        check_regular(saved, ConfigError)
        config = yaml.safe_load(saved.read_text()) or {}
        old = config.get("model") or {}
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        return None  # an incomplete checkpoint is the loader's to judge; this check needs the config
    new = cfg.to_dict()["model"]
    _check_same_objective(cfg, path, config)
    _check_same_seed(cfg, path, config)
    _check_same_phema(cfg, path, config)
    _check_same_latent_stats(cfg, path, config)
    keys = [*_MODEL_KEYS, *sorted(set(old) & set(new) - set(_MODEL_KEYS) - {"class_dropout_prob", "weights_path"})]
    norm = lambda k, v: str(v).lower() if k == "name" else v  # noqa: E731 (model names are case-insensitive)
    differ = [k for k in keys if k in old and norm(k, old.get(k)) != norm(k, new.get(k))]
    if differ:
        was = ", ".join(f"{k} {old.get(k)}" for k in differ)
        now = ", ".join(f"{k} {new.get(k)}" for k in differ)
        raise ConfigError(
            f"{path} holds another model ({was}) than this run builds ({now}); pass another output_dir, or "
            f"--checkpoint.resume false --checkpoint.on_existing archive to start over"
        )
    return config


def _check_same_seed(cfg, path, saved: dict) -> None:
    """A one-line error when `train.seed` changed since `path`: the seed orders the data, so the rest of
    the epoch would repeat some samples and skip others, unless `checkpoint.allow_new_seed` says so."""
    old = (saved.get("train") or {}).get("seed", 0)
    if old == cfg.train.seed or cfg.checkpoint.allow_new_seed:
        return
    raise ConfigError(
        f"{path} was trained with train.seed {old} but this run sets {cfg.train.seed}; the seed orders the data, so "
        f"set train.seed {old} to continue it, or pass --checkpoint.allow_new_seed true to continue with the new "
        "order from the saved sample on (the rest of this epoch then repeats some samples and skips others)")


def _check_same_phema(cfg, path, saved: dict) -> None:
    """A one-line error when this run asks for post-hoc EMA profiles that checkpoint `path` did not track."""
    old = sorted(float(s) for s in (saved.get("train") or {}).get("phema_stds") or [])
    new = sorted(cfg.train.phema_stds)
    if not new or old == new:
        return  # a run that turns post-hoc EMA off leaves the saved profiles unread
    # Refused rather than begun from the EMA or the weights: a profile must average every step from the
    # first with the power-function weights; one begun at step k is another average, and every
    # reconstruction from its snapshots would be silently wrong.
    held = f"tracks the post-hoc EMA widths {old}" if old else "holds no post-hoc EMA profiles (no phema.safetensors)"
    raise ConfigError(
        f"{path} {held} but this run sets train.phema_stds {new}; profiles are tracked from step 1, so set "
        f"train.phema_stds {old} to continue it, or start a new run in another output_dir (or --checkpoint.resume "
        "false --checkpoint.on_existing archive)")


def _check_same_latent_stats(cfg, path, saved: dict) -> None:
    """A one-line error when checkpoint `path` was trained on latents normalised otherwise than this run's
    (`data.latent_mean/std`, e.g. measured anew by a re-extract): the model would go on learning latents
    shifted and scaled differently from those it has learnt."""
    from dit_trainer.vae.latent_stats import describe_stats, same_stats, stats_of

    old, new = stats_of(saved.get("data") or {}), stats_of(cfg.data)
    if same_stats(old, new):
        return
    raise ConfigError(
        f"{path} was trained on latents {describe_stats(old)} but this run's data normalises them "
        f"{describe_stats(new)} (the data was extracted again?); set data.latent_mean and data.latent_std to the "
        f"checkpoint's (its config.yaml), or train on the new statistics in another output_dir (or "
        f"--checkpoint.resume false --checkpoint.on_existing archive)")


def _check_same_objective(cfg, path, saved: dict) -> None:
    """A one-line error when the checkpoint's model learnt another target than `cfg` trains
    (resuming would silently retrain it: the loss jumps); optimizer-like keys may change."""
    new = cfg.to_dict()
    keys = ["objective", *_OBJECTIVE_KEYS.get(cfg.objective, ())]
    for key in keys:
        section, _, name = key.rpartition(".")
        old_value = (saved.get(section) or {}).get(name) if section else saved.get(name, "diffusion")
        new_value = new[section][name] if section else new[name]
        if old_value is None and section:
            continue  # a config written before the key existed
        same = str(old_value).lower() == str(new_value).lower() if isinstance(new_value, str) else old_value == new_value
        if not same:
            raise ConfigError(
                f"{path} was trained with {key} {old_value} but this run sets {new_value}; set {key} {old_value} "
                f"to continue it, or train the new objective in another output_dir (or --checkpoint.resume false "
                f"--checkpoint.on_existing archive)"
            )


def move_aside_newer(output_dir, step: int):
    """Move the checkpoints of `output_dir` newer than `step` into `checkpoints/abandoned-TIME/`
    (with the run's metrics.jsonl as it was), so a run that resumed from `step` continues its own
    branch on the next rerun instead of the abandoned one; returns that folder, or None."""
    newer = [p for p in ckpt.list_checkpoints(output_dir) if ckpt.step_of(p) > step]
    if not newer:
        return None
    root = ckpt.checkpoint_root(output_dir)
    dest, n = root / f"abandoned-{time.strftime('%Y%m%d-%H%M%S')}", 1
    while dest.exists():
        dest, n = dest.with_name(f"{dest.name.split('~')[0]}~{n}"), n + 1
    dest.mkdir()
    metrics = Path(output_dir) / "metrics.jsonl"
    if metrics.is_file():
        shutil.copy2(metrics, dest / "metrics.jsonl")  # resuming drops the steps past `step` from it
    for path in newer:
        path.rename(dest / path.name)
    return dest


def remove_stale_tmp(output_dir) -> None:
    """Remove `step-*.tmp` folders a killed save left behind (only while this run holds the folder's lock)."""
    root = ckpt.checkpoint_root(output_dir)
    if root.is_dir():
        for path in root.glob("step-*.tmp"):
            shutil.rmtree(path, ignore_errors=True)
