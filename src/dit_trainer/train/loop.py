"""The training loop of `DiTTrainer`: resume, steps, logging, checkpoints, stopping on request."""

import sys
import time

import torch
from tqdm.auto import tqdm

from dit_trainer.config import save_config, user_keys
from dit_trainer.train.metrics import MetricsLogger
from dit_trainer.train.mfu import mfu_meter, peak_memory_gb


def run(trainer) -> dict:
    """The loop of `DiTTrainer.train` (its signal handlers already installed)."""
    cfg = trainer.cfg
    check_grid_vae(cfg)
    if trainer._loader is None:
        trainer._loader = trainer.build_loader()
    resumed = trainer.maybe_resume()
    main = trainer.dims.is_main
    if resumed is not None and trainer.step >= cfg.train.max_steps:
        if main:
            flag = trainer.max_steps_flag
            print(f"the run in {cfg.output_dir} is finished: {resumed.name} reached {flag} "
                  f"{cfg.train.max_steps}; raise {flag} to train further")
        return {}
    if main:
        _check_writable(cfg.output_dir)
        if resumed is not None:
            print(f"resuming from step {trainer.step} ({resumed})")
    wandb = {"project": cfg.logging.wandb_project, "config": cfg.to_dict()} if cfg.logging.wandb else None
    logger = MetricsLogger(cfg.output_dir, tensorboard=cfg.logging.tensorboard, enabled=main, wandb=wandb)
    mfu = mfu_meter(trainer)
    if main:
        save_config(cfg, _mkdir(cfg.output_dir) / "config.yaml")
        # Also without a checkpoint: a run killed before its first save logged steps that will be redone.
        logger.truncate_after(trainer.step)
    bar = tqdm(total=cfg.train.max_steps, initial=trainer.step, disable=not (main and cfg.logging.progress),
               desc="train", dynamic_ncols=True)
    last = {}
    running, n_running = _restore_window(trainer)
    t0, step0 = time.perf_counter(), trainer.step
    if trainer.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(trainer.device)
    deferred = trainer.deferred  # train.host_sync log: results are read at log steps only
    while trainer.step < cfg.train.max_steps:
        if deferred is not None:
            trainer.deferred_step(next(trainer._loader))
            out = {}
        else:
            out = trainer.train_step(next(trainer._loader))
            if not out.get("skipped"):
                running, n_running = running + out["loss"], n_running + 1
            bar.set_postfix(loss=f"{out['loss']:.4f}")
        bar.update(1)
        if trainer.step % cfg.logging.log_steps == 0 or trainer.step == cfg.train.max_steps:
            if deferred is not None:
                out = deferred.flush(trainer)
                running, n_running = out["loss"], 1
                bar.set_postfix(loss=f"{out['loss']:.4f}")
            elapsed = time.perf_counter() - t0
            steps = trainer.step - step0
            last = {
                "loss": running / n_running if n_running else float("nan"),
                "lr": trainer.lr_scheduler.get_last_lr()[0],
                "img_per_s": steps * cfg.train.global_batch_size / max(elapsed, 1e-9),
                "s_per_step": elapsed / max(steps, 1),
                "peak_mem_gb": peak_memory_gb(trainer.device),
            }
            if "grad_norm" in out:
                last["grad_norm"] = out["grad_norm"]
            if trainer.skipped_steps:
                last["skipped_steps"] = trainer.skipped_steps
            if mfu is not None:
                last.update(mfu(last["img_per_s"]))
            logger.log(trainer.step, last)
            if main:
                # tqdm.write keeps the bar intact; without a bar this is a plain log line.
                extra = f"  mfu {last['mfu']:.1%}" if "mfu" in last else ""
                tqdm.write(f"step {trainer.step:7d}  loss {last['loss']:.4f}  {last['img_per_s']:.1f} img/s  "
                           f"{last['s_per_step']:.3f} s/step  peak {last['peak_mem_gb']:.2f} GB{extra}")
            running, n_running, t0, step0 = 0.0, 0, time.perf_counter(), trainer.step
        # Sharded EMA weights are gathered by every rank, so all of them call in.
        if cfg.logging.image_steps and trainer.step % cfg.logging.image_steps == 0:
            grid = trainer.save_sample_grid(_mkdir(cfg.output_dir, "samples") / f"step-{trainer.step:08d}.png")
            if grid is not None:
                logger.log_image(trainer.step, "samples", grid)
        if trainer.step % cfg.checkpoint.save_steps == 0 or trainer.step == cfg.train.max_steps or trainer.stop_requested:
            if deferred is not None:
                # The last step's flags decide whether it diverged (raise, no save) and the skip count saved.
                deferred.read_pending(trainer)
            # A resume from here then logs the next line over the same steps as an uninterrupted run.
            trainer.log_window = (deferred.window(trainer) if deferred is not None
                                  else {"loss_sums": [running], "steps": n_running})
            trainer.save_checkpoint()
        if trainer.stop_requested:
            if main:
                tqdm.write(f"stopped at step {trainer.step} on request; checkpoint saved in "
                           f"{cfg.output_dir}/checkpoints; rerun the same command to continue")
            break
    bar.close()
    logger.close()
    if main and trainer.skipped_steps:
        # Skipping is what was asked for (exit 0), but a run that learnt from few steps should say so.
        print(f"warning: {trainer.skipped_steps} of {trainer.step} steps were skipped for a non-finite loss or "
              "grad norm (train.skip_nonfinite_steps); lower optim.lr or set optim.max_grad_norm", file=sys.stderr)
    return last


def _restore_window(trainer) -> tuple:
    """(loss sum, steps) of the steps since the last metrics line, as the checkpoint resumed from
    saved them; (0.0, 0) for a fresh run or an older checkpoint. Under train.host_sync log the
    device-side sums take them and the host's stay empty."""
    window, trainer.log_window = trainer.log_window, None
    if not window:
        return 0.0, 0
    sums, steps = list(window["loss_sums"]), int(window["steps"])
    if trainer.deferred is not None:
        trainer.deferred.restore(sums, steps, trainer.dims)
        return 0.0, 0
    return sum(sums) / len(sums), steps


def check_grid_vae(cfg) -> None:
    """A one-line ConfigError before step 1, not at the first sample grid (with that step's
    checkpoint unwritten), when the grids need a VAE folder that does not exist or diffusers is
    missing; a Hub id is checked when it is loaded."""
    if not cfg.logging.image_steps:
        return
    import importlib.util
    import os

    from dit_trainer.data.vae import looks_like_path
    from dit_trainer.errors import ConfigError
    from dit_trainer.sample.decode import data_manifest, vae_source

    source = vae_source(cfg)
    if source is None:
        return  # pixels, or latents previewed without a VAE
    name = source[0]
    from_manifest = "data.vae" not in user_keys(cfg) and (data_manifest(cfg.data.path) or {}).get("vae") == name
    where = f" (recorded in {os.path.join(str(cfg.data.path), 'manifest.json')})" if from_manifest else ""
    if not os.path.isdir(os.path.expanduser(name)) and looks_like_path(name):
        raise ConfigError(
            f"data.vae {name}{where} does not exist, and logging.image_steps {cfg.logging.image_steps} decodes "
            f"sample grids with it; set data.vae to the VAE folder or Hub id the latents came from, or "
            f"logging.image_steps 0")
    if importlib.util.find_spec("diffusers") is None:
        raise ConfigError(f"logging.image_steps {cfg.logging.image_steps} decodes sample grids with the VAE "
                          f"{name}{where}, which needs diffusers (the vae extra); install it or set logging.image_steps 0")


def _mkdir(*parts):
    from pathlib import Path

    p = Path(*[str(x) for x in parts])
    p.mkdir(parents=True, exist_ok=True)
    return p


def _check_writable(output_dir) -> None:
    """A one-line error naming output_dir when it cannot be created or written."""
    from pathlib import Path

    from dit_trainer.errors import CheckpointError

    try:
        path = _mkdir(output_dir)
        probe = Path(path) / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(f"output_dir {output_dir} is not writable ({err.strerror or err}); "
                              "pick another output_dir or fix its permissions") from None
