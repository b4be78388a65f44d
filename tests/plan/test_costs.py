"""The families' cost models (`ModelSpec.costs_fn`) against the models they describe."""

import pytest
import torch

from dit_trainer.config import ModelConfig, build_config
from dit_trainer.models import get_spec, list_specs
from dit_trainer.plan.layouts import Layout
from dit_trainer.plan.memory import state_bytes


def _unique_specs():
    seen, names = set(), []
    for name in list_specs():
        spec = get_spec(name)
        if id(spec) not in seen:
            seen.add(id(spec))
            names.append(name)
    return names


def _meta_state(model) -> dict:
    """What the trainer allocates for `model` (one process): float32 weights, gradients of the trained
    ones, AdamW's two moments and a step count per trained tensor, an EMA copy of every weight."""
    params = list(model.parameters())
    trained = [p for p in params if p.requires_grad]
    weights = sum(4 * p.numel() for p in params)
    return {"params": weights, "grads": sum(4 * p.numel() for p in trained),
            "optimizer": sum(8 * p.numel() + 4 for p in trained), "ema": weights, "phema": 0}


# DiT's block options, each alone and all together (DiT-L: SwiGLU's truncated 2730-wide layer).
BLOCK_OPTIONS = [{"norm": "rmsnorm"}, {"mlp": "swiglu"}, {"rope": True}, {"qk_norm": True},
                 {"norm": "rmsnorm", "mlp": "swiglu", "rope": True, "qk_norm": True}]
# Every registered size, and the options that change a family's parameter count.
CASES = [(name, {}) for name in _unique_specs()] + [
    ("DiT-S/2", {"learn_sigma": False, "class_dropout_prob": 0.0, "input_size": 16, "mlp_ratio": 2.5}),
    ("LargeDiT-600M/2", {"qk_norm": True, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3, "num_classes": 10}),
    *[("DiT-S/2", o) for o in BLOCK_OPTIONS],
    ("SiT-L/4", {"norm": "rmsnorm", "mlp": "swiglu", "rope": True, "qk_norm": True, "mlp_ratio": 3.0}),
    ("DiT-L/2", {"mlp": "swiglu"}),
]


def _model_config(name, options) -> ModelConfig:
    """A ModelConfig of `name` with shared fields set and the family's options in `options`."""
    shared = {k: v for k, v in options.items() if k in ModelConfig.__dataclass_fields__}
    return ModelConfig(name=name, **shared, options={k: v for k, v in options.items() if k not in shared})


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}{'+' + '+'.join(o) if o else ''}" for n, o in CASES])
def test_state_bytes_equal_a_meta_device_count(name, options):
    cfg = _model_config(name, options)
    spec = get_spec(name)
    with torch.device("meta"):
        model = spec.build_model_fn(cfg)
    assert state_bytes(spec.costs_fn(cfg), Layout()) == _meta_state(model)


@pytest.mark.parametrize("name", ["DiT-S/2", "LargeDiT-600M/2"])
def test_post_hoc_ema_profiles_are_counted_as_the_tracker_holds_them(name):
    from dit_trainer.phema.tracker import PowerEMA

    cfg = _model_config(name, {})
    spec = get_spec(name)
    with torch.device("meta"):
        model = spec.build_model_fn(cfg)
        tracker = PowerEMA(model, [0.05, 0.1, 0.15])
    held = sum(t.numel() * t.element_size() for ema in tracker.profiles.values() for t in ema.shadow.values())
    costs = spec.costs_fn(cfg)
    assert state_bytes(costs, Layout(), profiles=3)["phema"] == held
    assert state_bytes(costs, Layout(dp_shard=4), profiles=3)["phema"] == held / 4  # sharded like the EMA


FLOPS_CASES = [(n, {}) for n in _unique_specs() if get_spec(n).flops_fn] + [("DiT-B/2", o) for o in BLOCK_OPTIONS]


@pytest.mark.parametrize("name,options", FLOPS_CASES, ids=[f"{n}{'+' + '+'.join(o) if o else ''}" for n, o in FLOPS_CASES])
def test_forward_flops_are_the_family_flops_fn(name, options):
    spec = get_spec(name)
    with torch.device("meta"):
        model = spec.build_model_fn(_model_config(name, options))
    c = spec.costs_fn(_model_config(name, options))
    per_image = c.depth * (c.block_flops * c.tokens + c.block_flops_per_image) + c.edge_flops * c.tokens
    assert 3 * per_image == pytest.approx(spec.flops_fn(model), rel=1e-12)


def test_routed_forward_flops_are_the_flops_fn_of_the_routed_blocks():
    """Token routing: the planner's averaged block work is what the trainer's MFU counts block by block."""
    from dit_trainer.models.routing import TokenRouting

    cfg = build_config({"output_dir": "unused", "model": {"name": "DiT-XL/2"},
                            "train": {"routing_keep": 0.5, "routing_start": 2, "routing_end": -2}})
    spec = get_spec("DiT-XL/2")
    with torch.device("meta"):
        model = spec.build_model_fn(cfg)
    full = spec.costs_fn(cfg)
    per_block = TokenRouting.from_config(cfg.train, full.depth, full.tokens).tokens_per_block()
    c = full.routed(per_block)
    per_image = c.depth * (c.block_flops * c.tokens + c.block_flops_per_image) + c.edge_flops * c.tokens
    assert 3 * per_image == pytest.approx(spec.flops_fn(model, tokens_per_block=per_block), rel=1e-12)
    assert c.block_flops < 0.6 * full.block_flops and c.attention_share == pytest.approx((4 + 24 / 4) / 28)


# MeanFlow's interval embedder, and with a scale range the guidance-scale embedder: once per image, like t's.
MEANFLOW_CASES = [(name, scales) for name in ("DiT-B/2", "LargeDiT-600M/2", "PixArt-alpha-XL/2-256")
                  for scales in (None, [1.0, 2.0])]


@pytest.mark.parametrize("name,scales", MEANFLOW_CASES, ids=[f"{n}-{'w' if s else 'h'}" for n, s in MEANFLOW_CASES])
def test_meanflow_embedders_are_counted_in_state_and_flops(name, scales):
    cfg = build_config({"output_dir": "unused", "objective": "meanflow", "model": {"name": name},
                        "meanflow": {"omega_range": scales, "kappa": 0.0} if scales else {}})
    spec = get_spec(name)
    with torch.device("meta"):
        model = spec.build_model_fn(cfg)
    embedders = [k for k in model.state_dict() if k.startswith(("h_embedder.", "w_embedder."))]
    assert len(embedders) == (8 if scales else 4)
    c = spec.costs_fn(cfg)
    assert state_bytes(c, Layout()) == _meta_state(model)
    if spec.flops_fn:
        per_image = c.depth * (c.block_flops * c.tokens + c.block_flops_per_image) + c.edge_flops * c.tokens
        assert 3 * per_image == pytest.approx(spec.flops_fn(model), rel=1e-12)


_TINY_DIT = {"name": "DiT-S/2", "depth": 2, "hidden_size": 64, "num_heads": 4, "input_size": 8}


@pytest.mark.parametrize("model", [
    _TINY_DIT,
    {"name": "LargeDiT-600M/2", "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "input_size": 8},
    *[{**_TINY_DIT, **o} for o in BLOCK_OPTIONS],
    # Cross-attention over the release's 120 caption tokens, more than the 16 image tokens.
    {"name": "PixArt-alpha-XL/2-256", "depth": 2, "hidden_size": 48, "num_heads": 4, "text_hidden_size": 16,
     "input_size": 8},
])
def test_saved_activations_of_a_block_match_saved_tensor_hooks(model):
    """float32, so the count does not depend on the CPU's bf16 support; the fused SDPA path's extras included."""
    cfg = build_config({"output_dir": "unused", "model": {"num_classes": 10, **model}})
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
    x, t = torch.randn(b, 4, 8, 8), torch.randint(0, 1000, (b,))
    # A text family takes the caption its condition_keys name; the rest a class label.
    text = "text_embeds" in getattr(net, "condition_keys", ())
    cond = ({"text_embeds": torch.randn(b, 120, net.caption_channels), "text_mask": torch.ones(b, 120, dtype=torch.long)}
            if text else {"y": torch.randint(0, 10, (b,))})
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(x, t, **cond)
    costs = spec.costs_fn(cfg)
    predicted = b * costs.tokens * (costs.saved["none"] + costs.fused_attention).nbytes(4)
    # The norms' per-token statistics (a few floats) are not counted.
    assert sum(saved.values()) == pytest.approx(predicted, rel=0.08)
