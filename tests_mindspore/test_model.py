"""The MindSpore DiT against ours: names, shapes, forward outputs; the conversion map."""

import numpy as np
import pytest
from conftest import TINY, copy_into, rel, torch_dit, torch

from dit_trainer_mindspore.convert import name_map
from dit_trainer_mindspore.model import DiT


def test_names_and_shapes_equal_pytorch_and_the_generated_map():
    tm, mm = torch_dit(TINY), DiT(**TINY)
    ours = [(k, tuple(v.shape)) for k, v in tm.state_dict().items()]
    theirs = [(n, tuple(p.shape)) for n, p in mm.parameters_and_names()]
    assert theirs == ours
    generated = name_map("DiT-S/2", input_size=8, num_classes=10, depth=2, hidden_size=64)
    assert [(k, s) for k, (_, s) in generated.items()] == ours
    assert not mm.pos_embed.requires_grad


@pytest.mark.parametrize("name,count", [("DiT-XL/2", 292), ("DiT-L/4", 252), ("DiT-B/8", 132), ("DiT-S/2", 132)])
def test_name_map_counts_per_size(name, count):
    from dit_trainer.models.dit.model import DiT_models

    nm = name_map(name)
    assert len(nm) == count
    if name in ("DiT-S/2", "DiT-B/8"):  # the large ones only by count (building them takes seconds)
        sd = DiT_models[name]().state_dict()
        assert {k: tuple(v.shape) for k, v in sd.items()} == {k: s for k, (_, s) in nm.items()}


def test_forward_equals_pytorch_with_converted_weights():
    tm, mm = torch_dit(TINY), DiT(**TINY)
    copy_into(mm, tm)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 4, 8, 8)).astype(np.float32)
    t, y, drop = np.array([0, 5, 500, 999]), np.array([1, 2, 3, 9]), np.array([0, 1, 0, 0])
    tm.eval()
    with torch.no_grad():
        ref = tm(torch.from_numpy(x), torch.from_numpy(t), torch.from_numpy(y), force_drop_ids=torch.from_numpy(drop))
    import mindspore as ms

    out = mm(ms.Tensor(x), ms.Tensor(t.astype(np.int32)), ms.Tensor(y.astype(np.int32)), ms.Tensor(drop.astype(np.int32)))
    assert out.shape == (4, 8, 8, 8)
    assert rel(out.asnumpy(), ref.numpy()) < 1e-4
    # The dropped label really went to the null row: changing its class changes nothing.
    y2 = y.copy()
    y2[1] = 0
    out2 = mm(ms.Tensor(x), ms.Tensor(t.astype(np.int32)), ms.Tensor(y2.astype(np.int32)), ms.Tensor(drop.astype(np.int32)))
    np.testing.assert_array_equal(out2.asnumpy(), out.asnumpy())
