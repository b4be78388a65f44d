"""`MindSporeTrainer`: the train step of `DiTTrainer` on MindSpore: value_and_grad, AdamW, EMA.

The randomness of step s (timesteps, noise, label-dropout mask) comes from
`np.random.default_rng([seed, s])`, and the data order from a per-epoch permutation, so a run is
a function of (config, step) and resuming from a `.ckpt` continues it exactly.
"""

import os

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, ops

from dit_trainer.errors import ConfigError
from dit_trainer_mindspore import checkpoint as ckpt
from dit_trainer_mindspore.core import mindspore_config, model_kwargs
from dit_trainer_mindspore.diffusion import GaussianDiffusion
from dit_trainer_mindspore.model import DiT
from dit_trainer_mindspore.optim import adamw_update, ema_update, zeros_like_params


class MindSporeTrainer:
    """Model, diffusion, optimizer and EMA of one MindSpore training run (one process or msrun DP)."""

    def __init__(self, config, jit=None):
        self.cfg = cfg = mindspore_config(config)
        jit = str(cfg.train.compile).lower() == "true" if jit is None else jit
        if cfg.objective != "diffusion":
            raise ConfigError(f"objective {cfg.objective!r} is not supported with backend mindspore; use diffusion")
        if cfg.train.mixed_precision == "fp16" or cfg.train.grad_accum_steps != 1:
            raise ConfigError("backend mindspore trains in fp32 without accumulation; set train.mixed_precision fp32 "
                              "and train.grad_accum_steps 1")
        if cfg.train.routing_keep < 1:
            raise ConfigError("train.routing_keep < 1 (token routing) is not supported with backend mindspore; set it 1")
        if cfg.train.phema_stds:
            raise ConfigError("train.phema_stds (post-hoc EMA) is not supported with backend mindspore; set it []")
        if cfg.optim.lr_schedule != "constant":
            raise ConfigError(f"optim.lr_schedule {cfg.optim.lr_schedule} is not supported with backend mindspore "
                              "(warmup, then a constant rate); set it constant")
        # bf16 (the config default) has no CPU benefit here: the engine trains in fp32.
        ms.set_context(mode=ms.PYNATIVE_MODE)
        ms.set_seed(cfg.train.seed)
        self.model = DiT(**model_kwargs(cfg), seed=cfg.train.seed)
        if cfg.model.weights_path:
            ckpt.load_weights(self.model, cfg.model.weights_path)
        self.diffusion = GaussianDiffusion.from_config(cfg)
        self.params = ParameterTuple(self.model.trainable_params())
        self.all_params = ParameterTuple(self.model.get_parameters())
        self.exp_avg = zeros_like_params(self.params, "adamw.exp_avg")
        self.exp_avg_sq = zeros_like_params(self.params, "adamw.exp_avg_sq")
        self.ema = ParameterTuple(Parameter(Tensor(p.asnumpy()), name=f"ema.{p.name}", requires_grad=False)
                                  for p in self.all_params)
        self.step = 0
        self.grad_reducer = _grad_reducer(self.params)
        rank, self.dp_size = _dp()
        self.is_main = rank == 0
        self._all_reduce = ops.AllReduce() if self.dp_size > 1 else None
        self._grad_fn = ms.value_and_grad(self._loss, None, self.params)
        self.jit = jit
        # train.compile: graph mode, forward, backward, AdamW and EMA compiled into one graph
        # (bit-identical to PyNative; the first step pays the compile).
        self._step_fn = ms.jit(self._step) if jit else self._step

    # -- one step ------------------------------------------------------------------------

    def draw(self, n, step=None):
        """(t, noise, drop) of a step for a batch of n, from the (seed, step) generator."""
        rng = np.random.default_rng([self.cfg.train.seed, self.step if step is None else step])
        c, s = self.model.in_channels, self.model.input_size
        t = rng.integers(0, self.diffusion.num_timesteps, n)
        noise = rng.standard_normal((n, c, s, s), dtype=np.float32)
        drop = (rng.random(n) < self.cfg.model.class_dropout_prob).astype(np.int32)
        return t, noise, drop

    def _loss(self, x, y, t, noise, drop):
        x_t = self.diffusion.q_sample(x, t, noise)
        out = self.model(x_t, t, y, drop)
        return self.diffusion.training_losses(out, x, t, noise)["loss"].mean()

    def _step(self, x, y, t, noise, drop, scalars):
        """Forward, backward, (all-reduce,) clip, AdamW and EMA: one graph under ms.jit."""
        loss, grads = self._grad_fn(x, y, t, noise, drop)
        grads = self.grad_reducer(grads)
        lr, weight_decay, beta1, beta2, eps, step_size, bc2_sqrt, decay, max_norm = scalars
        if self.cfg.optim.max_grad_norm > 0:
            grads = ops.clip_by_global_norm(grads, max_norm)
        adamw_update(self.params, grads, self.exp_avg, self.exp_avg_sq, lr, weight_decay, beta1, beta2, eps,
                     step_size, bc2_sqrt)
        ema_update(self.ema, self.all_params, decay)
        if self._all_reduce is not None:
            loss = self._all_reduce(loss) / self.dp_size  # the global batch's mean, as one process logs it
        return loss

    def train_step(self, batch, draws=None) -> dict:
        """One AdamW step on (x, y); `draws` = (t, noise, drop) overrides the step's own draws."""
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        x = np.asarray(x.asnumpy() if isinstance(x, Tensor) else x, dtype=np.float32)
        y = np.asarray(y.asnumpy() if isinstance(y, Tensor) else y).astype(np.int32)
        t, noise, drop = draws if draws is not None else self.draw(len(x))
        o = self.cfg.optim
        n = self.step + 1
        lr = self.lr_at(self.step)
        # Host-side scalars in float64, cast once to float32 as torch does with Python scalars.
        # mutable: under ms.jit the values change every step without recompiling the graph.
        scalars = ms.mutable(tuple(Tensor(np.float32(v)) for v in (
            lr, o.weight_decay, o.beta1, o.beta2, o.eps, lr / (1 - o.beta1 ** n), np.sqrt(1 - o.beta2 ** n),
            self.ema_decay_at(n), o.max_grad_norm)))
        self.model.set_train(True)
        loss = self._step_fn(Tensor(x), Tensor(y), Tensor(np.asarray(t, dtype=np.int32)),
                             Tensor(np.asarray(noise, dtype=np.float32)), Tensor(np.asarray(drop, dtype=np.int32)),
                             scalars)
        self.step = n
        return {"loss": float(loss.asnumpy()), "lr": lr}

    def lr_at(self, step):
        """The learning rate of `step` (linear warmup over optim.warmup_steps, as the torch path)."""
        w = self.cfg.optim.warmup_steps
        return self.cfg.optim.lr * (min(1.0, (step + 1) / w) if w > 0 else 1.0)

    def ema_decay_at(self, step):
        """The EMA decay after optimizer step `step` (1-based), with the torch path's optional warmup."""
        d = self.cfg.train.ema_decay
        return min(d, step / (9 + step)) if self.cfg.train.ema_warmup else d

    def ema_weights(self) -> dict:
        """{model name: numpy array} of the EMA."""
        return {p.name[len("ema."):]: p.asnumpy() for p in self.ema}

    # -- checkpoints and the loop ----------------------------------------------------------

    def save_checkpoint(self, path=None):
        """Write `output_dir/checkpoints/step-XXXXXXXX.ckpt` (model, EMA, AdamW moments, step)."""
        path = path or os.path.join(self.cfg.output_dir, "checkpoints", f"step-{self.step:08d}.ckpt")
        return ckpt.save_state(self, path)

    def load_checkpoint(self, path):
        """Resume from a `.ckpt` written by `save_checkpoint`."""
        ckpt.load_state(self, path)

    def train(self) -> dict:
        """Train to `train.max_steps` over `data.path`, resuming from the newest checkpoint."""
        from dit_trainer_mindspore.data import build_dataset, open_source

        cfg = self.cfg
        if not cfg.data.path:
            raise ConfigError("data.path is not set; point it at a latent folder or shard folder")
        from dit_trainer.data.latent_norm import refuse_channel_norm

        refuse_channel_norm(cfg, "backend mindspore")
        latest = ckpt.latest(cfg.output_dir) if cfg.checkpoint.resume else None
        if latest:
            self.load_checkpoint(latest)
        source = open_source(cfg.data.path, cfg.data.labels_file, cfg.data.random_flip, cfg.train.seed)
        rank, size = _dp()
        batch = cfg.train.global_batch_size
        per_epoch = len(source) // batch
        losses = []
        while self.step < cfg.train.max_steps:
            epoch, skip = divmod(self.step, per_epoch)
            for x, y in build_dataset(source, batch, cfg.train.seed, epoch, skip).create_tuple_iterator(output_numpy=True):
                lo = rank * batch // size
                hi = (rank + 1) * batch // size
                t, noise, drop = self.draw(batch)
                out = self.train_step((x[lo:hi], y[lo:hi]), (t[lo:hi], noise[lo:hi], drop[lo:hi]))
                losses.append(out["loss"])
                if self.step % cfg.checkpoint.save_steps == 0 or self.step == cfg.train.max_steps:
                    if rank == 0:
                        self.save_checkpoint()
                if self.step >= cfg.train.max_steps:
                    break
        return {"loss": float(np.mean(losses)) if losses else float("nan"), "step": self.step}


def _dp():
    """(rank, size) under msrun, (0, 1) otherwise."""
    if "MS_WORKER_NUM" not in os.environ and "RANK_SIZE" not in os.environ:
        return 0, 1
    from mindspore.communication import get_group_size, get_rank, init

    global _INITIALISED
    if not _INITIALISED:
        init()
        _INITIALISED = True
    return get_rank(), get_group_size()


_INITIALISED = False


def _grad_reducer(params):
    """Averages gradients over data-parallel workers under msrun; the identity on one process."""
    rank, size = _dp()
    if size == 1:
        return lambda grads: grads
    from mindspore import nn

    return nn.DistributedGradReducer(params, mean=True)
