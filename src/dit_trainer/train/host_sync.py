"""Steps the host does not wait for: the loop's checks with one device sync per log step.

On an accelerator the host queues work ahead of the device, and reading any result of a step
(`loss.item()`, a non-finite flag) makes it wait until the device has finished that step, so
the device idles while the host prepares the next one. With `train.host_sync log` every check
stays on the device: the non-finite flag and the stop request are combined across ranks there
(one all-reduce MAX), a bad step's update is masked there (the fused AdamW's `found_inf`, an EMA
decay of 1), and the flags are copied to host memory without blocking. The host reads a step's
flags during the next step, when they are long done, before that step's update is queued: a
bad step k raises with the weights of step k - 1, as with per-step checks; a stop request is
honoured one step later. The loss is summed on the device and read at log steps.
"""

import math
import warnings

import torch

from dit_trainer.errors import ConfigError, DivergenceError
from dit_trainer.parallel.ema import ema_decay_at

MODES = ("auto", "step", "log")


def optimizer_is_fused(optimizer) -> bool:
    """Whether every parameter group runs the fused kernel (the one that takes `found_inf`)."""
    return all(group.get("fused") for group in optimizer.param_groups)


def resolve_host_sync(mode: str, device: torch.device, optimizer, scaler) -> str:
    """`step` or `log`; auto is `log` on an accelerator with the fused AdamW, where the wait costs."""
    fits = optimizer_is_fused(optimizer) and scaler is None
    if mode == "log" and not fits:
        why = "fp16's GradScaler" if scaler is not None else "the fused AdamW, which this layout does not run"
        raise ConfigError(f"train.host_sync log needs {why}; set train.host_sync step (or auto)")
    if mode == "auto":
        return "log" if fits and device.type != "cpu" else "step"
    return mode


def _clip_and_check(trainer, loss: torch.Tensor, check_norm: bool = True) -> tuple:
    """(gradient norm, clipped to optim.max_grad_norm where set; whether the loss is non-finite; whether the norm is)."""
    clip = trainer.cfg.optim.max_grad_norm
    # Without clipping the norm is still taken (max_norm inf leaves the gradients as they are).
    norm = trainer._clip_grads(clip if clip > 0 else math.inf)
    bad_loss = ~torch.isfinite(loss.detach()).all()
    bad_norm = ~torch.isfinite(norm.detach().to(bad_loss.device)).all() if check_norm else torch.zeros_like(bad_loss)
    return norm, bad_loss, bad_norm


def _agreed_flags(trainer, bad_loss: torch.Tensor, bad_norm: torch.Tensor) -> torch.Tensor:
    """[any rank's loss non-finite, any rank's grad norm non-finite, any rank asked to stop], on the
    device: one all-reduce MAX."""
    signals = trainer._signals
    stop = float(signals is not None and signals.requested is not None)
    flags = torch.stack([bad_loss.float(), bad_norm.float(), torch.full((), stop, device=bad_loss.device)])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    return flags


def _nonfinite(bad_loss: bool, bad_norm: bool, loss=None, norm=None) -> str:
    """Which of loss and grad norm is non-finite, with the values where known (`grad norm inf (loss 9.2e+22)`)."""
    shown = lambda name, v: name if v is None else f"{name} {v:.4g}"  # noqa: E731
    if bad_loss and bad_norm:
        return f"{shown('loss', loss)} and {shown('grad norm', norm)}"
    if bad_norm:
        return shown("grad norm", norm) + ("" if loss is None else f" (loss {loss:.4g})")
    return shown("loss", loss)


def _divergence(trainer, what: str, step: int) -> DivergenceError:
    from dit_trainer.checkpoint import latest_checkpoint

    last = latest_checkpoint(trainer.cfg.output_dir)
    kept = f"{last} is intact" if last else "no checkpoint was written yet"
    return DivergenceError(f"non-finite {what} at step {step}; the update was not applied and {kept}; "
                           "lower optim.lr, set optim.max_grad_norm, or set train.skip_nonfinite_steps true")


def finish_step_now(trainer, loss) -> dict:
    """After backward (train.host_sync step): optimizer with clipping, step count, EMA; floats out.

    A non-finite loss or gradient norm on any rank stops before the optimizer step, so the
    weights (and the last checkpoint) stay good, or skips the update with train.skip_nonfinite_steps.
    """
    cfg = trainer.cfg
    optimizer, scaler = trainer.optimizer, trainer.scaler
    if scaler:
        scaler.unscale_(optimizer)
    # GradScaler skips steps with inf gradients by itself; only the loss is checked then.
    norm, bad_loss, bad_norm = _clip_and_check(trainer, loss, check_norm=not scaler)
    grad_norm = norm if cfg.optim.max_grad_norm > 0 else None
    bad_loss, bad_norm, stop = _agreed_flags(trainer, bad_loss, bad_norm).tolist()
    trainer.stop_requested = stop > 0
    if bad_loss > 0 or bad_norm > 0:
        what = _nonfinite(bad_loss > 0, bad_norm > 0, trainer.dims.all_reduce_mean(loss).item(), float(norm))
        if not cfg.train.skip_nonfinite_steps:
            raise _divergence(trainer, what, trainer.step + 1)
        optimizer.zero_grad(set_to_none=True)
        if scaler:
            scaler.update()
        with warnings.catch_warnings():
            # The schedule follows the step count; torch warns when no optimizer step came first.
            warnings.simplefilter("ignore", UserWarning)
            trainer.lr_scheduler.step()
        trainer.step += 1
        trainer.skipped_steps += 1
        return {"loss": float("nan"), "lr": trainer.lr_scheduler.get_last_lr()[0], "skipped": True}
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    trainer.lr_scheduler.step()
    trainer.step += 1
    trainer.ema.update(ema_decay_at(trainer.step - 1, cfg.train.ema_decay, cfg.train.ema_warmup))
    out = {"loss": trainer.dims.all_reduce_mean(loss).item(), "lr": trainer.lr_scheduler.get_last_lr()[0]}
    if grad_norm is not None:
        out["grad_norm"] = float(grad_norm)
    return out


class DeferredChecks:
    """Device-side loss sum, skip count and flags of the steps since the host last looked."""

    def __init__(self, device: torch.device):
        self.device = device
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        self.ok_steps = torch.zeros((), dtype=torch.float32, device=device)
        self.grad_norm = None
        self._pending = None  # (flags in host memory, event or None, the step they belong to)

    def finish_step(self, trainer, loss: torch.Tensor) -> None:
        """Clip, agree, mask and apply one step's update, queueing no host wait."""
        cfg = trainer.cfg
        norm, bad_loss, bad_norm = _clip_and_check(trainer, loss)
        flags = _agreed_flags(trainer, bad_loss, bad_norm)
        # The previous step's flags are done by now; read them before this step's update is queued.
        self.read_pending(trainer)
        masked = flags[:2].amax()
        trainer.optimizer.found_inf = masked
        try:
            trainer.optimizer.step()
        finally:
            trainer.optimizer.found_inf = None
        with warnings.catch_warnings():
            # The optimizer step came (masked or not); torch cannot tell a masked one from none.
            warnings.simplefilter("ignore", UserWarning)
            trainer.lr_scheduler.step()
        trainer.step += 1
        decay = ema_decay_at(trainer.step - 1, cfg.train.ema_decay, cfg.train.ema_warmup)
        trainer.ema.update(decay, skip=masked)
        self.loss_sum += torch.where(masked > 0, 0.0, loss.detach().float())
        self.ok_steps += 1.0 - masked
        if cfg.optim.max_grad_norm > 0:
            self.grad_norm = norm.detach()
        self._queue(flags, trainer.step)

    def _queue(self, flags: torch.Tensor, step: int) -> None:
        if self.device.type == "cpu":
            self._pending = (flags, None, step)
            return
        host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=self.device.type == "cuda")
        host.copy_(flags, non_blocking=True)
        event = torch.Event(device=self.device)
        event.record()
        self._pending = (host, event, step)

    def read_pending(self, trainer) -> None:
        """Act on the last queued step's flags: raise on divergence, count a skip, note a stop."""
        if self._pending is None:
            return
        host, event, step = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        bad_loss, bad_norm, stop = host.tolist()
        if stop > 0:
            trainer.stop_requested = True
        if bad_loss > 0 or bad_norm > 0:
            if not trainer.cfg.train.skip_nonfinite_steps:
                raise _divergence(trainer, _nonfinite(bad_loss > 0, bad_norm > 0), step)
            trainer.skipped_steps += 1

    def window(self, trainer) -> dict:
        """The loss sums (one per data-parallel rank, in rank order) and good-step count since the
        last flush, for the trainer state; a collective, so every rank calls it."""
        sums, dims = self.loss_sum.reshape(1), trainer.dims
        if dims.dp_size > 1 and dims._mesh is not None:
            gathered = [torch.empty_like(sums) for _ in range(dims.dp_size)]
            torch.distributed.all_gather(gathered, sums, group=dims.dp_mesh.get_group())
            sums = torch.cat(gathered)
        values = torch.cat([sums, self.ok_steps.reshape(1)]).tolist()
        return {"loss_sums": values[:-1], "steps": int(values[-1])}

    def restore(self, sums: list, steps: int, dims) -> None:
        """Continue a window saved by `window`; under another data-parallel size each rank takes the
        mean sum, which flush's mean over ranks gives back up to float rounding."""
        self.loss_sum.fill_(sums[dims.dp_rank] if len(sums) == dims.dp_size else sum(sums) / len(sums))
        self.ok_steps.fill_(steps)

    def flush(self, trainer) -> dict:
        """Read everything (one wait): the mean loss of the good steps since the last flush, the last norm."""
        self.read_pending(trainer)
        loss_sum = trainer.dims.all_reduce_mean(self.loss_sum)
        values = torch.stack([loss_sum, self.ok_steps] + ([self.grad_norm.float()] if self.grad_norm is not None else []))
        values = values.tolist()
        self.loss_sum.zero_()
        self.ok_steps.zero_()
        out = {"loss": values[0] / values[1] if values[1] else float("nan")}
        if len(values) > 2:
            out["grad_norm"] = values[2]
        return out
