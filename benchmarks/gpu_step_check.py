"""The trainer's step on a GPU: with a step's checks read a step late (the update masked on the
device, what an accelerator runs) it computes what reading them at once computes, a NaN step
raises with the weights of the step before it, and skipping counts the step. Prints STEP CHECK OK
or FAILED (exit 1). `DEVICE=cpu` runs the same check on a CPU, forcing the late path.

    python benchmarks/gpu_step_check.py
"""
import os
import sys
import tempfile

import torch

DEVICE = os.environ.get("DEVICE", "cuda")
ROOT = tempfile.mkdtemp(prefix="gpu_step_check.")  # fresh run folders: nothing to resume
from dit_trainer.errors import DivergenceError
from dit_trainer.train import DiTTrainer

def cfg(out, steps, **train):
    return {"output_dir": out, "model": {"name": "DiT-S/2", "input_size": 8, "in_channels": 4, "num_classes": 10,
            "depth": 2, "hidden_size": 64, "num_heads": 4},
            "train": {"global_batch_size": 8, "max_steps": steps, "device": DEVICE, "mixed_precision": "bf16", **train},
            "optim": {"max_grad_norm": 1.0}, "checkpoint": {"save_steps": 1000},
            "logging": {"log_steps": 4, "progress": False, "tensorboard": False}}

g = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, 4, 8, 8, generator=g), torch.arange(8) % 10) for _ in range(12)]
class Feed:
    def __init__(self, b): self.b, self.i = b, 0
    def __next__(self): self.i += 1; return self.b[self.i - 1]
    def state_dict(self): return {}
    def load_state_dict(self, s): pass

res = {}
for mode in ("late", "now"):
    t = DiTTrainer(cfg(f"{ROOT}/{mode}", 12), dataset=[(b[0][0], b[1][0]) for b in batches])
    assert t.update.on_device == (DEVICE != "cpu")  # what the device decides
    t.update.on_device = mode == "late"
    print(mode, "on_device", t.update.on_device, "fused", t.optimizer.param_groups[0]["fused"])
    t.loader = Feed(batches)
    last = t.train()
    res[mode] = (last["loss"], [p.detach().float().cpu() for p in t.model.parameters()])
print("loss late/now", res["late"][0], res["now"][0])
maxdiff = max(float((a - b).abs().max()) for a, b in zip(res["late"][1], res["now"][1]))
print("max weight difference late vs now:", maxdiff)
ok = abs(res["late"][0] - res["now"][0]) <= 1e-5 * abs(res["now"][0]) and maxdiff == 0.0

bad = [(x.clone(), y) for x, y in batches]; bad[4][0][0, 0, 0, 0] = float("nan")
ref = DiTTrainer(cfg(f"{ROOT}/ref", 4), dataset=[(b[0][0], b[1][0]) for b in batches]); ref.loader = Feed(bad); ref.train()
t = DiTTrainer(cfg(f"{ROOT}/bad", 12), dataset=[(b[0][0], b[1][0]) for b in batches]); t.loader = Feed(bad)
try:
    t.train(); print("NO DIVERGENCE RAISED"); ok = False
except DivergenceError as e:
    print("raised:", str(e)[:90])
    same = all(torch.equal(a, b) for a, b in zip(ref.model.parameters(), t.model.parameters()))
    print("weights equal to step 4's:", same); ok = ok and "at step 5" in str(e) and same
t = DiTTrainer(cfg(f"{ROOT}/skip", 8, skip_nonfinite_steps=True), dataset=[(b[0][0], b[1][0]) for b in batches]); t.loader = Feed(bad)
t.train(); print("skipped", t.skipped_steps); ok = ok and t.skipped_steps == 1
print("STEP CHECK", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
