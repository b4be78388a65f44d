"""The direction term on the velocity loss: its two forms (flattened, per-position), off by default, velocity only."""

from types import SimpleNamespace

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.objective import build_objective
from dit_trainer.transport import TransportConfig
from dit_trainer.transport.direction import direction_loss, flattened_direction_loss, per_position_direction_loss


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


def _two_positions():
    # One sample, two channels, two positions: they agree at the first position and are orthogonal,
    # and ten times longer, at the second. pred[c, p] and target[c, p]:
    pred = torch.tensor([[[[1.0, 0.0]], [[0.0, 10.0]]]])
    target = torch.tensor([[[[1.0, 10.0]], [[0.0, 0.0]]]])
    return pred, target


def test_both_forms_against_a_hand_computation():
    pred, target = _two_positions()
    # Flattened: (1, 0, 0, 10) . (1, 10, 0, 0) = 1 over |.| |.| = 101.
    torch.testing.assert_close(flattened_direction_loss(pred, target), torch.tensor([1 - 1 / 101]))
    # Per position: cos (1, 0).(1, 0) = 1 at the first, (0, 10).(10, 0) = 0 at the second; mean 0.5.
    torch.testing.assert_close(per_position_direction_loss(pred, target), torch.tensor([0.5]))
    torch.testing.assert_close(direction_loss(pred, target, "per-position"), torch.tensor([0.5]))
    assert torch.equal(direction_loss(pred, target), flattened_direction_loss(pred, target))  # the default


def test_the_forms_differ_where_lengths_differ_between_positions_and_agree_where_not():
    pred, target = _two_positions()
    assert abs(flattened_direction_loss(pred, target) - per_position_direction_loss(pred, target)).item() > 0.4
    # One position: a cosine across its channels is the whole sample's.
    v, w = torch.randn(4, 3, 1, 1), torch.randn(4, 3, 1, 1)
    torch.testing.assert_close(flattened_direction_loss(v, w), per_position_direction_loss(v, w))


def test_per_position_on_one_channel_is_a_sign_without_gradient():
    g = torch.Generator().manual_seed(3)
    pred = torch.randn(2, 1, 4, 4, generator=g).requires_grad_()
    target = torch.randn(2, 1, 4, 4, generator=g)
    loss = per_position_direction_loss(pred, target)
    torch.testing.assert_close(loss, 1 - torch.sign(pred * target).detach().flatten(1).mean(1))
    loss.sum().backward()
    assert pred.grad.abs().max() < 1e-6


@pytest.mark.parametrize("weight", [0.5, 2.0])
def test_the_objective_adds_the_per_position_form_when_asked(weight):
    plain = _objective()
    obj = _objective(direction_loss_weight=weight, direction_loss_form="per-position")
    g = torch.Generator().manual_seed(0)
    x, output = torch.randn(6, 2, 4, 4, generator=g), torch.randn(6, 2, 4, 4, generator=g)
    draws = obj.draw(6, x.shape[1:], torch.Generator().manual_seed(1), "cpu")
    target = obj.transport.path.ut(draws["t"], draws["noise"], x)
    a, b = output.double(), target.double()
    cos = (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))  # (6, 4, 4): across channels
    expected = plain.loss(output, x, draws) + weight * (1 - cos.mean(dim=(1, 2))).float()
    torch.testing.assert_close(obj.loss(output, x, draws), expected, rtol=1e-5, atol=1e-6)


def test_an_unknown_form_is_one_line_naming_the_key():
    with pytest.raises(ConfigError) as err:
        _objective(direction_loss_weight=1.0, direction_loss_form="per-pixel")
    assert "transport.direction_loss_form 'per-pixel'" in str(err.value) and "per-position" in str(err.value)
    assert "\n" not in str(err.value)
