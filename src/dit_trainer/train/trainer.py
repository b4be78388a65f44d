"""`DiTTrainer`: one trainer for one process and for N under torchrun.

A step draws the objective's randomness (t, noise) and the label-dropout mask for the whole
global batch from one seeded generator; each data-parallel rank takes its slice. So every layout
computes the step of a single process, and restoring the generator's state resumes exactly. The
mesh is always a `ParallelDims` (world size 1 is a mesh of one), the model family's
`parallelize_fn` is always applied (a no-op where every degree is 1), and pipeline parallelism is
a branch of the step, not another class.
"""

import contextlib
import functools

import torch
import torch.nn as nn
from torch._functorch import config as functorch_config

from dit_trainer.config import as_config, validate
from dit_trainer.devices import enable_tf32, resolve_device
from dit_trainer.errors import ConfigError, DataError
from dit_trainer.host_memory import keep_freed_memory_on
from dit_trainer.models import get_spec
from dit_trainer.objective import build_objective
from dit_trainer.parallel.dims import init_distributed
from dit_trainer.parallel.ema import ShardedEMA
from dit_trainer.parallel.pipeline import TargetPacking, pipeline_step
from dit_trainer.parallel.utils import clip_grad_norm_, is_dtensor
from dit_trainer.plan import apply_auto_layout
from dit_trainer.train import checkpointing, host_sync, loop
from dit_trainer.train.backends import fused_adamw, other_engine, resolve_amp_dtype, resolve_compile
from dit_trainer.train.signals import StopSignals


class DiTTrainer:
    """Trains a registered model with the configured objective, on 1..N processes."""

    def __init__(self, config, dataset=None):
        self.cfg = cfg = as_config(config)
        # backend mindspore: the run belongs to the MindSpore engine; the methods below delegate to it.
        self._engine = None
        if cfg.backend != "torch":
            self._engine = other_engine(cfg)
            return
        if dataset is None and cfg.data.path is not None:
            from dit_trainer.data.loader import shape_from_data

            # The data decides the model's shape where the config does not: open it before the model.
            dataset = shape_from_data(cfg)
        else:
            validate(cfg)
        self.device = resolve_device(cfg.train.device)
        if cfg.parallel.layout == "auto":  # dit plan's fastest layout that fits this world size, written into cfg
            apply_auto_layout(cfg)
        self.dims = init_distributed(cfg.parallel, self.device)
        if self.device.type == "cuda" and self.dims.distributed:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type == "cuda":
            enable_tf32()
        # Before the model: its first steps then settle into a heap they reuse.
        keep_freed_memory_on(self.device, cfg.train.keep_freed_memory)
        self._check_layout()
        self.amp_dtype = resolve_amp_dtype(cfg.train.mixed_precision, self.device)
        torch.manual_seed(cfg.train.seed)

        self.spec = get_spec(cfg.model.name)
        model = self.spec.build_model_fn(cfg)
        if cfg.model.weights_path:
            from dit_trainer.checkpoint import load_into, load_weights

            load_into(model, self.spec.from_released(load_weights(cfg.model.weights_path)), cfg.model.weights_path)
        model.to(self.device)
        # Counted on the whole model, before parallelism splits its weights.
        self.flops_per_image = self.spec.flops_fn(model) if self.spec.flops_fn else None
        self.sample_shape = (model.in_channels, model.input_size, model.input_size)
        # auto becomes true/false here, so the run folder's config.yaml (and a resume) says which.
        compiled = resolve_compile(cfg, model, self.device, self.spec.parallelize_fn is not None)
        cfg.train.compile = "true" if compiled else "false"
        # AC decides what compiled blocks recompute by itself; without compile nothing reads it.
        no_ac = cfg.train.activation_checkpointing == "none"
        self._memory_budget = cfg.train.activation_memory_budget if compiled and no_ac else 1.0
        self.objective = build_objective(cfg)
        self._pp = None
        self.model_parts = self._parallelize(model)
        self.model = self.model_parts[0] if len(self.model_parts) == 1 else nn.ModuleList(self.model_parts)
        # The EMA is kept like the parameters: full on one process, shards under FSDP/TP/PP.
        self.ema = ShardedEMA(self.model_parts)

        params = [p for p in self.model.parameters() if p.requires_grad]
        sharded_params = self.dims.distributed or any(is_dtensor(p) for p in params)
        self.optimizer = torch.optim.AdamW(
            params,
            lr=cfg.optim.lr,
            weight_decay=cfg.optim.weight_decay,
            betas=(cfg.optim.beta1, cfg.optim.beta2),
            eps=cfg.optim.eps,
            fused=fused_adamw(self.device, params, sharded_params),
        )
        self._optimizer_kernels = {k: self.optimizer.param_groups[0][k] for k in ("fused", "foreach")}
        warmup = cfg.optim.warmup_steps
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0
        )
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        mode = host_sync.resolve_host_sync(cfg.train.host_sync, self.device, self.optimizer, self.scaler)
        self.deferred = host_sync.DeferredChecks(self.device) if mode == "log" else None
        # Draws come from a CPU generator on every device: a CUDA generator's draw of the timestep
        # sampler's seed (.item()) would make the host wait for the device every step, and CPU and
        # GPU runs of one seed now see the same noise.
        self.generator = torch.Generator().manual_seed(cfg.train.seed)
        self.step = 0
        self.skipped_steps = 0  # updates skipped for a non-finite loss (train.skip_nonfinite_steps)
        self._signals = None  # StopSignals while train() runs
        self.stop_requested = False  # every rank agreed to stop after this step
        self.log_window = None  # loss sums and steps since the last metrics line, saved for a resume (loop.py)
        self.max_steps_flag = "train.max_steps"  # how messages name it; `dit demo` says --steps
        self._dataset = dataset
        self._loader = None
        self._packing = None

    # -- layout ----------------------------------------------------------------------------

    def _check_layout(self):
        dims, cfg = self.dims, self.cfg
        if (dims.tp_enabled or dims.pp_enabled) and cfg.diffusion.timestep_sampler != "uniform" and cfg.objective == "diffusion":
            # Its loss history gathers every rank's batch: TP/PP peers would count samples twice.
            raise ConfigError("diffusion.timestep_sampler loss-second-moment is not supported with parallel.tp/pp > 1; use uniform")
        if dims.pp_enabled:
            if cfg.train.grad_accum_steps > 1:
                raise ConfigError("train.grad_accum_steps > 1 with parallel.pp > 1: raise parallel.pp_microbatches instead")
            local = dims.local_batch_size(cfg.train.global_batch_size)
            if local % cfg.parallel.pp_microbatches:
                raise ConfigError(
                    f"the per-rank batch {local} does not split into parallel.pp_microbatches "
                    f"{cfg.parallel.pp_microbatches}; pick a divisor of {local}"
                )

    def _parallelize(self, model) -> list:
        """The model family's plan on this layout; returns this rank's model parts."""
        spec, dims, cfg = self.spec, self.dims, self.cfg
        if spec.parallelize_fn is None:
            if dims.distributed or cfg.train.activation_checkpointing != "none" or cfg.train.compile == "true":
                raise ConfigError(f"model {spec.name} has no parallel plan; run it on one process without AC or compile")
            return [model]
        parallelize = functools.partial(spec.parallelize_fn, param_dtype=self.amp_dtype or torch.float32)
        if dims.pp_enabled:
            if spec.pipelining_fn is None:
                raise ConfigError(f"model {spec.name} cannot be pipelined; set parallel.pp 1")
            schedule, parts, first, last = spec.pipelining_fn(
                model, dims, cfg, loss_fn=self._pp_loss, device=self.device, parallelize_fn=parallelize
            )
            self._pp = (schedule, first, last)
            return list(parts)
        parallelize(model, dims, cfg)
        return [model]

    @property
    def diffusion(self):
        """The Gaussian diffusion of a diffusion objective (None for others)."""
        return getattr(self.objective, "diffusion", None)

    @property
    def sharded(self) -> bool:
        """Whether checkpoints are DCP shards (any sharded layout, or `checkpoint.sharded`)."""
        d = self.dims
        return bool(self.cfg.checkpoint.sharded or d.fsdp_enabled or d.tp_enabled or d.pp_enabled)

    # -- one step ------------------------------------------------------------------------

    def _forward_context(self):
        """Autocast to the run's mixed-precision dtype, and the compiled blocks' activation budget."""
        stack = contextlib.ExitStack()
        if self.amp_dtype:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.amp_dtype))
        if self._memory_budget < 1:
            # Read when a block's graph is compiled, i.e. inside its first calls: the partitioner
            # then recomputes the activations that cost least to recompute (pointwise ones first).
            stack.enter_context(functorch_config.patch(activation_memory_budget=self._memory_budget))
        return stack

    def _model_fn(self, x, t, **kwargs):
        # Autocast only the network; the objective's arithmetic around it stays in float32.
        with self._forward_context():
            out = self.model(x, t, **kwargs)
        return out.float()

    def _draw(self, global_batch: int):
        """The objective's draws and the label-dropout mask for the whole global batch (on the CPU)."""
        cpu = torch.device("cpu")
        draws = self.objective.draw(global_batch, self.sample_shape, self.generator, cpu)
        p = self.cfg.model.class_dropout_prob
        drop = (torch.rand(global_batch, generator=self.generator) < p).long()
        return draws, drop

    def _prepare(self, batch):
        """This rank's (x, y) on the device, and its slice of the global batch's randomness."""
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        x = x.to(self.device, dtype=torch.float32, non_blocking=True)
        y = y.to(self.device, dtype=torch.long, non_blocking=True)
        local = x.shape[0]
        lo = self.dims.dp_rank * local
        draws, drop = self._draw(local * self.dims.dp_size)
        draws = {k: self._to_device(v[lo:lo + local]) for k, v in draws.items()}
        return x, y, draws, self._to_device(drop[lo:lo + local])

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return t
        # Pinned, so the copy is queued behind the step instead of waiting for it.
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t.to(self.device)

    def train_step(self, batch) -> dict:
        """One optimizer step on this rank's share of a global batch; returns floats."""
        if self._engine is not None:
            return self._engine.train_step(batch)
        return self._finish_step(self._forward_backward(batch))

    def _forward_backward(self, batch) -> torch.Tensor:
        """The step's loss (on the device) with its gradients accumulated."""
        x, y, draws, drop = self._prepare(batch)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        return self._pipelined_loss(x, y, draws, drop) if self._pp else self._accumulated_loss(x, y, draws, drop)

    def deferred_step(self, batch) -> None:
        """One step whose results stay on the device (train.host_sync log); `self.deferred.flush` reads them."""
        self.deferred.finish_step(self, self._forward_backward(batch))

    def _accumulated_loss(self, x, y, draws, drop):
        local = x.shape[0]
        accum = self.cfg.train.grad_accum_steps
        if local % accum:
            raise ConfigError(f"per-rank batch {local} is not divisible by train.grad_accum_steps {accum}")
        loss_sum = torch.zeros((), device=self.device)
        for m in range(accum):
            sl = slice(m * local // accum, (m + 1) * local // accum)
            part = {k: v[sl] for k, v in draws.items()}
            with self._no_sync(m < accum - 1):
                x_t, t = self.objective.model_input(x[sl], part)
                out = self._model_fn(x_t, t, y=y[sl], force_drop_ids=drop[sl])
                losses = self.objective.loss(out, x[sl], part)
                self.objective.observe(part, losses.detach())
                loss = losses.mean() / accum
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
        return loss_sum

    def _pipelined_loss(self, x, y, draws, drop):
        """Forward-backward through the pipeline; the clean input and draws travel as the target."""
        x_t, t = self.objective.model_input(x, draws)
        carried = {"x": x, **draws}
        self._packing = TargetPacking(carried)
        schedule, first, last = self._pp
        with self._forward_context():
            return pipeline_step(schedule, first, last, self.dims, (x_t, t, y, drop), self._packing.pack(carried))

    def _pp_loss(self, output, target):
        """Last stage, per microbatch: the single-process loss from the stage's output."""
        carried = self._packing.unpack(target)
        x = carried.pop("x")
        return self.objective.loss(output.float(), x, carried).mean()

    def _no_sync(self, skip: bool):
        @contextlib.contextmanager
        def ctx():
            mods = [m for part in self.model_parts for m in part.modules() if hasattr(m, "set_requires_gradient_sync")]
            for m in mods:
                m.set_requires_gradient_sync(not skip)
            try:
                yield
            finally:
                for m in mods:
                    m.set_requires_gradient_sync(True)

        return ctx() if skip else contextlib.nullcontext()

    def _clip_grads(self, max_norm: float):
        pp_group = self.dims.mesh["pp"].get_group() if self.dims.pp_enabled else None
        clip = self.spec.clip_grad_fn or clip_grad_norm_
        return clip([p for p in self.model.parameters()], max_norm, pp_group=pp_group)

    def _finish_step(self, loss) -> dict:
        """After backward: clip, check, update, EMA; the global-batch loss as floats (one host wait)."""
        return host_sync.finish_step_now(self, loss)

    def _unwrapped(self):
        return getattr(self.model, "module", self.model)

    # -- state ---------------------------------------------------------------------------

    def trainer_state(self) -> dict:
        """Everything besides weights and optimizer that resuming needs."""
        state = {
            "step": self.step,
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "data": self._loader.state_dict() if self._loader is not None else None,
            "skipped_steps": self.skipped_steps,
            "log_window": self.log_window,
        }
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        state.update(self.objective.state_dict())
        if self.scaler:
            state["grad_scaler"] = self.scaler.state_dict()
        return state

    def load_trainer_state(self, state: dict) -> None:
        """Restore what `trainer_state` saved."""
        self.step = int(state["step"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.log_window = state.get("log_window")  # absent in older checkpoints: the window restarts empty
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if state.get("data") is not None and self._loader is not None:
            self._loader.load_state_dict(state["data"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.objective.load_state_dict(state)
        if self.scaler and "grad_scaler" in state:
            self.scaler.load_state_dict(state["grad_scaler"])

    def save_checkpoint(self):
        """Write model, EMA, optimizer and trainer state for the current step (all ranks call it)."""
        if self._engine is not None:
            return self._engine.save_checkpoint()
        return checkpointing.save(self)

    def load_checkpoint(self, path) -> None:
        """Resume from a checkpoint directory written by `save_checkpoint`, under any layout."""
        if self._engine is not None:
            return self._engine.load_checkpoint(path)
        checkpointing.load(self, path)

    def ema_model(self):
        """A plain eval-mode model holding the EMA weights on rank 0 (None elsewhere); all ranks call it."""
        return checkpointing.ema_model(self)

    # -- the loop ------------------------------------------------------------------------

    def build_loader(self):
        """The endless per-rank loader of global-batch shares."""
        from dit_trainer.data.loader import GlobalBatchSampler, StepLoader, build_dataset

        cfg = self.cfg
        dataset = self._dataset if self._dataset is not None else build_dataset(cfg)
        self._dataset = dataset
        shape = getattr(dataset, "latent_shape", None)
        if shape is not None and tuple(shape) != tuple(self.sample_shape):
            raise DataError(f"{cfg.data.path} holds {'x'.join(map(str, shape))} latents but the model takes "
                            f"{'x'.join(map(str, self.sample_shape))}; set model.in_channels/input_size to match "
                            "(input_size is the image size / 8) or re-extract the data")
        sampler = GlobalBatchSampler(
            len(dataset), cfg.train.global_batch_size, seed=cfg.train.seed,
            dp_rank=self.dims.dp_rank, dp_size=self.dims.dp_size,
        )
        return StepLoader(dataset, sampler, num_workers=cfg.data.num_workers, pin_memory=self.device.type == "cuda")

    def maybe_resume(self):
        """Load `checkpoint.resume_from`, else the newest usable checkpoint of `output_dir` when
        resuming is on; returns its path or None.

        With resuming off, an earlier run in `output_dir` is refused, archived or overwritten
        (`checkpoint.on_existing`). A checkpoint of another model is refused with a one-line error.
        """
        from dit_trainer.checkpoint import latest_checkpoint
        from dit_trainer.train import resume, resume_checks

        cfg = self.cfg
        if cfg.checkpoint.resume_from:
            path = resume_checks.resolve_resume_from(cfg)
            resume_checks.check_same_model(cfg, path)
            self.load_checkpoint(path)
            resume.apply_config_changes(self, path)
            return path
        if not cfg.checkpoint.resume:
            resume.prepare_fresh_start(self)
            return None
        latest = latest_checkpoint(cfg.output_dir)
        if latest is not None:
            resume_checks.check_same_model(cfg, latest)
        return resume.resume_latest(self)

    def train(self) -> dict:
        """Run until `train.max_steps` or a SIGTERM/SIGINT (then save and return); returns the last logged metrics."""
        if self._engine is not None:
            return self._engine.train()
        with StopSignals() as self._signals:
            try:
                return loop.run(self)
            finally:
                self._signals = None

    def save_sample_grid(self, path, **kwargs):
        """Draw a grid from the EMA weights (one row per class) with the run's objective; all ranks call it."""
        from dit_trainer.sample import sample_grid

        model = self.ema_model()
        result = None
        if model is not None:
            result = sample_grid(model, self.objective, self.cfg, path, device=self.device, **kwargs)
        checkpointing.barrier()
        return result
