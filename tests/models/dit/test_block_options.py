"""DiT's and SiT's block options (model.norm, model.mlp, model.rope, model.qk_norm): each builds with
its own layers and names, runs, learns, round-trips its state dict and is planned for TP; bad values
are one-line errors; the weights tell the options they hold."""

import copy
import types

import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.models import get_spec
from dit_trainer.models.dit.parallelize import apply_tp, tp_plan
from dit_trainer.models.dit.weights_shape import block_options_of, weights_shape

ALL = {"norm": "rmsnorm", "mlp": "swiglu", "rope": True, "qk_norm": True}
OPTIONS = [{"norm": "rmsnorm"}, {"mlp": "swiglu"}, {"rope": True}, {"qk_norm": True}, ALL]
IDS = ["rmsnorm", "swiglu", "rope", "qk_norm", "all"]
# The tensors each option adds to block 0 and the final layer (RoPE adds none), and what it drops.
ADDED = {"norm": {"blocks.0.norm1.weight", "blocks.0.norm2.weight", "final_layer.norm_final.weight"},
         "mlp": {"blocks.0.mlp.w1.weight", "blocks.0.mlp.w2.weight", "blocks.0.mlp.w3.weight"},
         "rope": set(), "qk_norm": {"blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.weight"}}
GELU_MLP = {"blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc1.bias", "blocks.0.mlp.fc2.weight", "blocks.0.mlp.fc2.bias"}


def tiny(name="DiT-S/2", seed=0, **options):
    """Depth 2, hidden 64, 4 heads of 16, 8x8x4 inputs, 10 classes; random weights everywhere (adaLN-Zero's
    zeros would hide the blocks), fixed positions kept."""
    torch.manual_seed(seed)
    model = get_spec(name).build_model_fn({"name": name, "input_size": 8, "num_classes": 10, "depth": 2,
                                           "hidden_size": 64, "num_heads": 4, **options})
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key != "pos_embed":
                p.add_(torch.randn_like(p) * 0.05)
    return model


def inputs(b=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 4, 8, 8, generator=g), torch.randint(0, 1000, (b,), generator=g), torch.randint(0, 10, (b,), generator=g)


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("name", ["DiT-S/2", "SiT-S/2"])
def test_each_option_builds_its_layers_and_runs(name, options):
    model, base = tiny(name, **options), tiny(name)
    keys, base_keys = set(model.state_dict()), set(base.state_dict())
    def both_blocks(names):
        return {k.replace("blocks.0.", f"blocks.{i}.") for k in names for i in (0, 1)}

    assert keys - base_keys == both_blocks(set().union(*(ADDED[k] for k in options)))
    assert base_keys - keys == (both_blocks(GELU_MLP) if "mlp" in options else set())
    out = model(*inputs())
    assert out.shape == base(*inputs()).shape == ((4, 8, 8, 8) if name == "DiT-S/2" else (4, 4, 8, 8))
    assert torch.isfinite(out).all()
    # Every option changes the function (RoPE included, though it holds no tensor).
    sd = {k: v for k, v in model.state_dict().items() if k in base_keys}
    plain = tiny(name)
    plain.load_state_dict(sd, strict=False)
    assert not torch.allclose(plain(*inputs()), out)


def test_swiglu_width_is_lightningdits():
    # int(2/3 * int(hidden * mlp_ratio)): DiT-S's 1536 -> 1024, a width with no rounding to a multiple.
    for hidden, ratio, width in ((384, 4.0, 1024), (1024, 4.0, 2730), (64, 2.5, 106)):
        with torch.device("meta"):
            model = get_spec("DiT-S/2").build_model_fn({"depth": 1, "hidden_size": hidden, "num_heads": 4,
                                                        "mlp_ratio": ratio, "mlp": "swiglu"})
        mlp = model.blocks[0].mlp
        assert (mlp.w1.out_features, mlp.w3.out_features, mlp.w2.in_features) == (width,) * 3
        assert mlp.w1.bias is None and mlp.w2.bias is None


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
def test_state_dict_round_trips(options, tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny(**options).eval()
    save_file(model.state_dict(), str(tmp_path / "w.safetensors"))
    other = tiny(seed=7, **options).eval()
    other.load_state_dict(load_file(str(tmp_path / "w.safetensors")), strict=True)
    assert torch.equal(other(*inputs()), model(*inputs()))
    if options != {"rope": True}:  # the release's block does not take them
        with pytest.raises(RuntimeError):
            tiny().load_state_dict(model.state_dict(), strict=True)


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
def test_loss_falls_on_a_tiny_run(options):
    model = tiny(**options).train()
    x, t, y = inputs(8)
    target = torch.randn(8, 8, 8, 8, generator=torch.Generator().manual_seed(3))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = torch.nn.functional.mse_loss(model(x, t, y, force_drop_ids=torch.zeros(8, dtype=torch.long)), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    # The options' own parameters learn too.
    for key, p in model.named_parameters():
        if any(part in key for part in ("norm", "w1", "w3")):
            assert p.grad is not None and p.grad.abs().sum() > 0, key


def test_rope_scores_depend_on_the_2d_offset_only():
    from dit_trainer.models.rope import apply_rope, rope_cos_sin_2d

    grid, d = 4, 16
    cos, sin = rope_cos_sin_2d(d, grid)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, d, generator=g), torch.randn(1, 1, 1, d, generator=g)
    rq = apply_rope(q.expand(1, grid * grid, 1, d), cos, sin)[0, :, 0]
    rk = apply_rope(k.expand(1, grid * grid, 1, d), cos, sin)[0, :, 0]
    s = (rq @ rk.T).reshape(grid, grid, grid, grid)  # [row_q, col_q, row_k, col_k]
    torch.testing.assert_close(s[0, 1, 2, 3], s[1, 0, 3, 2])  # offset (2, 2) both
    torch.testing.assert_close(s[0, 0, 0, 0], (q * k).sum())
    assert not torch.allclose(s[0, 0, 1, 0], s[0, 0, 0, 1])  # rows and columns turn different channels


def test_default_blocks_keep_the_release_path():
    # No option: no q/k norm modules and no rotary buffers, so state dicts and kernels are the release's.
    attn = tiny().blocks[0].attn
    assert not hasattr(attn, "q_norm") and not hasattr(attn, "rope_cos")
    assert list(tiny(rope=True).state_dict()) == list(tiny().state_dict())


def test_pipeline_stages_keep_rope_tables():
    from dit_trainer.models.dit.parallelize import split_stage

    full = tiny(**ALL).eval()
    x, t, y = inputs()
    drop = torch.zeros(4, dtype=torch.long)
    first = split_stage(copy.deepcopy(full), 0, 1, first=True, last=False)
    last = split_stage(copy.deepcopy(full), 1, 2, first=False, last=True)
    # Not bitwise: a stage hands on contiguous tokens, the full model the patch embedder's strided ones,
    # and RMSNorm rounds the two layouts apart in the last bit.
    torch.testing.assert_close(last(*first(x, t, y, drop)), full(x, t, y, force_drop_ids=drop), rtol=1e-6, atol=1e-6)


def test_tp_plan_covers_the_option_layers():
    plan = tp_plan(tiny(**ALL).blocks[0])
    assert {k: type(v).__name__ for k, v in plan.items()} == {
        "attn.qkv": "ColwiseParallel", "attn.proj": "RowwiseParallel", "mlp.w1": "ColwiseParallel",
        "mlp.w3": "ColwiseParallel", "mlp.w2": "RowwiseParallel", "attn.q_norm": "SequenceParallel",
        "attn.k_norm": "SequenceParallel"}
    assert set(tp_plan(tiny().blocks[0])) == {"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"}
    # SwiGLU's width, not fc1's, is what tp must divide: 4 heads, 170 channels at tp 4.
    with pytest.raises(ConfigError, match="170 SwiGLU channels"):
        apply_tp(tiny(mlp="swiglu"), types.SimpleNamespace(size=lambda: 4))


@pytest.mark.parametrize("model,match", [
    ({"norm": "batchnorm"}, "model.norm is 'batchnorm'; use one of layernorm, rmsnorm"),
    ({"mlp": "geglu"}, "model.mlp is 'geglu'; use one of gelu, swiglu"),
    ({"rope": True, "hidden_size": 72, "num_heads": 12}, "model.rope needs a head width .* multiple of 4"),
])
def test_bad_options_are_one_line_errors(model, match):
    with pytest.raises(ConfigError, match=match) as err:
        build_config({"output_dir": "unused", "model": {"name": "DiT-S/2", **model}})
    assert "\n" not in str(err.value)


def test_weights_tell_their_block_options():
    sd = tiny(**ALL).state_dict()
    assert block_options_of(sd) == {"norm": "rmsnorm", "mlp": "swiglu", "qk_norm": True}
    assert block_options_of(tiny().state_dict()) == {}
    keys = weights_shape(sd, None, {"num_heads": 4}, "w.safetensors")
    assert {k: keys.get(k) for k in ("norm", "mlp", "qk_norm", "mlp_ratio")} == {
        "norm": "rmsnorm", "mlp": "swiglu", "qk_norm": True, "mlp_ratio": None}
    with pytest.raises(ConfigError, match="model.mlp is gelu but w.safetensors holds swiglu"):
        weights_shape(sd, None, {"num_heads": 4, "mlp": "gelu"}, "w.safetensors")
    # A SwiGLU of another ratio gives back a ratio whose width is the tensors'.
    odd = tiny(mlp="swiglu", mlp_ratio=2.5).state_dict()
    ratio = weights_shape(odd, None, {"num_heads": 4}, "w")["mlp_ratio"]
    assert int(2 / 3 * int(64 * ratio)) == odd["blocks.0.mlp.w1.weight"].shape[0]
