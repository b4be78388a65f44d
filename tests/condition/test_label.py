"""ClassCondition: the release's label dropout (the same draw, the same model call) as a condition value."""

import pytest
import torch

from dit_trainer.condition import ClassCondition, build_condition
from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.models import get_spec


def test_class_families_build_a_class_condition():
    cfg = build_config({"model": {"name": "SiT-S/2", "num_classes": 7, "class_dropout_prob": 0.25}})
    cond = build_condition(cfg, get_spec(cfg.model.name))
    assert isinstance(cond, ClassCondition) and cond.keys == ("y",)
    assert (cond.num_classes, cond.dropout_prob) == (7, 0.25)


def test_draw_is_the_release_label_dropout_stream():
    """`torch.rand(n) < p` as int64 from the step generator: what every class run and checkpoint drew before."""
    cond = ClassCondition(10, 0.3)
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    drawn = cond.draw_drop(16, a)
    assert drawn.dtype == torch.long and torch.equal(drawn, (torch.rand(16, generator=b) < 0.3).long())
    assert torch.equal(a.get_state(), b.get_state())  # nothing more drawn: the routing draws after stay aligned


def test_inputs_drop_and_guidance_kwargs():
    cond = ClassCondition(10, 0.1)
    y = torch.tensor([1, 2, 3])
    assert torch.equal(cond.inputs((torch.zeros(3, 4), y), "cpu")["y"], y)  # (x, y) pairs, as datasets yield
    kwargs = cond.drop(cond.inputs({"x": torch.zeros(3), "y": y.int()}, "cpu"), torch.tensor([0, 1, 0]))
    assert kwargs["y"].dtype == torch.long and torch.equal(kwargs["force_drop_ids"], torch.tensor([0, 1, 0]))
    doubled = cond.guidance_kwargs(cond.from_labels([4, 5], "cpu"), cond.unconditional(2, "cpu"))
    assert doubled["y"].tolist() == [4, 5, 10, 10]  # labels then the null class, as DiT's sample.py
    with pytest.raises(ConfigError, match=r"0\.\.9"):
        cond.from_labels([10], "cpu")
