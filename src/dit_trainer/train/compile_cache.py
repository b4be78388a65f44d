"""Where compiled blocks are kept between runs: `train.compile_cache`.

torch.compile's work is cached on disk by torch itself (inductor's FX graph cache and
AOTAutograd's cache, the C++/Triton kernels they build), under TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR, by default /tmp/torchinductor_USER and ~/.triton: places a cluster job often
loses at a restart (a per-job /tmp) or shares with every other program. The trainer points both at
one folder per model, torch and device, inside `train.compile_cache` (default: the run folder's
`compile_cache/`, which a restart of the run is sure to find and every rank of a node shares;
inductor writes its entries under temporary names and renames them, so ranks racing on one
entry are safe). A changed model, torch, Python or device gets another folder, so it compiles
afresh; inductor's own keys (graph, input types, configs, torch's source hash, the CPU's vector
ISA) guard within a folder too. Nothing the run compiles is written outside the folder.
"""

import hashlib
import json
import os
import platform
import re
import sys
from pathlib import Path

import torch

from dit_trainer.errors import ConfigError

# The folder under output_dir when `train.compile_cache` is auto.
RUN_FOLDER_NAME = "compile_cache"
# The process-wide variables torch reads where it compiles (set before the first compile).
CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def device_description(device) -> dict:
    """What of `device` a compiled kernel depends on: the GPU's name and capability, or the CPU's model."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return {"type": "cuda", "name": torch.cuda.get_device_name(index),
                "capability": list(torch.cuda.get_device_capability(index)), "cuda": torch.version.cuda}
    if device.type == "cpu":
        return {"type": "cpu", "machine": platform.machine(), "name": cpu_model_name()}
    return {"type": device.type}


def cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo (`lscpu`'s), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_key(model_config: dict, device) -> dict:
    """What a folder of compiled artefacts is keyed by: the model's config, torch, Python and the device."""
    # Weights are no part of a compiled graph: a fine-tune of the same model reuses its kernels.
    model = {k: v for k, v in sorted(model_config.items()) if k != "weights_path"}
    key = {"model": model, "torch": torch.__version__, "python": list(sys.version_info[:2]),
           "device": device_description(device)}
    try:
        import triton  # the GPU kernels' compiler, when there is one

        key["triton"] = triton.__version__
    except ImportError:
        pass
    return key


def cache_folder(root, model_config: dict, device) -> Path:
    """The folder of `root` for this model, torch and device: NAME-HASH, NAME the model's name."""
    key = cache_key(model_config, device)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(model_config.get("name") or "model")).strip("-") or "model"
    return Path(os.path.expanduser(os.fspath(root))) / f"{name}-{digest}"


def resolve_root(setting: str, output_dir):
    """`train.compile_cache` as a folder: auto -> output_dir/compile_cache; off -> None (torch's own place)."""
    choice = str(setting).strip()
    if choice.lower() == "off":
        return None
    if choice.lower() == "auto":
        return Path(output_dir) / RUN_FOLDER_NAME
    return Path(os.path.expanduser(choice))


def use_compile_cache(cfg, device):
    """Point torch's compile caches at this run's folder (before anything compiles); returns it, or None
    when `train.compile_cache` is off."""
    root = resolve_root(cfg.train.compile_cache, cfg.output_dir)
    if root is None:
        return None
    model = cfg.to_dict()["model"]
    folder = cache_folder(root, model, device)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"train.compile_cache: cannot create {folder}: {err.strerror or err}; name a folder this "
                          "user can write, or off") from None
    _record_key(folder, model, device)
    point_torch_at(folder, root / HEADER_FOLDER_NAME)
    return folder


# Beside the keyed folders: inductor's precompiled C++ headers, named by a hash of the compiler, its flags and
# the headers' text, so one copy serves every model.
HEADER_FOLDER_NAME = "precompiled_headers"


def point_torch_at(folder: Path, headers: Path) -> None:
    """Set TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR under `folder`, and inductor's header folder to
    `headers`, for this process."""
    wanted = {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton")}
    if any(os.environ.get(k) != v for k, v in wanted.items()):
        os.environ.update(wanted)
        if "torch._inductor.utils" in sys.modules:
            # A process that compiled elsewhere before (a notebook, a test run) keeps some paths in memory:
            # drop them, as torch's own fresh_cache() does when it switches folders.
            from torch._inductor.utils import clear_caches

            clear_caches()
    from torch._inductor import codecache

    # Inductor puts these in the default folder (/tmp/torchinductor_USER, fixed when it is imported)
    # whatever TORCHINDUCTOR_CACHE_DIR says; torch without them has nothing to redirect.
    if hasattr(codecache, "_HEADER_DIR") and hasattr(codecache, "_HEADER_LOCK_DIR"):
        codecache._HEADER_DIR = str(headers)
        codecache._HEADER_LOCK_DIR = str(headers / "locks")


def _record_key(folder: Path, model: dict, device) -> None:
    """key.json: what the folder is keyed by, for a person deciding what to delete (written once, atomically)."""
    path = folder / "key.json"
    if path.exists():
        return
    tmp = folder / f"key.json.tmp{os.getpid()}"
    try:
        tmp.write_text(json.dumps(cache_key(model, device), indent=1, sort_keys=True, default=str) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a note for people: the cache works without it
