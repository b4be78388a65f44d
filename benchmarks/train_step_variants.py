"""The rows of benchmarks/train_step.py: variant names, the trainer config each stands for, and the
baseline, facebookresearch/DiT's training loop.

A variant is a precision (fp32 | bf16 | fp16) with optional modifiers: "+compile" (`train.compile`:
per-block `torch.compile`), "+ac"/"+sac" (`train.activation_checkpointing full/selective`),
"+budgetX" (`train.activation_memory_budget X`; "+budget1" undoes the budget), "+sysmalloc"
(`train.keep_freed_memory false`: glibc's malloc unmaps freed large blocks and page-faults them back
every step; process-wide, so such a row is timed in a fresh process and every other trainer row
keeps freed memory), and three that undo
one speed change each: "+flash" (PyTorch's SDPA kernel instead of the CPU bf16 matmul attention),
"+loopadam" (AdamW's per-parameter loop instead of the fused kernel) and "+tanhgelu" (compiled
graphs keep GELU's tanh instead of its sigmoid form). The default list adds the changes one at a
time: bf16+flash+loopadam, bf16+flash, bf16, bf16+compile+tanhgelu+budget1, bf16+compile+budget1,
bf16+compile+sysmalloc, bf16+compile (what a run of 1,000+ steps of a 10M+ parameter model does by default), then
bf16+compile+sac. On a CPU without native bf16 (AVX2 only: bf16 matmuls are emulated, ~100x
slower than fp32) the trainer computes in fp32, so the list is the same steps in fp32, without
orig-bf16 and +flash, and the bf16 peak is only sampled at n=512. `orig-fp32` and `orig-bf16` are
the baseline: facebookresearch/DiT's training loop as its train.py writes it (plain model,
`training_losses` drawing t and noise inside, attention through PyTorch's SDPA as timm's `Attention`
computes it, AdamW, EMA by a loop over named parameters), the
second under one `torch.autocast(bfloat16)` around the forward and loss, as a user would add it.
Every row is also given as a ratio to both baselines when they ran.
"""

import contextlib
import os
import tempfile
import time

import torch

EMULATED_BF16 = "DIT_BENCH_EMULATED_BF16"  # set by benchmarks/peak_memory.py --emulated-bf16
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def default_variants(has_bf16: bool, fp32: bool, ac: bool) -> list[str]:
    """The rows a plain run prints: both baselines, then the trainer's changes added one at a time."""
    if not has_bf16:
        # The default config runs fp32 here; +flash undoes nothing in fp32 (SDPA is its kernel anyway).
        return (["orig-fp32", "fp32+loopadam", "fp32", "fp32+compile+tanhgelu+budget1", "fp32+compile+budget1",
                 "fp32+compile+sysmalloc", "fp32+compile", "fp32+compile+sac"] + ["fp32+compile+ac"] * ac)
    return (["orig-fp32", "orig-bf16", "bf16+flash+loopadam", "bf16+flash", "bf16",
             "bf16+compile+tanhgelu+budget1", "bf16+compile+budget1", "bf16+compile+sysmalloc", "bf16+compile",
             "bf16+compile+sac"]
            + ["fp32"] * fp32 + ["bf16+compile+ac"] * ac)


def parse_variant(name: str) -> dict:
    """A variant name as the precision, compile/AC settings and undone changes it stands for."""
    if name in ("orig-fp32", "orig-bf16"):
        # The release's Attention is timm's, which calls F.scaled_dot_product_attention: so does the baseline.
        return {"name": name, "precision": name[5:], "compile": False, "ac": False, "original": True, "flash": True}
    precision, *mods = name.split("+")
    budgets = [m[len("budget"):] for m in mods if m.startswith("budget")]
    mods = [m for m in mods if not m.startswith("budget")]
    if (precision not in DTYPES or any(m not in MODIFIERS for m in mods) or ("ac" in mods and "sac" in mods)
            or len(budgets) > 1 or not all(_is_fraction(b) for b in budgets)):
        raise SystemExit(f"bad variant {name!r}: want fp32|bf16|fp16 optionally followed by +" + ", +".join(MODIFIERS))
    return {"name": name, "precision": precision, "compile": "compile" in mods,
            "ac": "full" if "ac" in mods else "selective" if "sac" in mods else False,
            "flash": "flash" in mods, "loopadam": "loopadam" in mods, "tanhgelu": "tanhgelu" in mods,
            "sysmalloc": "sysmalloc" in mods,
            "budget": float(budgets[0]) if budgets else None}


def _is_fraction(text: str) -> bool:
    try:
        return 0 < float(text) <= 1
    except ValueError:
        return False


# Variant modifiers. The last three undo one of the trainer's speed changes each, so that a row per
# change shows what it contributed: the CPU bf16 matmul attention (models/attention.py), fused AdamW
# and the sigmoid-form GELU of compiled graphs (models/layers.py); +budget1 undoes the memory change,
# the activation budget of compiled blocks (train.activation_memory_budget).
MODIFIERS = {
    "compile": "train.compile true (per-block torch.compile)",
    "ac": "train.activation_checkpointing full",
    "sac": "train.activation_checkpointing selective",
    "flash": "PyTorch's fused SDPA kernel instead of the CPU reduced-precision matmul attention",
    "loopadam": "AdamW's per-parameter loop instead of the fused kernel",
    "tanhgelu": "GELU's tanh form in compiled graphs instead of the sigmoid form (models/layers.py)",
    "budgetX": "train.activation_memory_budget X, e.g. +budget1: compiled blocks keep every activation inductor would",
    "sysmalloc": "train.keep_freed_memory false: glibc's malloc as it comes (timed in a fresh process: the setting is process-wide)",
}


@contextlib.contextmanager
def undone_changes(variant):
    """+flash (and the orig-* baselines) route attention to SDPA, +tanhgelu keeps GELU's tanh form
    in compiled graphs, while the variant is built and run."""
    import dit_trainer.models.attention as attention
    import dit_trainer.models.layers as layers

    keep = attention.use_matmul_kernel, layers.use_sigmoid_gelu
    if variant.get("flash"):
        attention.use_matmul_kernel = lambda q: False
    if variant.get("tanhgelu"):
        layers.use_sigmoid_gelu = lambda: False
    try:
        yield
    finally:
        attention.use_matmul_kernel, layers.use_sigmoid_gelu = keep


def make_config(args, variant: dict) -> dict:
    model = {"name": args.model, "input_size": args.input_size, "in_channels": args.in_channels,
             "num_classes": args.num_classes}
    for key in ("depth", "hidden_size", "num_heads"):
        if getattr(args, key) is not None:
            model[key] = getattr(args, key)
    for item in args.model_option or []:
        key, _, value = item.partition("=")
        model[key] = value
    return {
        "output_dir": os.path.join(tempfile.gettempdir(), "dit-bench-train-step"),
        "model": model,
        "data": {"num_workers": 0},
        "train": {
            "global_batch_size": args.batch_size,
            "device": args.device,
            "mixed_precision": variant["precision"],
            "compile": variant["compile"],
            "activation_checkpointing": variant["ac"] or "none",
            **({"activation_memory_budget": variant["budget"]} if variant.get("budget") else {}),
            "keep_freed_memory": not variant.get("sysmalloc"),
        },
        "logging": {"progress": False, "tensorboard": False},
    }


def make_batch(args, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, args.in_channels, args.input_size, args.input_size, generator=g)
    y = torch.randint(0, args.num_classes, (args.batch_size,), generator=g)
    return x.to(device), y.to(device)



class OriginalLoop:
    """facebookresearch/DiT's train.py step: the baseline every variant is compared with."""

    def __init__(self, args, variant, device):
        import copy
        from collections import OrderedDict

        from dit_trainer.config import config_from_dict
        from dit_trainer.diffusion import create_diffusion
        from dit_trainer.models import get_spec

        cfg = config_from_dict(make_config(args, variant))
        torch.manual_seed(0)
        self.model = get_spec(cfg.model.name).build_model_fn(cfg).to(device)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self.diffusion = create_diffusion(timestep_respacing="")
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0)
        self.device = device
        self.amp_dtype = torch.bfloat16 if variant["precision"] == "bf16" else None
        self._od = OrderedDict

    @torch.no_grad()
    def update_ema(self, decay=0.9999):
        ema_params = self._od(self.ema.named_parameters())
        for name, param in self._od(self.model.named_parameters()).items():
            ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)

    def train_step(self, batch):
        x, y = batch
        self.model.train()
        t = torch.randint(0, self.diffusion.num_timesteps, (x.shape[0],), device=self.device)
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            loss = self.diffusion.training_losses(self.model, x, t, dict(y=y))["loss"].mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.update_ema()
        return {"loss": loss.item()}


def build_trainer(args, variant):
    if variant.get("original"):
        return OriginalLoop(args, variant, torch.device(args.device))
    from dit_trainer.train import DiTTrainer

    if os.environ.get(EMULATED_BF16) == "1":
        # benchmarks/peak_memory.py --emulated-bf16: the trainer would fall back to fp32 without
        # native bf16; for memory, only the dtypes of the tensors matter, not how fast they are made.
        import dit_trainer.train.trainer as trainer_module

        trainer_module.resolve_amp_dtype = lambda precision, device: DTYPES[precision] if precision != "fp32" else None
    trainer = DiTTrainer(make_config(args, variant))
    if variant.get("loopadam"):
        for group in trainer.optimizer.param_groups:
            group["fused"], group["foreach"] = False, False
    return trainer


# -- what both timing loops (one variant at a time, interleaved) share ------------------------


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(args, variant: dict, trainer, batch, device) -> list[float]:
    """The untimed first steps, at least 2 with compile (it happens in them); their times are printed:
    they show the compile and, on a CPU, the page-fault transient."""
    times = []
    for _ in range(max(args.warmup, 2) if variant["compile"] else args.warmup):
        t0 = time.perf_counter()
        trainer.train_step(batch)
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def new_row(variant: dict, trainer, warm_times: list[float]) -> dict:
    """A variant's row before its timed steps: the dtype its matmuls run in and its size."""
    return {"variant": variant["name"], "times": [], "warm_times": warm_times,
            # bf16 falls back to fp32 without native support
            "compute": DTYPE_NAMES.get(trainer.amp_dtype, "fp32"),
            "params": sum(p.numel() for p in trainer.model.parameters())}
