"""The model code runs on tensor-parallel shards that hold whole heads (2 CPU processes, gloo).

The plan here is the test's own, the one the family's parallelize.py is to apply: wq/wk/wv
column-wise (kv heads too), wo row-wise, w1/w3 column-wise, w2 row-wise, q/k LayerNorm weights
sharded with the heads (their statistics reduced across shards), everything else replicated.
Forward and every gradient must equal one process's.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dit_trainer.models.large_dit import DiT_Llama

ARGS = dict(input_size=8, patch_size=2, in_channels=4, num_classes=10, dim=64, n_layers=2, n_heads=4,
            n_kv_heads=2, multiple_of=32, qk_norm=True)


def reference(seed=0):
    torch.manual_seed(seed)
    model = DiT_Llama(**ARGS)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))  # leave adaLN-Zero's inert start
    x = torch.randn(3, 4, 8, 8, generator=g)
    t = torch.randint(0, 1000, (3,), generator=g)
    y = torch.randint(0, 10, (3,), generator=g)
    return model, (x, t, y)


def _tp_plan(qk_norm):
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

    class HeadShardedNorm(ParallelStyle):
        """Norm weights split like the heads they scale; the output goes back to a local shard."""

        def _apply(self, module, mesh):
            for name, p in list(module.named_parameters(recurse=False)):
                module.register_parameter(name, torch.nn.Parameter(distribute_tensor(p.data, mesh, [Shard(0)])))
            module.register_forward_hook(lambda mod, inp, out: out.to_local())
            return module

    plan = {
        "attention.wq": ColwiseParallel(use_local_output=not qk_norm),
        "attention.wk": ColwiseParallel(use_local_output=not qk_norm),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    if qk_norm:
        plan.update({"attention.q_norm": HeadShardedNorm(), "attention.k_norm": HeadShardedNorm()})
    return plan


def _worker(rank, world, init_file, result_file):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model, (x, t, y) = reference()
        for layer in model.layers:
            parallelize_module(layer, mesh, _tp_plan(ARGS["qk_norm"]))
        out = model(x, t, y)
        out.square().mean().backward()
        grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad) for n, p in model.named_parameters()}
        if rank == 0:
            torch.save({"out": out.detach(), "grads": grads}, result_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_way_tensor_parallel_equals_one_process(tmp_path):
    model, (x, t, y) = reference()
    out = model(x, t, y)
    out.square().mean().backward()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # fork, not spawn: the children reuse the imported torch (spawn took 20 s on the shared machine).
    mp.start_processes(_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "tp.pt")), nprocs=2, start_method="fork")
    result = torch.load(tmp_path / "tp.pt", weights_only=True)
    tp_out, tp_grads = result["out"], result["grads"]
    torch.testing.assert_close(tp_out, out.detach(), rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(tp_grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
