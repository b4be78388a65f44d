"""MeanFlow's interval input in every family: absent from the model and its state dict unless the objective
is meanflow; with it, zero at init, so the model is its flow model whatever h, and h matters once trained."""

import pytest
import torch
from tests.meanflow._tiny import randomised

from dit_trainer.config import build_config
from dit_trainer.models import get_spec

FAMILIES = {
    "DiT-S/2": {"depth": 2, "hidden_size": 32, "num_heads": 2},
    "SiT-S/2": {"depth": 2, "hidden_size": 32, "num_heads": 2},
    "LargeDiT-600M/2": {"dim": 32, "n_layers": 2, "n_heads": 2, "multiple_of": 16},
}


def build(name, objective, seed=0):
    cfg = build_config({"objective": objective, "model": {"name": name, "input_size": 8, "in_channels": 4,
                                                           "num_classes": 10, "learn_sigma": False,
                                                           **FAMILIES[name]}})
    torch.manual_seed(seed)
    return get_spec(name).build_model_fn(cfg).eval()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_interval_embedding_only_under_meanflow(name):
    flow, meanflow = build(name, "transport"), build(name, "meanflow")
    extra = sorted(set(meanflow.state_dict()) - set(flow.state_dict()))
    assert extra == [f"h_embedder.mlp.{i}.{p}" for i in (0, 2) for p in ("bias", "weight")]
    assert set(flow.state_dict()) == set(build(name, "diffusion").state_dict())
    assert all(not k.startswith("h_embedder") for k in build(name, "diffusion").state_dict())
    with pytest.raises(ValueError, match="no interval"):
        flow(torch.zeros(1, 4, 8, 8), torch.zeros(1), torch.zeros(1, dtype=torch.long), h=torch.zeros(1))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_flow_models_weights_make_the_meanflow_model_that_flow_model(name):
    """The flow model's weights in a MeanFlow model (its own zero interval embedder beside them): at h = 0,
    and at any h while the embedder is zero, the output is the flow model's bit for bit."""
    flow = randomised(build(name, "transport"), seed=3)
    meanflow = build(name, "meanflow")
    own = {k: v for k, v in meanflow.state_dict().items() if k.startswith("h_embedder")}
    meanflow.load_state_dict({**flow.state_dict(), **own})
    g = torch.Generator().manual_seed(1)
    x, t, y = torch.randn(3, 4, 8, 8, generator=g), torch.rand(3, generator=g), torch.tensor([0, 4, 10])
    want = flow(x, t, y)
    assert torch.equal(meanflow(x, t, y, h=torch.zeros(3)), want)
    assert torch.equal(meanflow(x, t, y, h=torch.tensor([0.1, 0.5, 1.0])), want)
    assert torch.equal(meanflow(x, t, y), want)  # h None is 0
    randomised(meanflow.h_embedder, seed=5)  # a trained embedder: h now changes the output
    assert not torch.allclose(meanflow(x, t, y, h=torch.full((3,), 0.5)), meanflow(x, t, y, h=torch.zeros(3)))
