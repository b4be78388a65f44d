"""`DiTTrainer`: one training step is t ~ sampler → q_sample → model → loss → backward →
AdamW → (clip) → EMA; `train()` runs the loop from the config with logging, sample grids,
checkpoints and exact resume.

All randomness of a step (timesteps, noise, label dropout) is drawn for the whole global batch
from one seeded generator and each data-parallel rank takes its slice, so every layout computes
the same step as a single process, and restoring the generator's state resumes exactly.
"""

import contextlib
import math
import time

import torch
from tqdm.auto import tqdm

from dit_trainer.config import as_config, config_yaml, save_config
from dit_trainer.diffusion import create_diffusion, create_named_schedule_sampler
from dit_trainer.errors import ConfigError
from dit_trainer.models import get_spec
from dit_trainer.train import checkpoint as ckpt
from dit_trainer.train.data import GlobalBatchSampler, StepLoader, build_dataset
from dit_trainer.train.ema import create_ema, ema_decay_at, update_ema
from dit_trainer.train.metrics import MetricsLogger


def resolve_device(name: str) -> torch.device:
    """"auto" picks CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_amp_dtype(name: str, device: torch.device):
    """The autocast dtype for `train.mixed_precision`, or None for fp32."""
    if name == "fp32":
        return None
    if name == "bf16":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        # Without native bf16 (AVX512-BF16/AMX) autocast on CPU is slower than fp32: fall back.
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None
    if name == "fp16":
        if device.type != "cuda":
            raise ConfigError("train.mixed_precision fp16 needs a CUDA device; use bf16 or fp32 on CPU")
        return torch.float16
    raise ConfigError(f"train.mixed_precision {name!r} is not one of bf16, fp16, fp32")


def build_diffusion(cfg, timestep_respacing=""):
    """The Gaussian diffusion described by `cfg.diffusion` and `cfg.model.learn_sigma`."""
    d = cfg.diffusion
    return create_diffusion(
        timestep_respacing=timestep_respacing,
        noise_schedule=d.noise_schedule,
        use_kl=d.use_kl,
        sigma_small=d.sigma_small,
        predict_xstart=d.predict_xstart,
        learn_sigma=cfg.model.learn_sigma,
        rescale_learned_sigmas=d.rescale_learned_sigmas,
        diffusion_steps=d.num_timesteps,
    )


class SingleProcess:
    """Parallel dimensions of a plain one-process run."""

    world_size = 1
    rank = 0
    dp_rank = 0
    dp_size = 1
    is_main = True
    is_distributed = False

    def all_reduce_mean(self, tensor):
        return tensor


class DiTTrainer:
    """Trains a registered model with Gaussian diffusion; see the module docstring."""

    def __new__(cls, config=None, *args, **kwargs):
        # Under torchrun (or with sharded checkpoints) the same call builds the parallel trainer.
        if cls is DiTTrainer and _wants_parallel(config):
            from dit_trainer.parallel.trainer import ParallelTrainer

            cls = ParallelTrainer
        return super().__new__(cls)

    def __init__(self, config, dataset=None):
        self.cfg = cfg = as_config(config)
        self.device = resolve_device(cfg.train.device)
        self.dims = self._init_parallel()
        self.amp_dtype = resolve_amp_dtype(cfg.train.mixed_precision, self.device)
        torch.manual_seed(cfg.train.seed)

        self.spec = get_spec(cfg.model.name)
        model = self.spec.build_model_fn(cfg)
        if cfg.model.weights_path:
            ckpt.load_into(model, ckpt.load_weights(cfg.model.weights_path), cfg.model.weights_path)
        model.to(self.device)
        self.model = self._parallelize(model)
        self.ema = self._create_ema(self.model)

        self.diffusion = build_diffusion(cfg)
        self.schedule_sampler = create_named_schedule_sampler(cfg.diffusion.timestep_sampler, self.diffusion)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.optim.lr,
            weight_decay=cfg.optim.weight_decay,
            betas=(cfg.optim.beta1, cfg.optim.beta2),
            eps=cfg.optim.eps,
        )
        warmup = cfg.optim.warmup_steps
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0
        )
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.train.seed)
        self.step = 0
        self._dataset = dataset
        self._loader = None

    # -- hooks for parallel layouts (dit_trainer.parallel overrides these) -------------------

    def _init_parallel(self):
        return SingleProcess()

    def _parallelize(self, model):
        t = self.cfg.train
        if (t.activation_checkpointing != "none" or t.compile) and self.spec.parallelize_fn is not None:
            # One process has no mesh: of the parallelisms only AC and per-block compile apply.
            from dit_trainer.parallel.dims import ParallelDims

            self.spec.parallelize_fn(model, ParallelDims(world_size=1), self.cfg)
        return model

    def _create_ema(self, model):
        return create_ema(model)

    def _update_ema(self, decay: float) -> None:
        update_ema(self.ema, self._unwrapped(), decay)

    def _clip_grads(self, max_norm: float):
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    # -- one step ------------------------------------------------------------------------

    def _model_fn(self, x, t, **kwargs):
        # Autocast only the network; the diffusion arithmetic around it stays in float32.
        with self._autocast():
            out = self.model(x, t, **kwargs)
        return out.float()

    def _autocast(self):
        """Autocast to the run's mixed-precision dtype, or nothing for fp32."""
        return torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype else contextlib.nullcontext()

    def _draw(self, global_batch: int, shape):
        """Timesteps, weights, noise and label-dropout mask for the whole global batch."""
        t, w = self.schedule_sampler.sample(global_batch, self.device, generator=self.generator)
        noise = torch.randn((global_batch, *shape), generator=self.generator, device=self.device)
        p = self.cfg.model.class_dropout_prob
        drop = (torch.rand(global_batch, generator=self.generator, device=self.device) < p).long()
        return t, w, noise, drop

    def _prepare(self, batch):
        """This rank's (x, y) on the device, and its slice of the global batch's randomness."""
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        x = x.to(self.device, dtype=torch.float32, non_blocking=True)
        y = y.to(self.device, dtype=torch.long, non_blocking=True)
        local = x.shape[0]
        lo = self.dims.dp_rank * local
        t, w, noise, drop = (v[lo : lo + local] for v in self._draw(local * self.dims.dp_size, x.shape[1:]))
        return x, y, t, w, noise, drop

    def train_step(self, batch) -> dict:
        """One optimizer step on this rank's share of a global batch; returns floats."""
        x, y, t, w, noise, drop = self._prepare(batch)
        self.model.train()
        local = x.shape[0]
        accum = self.cfg.train.grad_accum_steps
        if local % accum:
            raise ConfigError(f"per-rank batch {local} is not divisible by train.grad_accum_steps {accum}")
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        for m in range(accum):
            sl = slice(m * local // accum, (m + 1) * local // accum)
            with self._no_sync(m < accum - 1):
                losses = self.diffusion.training_losses(
                    self._model_fn, x[sl], t[sl], model_kwargs=dict(y=y[sl], force_drop_ids=drop[sl]), noise=noise[sl]
                )
                if hasattr(self.schedule_sampler, "update_with_local_losses"):
                    self.schedule_sampler.update_with_local_losses(t[sl], losses["loss"].detach())
                loss = (losses["loss"] * w[sl]).mean() / accum
                self._backward(loss)
            loss_sum += loss.detach()
        return self._finish_step(loss_sum)

    def _finish_step(self, loss) -> dict:
        """After backward: optimizer (with clipping), step count, EMA; the global-batch loss as floats."""
        grad_norm = self._optimizer_step()
        self.step += 1
        self._update_ema(ema_decay_at(self.step - 1, self.cfg.train.ema_decay, self.cfg.train.ema_warmup))
        out = {"loss": self.dims.all_reduce_mean(loss).item(), "lr": self.lr_scheduler.get_last_lr()[0]}
        if grad_norm is not None:
            out["grad_norm"] = float(grad_norm)
        return out

    def _no_sync(self, skip: bool):
        no_sync = getattr(self.model, "no_sync", None)
        return no_sync() if skip and no_sync is not None else contextlib.nullcontext()

    def _backward(self, loss):
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def _optimizer_step(self):
        grad_norm = None
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.optim.max_grad_norm > 0:
            grad_norm = self._clip_grads(self.cfg.optim.max_grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.lr_scheduler.step()
        return grad_norm

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
        }
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        if hasattr(self.schedule_sampler, "state_dict"):
            state["schedule_sampler"] = self.schedule_sampler.state_dict()
        if self.scaler:
            state["grad_scaler"] = self.scaler.state_dict()
        return state

    def load_trainer_state(self, state: dict) -> None:
        """Restore what `trainer_state` saved."""
        self.step = int(state["step"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if state.get("data") is not None and self._loader is not None:
            self._loader.load_state_dict(state["data"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        if "schedule_sampler" in state and hasattr(self.schedule_sampler, "load_state_dict"):
            self.schedule_sampler.load_state_dict(state["schedule_sampler"])
        if self.scaler and "grad_scaler" in state:
            self.scaler.load_state_dict(state["grad_scaler"])

    def save_checkpoint(self):
        """Write model, EMA, optimizer and trainer state for the current step."""
        if not self.dims.is_main:
            return None
        files = {
            "model.safetensors": self._unwrapped().state_dict(),
            "ema.safetensors": self.ema.state_dict(),
            "optimizer.pt": self.optimizer.state_dict(),
            "trainer_state.pt": self.trainer_state(),
            "config.yaml": config_yaml(self.cfg),
        }
        return ckpt.save_checkpoint(self.cfg.output_dir, self.step, files, keep=self.cfg.checkpoint.save_total_limit)

    def load_checkpoint(self, path) -> None:
        """Resume from a checkpoint directory written by `save_checkpoint`."""
        from safetensors.torch import load_file

        if (path / "dcp").is_dir():  # sharded, written by a parallel run: DCP reshards it to one process
            from dit_trainer.parallel.checkpoint import load_sharded

            self.load_trainer_state(load_sharded(path / "dcp", [self._unwrapped()], self.optimizer, self.ema))
            return
        ckpt.load_into(self._unwrapped(), load_file(str(path / "model.safetensors")), path / "model.safetensors")
        ckpt.load_into(self.ema, load_file(str(path / "ema.safetensors")), path / "ema.safetensors")
        self.optimizer.load_state_dict(ckpt.load_pt(path / "optimizer.pt"))
        self.load_trainer_state(ckpt.load_pt(path / "trainer_state.pt"))

    # -- the loop ------------------------------------------------------------------------

    def build_loader(self) -> StepLoader:
        """The endless per-rank loader of global-batch shares."""
        cfg = self.cfg
        dataset = self._dataset if self._dataset is not None else build_dataset(cfg)
        self._dataset = dataset
        sampler = GlobalBatchSampler(
            len(dataset), cfg.train.global_batch_size, seed=cfg.train.seed,
            dp_rank=self.dims.dp_rank, dp_size=self.dims.dp_size,
        )
        return StepLoader(dataset, sampler, num_workers=cfg.data.num_workers, pin_memory=self.device.type == "cuda")

    def maybe_resume(self):
        """Load the newest checkpoint of `output_dir` when resuming is on; returns its path or None."""
        if not self.cfg.checkpoint.resume:
            return None
        latest = ckpt.latest_checkpoint(self.cfg.output_dir)
        if latest is not None:
            self.load_checkpoint(latest)
        return latest

    def train(self) -> dict:
        """Run until `train.max_steps`; returns the last logged metrics."""
        cfg = self.cfg
        if self._loader is None:
            self._loader = self.build_loader()
        resumed = self.maybe_resume()
        main = self.dims.is_main
        logger = MetricsLogger(cfg.output_dir, tensorboard=cfg.logging.tensorboard, enabled=main)
        if main:
            save_config(cfg, _mkdir(cfg.output_dir) / "config.yaml")
            if resumed is not None:
                logger.truncate_after(self.step)
        bar = tqdm(total=cfg.train.max_steps, initial=self.step, disable=not (main and cfg.logging.progress),
                   desc="train", dynamic_ncols=True)
        last, running, n_running = {}, 0.0, 0
        t0, step0 = time.perf_counter(), self.step
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        while self.step < cfg.train.max_steps:
            out = self.train_step(next(self._loader))
            if not math.isfinite(out["loss"]):
                raise FloatingPointError(f"loss is {out['loss']} at step {self.step}; lower optim.lr or check the data")
            running, n_running = running + out["loss"], n_running + 1
            bar.update(1)
            bar.set_postfix(loss=f"{out['loss']:.4f}")
            if self.step % cfg.logging.log_steps == 0 or self.step == cfg.train.max_steps:
                elapsed = time.perf_counter() - t0
                steps = self.step - step0
                last = {
                    "loss": running / n_running,
                    "lr": out["lr"],
                    "img_per_s": steps * cfg.train.global_batch_size / max(elapsed, 1e-9),
                    "s_per_step": elapsed / max(steps, 1),
                    "peak_mem_gb": _peak_memory_gb(self.device),
                }
                if "grad_norm" in out:
                    last["grad_norm"] = out["grad_norm"]
                logger.log(self.step, last)
                if main:
                    # tqdm.write keeps the bar intact; without a bar this is a plain log line.
                    tqdm.write(f"step {self.step:7d}  loss {last['loss']:.4f}  {last['img_per_s']:.1f} img/s  "
                               f"{last['s_per_step']:.3f} s/step  peak {last['peak_mem_gb']:.2f} GB")
                running, n_running, t0, step0 = 0.0, 0, time.perf_counter(), self.step
            # Sharded EMA weights are gathered by every rank, so all of them call in.
            if cfg.logging.image_steps and self.step % cfg.logging.image_steps == 0 and (main or self.dims.is_distributed):
                self.save_sample_grid(_mkdir(cfg.output_dir, "samples") / f"step-{self.step:08d}.png")
            if self.step % cfg.checkpoint.save_steps == 0 or self.step == cfg.train.max_steps:
                self.save_checkpoint()
        bar.close()
        logger.close()
        return last

    def save_sample_grid(self, path, **kwargs):
        """Draw a grid from the EMA model (one row per class) and save it as a PNG."""
        from dit_trainer.sample import sample_grid_from_trainer

        return sample_grid_from_trainer(self, path, **kwargs)


def _wants_parallel(config) -> bool:
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return True
    try:
        return bool(as_config(config).checkpoint.sharded)
    except Exception:  # a bad config fails in __init__ with its own message
        return False


def _mkdir(*parts):
    from pathlib import Path

    p = Path(*[str(x) for x in parts])
    p.mkdir(parents=True, exist_ok=True)
    return p


def _peak_memory_gb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    # ru_maxrss is in KiB on Linux: the process's peak resident memory.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
