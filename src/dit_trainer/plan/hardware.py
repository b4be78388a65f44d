"""Hardware profiles the planner prices layouts with: compute rates, memory, links.

Built-in profiles live in `profiles/*.yaml` (`--hardware h100|h200|a100|cpu`); `cpu.yaml` and any
measured profile are written by `benchmarks/hardware_profile.py`, which measures the machine it
runs on. `--hardware FILE.yaml` reads another.
"""

from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from dit_trainer.errors import ConfigError

PROFILES = Path(__file__).with_name("profiles")
ELEMENTWISE_CLASSES = ("pointwise", "norm", "act", "softmax")


@dataclass(frozen=True)
class Hardware:
    """One device type and its links; rates are per device (per process on a CPU)."""

    name: str
    device: str = "cuda"  # cuda | cpu: a CPU computes bf16 attention with matmuls (models/attention.py)
    bf16_tflops: float = 989.0  # dense bf16 matmul peak of one device
    matmul_efficiency: float = 0.5  # share of that peak a DiT block's matmuls sustain at many tokens
    matmul_half_tokens: float = 0.0  # tokens per matmul at which it runs at half that efficiency
    memory_gib: float = 80.0  # device memory
    memory_reserved_gib: float = 2.0  # what the runtime holds beside the tensors (CUDA context, NCCL)
    memory_bandwidth_gbs: float = 3350.0
    elementwise_gelem_s: dict = field(default_factory=dict)  # op class -> forward+backward elements/s
    compiled_elementwise: float = 0.15  # share of the elementwise time left when blocks are compiled
    optimizer_s_per_param: float = 1.3e-11  # AdamW + EMA + gradient norm per local parameter, fused
    loop_optimizer_s_per_tensor: float = 0.0  # AdamW's per-parameter loop (CPU, several processes), per tensor
    loop_optimizer_s_per_param: float = 0.0  # ... and per parameter
    intra_node_gbs: float = 360.0  # bus bandwidth of a collective inside a node, per device
    inter_node_gbs: float = 45.0  # across nodes, per device
    link_latency_us: float = 15.0  # per collective or send
    crowded_latency_us: float = 0.0  # the same with more processes than `cores` (0: as link_latency_us)
    tp_module_overhead_s: float = 0.0  # host time a tensor-parallel layer adds per forward+backward (DTensor)
    fsdp_block_overhead_s: float = 0.0  # host time FSDP adds per wrapped block per forward+backward (hooks, copies)
    step_overhead_s: float = 0.035  # per optimizer step: host work, synchronisation
    microbatch_overhead_s: float = 0.0  # per forward+backward of a micro-batch: launches, Python
    overlap: bool = True  # communication runs beside compute (CUDA streams); a CPU's cores do both
    cores: int = 0  # cores the processes of one node share, one thread each (0: a device per process)
    source: str = ""  # where the numbers come from

    def matmul_rate(self, tokens: float, act_bytes: int = 2) -> float:
        """FLOP/s of a block's matmuls over `tokens` rows (float32 at half the bf16 rate)."""
        rate = self.bf16_tflops * 1e12 * self.matmul_efficiency / (2 if act_bytes == 4 else 1)
        return rate * tokens / (tokens + self.matmul_half_tokens)

    def elementwise_rate(self, kind: str) -> float:
        """Elements per second, forward and backward, of one op class."""
        return self.elementwise_gelem_s[kind] * 1e9

    def to_yaml(self) -> str:
        """The profile as YAML that `load_hardware` reads back."""
        return yaml.safe_dump({f.name: getattr(self, f.name) for f in fields(self)}, sort_keys=False)


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def load_hardware(name_or_path) -> Hardware:
    """A built-in profile by name (`h100`) or a profile YAML file."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    text = str(name_or_path)
    path = PROFILES / f"{text.lower()}.yaml"
    if not path.is_file():
        path = Path(text).expanduser()
        if not path.is_file():
            raise ConfigError(f"--hardware {text!r} is neither a built-in profile ({', '.join(builtin_profiles())}) "
                              "nor a YAML file; benchmarks/hardware_profile.py writes one for this machine")
    data = _read_profile(path)
    known = {f.name for f in fields(Hardware)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"hardware profile {path} has unknown keys {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))}")
    missing = [k for k in ELEMENTWISE_CLASSES if k not in (data.get("elementwise_gelem_s") or {})]
    if missing:
        raise ConfigError(f"hardware profile {path}: elementwise_gelem_s lacks {', '.join(missing)}")
    data.setdefault("name", path.stem)
    data.setdefault("source", str(path))
    return Hardware(**data)


def _read_profile(path: Path) -> dict:
    """A profile file's mapping, or a one-line ConfigError naming the file and what is wrong in it."""
    from dit_trainer.typed import yaml_problem
    from dit_trainer.fs import check_regular

    check_regular(path, ConfigError, "a hardware profile")
    redo = "fix it, or write one with benchmarks/hardware_profile.py"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"hardware profile {path} is not text (byte {err.start} is not UTF-8); {redo}") from None
    except yaml.YAMLError as err:  # a python tag too: safe_load refuses it, nothing runs
        raise ConfigError(f"hardware profile {path} is not plain YAML: {yaml_problem(err)}; {redo}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("elementwise_gelem_s", {}), dict):
        raise ConfigError(f"hardware profile {path} holds no mapping of keys to values (with elementwise_gelem_s "
                          f"a mapping); {redo}")
    return data


def detect_hardware(device_type: str):
    """The built-in profile of the GPU this process sees (by name), or the CPU profile."""
    if device_type != "cuda":
        return load_hardware("cpu")
    import torch

    gpu = torch.cuda.get_device_name().lower()
    for name in ("h200", "h100", "a100"):
        if name in gpu:
            return load_hardware(name)
    return load_hardware("h100")


def parse_memory(text) -> float:
    """`80GiB`, `80GB`, `96000MiB` or a number of GiB -> GiB."""
    s = str(text).strip().replace(" ", "")
    units = {"tib": 1024, "tb": 1e12 / 2**30, "gib": 1, "gb": 1e9 / 2**30, "mib": 1 / 1024, "mb": 1e6 / 2**30, "": 1}
    for unit in sorted(units, key=len, reverse=True):
        if s.lower().endswith(unit):
            number = s[: len(s) - len(unit)]
            try:
                value = float(number)
            except ValueError:
                break
            if value > 0:
                return value * units[unit]
            break
    raise ConfigError(f"--gpu-memory {text!r} is not a memory size; write e.g. 80GiB, 80GB or 96000MiB")
