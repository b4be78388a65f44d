"""Samplers against closed forms: Gaussian data make the velocity affine, so the ODE's solution,
the SDE's marginals and the likelihood are all known exactly."""

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.transport import Sampler, bits_per_dim, create_transport
from dit_trainer.transport.integrators import ode_methods

from tests.transport.gaussian import GaussianTarget

MU, S = 0.8, 0.5
# Error bounds after 100 steps (fixed grids), and (tolerance, bound) for the adaptive methods;
# low orders get looser tolerances so that they finish in well under a second.
FIXED = {"euler": 3e-2, "midpoint": 1e-6, "heun2": 1e-4, "heun3": 1e-6, "rk4": 1e-9,
         "explicit_adams": 1e-3, "implicit_adams": 1e-7, "fixed_adams": 1e-7}
ADAPTIVE = {"dopri8": (1e-11, 1e-6), "dopri5": (1e-11, 1e-6), "bosh3": (1e-7, 1e-5), "fehlberg2": (1e-7, 1e-4),
            "adaptive_heun": (1e-5, 1e-3)}


def _z(n=64, seed=0):
    return torch.randn(n, 2, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _ode_error(path_type, prediction, method, num_steps, **tol):
    transport = create_transport(path_type, prediction)
    target = GaussianTarget(transport.path, MU, S)
    z = _z()
    xs = Sampler(transport).sample_ode(sampling_method=method, num_steps=num_steps, **tol)(z, target.model(prediction))
    t0, t1 = transport.check_interval(transport.train_eps, transport.sample_eps, eval=True)
    assert xs.shape == (num_steps, *z.shape)
    return float((xs[-1] - target.flow(z, t0, t1)).abs().max())


@pytest.mark.parametrize("method", ode_methods())
def test_every_ode_method_reaches_the_analytic_answer(method):
    assert method in FIXED or method in ADAPTIVE, f"no bound for the new torchdiffeq method {method}"
    if method in FIXED:
        assert _ode_error("Linear", "velocity", method, 101) < FIXED[method]
    else:
        tol, bound = ADAPTIVE[method]
        assert _ode_error("Linear", "velocity", method, 5, atol=tol, rtol=tol) < bound


def test_euler_converges_at_first_order():
    ratio = _ode_error("Linear", "velocity", "euler", 51) / _ode_error("Linear", "velocity", "euler", 101)
    assert 1.6 < ratio < 2.4


@pytest.mark.parametrize("path_type", ["Linear", "GVP", "VP"])
@pytest.mark.parametrize("prediction", ["velocity", "score", "noise"])
def test_ode_on_every_path_and_prediction(path_type, prediction):
    assert _ode_error(path_type, prediction, "dopri5", 3, atol=1e-9, rtol=1e-9) < 1e-5
    assert _ode_error(path_type, prediction, "rk4", 201) < 1e-4


def test_reverse_ode_returns_to_the_noise():
    transport = create_transport("Linear", "velocity")
    target = GaussianTarget(transport.path, MU, S)
    sampler, z = Sampler(transport), _z()
    x1 = sampler.sample_ode(num_steps=2, atol=1e-9, rtol=1e-9)(z, target.velocity)[-1]
    back = sampler.sample_ode(num_steps=2, atol=1e-9, rtol=1e-9, reverse=True)(x1, target.velocity)[-1]
    assert torch.allclose(back, z, atol=1e-6)


def test_unknown_ode_method_is_a_config_error():
    with pytest.raises(ConfigError, match="dopri5"):
        Sampler(create_transport()).sample_ode(sampling_method="rk45")


@pytest.mark.parametrize("path_type,prediction,method,form,last", [
    ("Linear", "velocity", "Euler", "sigma", "Mean"),
    ("Linear", "velocity", "Heun", "linear", "Euler"),
    ("Linear", "velocity", "Euler", "decreasing", None),
    ("Linear", "velocity", "Euler", "increasing-decreasing", "Mean"),
    # A Mean last step removes w·score·0.04 of spread: fine for small w at the end, not for "constant".
    ("Linear", "velocity", "Euler", "constant", "Euler"),
    ("GVP", "score", "Euler", "sigma", "Tweedie"),
    ("VP", "noise", "Euler", "SBDM", "Euler"),
])
def test_sde_samples_have_the_target_moments(path_type, prediction, method, form, last):
    transport = create_transport(path_type, prediction)
    target = GaussianTarget(transport.path, MU, S)
    z = torch.randn(10000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sample = Sampler(transport).sample_sde(sampling_method=method, diffusion_form=form, last_step=last, num_steps=100)
    xs = sample(z, target.model(prediction), generator=torch.Generator().manual_seed(1))
    assert len(xs) == 100
    x = xs[-1]
    # Monte Carlo error: S/sqrt(10000) = 0.005 on the mean, about 0.7% on the std.
    assert float((x.mean(0) - MU).abs().max()) < 0.03
    assert float((x.std(0) / S - 1).abs().max()) < 0.06


def test_sde_noise_comes_from_the_generator():
    transport = create_transport("Linear", "velocity")
    target = GaussianTarget(transport.path, MU, S)
    sample = Sampler(transport).sample_sde(num_steps=20)
    z = _z()
    a = sample(z, target.velocity, generator=torch.Generator().manual_seed(7))[-1]
    torch.manual_seed(123)  # the global RNG must not matter
    b = sample(z, target.velocity, generator=torch.Generator().manual_seed(7))[-1]
    c = sample(z, target.velocity, generator=torch.Generator().manual_seed(8))[-1]
    assert torch.equal(a, b) and not torch.allclose(a, c)


@pytest.mark.parametrize("divergence", ["exact", "hutchinson"])
# VP is left out: its σ̇ is infinite at the data end, where the analytic velocity is 0·∞.
@pytest.mark.parametrize("path_type,prediction", [("Linear", "velocity"), ("GVP", "velocity"), ("GVP", "score")])
def test_likelihood_of_a_gaussian(path_type, prediction, divergence):
    transport = create_transport(path_type, prediction)
    target = GaussianTarget(transport.path, MU, S)
    x = MU + S * torch.randn(8, 1, 2, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    fn = Sampler(transport).sample_ode_likelihood(num_steps=2, atol=1e-9, rtol=1e-9, divergence=divergence)
    logp, z = fn(x, target.model(prediction), generator=torch.Generator().manual_seed(3))
    expected = target.logp(x)
    t0, t1 = transport.check_interval(transport.train_eps, transport.sample_eps, eval=True)
    if (t0, t1) != (0, 1):
        # Trimmed ends: x is read as a point at t = 1 - t0 and z at 1 - t1 is scored by N(0, I),
        # so the closed form is log N(z) + log|dz/dx| along the affine flow.
        z_exact = target.flow(x, 1 - t0, 1 - t1)
        v_from, v_to = target.mean_var(1 - t0)[1], target.mean_var(1 - t1)[1]
        expected = transport.prior_logp(z_exact) + 0.5 * x[0].numel() * torch.log(v_to / v_from)
        assert torch.allclose(z, z_exact, atol=1e-6)
    assert torch.allclose(logp, expected, atol=1e-5), (logp - expected)
    bpd = Sampler(transport).sample_ode_likelihood(num_steps=2, atol=1e-9, rtol=1e-9, divergence=divergence,
                                                   bits_per_dim=True)(x, target.model(prediction))[0]
    assert torch.allclose(bpd, bits_per_dim(expected, x), atol=1e-5)
