"""DiT family: shapes, parameter counts, the release's names, save/load and CFG (DIT-UT-01)."""

import pytest
import torch

from dit_trainer.models import DiT, DiT_models, get_spec
from dit_trainer.models.layers import get_2d_sincos_pos_embed

# (depth, hidden, heads) of the paper's sizes; the counts below are computed from these
# independently of the module, layer by layer, with learned sigma and 1000 classes at 32x32.
SIZES = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}


def expected_params(depth, d, patch, in_ch=4, num_classes=1000, input_size=32, learn_sigma=True):
    out_ch = in_ch * 2 if learn_sigma else in_ch
    n_patches = (input_size // patch) ** 2
    x_emb = in_ch * patch * patch * d + d
    t_emb = (256 * d + d) + (d * d + d)
    y_emb = (num_classes + 1) * d
    pos = n_patches * d
    block = (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + (d * 6 * d + 6 * d)
    final = (d * 2 * d + 2 * d) + (d * patch * patch * out_ch + patch * patch * out_ch)
    return x_emb + t_emb + y_emb + pos + depth * block + final


def small(**kw):
    args = dict(input_size=8, in_channels=4, num_classes=10, depth=2, hidden_size=64, num_heads=4)
    args.update(kw)
    return get_spec(args.pop("name", "DiT-S/2")).build_model_fn(args)


def test_twelve_names():
    assert sorted(DiT_models) == sorted(f"DiT-{s}/{p}" for s in SIZES for p in (2, 4, 8))


@pytest.mark.parametrize("name", sorted(DiT_models))
def test_parameter_count_every_config(name):
    size, patch = name[4:].split("/")
    depth, hidden, _ = SIZES[size]
    with torch.device("meta"):
        model = DiT_models[name]()
    assert sum(p.numel() for p in model.parameters()) == expected_params(depth, hidden, int(patch))


def test_xl2_matches_release():
    with torch.device("meta"):
        model = DiT_models["DiT-XL/2"]()
    sd = model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == 675_129_632
    assert len(sd) == 292
    for key in ["pos_embed", "x_embedder.proj.weight", "t_embedder.mlp.0.weight", "t_embedder.mlp.2.bias",
                "y_embedder.embedding_table.weight", "blocks.27.attn.qkv.weight", "blocks.0.attn.proj.bias",
                "blocks.3.mlp.fc1.weight", "blocks.3.mlp.fc2.weight", "blocks.5.adaLN_modulation.1.weight",
                "final_layer.adaLN_modulation.1.bias", "final_layer.linear.weight"]:
        assert key in sd, key
    assert tuple(sd["y_embedder.embedding_table.weight"].shape) == (1001, 1152)
    assert tuple(sd["blocks.0.attn.qkv.weight"].shape) == (3456, 1152)
    assert tuple(sd["pos_embed"].shape) == (1, 256, 1152)


def test_s2_about_33m():
    with torch.device("meta"):
        n = sum(p.numel() for p in DiT_models["DiT-S/2"]().parameters())
    assert 32.5e6 < n < 33.5e6


@pytest.mark.parametrize("learn_sigma,channels", [(True, 8), (False, 4)])
def test_forward_shape(learn_sigma, channels):
    torch.manual_seed(0)
    model = DiT_models["DiT-S/8"](input_size=32, learn_sigma=learn_sigma, num_classes=10)
    x = torch.randn(2, 4, 32, 32)
    out = model(x, torch.tensor([1, 500]), torch.tensor([3, 7]))
    assert out.shape == (2, channels, 32, 32)


def test_adaln_zero_init():
    model = small()
    for block in model.blocks:
        assert block.adaLN_modulation[-1].weight.abs().sum() == 0
    assert model.final_layer.linear.weight.abs().sum() == 0
    # Zero final layer: the untrained model predicts exactly zero.
    out = model(torch.randn(2, 4, 8, 8), torch.tensor([3, 9]), torch.tensor([1, 2]))
    assert torch.count_nonzero(out) == 0


def _randomise(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_state_dict_roundtrip(tmp_path):
    from safetensors.torch import load_file, save_file

    a = small()
    _randomise(a)
    save_file({k: v.contiguous() for k, v in a.state_dict().items()}, str(tmp_path / "m.safetensors"))
    torch.save(a.state_dict(), tmp_path / "m.pt")
    b, c = small(), small()
    b.load_state_dict(load_file(str(tmp_path / "m.safetensors")), strict=True)
    c.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True), strict=True)
    a.eval(), b.eval(), c.eval()
    x, t, y = torch.randn(3, 4, 8, 8), torch.tensor([0, 10, 999]), torch.tensor([0, 5, 9])
    assert torch.equal(a(x, t, y), b(x, t, y))
    assert torch.equal(a(x, t, y), c(x, t, y))


def _reference_attention(attn, x):
    # The textbook formula, written independently of F.scaled_dot_product_attention.
    B, N, C = x.shape
    h = attn.num_heads
    qkv = attn.qkv(x).reshape(B, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    a = (q @ k.transpose(-2, -1)) * (C // h) ** -0.5
    out = (a.softmax(-1) @ v).transpose(1, 2).reshape(B, N, C)
    return attn.proj(out)


def test_attention_matches_formula():
    model = small()
    _randomise(model)
    attn = model.blocks[0].attn
    x = torch.randn(2, 16, 64)
    torch.testing.assert_close(attn(x), _reference_attention(attn, x), rtol=1e-5, atol=1e-6)


def test_pos_embed_layout():
    emb = get_2d_sincos_pos_embed(8, 3)
    # Token (row 0, col 2): the first half encodes the column, the second the row.
    assert emb.shape == (9, 8)
    assert emb[2, 0] == pytest.approx(0.9092974, rel=1e-6)  # sin(2)
    assert emb[2, 4] == pytest.approx(0.0)  # sin(0) for row 0


def test_forward_with_cfg():
    model = small()
    _randomise(model)
    model.eval()
    x = torch.randn(2, 4, 8, 8)
    xx, t, y = torch.cat([x, x]), torch.tensor([5, 5, 5, 5]), torch.tensor([1, 2, 10, 10])
    out = model.forward_with_cfg(xx, t, y, 4.0)
    full = model(xx, t, y)
    cond, uncond = full[:2, :4], full[2:, :4]
    guided = uncond + 4.0 * (cond - uncond)
    torch.testing.assert_close(out[:2, :4], guided)
    torch.testing.assert_close(out[2:, :4], guided)
    torch.testing.assert_close(out[:, 4:], full[:, 4:])
    # The release's behaviour: only three channels guided.
    out3 = model.forward_with_cfg(xx, t, y, 4.0, cfg_channels=3)
    torch.testing.assert_close(out3[:2, :3], guided[:, :3])
    torch.testing.assert_close(out3[:, 3:], full[:, 3:])


def test_label_dropout_uses_null_class():
    model = small()
    emb = model.y_embedder
    y = torch.tensor([1, 2, 3])
    dropped = emb.token_drop(y, force_drop_ids=torch.tensor([1, 0, 1]))
    assert dropped.tolist() == [10, 2, 10]
    assert emb.embedding_table.num_embeddings == 11


def test_bad_sizes():
    with pytest.raises(ValueError, match="divisible"):
        DiT(input_size=9, patch_size=2, depth=1, hidden_size=64, num_heads=4)
    with pytest.raises(ValueError, match="num_heads"):
        DiT(input_size=8, patch_size=2, depth=1, hidden_size=60, num_heads=7)
