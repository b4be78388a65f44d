"""FasterDiT's direction term on the velocity loss: its formula, off by default, velocity only."""

from types import SimpleNamespace

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.objective import build_objective
from dit_trainer.transport import TransportConfig
from dit_trainer.transport.direction import direction_loss


def _objective(**kw):
    cfg = SimpleNamespace(objective="transport", transport=TransportConfig(**kw), model=SimpleNamespace(learn_sigma=False))
    return build_objective(cfg)


@pytest.mark.parametrize("path_type", ["Linear", "GVP", "VP"])
@pytest.mark.parametrize("weight", [0.5, 2.0])
def test_direction_term_is_one_minus_cosine_per_sample(path_type, weight):
    plain = _objective(path_type=path_type)
    obj = _objective(path_type=path_type, direction_loss_weight=weight)
    g = torch.Generator().manual_seed(0)
    x, output = torch.randn(6, 2, 4, 4, generator=g), torch.randn(6, 2, 4, 4, generator=g)
    draws = obj.draw(6, x.shape[1:], torch.Generator().manual_seed(1), "cpu")
    base = plain.loss(output, x, draws)
    target = obj.transport.path.ut(draws["t"], draws["noise"], x)
    a, b = output.reshape(6, -1).double(), target.reshape(6, -1).double()
    cos = (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))
    torch.testing.assert_close(obj.loss(output, x, draws), base + weight * (1 - cos).float(), rtol=1e-5, atol=1e-6)
    # Off: the release's loss, bit for bit.
    assert torch.equal(base, plain.transport.loss_from_output(output, x, draws["t"], draws["noise"]))


def test_direction_sees_direction_only():
    v = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(direction_loss(3.0 * v, v), torch.zeros(3), atol=1e-6, rtol=0)
    torch.testing.assert_close(direction_loss(-v, v), torch.full((3,), 2.0))
    ortho = torch.zeros_like(v)
    ortho[:, 0], v2 = 1.0, torch.zeros_like(v)
    v2[:, 1] = 1.0
    torch.testing.assert_close(direction_loss(ortho, v2), torch.ones(3))


@pytest.mark.parametrize("kw,needle", [
    ({"prediction": "score", "direction_loss_weight": 0.1}, "velocity prediction only"),
    ({"prediction": "noise", "direction_loss_weight": 1.0}, "velocity prediction only"),
    ({"direction_loss_weight": -0.1}, "0 \\(off\\) or a positive"),
    ({"direction_loss_weight": float("nan")}, "0 \\(off\\) or a positive"),
])
def test_direction_refused_where_it_has_no_meaning(kw, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        _objective(**kw)
    assert "transport.direction_loss_weight" in str(err.value) and "\n" not in str(err.value)


def test_a_tiny_sit_run_learns_with_the_direction_term(tiny_train_losses):
    losses = tiny_train_losses(40, objective="transport", model={"name": "SiT-S/2"},
                               transport={"direction_loss_weight": 1.0})
    assert sum(losses[-8:]) / 8 < 0.8 * sum(losses[:8]) / 8, losses
