"""Training with token routing (train.routing_*): the loss falls, the trainer hands the model each
step's route, routing changes the step, MFU counts the routed blocks' work, and a pipelined layout
refuses it in one line."""

import pytest
import torch
from tests.train.trainer_helpers import tiny_config

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.models.flops import train_flops_per_image
from dit_trainer.parallel import ParallelDims
from dit_trainer.train import DiTTrainer
from dit_trainer.train.preflight import check_layout

ROUTING = {"routing_keep": 0.5, "routing_start": 0, "routing_end": -1}  # the tiny model's 2 blocks: route the first


def _losses(trainer, steps):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)
    return [trainer.train_step((x, y))["loss"] for _ in range(steps)]


@pytest.mark.parametrize("name", ["DiT-S/2", "LargeDiT-600M/2"])
def test_routed_loss_falls_on_a_fixed_batch(tmp_path, name):
    cfg = tiny_config(tmp_path, model={"name": name, "learn_sigma": False}, optim={"lr": 1e-3}, train=ROUTING)
    if name.startswith("Large"):  # rotary positions: routed tokens keep their own
        cfg["model"] = {"name": name, "input_size": 8, "in_channels": 4, "num_classes": 10, "learn_sigma": False,
                        "dim": 64, "n_layers": 2, "n_heads": 4}
    torch.manual_seed(0)
    trainer = DiTTrainer(cfg)
    assert trainer.routing is not None and trainer.routing.kept == 8  # of 16 tokens
    losses = _losses(trainer, 40)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.8 * first, (first, last)


def test_routing_changes_the_step_and_counts_only_the_kept_tokens_work(tmp_path):
    plain = DiTTrainer(tiny_config(tmp_path / "plain", optim={"lr": 1e-3}))
    routed = DiTTrainer(tiny_config(tmp_path / "routed", optim={"lr": 1e-3}, train=ROUTING))
    assert plain.routing is None
    # Same seed, same draws before the routing's: the first step's loss differs only by the routing.
    assert _losses(plain, 3) != _losses(routed, 3)
    expected = train_flops_per_image(routed.model, tokens_per_block=[8, 16])
    assert routed.flops_per_image == expected < plain.flops_per_image == train_flops_per_image(plain.model)


def test_the_trainer_hands_each_steps_route_to_the_model(tmp_path):
    # What the model is handed, and what its blocks then see: a trainer that drew the route but
    # called the model without it would show no route and every block on all 16 tokens.
    trainer = DiTTrainer(tiny_config(tmp_path, optim={"lr": 1e-3}, train=ROUTING))
    routes, tokens = [], []
    trainer.model.register_forward_pre_hook(lambda m, args, kwargs: routes.append(kwargs.get("route")),
                                            with_kwargs=True)
    for i, block in enumerate(trainer.model.blocks):
        block.register_forward_pre_hook(lambda m, args, i=i: tokens.append((i, args[0].shape[1])))
    _losses(trainer, 2)
    assert tokens == [(0, 8), (1, 16)] * 2  # block 0 is the span: 8 of the 16 tokens
    assert all(r is not None and tuple(r.kept.shape) == (8, 8) and (r.start, r.end) == (0, 1) for r in routes)
    assert len(routes) == 2 and not torch.equal(routes[0].kept, routes[1].kept)  # drawn afresh each step


def test_routing_with_pipeline_parallel_is_refused_in_one_line(tmp_path):
    cfg = build_config(tiny_config(tmp_path, train=ROUTING, parallel={"pp": 2, "dp_shard": 1}))
    with pytest.raises(ConfigError) as info:
        check_layout(cfg, ParallelDims(pp=2, dp_shard=1, world_size=2))
    assert "train.routing_keep" in str(info.value) and "parallel.pp" in str(info.value)
    assert "\n" not in str(info.value)


def test_routing_keep_out_of_range_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"train.routing_keep is 0.0; it must be a fraction in \(0, 1\]"):
        build_config(tiny_config(tmp_path, train={"routing_keep": 0}))
