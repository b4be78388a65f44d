"""ShardedEMA follows DiT's update for trained parameters and keeps frozen ones (pos_embed) equal to the
model's, on one plain module and as FSDP DTensors; ema_decay_at's warm-up."""

import socket

import pytest
import torch
import torch.distributed as dist

from dit_trainer.models import DiT
from dit_trainer.parallel.ema import ShardedEMA, ema_decay_at
from dit_trainer.parallel.utils import full, is_dtensor, local


def _tiny():
    torch.manual_seed(0)
    return DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=1, num_heads=2, num_classes=4)


@torch.no_grad()
def _step(model):
    for p in model.parameters():
        if p.requires_grad:
            local(p).add_(torch.randn_like(local(p)))


@torch.no_grad()
def _dit_update(ema, model, decay):
    # facebookresearch/DiT's train.py update_ema, over every parameter: ema = decay * ema + (1 - decay) * param.
    for name, param in model.named_parameters():
        ema[name].mul_(decay).add_(param.data, alpha=1 - decay)


@pytest.mark.parametrize("skip", [None, 0.0, 1.0])
def test_trained_follow_dits_update_frozen_are_copied(skip):
    model = _tiny()
    assert not model.pos_embed.requires_grad
    ema = ShardedEMA(model)
    reference = {name: p.detach().clone() for name, p in model.named_parameters()}
    for step in range(20):
        _step(model)
        decay = ema_decay_at(step, 0.9999, warmup=step % 2 == 0)  # the warm-up's decays and the full one
        ema.update(decay, skip=None if skip is None else torch.tensor(skip))
        if skip != 1.0:
            _dit_update(reference, model, decay)
    # DiT's rule lets the constant pos_embed drift by rounding; that drift is what the exporters refused.
    assert skip == 1.0 or not torch.equal(reference["pos_embed"], model.pos_embed)
    assert torch.equal(ema.shadow["pos_embed"], model.pos_embed)
    for name, want in reference.items():
        if name == "pos_embed":
            continue
        if skip is None:
            assert torch.equal(ema.shadow[name], want), name
        else:  # the device-side path lerps: same rule, other rounding
            torch.testing.assert_close(ema.shadow[name], want, rtol=1e-5, atol=1e-6)


def test_state_dict_loads_into_a_plain_model():
    model = _tiny()
    ema = ShardedEMA(model)
    _step(model)
    ema.update(0.5)
    assert list(ema.state_dict()) == [n for n, _ in model.named_parameters()]  # checkpoint names unchanged
    averaged = _tiny()
    averaged.load_state_dict(ema.state_dict())  # strict: every key of the model's state dict is there
    assert torch.equal(averaged.x_embedder.proj.weight, ema.shadow["x_embedder.proj.weight"])
    assert not torch.equal(averaged.x_embedder.proj.weight, model.x_embedder.proj.weight)


def test_decay_warmup_averages_over_fewer_steps_early():
    # (1 + step) / (10 + step): 0.1 at the first update, 0.91 at step 90, capped by the decay.
    assert abs(ema_decay_at(0, 0.9999, True) - 0.1) < 1e-12
    assert abs(ema_decay_at(90, 0.9999, True) - 0.91) < 1e-12
    assert ema_decay_at(10**6, 0.9999, True) == 0.9999
    assert {ema_decay_at(s, 0.9999, False) for s in (0, 1, 10**6)} == {0.9999}


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
