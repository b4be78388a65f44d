"""DiT's parallel plan in-process: pipeline stages compose to the model, names survive."""

import copy
import types

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.models import DiT
from dit_trainer.models.dit.parallelize import apply_tp, split_stage, units


def _tiny(**kw):
    torch.manual_seed(0)
    model = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=3, num_heads=4, num_classes=10, **kw)
    for p in model.parameters():  # leave adaLN-Zero's identity start so that gradients are non-trivial
        torch.nn.init.normal_(p, std=0.05)
    return model


def test_pipeline_stages_compose_to_the_model():
    full = _tiny()
    g = torch.Generator().manual_seed(2)
    x, t, y = torch.randn(2, 4, 8, 8, generator=g), torch.tensor([5, 50]), torch.tensor([3, 4])
    drop = torch.tensor([0, 1])
    ref = full(x, t, y, force_drop_ids=drop)
    first = split_stage(copy.deepcopy(full), 0, 2, first=True, last=False)
    last = split_stage(copy.deepcopy(full), 2, 3, first=False, last=True)
    assert {n for n, _ in first.named_parameters()} | {n for n, _ in last.named_parameters()} == {
        n for n, _ in full.named_parameters()
    }
    assert torch.equal(last(*first(x, t, y, drop)), ref)



def test_stage_units_keep_their_original_indices():
    stage = split_stage(_tiny(), 1, 3, first=False, last=True)
    assert list(stage.blocks) == ["1", "2"] and len(units(stage)) == 2
    assert not hasattr(stage, "x_embedder") and hasattr(stage, "final_layer")



def test_tp_error_names_only_what_does_not_divide():
    # 3 heads of 8 channels, MLP 96 wide: tp 2 divides the MLP, not the heads.
    model = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=24, depth=1, num_heads=3, num_classes=10)
    with pytest.raises(ConfigError) as err:
        apply_tp(model, types.SimpleNamespace(size=lambda: 2))  # the degree is checked before the mesh is used
    text = str(err.value)
    assert "3 attention heads; change model.num_heads" in text and "MLP" not in text and "divides 3" in text


def test_tp_error_names_the_mlp_keys_and_says_no_degree_fits():
    # 2 heads, MLP int(68 x 1.25) = 85 wide: gcd 1, so no parallel.tp > 1 fits this width.
    model = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=68, depth=1, num_heads=2, num_classes=10,
                mlp_ratio=1.25)
    with pytest.raises(ConfigError) as err:
        apply_tp(model, types.SimpleNamespace(size=lambda: 2))
    text = str(err.value)
    assert "85 MLP channels" in text and "model.mlp_ratio or model.hidden_size" in text
    assert "needs a different width" in text and "divisor of 1" not in text and "heads" not in text
