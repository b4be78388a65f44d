"""Which device a command runs on."""

from dit_trainer.errors import ConfigError


def resolve_device(name: str, key: str = "train.device"):
    """"auto" picks CUDA when present, else CPU; asking for an absent CUDA device is a one-line error naming `key`."""
    import torch

    from dit_trainer.config.checks import check_device_name

    check_device_name(name, key)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key} is {name!r} but this machine has no usable CUDA device; use auto or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{key} is {name!r} but only {torch.cuda.device_count()} CUDA devices are visible")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key} is {name!r} but MPS is not available here; use auto or cpu")
    return device


def enable_tf32() -> None:
    """TF32 for float32 matmuls and convolutions on CUDA, as DiT's release trains (the fp32 ops
    around autocast, and fp32 runs, take the tensor cores)."""
    import torch

    # The release's spelling. It sets CUDA alone (set_float32_matmul_precision would also switch
    # oneDNN's CPU matmuls), and setting only the new per-backend `fp32_precision` makes readers of
    # the legacy flags (inductor reads `matmul.allow_tf32`) raise "mix of the legacy and new APIs".
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def compile_supported(device) -> bool:
    """Whether torch.compile can run here: dynamo on this platform and, on CPU, a C compiler (inductor writes C++)."""
    import shutil

    import torch

    if not torch._dynamo.is_dynamo_supported():
        return False
    if getattr(device, "type", device) == "cpu":
        return any(shutil.which(cc) for cc in ("cc", "gcc", "clang", "g++", "c++"))
    return True


# `train.compile auto` compiles when the run repays the compile: the first per-block compile of a
# DiT takes about a minute, so short runs stay eager. Here, not in train/, so that the layout
# planner prices the same policy without importing the trainer.
AUTO_COMPILE_MIN_STEPS = 1000

# `auto` compiles only models of this many parameters or more: smaller ones (tests, the digits demo)
# take as long to compile as a big one and gain little per call.
COMPILE_MIN_PARAMS = 10_000_000


def compile_repays(model, device, calls: int, min_calls: int) -> bool:
    """What an `auto` compile decides: compile runs here, the model has 10M+ parameters, `calls` >= `min_calls`."""
    if calls < min_calls or not compile_supported(device):
        return False
    return sum(p.numel() for p in model.parameters()) >= COMPILE_MIN_PARAMS
