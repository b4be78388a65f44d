"""REPA's projector and loss against a plain reimplementation of the release's formulas, the model's
forward with and without them, and where the aligned block is."""

import pytest
import torch
import torch.nn.functional as F
from tests.repa._tiny import TINY_REPA

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.models import get_spec
from dit_trainer.repa.attach import drop_projector
from dit_trainer.repa.config import resolve_depth
from dit_trainer.repa.projector import alignment_loss, build_projector

MODELS = {
    "DiT-S/2": {"depth": 4, "hidden_size": 32, "num_heads": 2},
    "SiT-S/2": {"depth": 4, "hidden_size": 32, "num_heads": 2},
    "LargeDiT-600M/2": {"dim": 32, "n_layers": 4, "n_heads": 2},
}


def _release_proj_loss(zs, zs_tilde):
    # The REPA release's SILoss term, written out: per image, the token mean of -<z/|z|, z~/|z~|>,
    # summed over the batch and divided by its size.
    total, bsz = 0.0, zs[0].shape[0]
    for z, z_tilde in zip(zs, zs_tilde):
        for z_j, z_tilde_j in zip(z, z_tilde):
            z_j = z_j / z_j.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            z_tilde_j = z_tilde_j / z_tilde_j.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            total = total + (-(z_j * z_tilde_j).sum(dim=-1)).mean()
    return total / (len(zs) * bsz)


def _release_mlp(weights, x):
    (w0, b0), (w1, b1), (w2, b2) = weights
    return F.linear(F.silu(F.linear(F.silu(F.linear(x, w0, b0)), w1, b1)), w2, b2)


def test_projector_and_loss_equal_the_release_formulas():
    torch.manual_seed(0)
    mlp = build_projector(24, 64, 16)
    assert [type(m).__name__ for m in mlp] == ["Linear", "SiLU", "Linear", "SiLU", "Linear"]
    assert (mlp[0].in_features, mlp[0].out_features, mlp[2].out_features, mlp[4].out_features) == (24, 64, 64, 16)
    assert all(torch.count_nonzero(mlp[i].bias) == 0 for i in (0, 2, 4))  # the release's zero biases
    hidden, target = torch.randn(3, 10, 24), torch.randn(3, 10, 16)
    weights = [(mlp[i].weight, mlp[i].bias) for i in (0, 2, 4)]
    ours = mlp(hidden)
    theirs = _release_mlp(weights, hidden.reshape(-1, 24)).reshape(3, 10, 16)  # the release flattens tokens
    assert torch.allclose(ours, theirs, atol=1e-6)
    per_image = alignment_loss(ours, target)
    assert per_image.shape == (3,)
    assert abs(per_image.mean().item() - _release_proj_loss([target], [theirs]).item()) < 1e-5
    # Aligned features reach the minimum -1, opposite ones +1.
    assert torch.allclose(alignment_loss(target, 2 * target), torch.full((3,), -1.0), atol=1e-6)
    assert torch.allclose(alignment_loss(-target, target), torch.full((3,), 1.0), atol=1e-6)


def _cfg(name, repa=None):
    model = {"name": name, "input_size": 8, "in_channels": 4, "num_classes": 10, **MODELS[name]}
    return build_config({"model": model, **({"repa": repa} if repa else {})})


@pytest.mark.parametrize("name", list(MODELS))
def test_forward_returns_the_projected_tokens_of_the_aligned_block(name):
    spec = get_spec(name)
    torch.manual_seed(0)
    plain = spec.build_model_fn(_cfg(name))
    torch.manual_seed(0)
    model = spec.build_model_fn(_cfg(name, TINY_REPA))
    assert not hasattr(plain, "repa_projector") and model.repa_depth == 1  # round(4 * 8 / 28)
    # The denoiser's weights are the release model's: the projector is built after them.
    assert drop_projector(model.state_dict()).keys() == plain.state_dict().keys()
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in drop_projector(model.state_dict()).items())
    seen = []
    model.blocks[0].register_forward_hook(lambda m, args, out: seen.append(out))
    x, t, y = torch.randn(2, 4, 8, 8), torch.rand(2), torch.tensor([1, 2])
    out, projected = model(x, t, y, repa=True)
    assert torch.equal(out, model(x, t, y)) and torch.equal(out, plain(x, t, y))  # off: the release's output
    assert projected.shape == (2, 16, 16)
    assert torch.allclose(projected, model.repa_projector(seen[0]))


def test_the_release_model_is_untouched_when_off():
    cfg = _cfg("SiT-S/2")
    assert cfg.repa.enabled is False
    model = get_spec("SiT-S/2").build_model_fn(cfg)
    assert not any(k.startswith("repa") for k in model.state_dict())
    with pytest.raises(ValueError, match="no REPA projector"):
        model(torch.randn(1, 4, 8, 8), torch.rand(1), torch.tensor([0]), repa=True)


def test_default_depth_is_the_releases_8_for_every_model_and_0_scales_it():
    r = build_config({"repa": {"enabled": True}}).repa
    assert [resolve_depth(r, n) for n in (28, 24, 12, 8)] == [8, 8, 8, 8]
    with pytest.raises(ConfigError, match="past the model's 4 blocks"):
        resolve_depth(r, 4)
    r.encoder_depth = 0
    assert [resolve_depth(r, n) for n in (28, 24, 12, 2, 1)] == [8, 7, 3, 1, 1]
    r.encoder_depth = 5
    assert resolve_depth(r, 12) == 5


@pytest.mark.parametrize("repa,key", [
    ({"coefficient": 0}, "repa.coefficient"), ({"encoder_depth": -1}, "repa.encoder_depth"),
    ({"projector_dim": 0}, "repa.projector_dim"), ({"encoder_size": 2.5}, "repa.encoder_size"),
    ({"encoder_overrides": [1]}, "repa.encoder_overrides"),
])
def test_bad_values_are_one_line(repa, key):
    with pytest.raises(ConfigError) as err:
        build_config({"repa": {"enabled": True, **repa}})
    assert key in str(err.value) and "\n" not in str(err.value)


def test_pipeline_parallel_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        build_config({"repa": {"enabled": True}, "parallel": {"pp": 2}})
    assert "parallel.pp 1" in str(err.value) and "\n" not in str(err.value)


def test_encoder_input_size_matches_the_token_grid():
    from dit_trainer.repa.config import encoder_size

    r = build_config({"repa": {"enabled": True}}).repa
    assert encoder_size(r, 16) == 224  # REPA's 224 px for a /2 model on 256 px images
    assert encoder_size(r, 32) == 448
    r.encoder_size = 210
    with pytest.raises(ConfigError, match="set repa.encoder_size 224"):
        encoder_size(r, 16)


def test_the_aligned_block_inside_a_routed_span_is_refused():
    from dit_trainer.models.routing import TokenRouting

    name = "DiT-S/2"
    model = get_spec(name).build_model_fn(_cfg(name, {**TINY_REPA, "encoder_depth": 2}))
    route = TokenRouting(4, 16, 8, 1, 3).draw(2, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="routed subset"):
        model.train()(torch.randn(2, 4, 8, 8), torch.rand(2), torch.tensor([1, 2]), route=route, repa=True)
