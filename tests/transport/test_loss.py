"""The training loss with t and the noise given, its weights, and the t samplers."""

import math

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.transport import create_transport, sample_t
from dit_trainer.transport.path import expand_t_like_x

PAIRS = [(p, q) for p in ("Linear", "GVP", "VP") for q in ("velocity", "score", "noise")]


def _batch(seed=0, n=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 4, 4, generator=g), torch.randn(n, 2, 4, 4, generator=g)


def test_default_epsilons_follow_the_release():
    assert (create_transport("Linear", "velocity").train_eps, create_transport("Linear", "velocity").sample_eps) == (0, 0)
    assert (create_transport("GVP", "score").train_eps, create_transport("GVP", "score").sample_eps) == (1e-3, 1e-3)
    assert (create_transport("VP", "velocity").train_eps, create_transport("VP", "velocity").sample_eps) == (1e-5, 1e-3)
    assert create_transport("VP", "noise", train_eps=0.01).sample_eps == 1e-3  # the release left this None
    assert create_transport("Linear", "velocity").train_interval() == (0, 1)
    assert create_transport("VP", "velocity").train_interval() == (0, 1 - 1e-5)
    assert create_transport("Linear", "noise").train_interval() == (1e-3, 1 - 1e-3)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(path_type="Linear", prediction="score", train_eps=-0.5), "transport.train_eps is -0.5; it must be in [0, 0.5)"),
    (dict(path_type="GVP", prediction="noise", sample_eps=0.7), "transport.sample_eps is 0.7"),
    (dict(path_type="VP", prediction="velocity", train_eps=float("nan")), "transport.train_eps is nan"),
    # The release silently trains on [0, 1] whatever is passed here.
    (dict(path_type="Linear", prediction="velocity", train_eps=0.01), "transport.train_eps 0.01 has no effect"),
    (dict(path_type="GVP", prediction="velocity", sample_eps=0.05), "transport.sample_eps 0.05 has no effect"),
])
def test_epsilons_out_of_range_or_without_effect_are_refused(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        create_transport(**kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)
    # Values that do apply, and 0 where none does, are taken as given.
    assert create_transport("Linear", "score", train_eps=0.01).train_interval() == (0.01, 0.99)
    assert create_transport("Linear", "velocity", train_eps=0, sample_eps=0).train_interval() == (0, 1)


@pytest.mark.parametrize("bad", [dict(path_type="Cosine"), dict(prediction="x0"), dict(loss_weight="snr")])
def test_bad_names_are_config_errors(bad):
    with pytest.raises(ConfigError):
        create_transport(**bad)


@pytest.mark.parametrize("path_type,prediction", PAIRS)
def test_training_losses_equals_loss_from_output(path_type, prediction):
    transport = create_transport(path_type, prediction, loss_weight="likelihood")
    x1, x0 = _batch()
    t = sample_t(transport, len(x1), generator=torch.Generator().manual_seed(1))

    def model(x, t, scale):
        return torch.tanh(x) * scale + t.view(-1, 1, 1, 1)

    terms = transport.training_losses(model, x1, t, x0, model_kwargs={"scale": 0.5})
    _, xt, _ = transport.plan(t, x0, x1)
    assert torch.equal(terms["pred"], model(xt, t, 0.5))
    assert torch.equal(terms["loss"], transport.loss_from_output(model(xt, t, 0.5), x1, t, x0))
    assert terms["loss"].shape == (len(x1),) and bool((terms["loss"] > 0).all())


@pytest.mark.parametrize("path_type,prediction", PAIRS)
def test_the_regression_target_has_zero_loss(path_type, prediction):
    transport = create_transport(path_type, prediction)
    x1, x0 = _batch(2)
    t = sample_t(transport, len(x1), generator=torch.Generator().manual_seed(3))
    sigma = transport.path.sigma(expand_t_like_x(t, x1))[0]
    target = {"velocity": transport.path.ut(t, x0, x1), "noise": x0, "score": -x0 / sigma}[prediction]
    assert float(transport.loss_from_output(target, x1, t, x0).max()) < 1e-10
    assert float(transport.loss_from_output(target + 0.1, x1, t, x0).min()) > 1e-4


def test_loss_weights_for_linear_score():
    x1, x0 = _batch(4)
    t = torch.linspace(0.1, 0.9, len(x1))
    out = torch.randn_like(x1)
    sigma = (1 - t).view(-1, 1, 1, 1)
    plain = ((out * sigma + x0) ** 2).mean(dim=(1, 2, 3))
    # Linear: g²/2 = σ²/t + σ, so the likelihood weight is 1/t + 1/σ and the velocity weight its square·σ².
    half_g2 = (1 - t) ** 2 / t + (1 - t)
    for weight, expected in ((None, 1.0), ("likelihood", half_g2 / (1 - t) ** 2), ("velocity", (half_g2 / (1 - t)) ** 2)):
        loss = create_transport("Linear", "score", loss_weight=weight).loss_from_output(out, x1, t, x0)
        assert torch.allclose(loss, plain * expected, rtol=1e-5)
    # Velocity prediction ignores the weighting, as in the release.
    v = create_transport("Linear", "velocity", loss_weight="likelihood").loss_from_output(out, x1, t, x0)
    assert torch.allclose(v, ((out - (x1 - x0)) ** 2).mean(dim=(1, 2, 3)))


def test_t_samplers_are_deterministic_and_in_range():
    transport = create_transport("Linear", "noise")
    a = sample_t(transport, 1000, generator=torch.Generator().manual_seed(5))
    b = sample_t(transport, 1000, generator=torch.Generator().manual_seed(5))
    c = sample_t(transport, 1000, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.min()) >= 1e-3 and float(a.max()) <= 1 - 1e-3
    assert abs(float(a.mean()) - 0.5) < 0.03


def test_logit_normal_has_the_asked_mean_and_std():
    transport = create_transport("Linear", "velocity")
    t = sample_t(transport, 20000, generator=torch.Generator().manual_seed(0), sampler="logit-normal",
                 mean=0.5, std=0.8).double()
    logit = torch.log(t / (1 - t))
    assert abs(float(logit.mean()) - 0.5) < 0.03 and abs(float(logit.std()) - 0.8) < 0.03
    with pytest.raises(ConfigError):
        sample_t(transport, 4, sampler="beta")
    assert math.isfinite(float(t.sum()))
