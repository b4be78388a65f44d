"""Peak tensor memory of one training step, measured by the allocator: what `plan_check.py`
compares with the planner's prediction.

On CUDA it is `torch.cuda.max_memory_allocated` over the step. On a CPU, PyTorch's profiler with
`profile_memory=True` records every allocation and free of the CPU allocator (address and size);
the running sum of the step's own allocations, less those of them freed, peaks at the step's
transient peak (the profiler's "Total Allocated" would also carry blocks a previous profiling
session allocated and left, whose later frees it never saw). The step's peak is that plus the
bytes the trainer holds when the step begins (weights and buffers, EMA, AdamW state: each storage
once, a DTensor by its local shard). Gradients are set to None first, as the trainer's own
`zero_grad(set_to_none=True)` would at the start of the step, so the profiler sees them allocated.
Process baselines (the interpreter, libraries, gloo's own buffers) are not tensors and not counted.
"""

import json
import os
import tempfile

import torch


def trainer_state_bytes(trainer) -> int:
    """Bytes of the distinct storages behind the trainer's weights, buffers, EMA and AdamW state."""
    from dit_trainer.parallel.utils import local

    tensors = [t for part in trainer.model_parts for t in (*part.parameters(), *part.buffers())]
    tensors += list(trainer.ema.state_dict().values())
    tensors += [v for state in trainer.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    storages = {}
    for t in tensors:
        st = local(t).untyped_storage()
        if st.data_ptr():
            storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())


def _profiled_peak(step) -> int:
    """The maximum of what `step()` has allocated and not yet freed, in bytes (CPU allocator)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    live, total, peak = {}, 0, 0
    for e in sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"]):
        addr, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
        if nbytes > 0:
            live[addr] = nbytes
            total += nbytes
            peak = max(peak, total)
        elif addr in live:
            total -= live.pop(addr)
    return peak


def step_peak(trainer, batch) -> dict:
    """{"base", "peak"}: bytes alive when the step starts and at its peak, for one `train_step(batch)`."""
    trainer.optimizer.zero_grad(set_to_none=True)
    device = trainer.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        trainer.train_step(batch)
        torch.cuda.synchronize(device)
        return {"base": base, "peak": torch.cuda.max_memory_allocated(device)}
    base = trainer_state_bytes(trainer)
    return {"base": base, "peak": base + _profiled_peak(lambda: trainer.train_step(batch))}
