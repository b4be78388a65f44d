"""`DiTTrainer`: one trainer for one process and for N under torchrun.

A step draws the objective's randomness (t, noise) and the label-dropout mask for the whole
global batch from one seeded generator; each data-parallel rank takes its slice. So every layout
computes the step of a single process, and restoring the generator's state resumes exactly. The
mesh is always a `ParallelDims` (world size 1 is a mesh of one), the model family's
`parallelize_fn` is always applied (a no-op where every degree is 1), and pipeline parallelism is
a branch of the step, not another class. `train()` reads like DiT's train.py: resume, then per
step forward-backward, guarded update, EMA, metrics, sample grid, checkpoint.
"""

import functools
import sys
import time

import torch
import torch.nn as nn

from dit_trainer.checkpoint.checkpointer import Checkpointer
from dit_trainer.condition import build_condition
from dit_trainer.config import backend_of, build_config, config_yaml, save_config
from dit_trainer.data.loader import DataShapes
from dit_trainer.devices import enable_tf32, resolve_device
from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.fs import write_error_text
from dit_trainer.models import get_spec
from dit_trainer.models.interval import check_interval
from dit_trainer.models.routing import TokenRouting
from dit_trainer.objective import build_objective
from dit_trainer.parallel.dims import init_distributed
from dit_trainer.parallel.ema import ShardedEMA
from dit_trainer.parallel.process_group import resume_record
from dit_trainer.parallel.utils import barrier, clip_grad_norm_, is_dtensor
from dit_trainer.phema import snapshots, tracker
from dit_trainer.repa.encoder import Alignment
from dit_trainer.repa.objective import aligned
from dit_trainer.train import preflight, resume, state
from dit_trainer.train.choices import RuntimeChoices, fused_adamw, gathered_dtype, resolve_amp_dtype
from dit_trainer.train.compile_cache import use_compile_cache
from dit_trainer.train.eval_during_training import TrainingFID
from dit_trainer.train.heartbeat import Heartbeat
from dit_trainer.train.lr_schedule import lr_factor
from dit_trainer.train.forward_backward import ForwardBackward
from dit_trainer.train.pretrained import PretrainedShapes, load_pretrained
from dit_trainer.train.run_lock import RunLock
from dit_trainer.train.signals import StopSignals
from dit_trainer.train.step_model import HeldCondition
from dit_trainer.train.update import GuardedUpdate
from dit_trainer.train.validation import Validation, draw_grid
from dit_trainer.vae.latent_stats import device_stats, normalize


class DiTTrainer:
    """Trains a registered model with the configured objective, on 1..N processes (the torch engine)."""

    def __init__(self, config, dataset=None):
        """`config`: a Config, a nested or flat dict, or a YAML path; `dataset`: one to train on instead
        of the one `data.path` names. The data fills the model's shape where the config sets none."""
        if backend_of(config) != "torch":
            raise ConfigError("DiTTrainer is the torch engine; for backend mindspore use dit_trainer.build_trainer(config) "
                              "or `dit train`, which pick the engine the config names")
        # The weights of model.weights_path give the model's shape first, then the data fills the rest.
        pretrained = PretrainedShapes()
        shapes = DataShapes(dataset, first=pretrained)
        # `auto` layout and compile are decided inside, so the config is final from here on.
        self.cfg = build_config(config, shapes=shapes, runtime=RuntimeChoices())
        self.dataset = shapes.dataset
        cfg = self.cfg
        self.device = resolve_device(cfg.train.device)
        self.dims = init_distributed(cfg.parallel, self.device)
        self.is_main = self.dims.is_main
        if self.device.type == "cuda" and self.dims.distributed:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type == "cuda":
            enable_tf32()
        preflight.check_layout(cfg, self.dims)
        self.amp_dtype = resolve_amp_dtype(cfg.train.mixed_precision, self.device)
        torch.manual_seed(cfg.train.seed)

        self.spec = get_spec(cfg.model.name)
        model = self.spec.build_model_fn(cfg)
        check_interval(model, cfg, self.spec.name)  # MeanFlow's second time input, in the families that have one
        if cfg.model.weights_path:
            load_pretrained(model, self.spec, pretrained.state_dict, cfg.model.weights_path, log=self.is_main)
        model.to(self.device)
        # REPA's frozen encoder (None when off): whole on every rank, outside the model and its checkpoints.
        self.alignment = Alignment.for_run(cfg, model, self.device, self.amp_dtype)
        # Token routing: which tokens skip which blocks is drawn each step with the objective's draws.
        self.routing = TokenRouting.for_model(cfg.train, model)
        # Counted on the whole model, before parallelism splits its weights (routed blocks on their kept tokens).
        routed = {"tokens_per_block": self.routing.tokens_per_block()} if self.routing else {}
        self.flops_per_image = self.spec.flops_fn(model, **routed) if self.spec.flops_fn else None
        if self.flops_per_image is not None and self.alignment is not None:  # the encoder's (the projector is the model's)
            self.flops_per_image += self.alignment.flops_per_image()
        # What the model is conditioned on (class labels, captions): read from each batch, dropped for guidance.
        self.condition = build_condition(cfg, self.spec, model)
        self.condition.check_config(cfg)
        if self.dataset is not None:
            self.condition.bind(self.dataset, self.device)
        self.sample_shape = (model.in_channels, model.input_size, model.input_size)
        self.latent_stats = device_stats(cfg.data, self.device)  # None unless latents are normalised per channel
        compiled = cfg.train.compile == "true"
        # Before the first compile: torch reads where its caches live when it first compiles.
        self.compile_cache = use_compile_cache(cfg, self.device) if compiled else None
        # AC decides what compiled blocks recompute by itself; without compile nothing reads the budget.
        no_ac = cfg.train.activation_checkpointing == "none"
        budget = cfg.train.activation_memory_budget if compiled and no_ac else 1.0
        self.objective = aligned(build_objective(cfg), cfg)
        self.objective.check_condition(self.condition)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.forward_backward = ForwardBackward(self.objective, self.dims, self.device, self.amp_dtype, budget,
                                                cfg.train.grad_accum_steps, self.scaler)
        self.model_parts = self._parallelize(model)
        self.model = self.model_parts[0] if len(self.model_parts) == 1 else nn.ModuleList(self.model_parts)
        # The EMA, and the post-hoc EMA profiles of train.phema_stds (None when off), are kept like the
        # parameters: full on one process, shards under FSDP/TP/PP.
        self.ema = ShardedEMA(self.model_parts)
        self.phema = tracker.PowerEMA.for_run(self.model_parts, cfg, self.dims, self.device)

        params = [p for p in self.model.parameters() if p.requires_grad]
        sharded_params = self.dims.distributed or any(is_dtensor(p) for p in params)
        self.optimizer = torch.optim.AdamW(
            params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, betas=(cfg.optim.beta1, cfg.optim.beta2),
            eps=cfg.optim.eps, fused=fused_adamw(self.device, params, sharded_params))
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, cfg.optim, cfg.train.max_steps))
        d = self.dims
        self.checkpointer = Checkpointer(cfg.output_dir, self.model_parts, self.optimizer, self.ema, d, self.device,
                                         sharded=bool(cfg.checkpoint.sharded or d.fsdp_enabled or d.tp_enabled or d.pp_enabled),
                                         keep=cfg.checkpoint.save_total_limit, keep_steps=cfg.checkpoint.keep_steps,
                                         phema=self.phema)
        self.update = GuardedUpdate(self.optimizer, self.lr_scheduler, self.scaler, self.ema, self._clip_grads, d,
                                    self.device, cfg.optim, cfg.train, self._kept_checkpoint, phema=self.phema)
        # Draws come from a CPU generator on every device: a CUDA generator's draw of the timestep
        # sampler's seed (.item()) would make the host wait for the device every step, and CPU and
        # GPU runs of one seed now see the same noise.
        self.generator = torch.Generator().manual_seed(cfg.train.seed)
        self.step = 0
        self.loader = None  # the step loader train() draws from; built by train() unless set
        self._stop = None  # why this rank was asked to stop (a signal's name), or None

    # -- layout ----------------------------------------------------------------------------

    def _parallelize(self, model) -> list:
        """The model family's plan on this layout; returns this rank's model parts."""
        spec, dims, cfg = self.spec, self.dims, self.cfg
        if spec.parallelize_fn is None:
            if dims.distributed or cfg.train.activation_checkpointing != "none" or cfg.train.compile == "true":
                raise ConfigError(f"model {spec.name} has no parallel plan; run it on one process without AC or compile")
            self.forward_backward.attach([model])
            return [model]
        parallelize = functools.partial(spec.parallelize_fn, param_dtype=gathered_dtype(self.objective, self.amp_dtype))
        if not dims.pp_enabled:
            parallelize(model, dims, cfg)
            self.forward_backward.attach([model])
            return [model]
        if spec.pipelining_fn is None:
            raise ConfigError(f"model {spec.name} cannot be pipelined; set parallel.pp 1")
        schedule, parts, first, last = spec.pipelining_fn(
            model, dims, cfg, loss_fn=self.forward_backward.pipeline_loss, device=self.device, parallelize_fn=parallelize)
        self.forward_backward.attach(parts, (schedule, first, last))
        return list(parts)

    def _clip_grads(self, max_norm: float):
        pp_group = self.dims.mesh["pp"].get_group() if self.dims.pp_enabled else None
        clip = self.spec.clip_grad_fn or clip_grad_norm_
        return clip(list(self.model.parameters()), max_norm, pp_group=pp_group)

    def _kept_checkpoint(self) -> str:
        # Only a checkpoint this run wrote or verified is called intact (not merely the newest folder).
        last = self.checkpointer.last_good
        return f"{last} is intact" if last else "no checkpoint was written or verified yet"

    @property
    def diffusion(self):
        """The Gaussian diffusion of a diffusion objective (None for others)."""
        return getattr(self.objective, "diffusion", None)

    @property
    def skipped_steps(self) -> int:
        """Updates skipped for a non-finite loss or grad norm (train.skip_nonfinite_steps)."""
        return self.update.skipped_steps

    @property
    def stop_requested(self) -> bool:
        """Whether every rank agreed to stop after the step that asked."""
        return self.update.stop_requested

    # -- one step ------------------------------------------------------------------------

    def _prepare(self, batch):
        """This rank's x and condition (the model's keyword arguments, dropped rows made unconditional)
        on the device, its slice of the global batch's randomness, and the condition before dropout.

        The objective's draws, the condition's dropout mask and the token routing (when on) are drawn
        for the whole global batch on the CPU, in that order; the order is part of the contract that
        resume and parity replay.
        """
        x = batch["x"] if isinstance(batch, dict) else batch[0]
        x = normalize(x.to(self.device, dtype=torch.float32, non_blocking=True), self.latent_stats)
        cond = self.condition.inputs(batch, self.device)
        local = x.shape[0]
        n, lo = local * self.dims.dp_size, self.dims.dp_rank * local
        draws = self.objective.draw(n, self.sample_shape, self.generator, torch.device("cpu"))
        drop = self.condition.draw_drop(n, self.generator)
        draws = {k: self._to_device(v[lo:lo + local]) for k, v in draws.items()}
        # Routing off draws nothing: the generator's stream stays the release's.
        route = self.routing.draw(n, self.generator).part(slice(lo, lo + local), self._to_device) if self.routing else None
        if self.alignment is not None:  # the encoder's targets of this rank's images: no randomness
            self.alignment.add_targets(batch, x, draws)
        drop = self._to_device(drop[lo:lo + local])  # the undropped condition too: MeanFlow guides with other masks
        return x, self.condition.drop(cond, drop), draws, route, HeldCondition(self.condition, cond, drop)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return t
        # Pinned, so the copy is queued behind the step instead of waiting for it.
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t.to(self.device)

    def queue_step(self, batch) -> torch.Tensor:
        """One optimizer step on this rank's share of a global batch, without waiting for its results
        where the device can check them itself; returns the rank's loss (a device tensor)."""
        x, cond, draws, route, held = self._prepare(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward.loss_and_grads(x, cond, draws, route, held)
        self.update.apply_or_skip(loss, stop=self._stop is not None, done=self.step)
        self.step += 1
        return loss

    def train_step(self, batch) -> dict:
        """One optimizer step on this rank's share of a global batch; returns floats (one host wait):
        the global-batch loss (NaN for a skipped step), the lr, and the grad norm when clipping."""
        skipped = self.skipped_steps
        loss = self.queue_step(batch)
        self.update.read_pending()
        out = {"loss": self.dims.all_reduce_mean(loss).item(), "lr": self.lr_scheduler.get_last_lr()[0]}
        out.update(self.objective.read_alignment(self.dims) if self.alignment is not None else {})
        if self.skipped_steps > skipped:
            out.update(loss=float("nan"), skipped=True)
        elif self.update.last_grad_norm() is not None:
            out["grad_norm"] = float(self.update.last_grad_norm())
        return out

    def request_stop(self, reason: str = "request") -> None:
        """Stop after the current step: every rank agrees at its end, saves a checkpoint and returns."""
        self._stop = self._stop or reason

    # -- state ---------------------------------------------------------------------------

    def trainer_state(self) -> dict:
        """Everything besides weights and optimizer that resuming needs (a collective: every rank calls it)."""
        return state.collect(self)

    def load_trainer_state(self, saved: dict) -> None:
        """Restore what `trainer_state` saved."""
        state.restore(self, saved)

    def save_checkpoint(self):
        """Write model, EMA, optimizer and trainer state for the current step (all ranks call it)."""
        # The last step's flags decide whether it diverged (raise, no save) and the skip count saved.
        self.update.read_pending()
        self._flush_loader()
        return self.checkpointer.save(self.step, self.trainer_state(), config_yaml(self.cfg))

    def _flush_loader(self) -> None:
        # An image folder's loader keeps freshly encoded latents in memory; written now, a resume or
        # the next run finds them in the cache.
        getattr(self.loader, "flush", lambda: None)()

    def load_checkpoint(self, path) -> None:
        """Resume from a checkpoint directory written by `save_checkpoint`, under any layout."""
        self.load_trainer_state(self.checkpointer.load(path))

    def ema_model(self, everywhere: bool = False):
        """A plain eval-mode model holding the EMA weights on rank 0 (on every rank with `everywhere`,
        not under pipeline parallelism; None elsewhere); all ranks call it."""
        return self.checkpointer.ema_model(functools.partial(self.spec.build_model_fn, self.cfg), everywhere)

    def maybe_resume(self):
        """Resume as `train()` does (`train.resume.resume_or_start`: `checkpoint.resume_from`, the newest
        usable checkpoint, or a fresh start by `checkpoint.on_existing`); returns its path or None."""
        return resume.resume_or_start(self.checkpointer, self.cfg, self.dims.is_main, self.device,
                                      self.load_trainer_state, self.optimizer, self.lr_scheduler)

    # -- the loop ------------------------------------------------------------------------

    def build_loader(self):
        """The endless per-rank loader of global-batch shares."""
        return state.build_loader(self)

    def train(self, max_steps_name: str = "train.max_steps") -> dict:
        """Run until `train.max_steps` or a SIGTERM/SIGINT (then save and return); returns the last logged
        metrics. `max_steps_name`: how messages name that limit (a command passes its own flag)."""
        self._stop = None
        self.update.clear_stop()
        with StopSignals(self.request_stop), RunLock(self.cfg.output_dir, self.dims.is_main), \
                Heartbeat(self.cfg.output_dir, self.dims.rank, self.dims.world_size, self.cfg.parallel.timeout,
                          self.step) as self.heartbeat:
            try:
                return self._train(max_steps_name)
            except Exception as err:
                self.heartbeat.on_error(err)  # a peer that stopped answering: one line naming it, and exit
                if not isinstance(err, OSError):
                    raise
                # A full disk or failing mount under metrics, TensorBoard, grids or config.yaml: one line.
                raise CheckpointError(f"{write_error_text(self.cfg.output_dir, err)}; free space or fix the "
                                      f"mount ({self._kept_checkpoint()})") from None
            finally:
                getattr(self.loader, "stop_workers", lambda: None)()  # a set loader may be any iterator

    def _train(self, max_steps_name: str) -> dict:
        from tqdm.auto import tqdm

        from dit_trainer.progress import progress_bar
        from dit_trainer.train.metrics import MetricsLogger, console_line, metrics_line
        from dit_trainer.train.mfu import mfu_meter

        cfg, main = self.cfg, self.dims.is_main
        preflight.check_grid_vae(cfg)
        if self.loader is None:
            self.loader = self.build_loader()
        self.validation = Validation.for_run(self)  # held-out samples: the validation loss, the grid's rows
        resumed = self.maybe_resume()
        if resumed is not None and self.step >= cfg.train.max_steps:
            if main:
                print(f"the run in {cfg.output_dir} is finished: {resumed.name} reached {max_steps_name} "
                      f"{cfg.train.max_steps}; raise {max_steps_name} to train further")
            return {}
        if main:
            resume.remove_stale_tmp(cfg.output_dir)  # a killed save's; no other writer can hold one (the lock)
            snapshots.set_aside_newer(cfg.output_dir, self.step)  # post-hoc EMA snapshots of steps this run redoes
            if resumed is not None:
                print(f"resuming from step {self.step} ({resumed})")
            save_config(cfg, preflight.make_dir(cfg.output_dir) / "config.yaml")
        wandb = {"project": cfg.logging.wandb_project, "config": cfg.to_dict()} if cfg.logging.wandb else None
        logger = MetricsLogger(cfg.output_dir, tensorboard=cfg.logging.tensorboard, enabled=main, wandb=wandb)
        if main:
            # Also without a checkpoint: a run killed before its first save logged steps that will be redone.
            logger.truncate_after(self.step)
            if resumed is not None and (record := resume_record(resumed, self.dims.world_size)):
                logger.note(self.step, record)
        mfu = mfu_meter(self)
        fid = TrainingFID.for_run(self) if cfg.eval.every else None
        bar = progress_bar(total=cfg.train.max_steps, initial=self.step, disable=not (main and cfg.logging.progress),
                           desc="train", dynamic_ncols=True, logged=True)
        last = {}
        t0, step0 = time.perf_counter(), self.step
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.heartbeat.beat(self.step)
        while self.step < cfg.train.max_steps:
            self.queue_step(next(self.loader))
            self.heartbeat.beat(self.step)
            bar.update(1)
            if self.step % cfg.logging.log_steps == 0 or self.step == cfg.train.max_steps:
                last = metrics_line(self.update.read_losses(), self.lr_scheduler.get_last_lr()[0],
                                    self.step - step0, time.perf_counter() - t0, cfg.train.global_batch_size,
                                    self.device, self.skipped_steps, mfu)
                last.update(self.objective.read_alignment(self.dims) if self.alignment is not None else {})
                logger.log(self.step, last)
                if main:
                    bar.set_postfix(loss=f"{last['loss']:.4f}")
                    tqdm.write(console_line(self.step, last))  # keeps the bar intact; a plain line without one
                t0, step0 = time.perf_counter(), self.step
            if self.validation.due(self.step):  # every rank measures its share of the held-out samples
                values = self.validation.measure(self.model)
                logger.log(self.step, values)
                last = {**last, **values}
            # Sharded EMA weights are gathered by every rank, so all of them call in.
            if cfg.logging.image_steps and self.step % cfg.logging.image_steps == 0:
                path = preflight.make_dir(cfg.output_dir, "samples") / f"step-{self.step:08d}.png"
                grid = self.save_sample_grid(path)
                if grid is not None:
                    logger.log_image(self.step, "samples", grid)
            if fid is not None and fid.due(self.step):  # a collective, as the grid
                values = fid.measure(self.ema_model(fid.every_rank_samples), self.objective, self.step)
                if values:
                    logger.log(self.step, values)
                    last = {**last, **values}
            # Before the checkpoint of its step: a crash between the two redoes the step and its snapshot.
            if self.phema is not None and self.phema.snapshot_due(self.step, cfg.train.max_steps):
                self.update.read_pending()  # a step that diverged raises before its snapshot is written
                self.phema.write_snapshot(self.step)
            if (self.step % cfg.checkpoint.save_steps == 0 or self.step == cfg.train.max_steps or self.stop_requested
                    or self.step in cfg.checkpoint.keep_steps):
                self.save_checkpoint()
            if self.stop_requested:
                if main:
                    tqdm.write(f"stopped at step {self.step} on request; checkpoint saved in "
                               f"{cfg.output_dir}/checkpoints; rerun the same command to continue")
                break
        bar.close()
        logger.close()
        self._flush_loader()
        if main and self.skipped_steps:
            # Skipping is what was asked for (exit 0), but a run that learnt from few steps should say so.
            print(f"warning: {self.skipped_steps} of {self.step} steps were skipped for a non-finite loss or grad "
                  "norm (train.skip_nonfinite_steps); lower optim.lr or set optim.max_grad_norm", file=sys.stderr)
        return last

    def save_sample_grid(self, path, **kwargs):
        """Draw a grid from the EMA weights (a row per class, or per prompt or held-out caption) with the run's
        objective; all ranks call it."""
        model = self.ema_model()
        result = draw_grid(self, model, path, **kwargs) if model is not None else None
        barrier()
        return result
