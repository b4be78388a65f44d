"""The end of every training step: clip, agree across ranks, then update or not, and the loss
kept for the next metrics line.

One path for every device. The non-finite flags (loss, gradient norm) and the stop request are
combined across ranks on the device (one all-reduce MAX). Where the optimizer can mask a step on
the device (the fused AdamW's `found_inf`, on an accelerator) the host does not wait for them: a
bad step's update is masked there (an EMA weight of 0 too) and the host reads the flags during
the next step, before that step's update is queued, so a bad step k still raises with the
weights of step k - 1. Elsewhere (a CPU, a GradScaler, a layout without the fused kernel) the host
reads them at once, before the update, which it then applies or skips. Either way a non-finite
step is never applied, a divergence raises naming the step, and every rank stops at the same one.
"""

import math
import warnings

import torch

from dit_trainer.errors import DivergenceError
from dit_trainer.parallel.ema import ema_decay_at


def masks_on_device(device: torch.device, optimizer, scaler) -> bool:
    """Whether a bad step can be masked on the device, so the host need not wait for each step's flags:
    an accelerator, every parameter group on the fused AdamW (the kernel that takes `found_inf`), no GradScaler."""
    fused = all(group.get("fused") for group in optimizer.param_groups)
    return device.type != "cpu" and fused and scaler is None


def describe_nonfinite(bad_loss: bool, bad_norm: bool, loss=None, norm=None) -> str:
    """Which of loss and grad norm is non-finite, with the values where known (`grad norm inf (loss 9.2e+22)`)."""
    shown = lambda name, v: name if v is None else f"{name} {v:.4g}"  # noqa: E731
    if bad_loss and bad_norm:
        return f"{shown('loss', loss)} and {shown('grad norm', norm)}"
    if bad_norm:
        return shown("grad norm", norm) + ("" if loss is None else f" (loss {loss:.4g})")
    return shown("loss", loss)


class LossWindow:
    """The loss summed on the device over the good steps since the last metrics line, per rank."""

    def __init__(self, device: torch.device):
        # float64: summing a thousand float32 losses keeps every bit of each.
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.ok_steps = torch.zeros((), dtype=torch.float64, device=device)
        self.grad_norm = None

    def add(self, loss: torch.Tensor, masked=None) -> None:
        """Count one step's (rank-local) loss; a step `masked` on the device counts for nothing."""
        loss = loss.detach().double()
        if masked is None:
            self.loss_sum += loss
            self.ok_steps += 1.0
        else:
            self.loss_sum += torch.where(masked > 0, 0.0, loss)
            self.ok_steps += 1.0 - masked.double()

    def read(self, dims) -> dict:
        """The mean loss over ranks and good steps since the last read, and the last grad norm (one host wait); resets."""
        loss_sum = dims.all_reduce_mean(self.loss_sum)
        values = [loss_sum, self.ok_steps] + ([self.grad_norm.double()] if self.grad_norm is not None else [])
        values = torch.stack(values).tolist()
        self.loss_sum.zero_()
        self.ok_steps.zero_()
        out = {"loss": values[0] / values[1] if values[1] else float("nan")}
        if len(values) > 2:
            out["grad_norm"] = values[2]
        return out

    def state(self, dims) -> dict:
        """The loss sums (one per data-parallel rank, in rank order) and good-step count, for a resume;
        a collective, so every rank calls it."""
        sums = dims.all_gather_dp(self.loss_sum.reshape(1))
        values = torch.cat([sums, self.ok_steps.reshape(1)]).tolist()
        return {"loss_sums": values[:-1], "steps": int(values[-1])}

    def restore(self, state: dict, dims) -> None:
        """Continue a window saved by `state`; under another data-parallel size each rank takes the
        mean sum, which `read`'s mean over ranks gives back up to rounding."""
        sums = list(state["loss_sums"])
        self.loss_sum.fill_(sums[dims.dp_rank] if len(sums) == dims.dp_size else sum(sums) / len(sums))
        self.ok_steps.fill_(int(state["steps"]))


class GuardedUpdate:
    """Clip, check, update (or skip) and average one step; counts skipped steps and stop requests.

    Its state is its own: read through `skipped_steps`, `stop_requested`, `last_grad_norm()` and
    `read_losses()`, saved and restored through `state_dict()` / `load_state_dict()`."""

    def __init__(self, optimizer, lr_scheduler, scaler, ema, clip_fn, dims, device, optim_cfg, train_cfg,
                 describe_kept, phema=None):
        """`clip_fn(max_norm)` clips every gradient and returns the norm; `describe_kept()` says which
        checkpoint a divergence leaves intact (for its message); `phema`: the post-hoc EMA profiles
        (`phema.PowerEMA`), updated and skipped exactly where the EMA is, or None."""
        self.optimizer, self.lr_scheduler, self.scaler, self.ema = optimizer, lr_scheduler, scaler, ema
        self.phema = phema
        self.clip_fn, self.dims, self.device = clip_fn, dims, device
        self.max_grad_norm = optim_cfg.max_grad_norm
        self.skip_nonfinite = train_cfg.skip_nonfinite_steps
        self.ema_decay, self.ema_warmup = train_cfg.ema_decay, train_cfg.ema_warmup
        self.describe_kept = describe_kept
        # Whether a bad update is masked on the device and its flags read a step later (they can be
        # on a CPU too, with the fused AdamW; that is how the tests follow the accelerators' path).
        self.on_device = masks_on_device(device, optimizer, scaler)
        self._window = LossWindow(device)
        self._skipped = 0
        self._stop_agreed = False
        self._pending = None  # (flags in host memory, event or None, the step they belong to)

    @property
    def skipped_steps(self) -> int:
        """Updates skipped for a non-finite loss or grad norm (train.skip_nonfinite_steps)."""
        return self._skipped

    @property
    def stop_requested(self) -> bool:
        """Whether every rank agreed to stop after the step that asked (as far as the flags were read)."""
        return self._stop_agreed

    def clear_stop(self) -> None:
        """Forget an earlier agreed stop (a new `train()` begins)."""
        self._stop_agreed = False

    def last_grad_norm(self):
        """The last step's gradient norm (a device tensor) when clipping, else None."""
        return self._window.grad_norm

    def read_losses(self) -> dict:
        """Act on pending flags, then the mean loss since the last read and the last grad norm (one host
        wait, a collective); starts the next window."""
        self.read_pending()
        return self._window.read(self.dims)

    def state_dict(self) -> dict:
        """The skip count and the loss window, for a resume (a collective: every rank calls it)."""
        # A resume then logs the next line over the same steps as an uninterrupted run.
        return {"skipped_steps": self._skipped, "log_window": self._window.state(self.dims)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` saved (older checkpoints have no window: it restarts empty)."""
        self._skipped = int(state.get("skipped_steps", 0))
        if state.get("log_window"):
            self._window.restore(state["log_window"], self.dims)

    def apply_or_skip(self, loss: torch.Tensor, stop: bool, done: int) -> bool:
        """Finish step `done + 1`, whose gradients are accumulated; `stop`: this rank was asked to stop.
        Returns whether the update was applied (True where the flags are read later)."""
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        # Without clipping the norm is still taken (max_norm inf leaves the gradients as they are).
        norm = self.clip_fn(self.max_grad_norm if self.max_grad_norm > 0 else math.inf)
        bad_loss = ~torch.isfinite(loss.detach()).all()
        # GradScaler skips steps with inf gradients by itself; only the loss is checked then.
        bad_norm = torch.zeros_like(bad_loss) if self.scaler else ~torch.isfinite(norm.detach().to(bad_loss.device)).all()
        flags = torch.stack([bad_loss.float(), bad_norm.float(), torch.full((), float(stop), device=bad_loss.device)])
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        if self.max_grad_norm > 0:
            self._window.grad_norm = norm.detach()
        decay = ema_decay_at(done, self.ema_decay, self.ema_warmup)
        if self.on_device:
            # The previous step's flags are done by now; read them before this step's update is queued.
            self.read_pending()
            masked = flags[:2].amax()
            self.optimizer.found_inf = masked
            try:
                self.optimizer.step()
            finally:
                self.optimizer.found_inf = None
            self._schedule_step()
            self.ema.update(decay, skip=masked)
            if self.phema is not None:
                self.phema.update(done + 1, skip=masked)
            self._window.add(loss, masked)
            self._queue(flags, done + 1)
            return True
        bad_loss, bad_norm, stop = flags.tolist()
        self._stop_agreed = self._stop_agreed or stop > 0
        if bad_loss > 0 or bad_norm > 0:
            what = describe_nonfinite(bad_loss > 0, bad_norm > 0, self.dims.all_reduce_mean(loss).item(), float(norm))
            self._skip(what, done + 1)
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler:
                self.scaler.update()
            self._schedule_step()
            return False
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self._schedule_step()
        self.ema.update(decay)
        if self.phema is not None:
            self.phema.update(done + 1)
        self._window.add(loss)
        return True

    def _schedule_step(self) -> None:
        with warnings.catch_warnings():
            # After a masked or skipped update torch warns that no optimizer step came first; the
            # schedule follows the step count regardless.
            warnings.simplefilter("ignore", UserWarning)
            self.lr_scheduler.step()

    def _skip(self, what: str, step: int) -> None:
        """A non-finite step: raise, or count it skipped with train.skip_nonfinite_steps."""
        if not self.skip_nonfinite:
            raise DivergenceError(
                f"non-finite {what} at step {step}; the update was not applied and {self.describe_kept()}; "
                "lower optim.lr, set optim.max_grad_norm, or set train.skip_nonfinite_steps true")
        self._skipped += 1

    def _queue(self, flags: torch.Tensor, step: int) -> None:
        if self.device.type == "cpu":
            self._pending = (flags, None, step)
            return
        host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=self.device.type == "cuda")
        host.copy_(flags, non_blocking=True)
        event = torch.Event(device=self.device)
        event.record()
        self._pending = (host, event, step)

    def read_pending(self) -> None:
        """Act on the last masked step's flags (where they are read late): raise on divergence, count
        a skip, note a stop."""
        if self._pending is None:
            return
        host, event, step = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        bad_loss, bad_norm, stop = host.tolist()
        self._stop_agreed = self._stop_agreed or stop > 0
        if bad_loss > 0 or bad_norm > 0:
            self._skip(describe_nonfinite(bad_loss > 0, bad_norm > 0), step)
