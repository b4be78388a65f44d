"""Training with token routing (train.routing_*): the loss falls, routing changes the step, MFU
counts the routed blocks' work, and a pipelined layout refuses it in one line."""

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


def test_routing_with_pipeline_parallel_is_refused_in_one_line(tmp_path):
    cfg = build_config(tiny_config(tmp_path, train=ROUTING, parallel={"pp": 2, "dp_shard": 1}))
    with pytest.raises(ConfigError) as info:
        check_layout(cfg, ParallelDims(pp=2, dp_shard=1, world_size=2))
    assert "train.routing_keep" in str(info.value) and "parallel.pp" in str(info.value)
    assert "\n" not in str(info.value)


def test_routing_keep_out_of_range_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"train.routing_keep is 0.0; it must be a fraction in \(0, 1\]"):
        build_config(tiny_config(tmp_path, train={"routing_keep": 0}))
