"""Parallel degrees and the named device mesh built from them, in the manner of torchtitan."""

import datetime
import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from dit_trainer.errors import ConfigError

# Outermost to innermost: tp innermost keeps its traffic on neighbouring ranks (one node),
# pp outermost keeps the rarest, point-to-point traffic on the slowest links.
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass
class ParallelDims:
    """Resolved degrees: `-1` takes what the others leave of the world size; the product must equal it."""

    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    world_size: int = 1
    _mesh: Optional[object] = field(default=None, repr=False, compare=False)
    _dp_mesh: Optional[object] = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        degrees = {n: getattr(self, n) for n in ("dp_replicate", "dp_shard", "tp", "pp")}
        bad = [f"{n}={d}" for n, d in degrees.items() if d == 0 or d < -1]
        if bad:
            raise ConfigError(f"parallel degrees must be positive or -1, got {', '.join(bad)}")
        free = [n for n, d in degrees.items() if d == -1]
        if len(free) > 1:
            raise ConfigError(f"only one parallel degree may be -1, got {', '.join(f'{n}=-1' for n in free)}")
        fixed = 1
        for n, d in degrees.items():
            fixed *= d if d != -1 else 1
        if free:
            if self.world_size % fixed:
                raise ConfigError(self._no_share(degrees, free[0], fixed))
            setattr(self, free[0], self.world_size // fixed)
            degrees[free[0]] = self.world_size // fixed
        elif fixed != self.world_size:
            raise ConfigError(self._mismatch(degrees))

    def _mismatch(self, degrees) -> str:
        shown = " x ".join(f"{n}={d}" for n, d in degrees.items())
        return (
            f"parallel degrees {shown} do not multiply to the world size {self.world_size}; "
            f"change them or set one to -1 to take the rest"
        )

    def _no_share(self, degrees, free: str, fixed: int) -> str:
        # The -1 is already there: what conflicts is the set degrees' product and the world size.
        set_ = [f"parallel.{n}={d}" for n, d in degrees.items() if d not in (1, -1)]
        return (
            f"{' x '.join(set_)} need{'s' if len(set_) == 1 else ''} a multiple of {fixed} processes, but the "
            f"world size is {self.world_size}, so parallel.{free}=-1 gets no whole share; launch a multiple of "
            f"{fixed} processes (torchrun --nproc_per_node) or lower {'it' if len(set_) == 1 else 'them'}"
        )

    @classmethod
    def from_config(cls, parallel, world_size: Optional[int] = None) -> "ParallelDims":
        """Degrees from a `ParallelConfig` (or a `Config`) and the world size (default: torchrun's)."""
        parallel = getattr(parallel, "parallel", parallel)
        if world_size is None:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(parallel.dp_replicate, parallel.dp_shard, parallel.tp, parallel.pp, world_size)

    # Which parallelisms are on.
    @property
    def dp_enabled(self) -> bool:
        return self.dp_replicate * self.dp_shard > 1

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def ddp_enabled(self) -> bool:
        return self.dp_replicate > 1 and self.dp_shard == 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def dp_size(self) -> int:
        """Data-parallel width: how many distinct slices each global batch is cut into."""
        return self.dp_replicate * self.dp_shard

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    # The name the trainer reads.
    is_distributed = distributed

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean over data-parallel ranks (TP/PP peers hold the same value); SUM then divide, never AVG."""
        if self.dp_size == 1 or self._mesh is None:
            return tensor
        import torch.distributed as dist

        out = tensor.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self._dp_mesh.get_group())
        return out / self.dp_size

    def all_gather_dp(self, tensor: torch.Tensor) -> torch.Tensor:
        """A 1-D `tensor` of every data-parallel rank, concatenated in rank order (itself on one rank)."""
        if self.dp_size == 1 or self._mesh is None:
            return tensor
        import torch.distributed as dist

        gathered = [torch.empty_like(tensor) for _ in range(self.dp_size)]
        dist.all_gather(gathered, tensor, group=self._dp_mesh.get_group())
        return torch.cat(gathered)

    def build_mesh(self, device_type: str = "cpu", timeout: Optional[datetime.timedelta] = None):
        """The 4-D mesh ("pp", "dp_replicate", "dp_shard", "tp") plus a flattened "dp" dimension; `timeout`:
        its groups' (parallel.timeout), None for torch's default."""
        from torch.distributed.device_mesh import init_device_mesh

        # Size-1 dimensions stay in the mesh so that `mesh["tp"]` works for every layout.
        shape = tuple(getattr(self, n) for n in MESH_DIMS)
        options = _group_options(timeout)
        # The mesh makes its own groups, with torch's default timeout (30 min on gloo) unless told otherwise,
        # so a rank stuck in an HSDP or TP collective would outwait parallel.timeout.
        override = {n: options for n in MESH_DIMS} if options is not None else None
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS, backend_override=override)
        # Keep the flattened mesh itself: slicing a flattened dim from the root is deprecated.
        self._dp_mesh = mesh["dp_replicate", "dp_shard"]._flatten("dp", backend_override=options)
        self._mesh = mesh
        return mesh

    @property
    def dp_mesh(self):
        """The flattened (dp_replicate x dp_shard) mesh: loss averaging and data slicing."""
        if self._mesh is None:
            raise RuntimeError("call ParallelDims.build_mesh() first")
        return self._dp_mesh

    @property
    def mesh(self):
        if self._mesh is None:
            raise RuntimeError("call ParallelDims.build_mesh() first")
        return self._mesh

    def _coord(self, name: str) -> int:
        if self._mesh is None:
            return 0
        return (self._dp_mesh if name == "dp" else self._mesh[name]).get_local_rank()

    @property
    def dp_rank(self) -> int:
        """This rank's slice of the global batch; TP and PP peers share it."""
        return self._coord("dp")

    @property
    def tp_rank(self) -> int:
        return self._coord("tp")

    @property
    def pp_rank(self) -> int:
        return self._coord("pp")

    def local_batch_size(self, global_batch_size: int) -> int:
        """Samples per data-parallel rank; the global batch must split evenly."""
        if global_batch_size % self.dp_size:
            raise ConfigError(
                f"train.global_batch_size {global_batch_size} does not split over {self.dp_size} "
                f"data-parallel ranks; make it a multiple of {self.dp_size}"
            )
        return global_batch_size // self.dp_size


def choose_backend(requested: str = "auto", device: Optional[torch.device] = None) -> str:
    """nccl for CUDA tensors, gloo for CPU ones, unless the config names one."""
    if requested and requested != "auto":
        return requested
    if device is not None:
        return "nccl" if torch.device(device).type == "cuda" else "gloo"
    return "nccl" if torch.cuda.is_available() else "gloo"


def _group_options(timeout: Optional[datetime.timedelta]):
    """Options that give a device mesh's groups `timeout` on the default group's backend (None: torch's default)."""
    import torch.distributed as dist

    if timeout is None or not dist.is_initialized():
        return None
    options = dist.ProcessGroupNCCL.Options() if dist.get_backend() == "nccl" else dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    return options


def init_distributed(parallel, device: Optional[torch.device] = None) -> ParallelDims:
    """Join torchrun's process group (if launched by it) and build the mesh; single process otherwise."""
    import torch.distributed as dist

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    dims = ParallelDims.from_config(parallel, world_size)
    if world_size == 1:
        return dims
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    section = getattr(parallel, "parallel", parallel)
    # parallel.timeout: how long a collective waits for a missing rank before it fails (gloo's own default is 30 min).
    timeout = datetime.timedelta(seconds=getattr(section, "timeout", 600.0))
    if not dist.is_initialized():
        from dit_trainer.parallel.process_group import init_process_group

        init_process_group(choose_backend(getattr(section, "backend", "auto"), device), timeout=timeout)
    dims.build_mesh("cuda" if device is not None and torch.device(device).type == "cuda" else "cpu", timeout)
    return dims
