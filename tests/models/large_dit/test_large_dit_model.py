"""Large-DiT (DiT_Llama): options, pipeline split, sizes on `meta`, CFG and the registry."""

import types

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.models import get_spec
from dit_trainer.models.spec import family_options
from dit_trainer.models.large_dit import SIZES, DiT_Llama, swiglu_hidden
from dit_trainer.models.rope import apply_rope, rope_cos_sin

TINY = dict(input_size=8, patch_size=2, in_channels=4, num_classes=10, dim=64, n_layers=2, n_heads=4, multiple_of=32)
OPTIONS = {
    "plain": {},
    "qk_norm": {"qk_norm": True},
    "gqa": {"n_kv_heads": 2},
    "gqa+qk_norm": {"n_kv_heads": 1, "qk_norm": True},
    "ffn_dim_multiplier": {"ffn_dim_multiplier": 1.5},
}


def tiny(**kw):
    return DiT_Llama(**{**TINY, **kw})


def shake(model, seed=0):
    """Move every weight off its initial value: adaLN-Zero makes most gradients zero at init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def inputs(n=4, seed=0, model=None):
    g = torch.Generator().manual_seed(seed)
    c, s = (4, 8) if model is None else (model.in_channels, model.input_size)
    return torch.randn(n, c, s, s, generator=g), torch.randint(0, 1000, (n,), generator=g), torch.randint(0, 10, (n,), generator=g)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_forward_backward_every_option(option):
    model = shake(tiny(**OPTIONS[option]))
    x, t, y = inputs()
    out = model(x, t, y)
    assert out.shape == (4, 8, 8, 8)  # learned sigma doubles the channels
    out.square().mean().backward()
    for name, p in model.named_parameters():
        if name == "y_embedder.embedding_table.weight":
            continue  # the null row gets no gradient without label dropout
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_options_change_the_parameters():
    plain, gqa, qk, ffn = (tiny(**OPTIONS[k]) for k in ("plain", "gqa", "qk_norm", "ffn_dim_multiplier"))
    head_dim = 64 // 4
    assert gqa.layers[0].attention.wk.weight.shape == (2 * head_dim, 64)
    assert gqa.layers[0].attention.wv.weight.shape == (2 * head_dim, 64)
    assert plain.layers[0].attention.wk.weight.shape == (64, 64)
    assert "layers.0.attention.q_norm.weight" in qk.state_dict()
    assert "layers.0.attention.q_norm.weight" not in plain.state_dict()
    # LLaMA's rule: 2/3 of 4·dim, times the multiplier, rounded up to multiple_of.
    assert plain.layers[0].feed_forward.w1.weight.shape[0] == 32 * -(-int(2 * 256 / 3) // 32)
    assert ffn.layers[0].feed_forward.w1.weight.shape[0] == 32 * -(-int(1.5 * int(2 * 256 / 3)) // 32)


def test_swiglu_width_of_llama_7b():
    assert swiglu_hidden(4096, 256) == 11008  # LLaMA-7B's published FFN width


def test_gqa_equals_mha_with_repeated_kv_heads():
    """Query head i reads kv head i // (n_heads / n_kv_heads), the release's grouping."""
    gqa = shake(tiny(n_kv_heads=2), seed=1).eval()
    mha = tiny().eval()
    sd = gqa.state_dict()
    for i in range(2):
        for w in ("wk", "wv"):
            key = f"layers.{i}.attention.{w}.weight"
            sd[key] = sd[key].unflatten(0, (2, 16)).repeat_interleave(2, dim=0).flatten(0, 1)
    mha.load_state_dict(sd)
    x, t, y = inputs()
    torch.testing.assert_close(gqa(x, t, y), mha(x, t, y), rtol=1e-5, atol=1e-6)


def test_rope_scores_depend_on_relative_position_only():
    cos, sin = rope_cos_sin(16, 32)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    seq = lambda v: v.expand(1, 32, 1, 16)  # the same vector at every position
    rq, rk = apply_rope(seq(q), cos, sin)[0, :, 0], apply_rope(seq(k), cos, sin)[0, :, 0]
    scores = rq @ rk.T
    torch.testing.assert_close(scores[3, 7], scores[10, 14])
    torch.testing.assert_close(scores[0, 0], (q * k).sum())
    assert not torch.allclose(scores[3, 7], scores[3, 8])


def test_forward_is_head_of_layers_of_embed():
    model = shake(tiny(qk_norm=True, n_kv_heads=2)).train()
    x, t, y = inputs()
    drop = torch.tensor([1, 0, 1, 0])
    tokens, c = model.embed(x, t, y, force_drop_ids=drop)
    assert tokens.shape == (4, 16, 64) and c.shape == (4, 64)
    for layer in model.layers:
        tokens = layer(tokens, c)
    torch.testing.assert_close(model.head(tokens, c), model(x, t, y, force_drop_ids=drop), rtol=0, atol=0)
    assert model.blocks is model.layers

    # force_drop_ids replaces labels by the null class, exactly as passing that class.
    null = torch.where(drop == 1, 10, y)
    torch.testing.assert_close(model(x, t, y, force_drop_ids=drop), model(x, t, null, force_drop_ids=torch.zeros(4)))


def test_a_stage_keeps_a_slice_of_blocks():
    """A pipeline stage replaces `blocks` by a ModuleDict of its layers, keyed by global index."""
    model = shake(tiny(n_layers=3)).eval()
    x, t, y = inputs()
    full = model(x, t, y)
    first = model.layers[0]
    model.blocks = torch.nn.ModuleDict({str(i): layer for i, layer in enumerate(model.layers)})
    assert model.layers is model.blocks and "blocks" not in dict(model.named_children())
    torch.testing.assert_close(model(x, t, y), full, rtol=0, atol=0)
    model.blocks = torch.nn.ModuleDict({"1": model.layers["1"], "2": model.layers["2"]})
    assert sorted({k.split(".")[1] for k in model.state_dict() if k.startswith("layers.")}) == ["1", "2"]
    tokens, c = model.embed(x, t, y)
    tokens = first(tokens, c)
    for layer in model.blocks.values():
        tokens = layer(tokens, c)
    torch.testing.assert_close(model.head(tokens, c), full, rtol=0, atol=0)


def test_release_names_and_no_position_table():
    sd = tiny(qk_norm=True).state_dict()
    for key in ("x_embedder.weight", "t_embedder.mlp.0.weight", "t_embedder.mlp.2.bias",
                "layers.1.attention.wo.weight", "layers.1.attention.k_norm.bias", "layers.1.feed_forward.w3.weight",
                "layers.1.attention_norm.weight", "layers.1.ffn_norm.weight", "layers.1.adaLN_modulation.1.weight",
                "final_layer.linear.bias", "final_layer.adaLN_modulation.1.weight"):
        assert key in sd, key
    assert not any("pos_embed" in k or "rope" in k or "freqs" in k for k in sd)
    assert not any(k.endswith(".bias") and (".w" in k) for k in sd)  # attention and SwiGLU have no biases


def test_conditioning_width_is_capped_at_1024():
    with torch.device("meta"):
        model = DiT_Llama(input_size=8, dim=1280, n_layers=1, n_heads=10, num_classes=10)
    assert model.y_embedder.embedding_table.weight.shape == (11, 1024)
    assert model.t_embedder.mlp[2].weight.shape == (1024, 1024)
    assert model.layers[0].adaLN_modulation[1].weight.shape == (6 * 1280, 1024)
    assert model.final_layer.adaLN_modulation[1].weight.shape == (2 * 1280, 1024)


def test_adaln_zero_init_makes_output_zero():
    model = tiny()
    x, t, y = inputs()
    assert model(x, t, y).abs().max() == 0
    assert all(layer.adaLN_modulation[1].weight.abs().max() == 0 for layer in model.layers)


def expected_params(dim, n_layers, n_heads, patch=2, in_ch=4, num_classes=1000, multiple_of=256):
    """Parameter count written out from the architecture, for learned sigma and 1000 classes."""
    c = min(dim, 1024)
    hidden = multiple_of * -(-int(2 * 4 * dim / 3) // multiple_of)
    layer = 4 * dim * dim + 3 * dim * hidden + 2 * dim + (c * 6 * dim + 6 * dim)
    embed = (patch * patch * in_ch * dim + dim) + (256 * c + c + c * c + c) + (num_classes + 1) * c
    final = (dim * patch * patch * 2 * in_ch + patch * patch * 2 * in_ch) + (c * 2 * dim + 2 * dim)
    return embed + n_layers * layer + final


@pytest.mark.parametrize("size", sorted(SIZES))
def test_release_sizes_on_meta(size, capsys):
    with torch.device("meta"):
        model = get_spec(f"LargeDiT-{size}/2").build_model_fn({"input_size": 32})
    n = sum(p.numel() for p in model.parameters())
    assert all(p.is_meta for p in model.parameters())
    assert n == expected_params(*SIZES[size])
    # No nominal-size check: the release's "3B" (dim 3072, 32 layers) counts 4.24B parameters.
    with capsys.disabled():
        print(f"\nLargeDiT-{size}/2 (DiT_Llama_{size}_patch2): {n:,} parameters")


def test_meta_then_to_empty_and_init_weights():
    with torch.device("meta"):
        model = tiny(qk_norm=True)
    model.to_empty(device="cpu")
    model.init_weights()
    fresh = tiny(qk_norm=True)
    for a, b in zip(model.buffers(), fresh.buffers()):
        torch.testing.assert_close(a, b)
    assert model.layers[0].attention.q_norm.weight.eq(1).all()
    x, t, y = inputs()
    assert torch.isfinite(model(x, t, y)).all()


def test_forward_with_cfg():
    model = shake(tiny()).eval()
    x, t, y = inputs()
    x = torch.cat([x[:2], x[:2]])
    y_cfg = torch.cat([y[:2], torch.full((2,), 10)])
    out = model.forward_with_cfg(x, t, y_cfg, 4.0)
    plain = model(x, t, y_cfg)
    assert out.shape == plain.shape == (4, 8, 8, 8)
    torch.testing.assert_close(out[:2, :4], out[2:, :4])  # one guided eps for both halves
    cond, uncond = plain[:2, :4], plain[2:, :4]
    torch.testing.assert_close(out[:2, :4], uncond + 4.0 * (cond - uncond))
    torch.testing.assert_close(out[:, 4:], plain[:, 4:])  # learned sigma is not guided
    torch.testing.assert_close(model.forward_with_cfg(x, t, y_cfg, 1.0)[:2], plain[:2])
    three = model.forward_with_cfg(x, t, y_cfg, 4.0, cfg_channels=3)  # the release's choice
    torch.testing.assert_close(three[:2, :3], out[:2, :3])
    torch.testing.assert_close(three[:, 3:], plain[:, 3:])


def test_registry_names_and_overrides():
    for size, (dim, n_layers, n_heads) in SIZES.items():
        assert get_spec(f"LargeDiT-{size}/2") is get_spec(f"DiT_Llama_{size}_patch2")
    model = get_spec("DiT_Llama_7B_patch2").build_model_fn(
        {"name": "DiT_Llama_7B_patch2", "input_size": 8, "dim": 32, "n_layers": 1, "n_heads": 2, "qk_norm": True,
         "num_classes": 3, "in_channels": 2, "learn_sigma": False})
    assert (model.dim, len(model.layers), model.n_heads, model.num_classes) == (32, 1, 2, 3)
    assert (model.in_channels, model.out_channels, model.learn_sigma) == (2, 2, False)
    with pytest.raises(ConfigError, match="depth"):
        family_options("LargeDiT-600M/2", {"depth": 4})  # a DiT key in a Large-DiT config
    assert family_options("dit_llama_600m_patch2", {"n_kv_heads": "8", "qk_norm": "true"}) == {"n_kv_heads": 8, "qk_norm": True}
    with pytest.raises(ConfigError, match="n_kv_heads"):
        get_spec("LargeDiT-600M/2").build_model_fn({"dim": 64, "n_heads": 4, "n_kv_heads": 3})


@pytest.mark.parametrize("options, needle", [
    ({"dim": 66, "n_heads": 2}, "33 must be even"), ({"n_heads": 0}, "model.n_heads is 0"),
    ({"multiple_of": 0}, "model.multiple_of is 0"), ({"patch_size": 3}, "model.input_size 8 is not divisible"),
])
def test_bad_sizes_are_one_line_at_config_validation(options, needle):
    # Before, zeros and a patch not dividing the input were tracebacks from building the model.
    with pytest.raises(ConfigError, match=needle) as err:
        family_options("LargeDiT-600M/2", options, model=types.SimpleNamespace(input_size=8))
    assert "\n" not in str(err.value)
