"""`ParallelTrainer`: the `DiTTrainer` under torchrun, filling its parallel hooks.

`DiTTrainer(config)` becomes one of these when launched with more than one process (or when
`checkpoint.sharded` is set). The step is the single-process step: the global batch and all its
randomness are drawn identically on every rank and sliced by data-parallel rank, so the loss of
any layout is the loss of one process at the same global batch.
"""

import contextlib
import functools
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn

from dit_trainer.config import config_yaml
from dit_trainer.errors import ConfigError
from dit_trainer.parallel import checkpoint as pckpt
from dit_trainer.parallel.dims import init_distributed
from dit_trainer.parallel.ema import ShardedEMA
from dit_trainer.parallel.pipeline import diffusion_loss, pack_target, pipeline_loss, pipeline_step
from dit_trainer.parallel.utils import clip_grad_norm_
from dit_trainer.train import checkpoint as ckpt
from dit_trainer.train.trainer import DiTTrainer


def _barrier():
    if dist.is_initialized():
        dist.barrier()


class ParallelTrainer(DiTTrainer):
    """DDP, FSDP/HSDP, TP and PP from `config.parallel`; sharded EMA and DCP checkpoints."""

    # -- layout ---------------------------------------------------------------------------

    def _init_parallel(self):
        dims = init_distributed(self.cfg.parallel, self.device)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
        cfg = self.cfg
        if (dims.tp_enabled or dims.pp_enabled) and cfg.diffusion.timestep_sampler != "uniform":
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
        return dims

    @property
    def sharded(self) -> bool:
        """Whether checkpoints are DCP shards (any sharded layout, or `checkpoint.sharded`)."""
        d = self.dims
        return bool(self.cfg.checkpoint.sharded or d.fsdp_enabled or d.tp_enabled or d.pp_enabled)

    def _parallelize(self, model):
        dims, cfg = self.dims, self.cfg
        self._sample_shape = (model.in_channels, model.input_size, model.input_size)
        parallelize = functools.partial(self.spec.parallelize_fn, param_dtype=self.amp_dtype or torch.float32)
        if dims.pp_enabled:
            schedule, parts, first, last = self.spec.pipelining_fn(
                model, dims, cfg, loss_fn=self._pp_loss, device=self.device, parallelize_fn=parallelize
            )
            self._pp = SimpleNamespace(schedule=schedule, has_first=first, has_last=last)
            self.model_parts = parts
            return parts[0] if len(parts) == 1 else nn.ModuleList(parts)
        parallelize(model, dims, cfg)  # one process: AC and compile only
        self.model_parts = [model]
        return model

    def _create_ema(self, model):
        return ShardedEMA(self.model_parts)

    def _update_ema(self, decay):
        self.ema.update(decay)

    def _clip_grads(self, max_norm):
        pp_group = self.dims.mesh["pp"].get_group() if self.dims.pp_enabled else None
        return clip_grad_norm_([p for p in self.model.parameters()], max_norm, pp_group=pp_group)

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

        return ctx()

    # -- the pipelined step ----------------------------------------------------------------

    def _model_timesteps(self, t):
        """The timesteps the model sees (respaced diffusions map their indices first)."""
        seen = []
        wrap = getattr(self.diffusion, "_wrap_model", None)
        if wrap is None:
            return t
        wrap(lambda x, ts, **kwargs: seen.append(ts))(None, t)
        return seen[0]

    def _pp_loss(self, output, target):
        """Last stage, per microbatch: the single-process loss of `train_step` from the stage's output."""
        # Built per call: the schedule is made before `self.diffusion` exists.
        return pipeline_loss(diffusion_loss(self.diffusion), self._sample_shape)(output, target)

    def train_step(self, batch) -> dict:
        if not self.dims.pp_enabled:
            return super().train_step(batch)
        x, y, t, w, noise, drop = self._prepare(batch)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        x_t = self.diffusion.q_sample(x, t, noise=noise)
        target = pack_target(x, noise, t, w)
        with self._autocast():
            pp = self._pp
            loss = pipeline_step(pp.schedule, pp.has_first, pp.has_last, self.dims, x_t, self._model_timesteps(t), y, drop, target)
        return self._finish_step(loss)

    # -- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self):
        """Full files from rank 0 when nothing is sharded (DDP); otherwise DCP shards plus the full EMA."""
        if not self.sharded:
            return super().save_checkpoint()
        root = ckpt.checkpoint_root(self.cfg.output_dir)
        tmp = root / f"step-{self.step:08d}.tmp"
        main = self.dims.is_main
        if main:
            tmp = ckpt.begin_checkpoint(self.cfg.output_dir, self.step)
        _barrier()
        pckpt.save_sharded(tmp / "dcp", self.model_parts, self.optimizer, self.ema, self.trainer_state())
        # Sampling and the converters read full weights; gathering them costs one all-gather per tensor.
        pckpt.export_safetensors(tmp / "ema.safetensors", self.ema.state_dict(), self.model_parts, self.dims)
        final = root / f"step-{self.step:08d}"
        if main:
            (tmp / "config.yaml").write_text(config_yaml(self.cfg))
            ckpt.commit_checkpoint(tmp, self.cfg.checkpoint.save_total_limit)
        _barrier()
        return final

    def load_checkpoint(self, path) -> None:
        """DCP shards under any layout, or full files (from a 1-process or DDP run)."""
        if (path / "dcp").is_dir():
            state = pckpt.load_sharded(path / "dcp", self.model_parts, self.optimizer, self.ema)
            self.load_trainer_state(state)
        elif self.sharded:
            pckpt.load_full_into_sharded(path, self.model_parts, self.optimizer, self.ema)
            self.load_trainer_state(ckpt.load_pt(path / "trainer_state.pt"))
        else:
            super().load_checkpoint(path)
        _barrier()

    def save_sample_grid(self, path, **kwargs):
        """Gather the EMA on rank 0, sample there from a plain model; every rank must call it."""
        from dit_trainer.sample import sample_grid_from_trainer

        full = pckpt.gather_full(self.ema.state_dict(), self.model_parts, self.dims)
        result = None
        if self.dims.is_main:
            model = self.spec.build_model_fn(self.cfg)
            model.load_state_dict(full, strict=True)
            model.to(self.device).eval()
            result = sample_grid_from_trainer(SimpleNamespace(cfg=self.cfg, ema=model, device=self.device), path, **kwargs)
        _barrier()
        return result
