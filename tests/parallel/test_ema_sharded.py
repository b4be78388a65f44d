"""ShardedEMA keeps frozen parameters (pos_embed) equal to the model's, plain and as FSDP DTensors."""

import socket

import pytest
import torch
import torch.distributed as dist

from dit_trainer.models import DiT
from dit_trainer.parallel.ema import ShardedEMA
from dit_trainer.parallel.utils import full, is_dtensor, local
from dit_trainer.train.ema import create_ema, update_ema


def _tiny():
    torch.manual_seed(0)
    return DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=1, num_heads=2, num_classes=4)


@torch.no_grad()
def _step(model):
    for p in model.parameters():
        if p.requires_grad:
            local(p).add_(torch.randn_like(local(p)))


@pytest.mark.parametrize("skip", [None, 0.0, 1.0])
def test_frozen_copied_trained_as_update_ema(skip):
    model = _tiny()
    ema, reference = ShardedEMA(model), create_ema(model)
    for _ in range(20):
        _step(model)
        ema.update(0.9999, skip=None if skip is None else torch.tensor(skip))
        if skip != 1.0:
            update_ema(reference, model, 0.9999)
    assert torch.equal(ema.shadow["pos_embed"], model.pos_embed)
    assert list(ema.state_dict()) == [n for n, _ in model.named_parameters()]  # checkpoint names unchanged
    for name, p in reference.named_parameters():
        if skip is None:
            assert torch.equal(ema.shadow[name], p), name
        else:  # the device-side path lerps: same rule, other rounding
            torch.testing.assert_close(ema.shadow[name], p, rtol=1e-5, atol=1e-6)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(dist.is_initialized(), reason="needs its own one-process group")
def test_frozen_dtensor_copied_under_fsdp():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        model = _tiny()
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        assert is_dtensor(model.pos_embed) and not model.pos_embed.requires_grad
        ema = ShardedEMA(model)
        with torch.no_grad():
            model.pos_embed.to_local().mul_(1.5)  # a changed table must reach the EMA exactly
        for _ in range(5):
            _step(model)
            ema.update(0.9999)
        assert is_dtensor(ema.shadow["pos_embed"])
        assert torch.equal(full(ema.shadow["pos_embed"]), full(model.pos_embed))
        assert not torch.equal(full(ema.shadow["x_embedder.proj.weight"]), full(model.x_embedder.proj.weight))
    finally:
        dist.destroy_process_group()
