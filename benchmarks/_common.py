"""What more than one benchmark script needs: device sync, peak memory, the machine line of a header
and a markdown table. The scripts run as `python benchmarks/NAME.py`, which puts this folder on sys.path."""

import os
import platform

import torch


def sync(device) -> None:
    """Wait for the device's queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def vm_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MiB; NaN where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def peak_mib(device) -> float:
    """The peak CUDA allocation on a GPU, the process's peak RSS (VmHWM) on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return vm_mib("VmHWM")


def machine(device) -> str:
    """The device's name, the CPU count and torch threads, and the load average."""
    name = platform.processor() or platform.machine()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (f"device {device.type} ({name})  {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads  "
            f"loadavg {load} (1/5/15 min)")


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table, the first column left-aligned and the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if i else ":" + "-" * (w + 1) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])
