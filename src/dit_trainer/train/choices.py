"""What the trainer decides from the config and the device: the `auto` keys (layout, compile),
the autocast dtype and the AdamW kernel."""

import torch

from dit_trainer.devices import AUTO_COMPILE_MIN_STEPS, compile_repays
from dit_trainer.errors import ConfigError


class RuntimeChoices:
    """`build_config`'s runtime step: `parallel.layout auto` and `train.compile auto` become what this
    machine and world size get, so the checked config is final and the run folder's config.yaml
    (and a resume) says what ran."""

    def __call__(self, cfg) -> None:
        """Write the decisions into `cfg` (called once, before the config's last check)."""
        from dit_trainer.devices import resolve_device
        from dit_trainer.models import get_spec
        from dit_trainer.plan import apply_auto_layout

        if cfg.parallel.layout == "auto":  # dit plan's fastest layout that fits this world size
            apply_auto_layout(cfg)
        if str(cfg.train.compile).lower() == "auto":
            spec = get_spec(cfg.model.name)
            with torch.device("meta"):  # only its parameter count is read: no memory, no init
                model = spec.build_model_fn(cfg)
            compiled = resolve_compile(cfg, model, resolve_device(cfg.train.device), spec.parallelize_fn is not None)
            cfg.train.compile = "true" if compiled else "false"


def resolve_amp_dtype(name: str, device: torch.device):
    """The autocast dtype for `train.mixed_precision`, or None for fp32."""
    if name == "fp32":
        return None
    if name == "bf16":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        # Without native bf16 (AVX512-BF16/AMX) autocast on CPU is slower than fp32: fall back.
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None
    if name == "fp16":
        if device.type != "cuda":
            raise ConfigError("train.mixed_precision fp16 needs a CUDA device; use bf16 or fp32 on CPU")
        return torch.float16
    raise ConfigError(f"train.mixed_precision {name!r} is not one of bf16, fp16, fp32")


def fused_adamw(device: torch.device, params, sharded: bool):
    """AdamW's `fused` argument: True where the fused kernel runs, else None (torch's default).

    On one process the fused kernel always runs: on CPU the default per-parameter loop costs as
    much as a DiT-S step's backward. On CUDA it also runs on DDP's plain and FSDP's DTensor
    parameters (what torchtitan does), and it is what lets the trainer mask a bad
    step on the device. A mix of DTensor and plain parameters (TP leaves the embedders whole)
    fits no multi-tensor kernel; gloo layouts on CPU keep the default, which they were tested with.
    The choice depends on the layout only, so every rank's optimizer state has one form.
    """
    from dit_trainer.parallel.utils import is_dtensor

    if not sharded:
        return True
    kinds = {is_dtensor(p) for p in params}
    return True if device.type == "cuda" and len(kinds) == 1 else None



def resolve_compile(cfg, model, device: torch.device, has_plan: bool) -> bool:
    """`train.compile` as a decision: true/false as given; auto by run length, model size and platform."""
    choice = str(cfg.train.compile).lower()
    if choice != "auto":
        return choice == "true"
    return has_plan and compile_repays(model, device, cfg.train.max_steps, AUTO_COMPILE_MIN_STEPS)


def gathered_dtype(objective, amp_dtype):
    """The dtype FSDP gathers weights in: float32 where `objective` runs float32 calls inside the run's autocast
    (which casts them for its other calls) or the run is float32, else the run's mixed-precision dtype."""
    return torch.float32 if objective.float32_calls or amp_dtype is None else amp_dtype
