"""Where training numbers go: console, `metrics.jsonl`, TensorBoard when installed, and
Weights & Biases when asked (`logging.wandb`)."""

import json
import math
import warnings
from pathlib import Path

from dit_trainer.errors import DataError
from dit_trainer.fs import check_regular


class MetricsLogger:
    """Writes one JSON object per logged step; only the main process should own one."""

    def __init__(self, output_dir, tensorboard=True, enabled=True, wandb=None):
        """`wandb`: None, or the keyword arguments of `WandbSink` (project, config)."""
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        check_regular(self.path, DataError, "the run's metrics")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if wandb is not None:
            from dit_trainer.train.wandb_sink import WandbSink

            self._wandb = WandbSink(output_dir, **wandb)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(Path(output_dir) / "tensorboard"))
            except ImportError:
                warnings.warn("tensorboard is not installed (pip install dit-trainer[tensorboard]); logging to metrics.jsonl only")

    def log(self, step: int, values: dict) -> None:
        """Append `values` for `step` to every sink."""
        if not self.enabled:
            return
        self.note(step, values)
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(f"train/{k}", v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(step, values)

    def note(self, step: int, values: dict) -> None:
        """Append `values` for `step` to metrics.jsonl only: an event (a resume), not a curve to plot."""
        if not self.enabled:
            return
        # NaN and inf are not JSON (strict readers refuse `"loss": NaN`): they are written as null.
        record = {"step": step, **{k: None if isinstance(v, float) and not math.isfinite(v) else v
                                   for k, v in values.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")

    def log_image(self, step: int, tag: str, path) -> None:
        """A sample grid (PNG at `path`) beside the scalars, in TensorBoard and W&B."""
        if not self.enabled:
            return
        if self._tb is not None:
            import numpy as np
            from PIL import Image

            with Image.open(path) as im:
                self._tb.add_image(tag, np.asarray(im.convert("RGB")), step, dataformats="HWC")
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log_image(step, tag, path)

    def truncate_after(self, step: int) -> None:
        """Drop records past `step`, so a resumed run does not log steps twice."""
        if not self.enabled or not self.path.exists():
            return
        kept = [json.dumps(r) for r in _records(self.path) if r.get("step", 0) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.close()


def _records(path) -> list[dict]:
    # A kill during a write leaves a half line: records that do not parse are dropped, not fatal.
    out = []
    check_regular(path, DataError, "a metrics file")
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def read_metrics(path) -> list[dict]:
    """All complete records of a `metrics.jsonl` (a half-written last line is skipped)."""
    return _records(path)


def metrics_line(window: dict, lr: float, steps: int, elapsed: float, global_batch: int, device, skipped: int,
                 mfu=None) -> dict:
    """One metrics.jsonl record: the loss window's mean (and grad norm), lr, throughput, peak memory,
    skipped steps when any, and TFLOP/s and MFU when `mfu` (an MFUMeter) is given."""
    from dit_trainer.train.mfu import peak_memory_gb

    line = {"loss": window["loss"], "lr": lr, "img_per_s": steps * global_batch / max(elapsed, 1e-9),
            "s_per_step": elapsed / max(steps, 1), "peak_mem_gb": peak_memory_gb(device)}
    if "grad_norm" in window:
        line["grad_norm"] = window["grad_norm"]
    if skipped:
        line["skipped_steps"] = skipped
    if mfu is not None:
        line.update(mfu(line["img_per_s"]))
    return line


def console_line(step: int, line: dict) -> str:
    """The console's view of a metrics record."""
    extra = f"  mfu {line['mfu']:.1%}" if "mfu" in line else ""
    if "repa_loss" in line:
        extra = f"  repa {line['repa_loss']:.4f}{extra}"
    return (f"step {step:7d}  loss {line['loss']:.4f}  {line['img_per_s']:.1f} img/s  "
            f"{line['s_per_step']:.3f} s/step  peak {line['peak_mem_gb']:.2f} GB{extra}")
