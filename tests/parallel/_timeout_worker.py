"""torchrun worker: join with `parallel.timeout` and print, as JSON, the timeout of every group the mesh uses,
for each (timeout, parallel section) pair given: the first joins the process group, the others build their
mesh on it (one launch; starting one is the slow part)."""

import json
import sys

import torch
import torch.distributed as dist

from dit_trainer.config import build_config
from dit_trainer.parallel.dims import init_distributed


def mesh_timeouts(timeout: float, parallel: str) -> dict:
    """Each mesh group's timeout in seconds (and the flattened data-parallel group's, as "dp")."""
    cfg = build_config({"model": {"name": "DiT-S/2"}, "parallel": {**json.loads(parallel), "timeout": timeout}})
    dims = init_distributed(cfg.parallel, torch.device("cpu"))
    groups = {name: dims.mesh[name].get_group() for name in ("pp", "dp_replicate", "dp_shard", "tp")}
    groups["dp"] = dims.dp_mesh.get_group()
    return {name: g._get_backend(torch.device("cpu")).options._timeout.total_seconds() for name, g in groups.items()}


def main(pairs):
    seconds = [mesh_timeouts(float(timeout), parallel) for timeout, parallel in zip(pairs[::2], pairs[1::2])]
    if dist.get_rank() == 0:
        print(json.dumps(seconds), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
