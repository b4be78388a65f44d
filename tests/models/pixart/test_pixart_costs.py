"""PixArt's planner counts against the block they describe, and `dit plan` pricing a PixArt (never pipelined).
Parameter counts of every registered PixArt are held to a meta-device model by tests/plan/test_costs.py."""

import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.models import get_spec


@pytest.mark.parametrize("tokens", [5, 64])
def test_saved_activations_of_a_block_match_saved_tensor_hooks(tokens):
    """float32 (the fused SDPA path for both attentions); the caption's k and v per image token included."""
    cfg = build_config({"output_dir": "unused", "data": {"text_max_length": tokens},
                        "model": {"name": "PixArt-alpha-XL/2-256", "depth": 2, "hidden_size": 48, "num_heads": 4,
                                  "caption_channels": 16, "input_size": 8}})
    spec = get_spec(cfg.model.name)
    net = spec.build_model_fn(cfg)
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    block = list(net.blocks)[1]
    saved, inside = {}, [False]
    block.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
    block.register_forward_hook(lambda *a: inside.__setitem__(0, False))

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if inside[0] and ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    b = 3
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(torch.randn(b, 4, 8, 8), torch.randint(0, 1000, (b,)), torch.randn(b, tokens, 16),
            torch.ones(b, tokens, dtype=torch.long))
    costs = spec.costs_fn(cfg)
    predicted = b * costs.tokens * (costs.saved["none"] + costs.fused_attention).nbytes(4)
    assert sum(saved.values()) == pytest.approx(predicted, rel=0.08)


def test_dit_plan_prices_pixart_xl_without_pipelining():
    from dit_trainer.plan import make_request, plan_layouts

    cfg = build_config(None, ["--model.name", "PixArt-alpha-XL/2-512", "--train.global_batch_size", "64"])
    plans = plan_layouts(make_request(cfg, 8, 8, "h100", 80))
    assert plans[0].fits and all(p.layout.pp == 1 for p in plans)
    assert any(p.layout.tp > 1 for p in plans) and any(p.layout.dp_shard > 1 for p in plans)
    # The caption's 120 tokens per image cost work: Sigma's 300 are priced dearer at the same size.
    sigma = plan_layouts(make_request(build_config(None, ["--model.name", "PixArt-Sigma-XL/2-512",
                                                          "--train.global_batch_size", "64"]), 8, 8, "h100", 80))
    alpha = {p.layout: p.time.compute for p in plans}
    assert all(p.time.compute > alpha[p.layout] for p in sigma)
