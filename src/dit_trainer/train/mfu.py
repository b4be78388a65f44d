"""Model FLOPs utilisation: the model's training FLOPs per second over one device's peak.

The peak is `logging.peak_tflops` when given (a datasheet number, e.g. 989 for an H100 SXM in
dense bf16), else measured once at start-up with large matmuls in the run's dtype. We measure
rather than keep a table of devices: a table goes stale and misses every CPU and most GPUs,
while a measured matmul rate exists everywhere and says how close the run comes to what this
device really sustains (it reads a little higher than datasheet MFU, which nobody reaches).
Measuring costs about a second, so it happens only when `logging.mfu` is on.
"""

import time

import torch


def measure_peak_tflops(device, dtype=None, seconds: float = 0.5) -> float:
    """The best matmul TFLOP/s of `device` in `dtype` (float32 when None) over about `seconds`."""
    dtype = dtype or torch.float32
    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best, deadline = 0.0, time.perf_counter() + seconds
    for _ in range(2):  # warm-up: kernel selection, caches
        a @ b
    while time.perf_counter() < deadline or best == 0.0:
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        _sync(device)
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t0))
    return best / 1e12


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MFUMeter:
    """Turns images per second into achieved TFLOP/s per device and MFU."""

    def __init__(self, flops_per_image: float, world_size: int, peak_tflops: float = 0.0):
        self.flops_per_image = flops_per_image
        self.world_size = max(1, world_size)
        self.peak_tflops = peak_tflops

    def __call__(self, images_per_s: float) -> dict:
        """{"tflops": per-device model TFLOP/s, "mfu": its share of the peak (when a peak is known)}."""
        tflops = self.flops_per_image * images_per_s / self.world_size / 1e12
        out = {"tflops": tflops}
        if self.peak_tflops > 0:
            out["mfu"] = tflops / self.peak_tflops
        return out


def mfu_meter(trainer):
    """An MFUMeter for `trainer` when `logging.mfu` is on and its model counts its FLOPs, else None."""
    cfg = trainer.cfg
    if not cfg.logging.mfu or trainer.flops_per_image is None:
        return None
    peak = cfg.logging.peak_tflops or measure_peak_tflops(trainer.device, trainer.amp_dtype)
    return MFUMeter(trainer.flops_per_image, trainer.dims.world_size, peak)


def peak_memory_gb(device) -> float:
    """Peak GPU memory allocated (CUDA), else the process's peak resident memory, in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    # ru_maxrss is in KiB on Linux: the process's peak resident memory.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
