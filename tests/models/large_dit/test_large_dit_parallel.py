"""Large-DiT's parallel plan: pipeline stages compose in-process; on 2 CPU processes (gloo) the
family's TP plan (whole query and kv heads per rank, q/k norms reduced across shards) and FSDP
equal one process, and LargeDiT-7B/2 takes the sharded plan on the meta device."""

import copy
import os
import types

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dit_trainer.models.large_dit import DiT_Llama
from dit_trainer.models.large_dit.parallelize import split_stage, units

ARGS = dict(input_size=8, patch_size=2, in_channels=4, num_classes=10, dim=64, n_layers=3, n_heads=4,
            n_kv_heads=2, multiple_of=32, qk_norm=True)


def reference(seed=0):
    torch.manual_seed(seed)
    model = DiT_Llama(**ARGS)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))  # leave adaLN-Zero's inert start
    x = torch.randn(4, 4, 8, 8, generator=g)
    t = torch.randint(0, 1000, (4,), generator=g)
    y = torch.randint(0, 10, (4,), generator=g)
    drop = torch.tensor([0, 1, 0, 1])  # label dropout is the trainer's draw, never the model's own
    return model, (x, t, y, drop)


def test_pipeline_stages_compose_to_the_model():
    full, (x, t, y, drop) = reference()
    ref = full(x, t, y, force_drop_ids=drop)
    first = split_stage(copy.deepcopy(full), 0, 2, first=True, last=False)
    last = split_stage(copy.deepcopy(full), 2, 3, first=False, last=True)
    names = {n for n, _ in first.named_parameters()} | {n for n, _ in last.named_parameters()}
    assert names == {n for n, _ in full.named_parameters()}
    assert list(last.layers) == ["2"] and len(units(first)) == 2
    assert not hasattr(last, "x_embedder") and not hasattr(first, "final_layer")
    assert torch.equal(last(*first(x, t, y, drop)), ref)


def _grads(model):
    from torch.distributed.tensor import DTensor

    return {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone() for n, p in model.named_parameters()}


def _run(layout, rank):
    """Forward/backward of the reference under `layout`; FSDP ranks take half the batch each."""
    from dit_trainer.models.large_dit.parallelize import parallelize_large_dit
    from dit_trainer.parallel.dims import ParallelDims

    dims = ParallelDims(dp_shard=2 if layout == "fsdp" else 1, tp=2 if layout == "tp" else 1, world_size=2)
    dims.build_mesh("cpu")
    model, inputs = reference()
    parallelize_large_dit(model, dims, types.SimpleNamespace())
    if layout == "fsdp":
        inputs = [v[rank * 2:(rank + 1) * 2] for v in inputs]
    out = model(*inputs)
    out.square().mean().backward()
    out = out.detach()
    if layout == "fsdp":
        gathered = [torch.empty_like(out) for _ in range(2)]
        dist.all_gather(gathered, out.contiguous())
        out = torch.cat(gathered)
    return out, _grads(model)


def _meta_7b(rank):
    """LargeDiT-7B/2 on meta, with TP=2 and with FSDP=2: the plan applies, shards have the right shape."""
    from dit_trainer.models import get_spec
    from dit_trainer.models.large_dit.parallelize import parallelize_large_dit
    from dit_trainer.parallel.dims import ParallelDims

    shapes = {}
    for layout in ("tp", "fsdp"):
        dims = ParallelDims(dp_shard=2 if layout == "fsdp" else 1, tp=2 if layout == "tp" else 1, world_size=2)
        dims.build_mesh("cpu")
        with torch.device("meta"):
            model = get_spec("LargeDiT-7B/2").build_model_fn({"input_size": 32, "qk_norm": True})
        parallelize_large_dit(model, dims, types.SimpleNamespace())
        attn, ffn = model.layers[31].attention, model.layers[31].feed_forward
        shapes[layout] = {
            "wq": tuple(attn.wq.weight.to_local().shape), "wo": tuple(attn.wo.weight.to_local().shape),
            "q_norm": tuple(attn.q_norm.weight.to_local().shape), "w2": tuple(ffn.w2.weight.to_local().shape),
            "meta": all(p.is_meta for p in model.parameters()),
        }
    return shapes


def _worker(rank, init_file, result_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        results = {layout: _run(layout, rank) for layout in ("tp", "fsdp")}
        results["meta_7b"] = _meta_7b(rank)
        if rank == 0:
            torch.save(results, result_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_tp_and_fsdp_on_two_processes_equal_one(tmp_path):
    model, inputs = reference()
    out = model(*inputs)
    out.square().mean().backward()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # fork, not spawn: the children reuse the imported torch (spawn took 20 s on the shared machine).
    mp.start_processes(_worker, args=(str(tmp_path / "init"), str(tmp_path / "r.pt")), nprocs=2, start_method="fork")
    results = torch.load(tmp_path / "r.pt", weights_only=True)
    for layout in ("tp", "fsdp"):
        # Under FSDP each rank's loss is the mean over its half of the batch; the reduced
        # gradient is their average, the full batch's gradient.
        got_out, got_grads = results[layout]
        torch.testing.assert_close(got_out, out.detach(), rtol=1e-5, atol=1e-6, msg=layout)
        for name, p in model.named_parameters():
            torch.testing.assert_close(got_grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=f"{layout} {name}")
    tp, fsdp = results["meta_7b"]["tp"], results["meta_7b"]["fsdp"]
    assert tp == {"wq": (2048, 4096), "wo": (4096, 2048), "q_norm": (2048,), "w2": (4096, 5504), "meta": True}
    assert fsdp["wq"] == (2048, 4096) and fsdp["w2"] == (2048, 11008) and fsdp["meta"]


def test_tp_error_names_only_what_does_not_divide():
    from dit_trainer.errors import ConfigError
    from dit_trainer.models.large_dit.parallelize import apply_tp

    model = DiT_Llama(**{**ARGS, "n_layers": 1, "n_heads": 4, "n_kv_heads": 1})
    with pytest.raises(ConfigError) as err:
        apply_tp(model, types.SimpleNamespace(size=lambda: 2))
    text = str(err.value)
    assert "1 kv heads of Large-DiT" in text and "change model.n_kv_heads" in text
    assert "query" not in text and "SwiGLU" not in text and "set parallel.tp 1" in text
