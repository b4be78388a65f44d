"""Numerical integrators: torchdiffeq for the ODE, Euler–Maruyama and stochastic Heun for the SDE.

The time grid is `linspace(t0, t1, num_steps)` in float32 as in the SiT release; fixed-step ODE
methods step on that grid, adaptive ones (dopri5, ...) use it only as output times. SDE noise comes
from a `torch.Generator` when one is given (seeded sampling), else from torch's global RNG
exactly as the release draws it.
"""

import torch

from dit_trainer.errors import ConfigError


def _torchdiffeq():
    try:
        import torchdiffeq
    except ImportError:
        raise ConfigError("ODE sampling needs torchdiffeq; pip install 'dit-trainer[transport]'") from None
    return torchdiffeq


def ode_methods():
    """torchdiffeq's odeint methods (euler, midpoint, rk4, dopri5, heun3, ...) but scipy_solver,
    which needs solver options of its own."""
    from torchdiffeq._impl.odeint import SOLVERS

    return tuple(m for m in SOLVERS if m != "scipy_solver")


def is_adaptive(method) -> bool:
    """Whether torchdiffeq's `method` chooses its own steps (dopri5, ...); unknown names are not."""
    from torchdiffeq._impl.odeint import SOLVERS
    from torchdiffeq._impl.rk_common import RKAdaptiveStepsizeODESolver

    return method in SOLVERS and issubclass(SOLVERS[method], RKAdaptiveStepsizeODESolver)


def time_grid(t0, t1, num_steps, device):
    """The release's float32 grid of `num_steps` times from t0 to t1."""
    return torch.linspace(t0, t1, num_steps).to(device)


class ODE:
    """Solve dx/dt = drift(x, t, model_fn, **kwargs) from t0 to t1 with a torchdiffeq method."""

    def __init__(self, drift, *, t0, t1, sampler_type, num_steps, atol, rtol):
        odeint = _torchdiffeq().odeint  # fail early, before any model call
        if sampler_type not in ode_methods():
            raise ConfigError(f"ODE method {sampler_type!r} is not one of {', '.join(ode_methods())}")
        if num_steps < 2:
            raise ConfigError(f"ODE sampling needs num_steps >= 2 (the grid's end points), got {num_steps}")
        self._odeint = odeint
        self.drift = drift
        self.t0, self.t1, self.num_steps = t0, t1, num_steps
        self.atol, self.rtol, self.method = atol, rtol, sampler_type

    def sample(self, x, model_fn, **model_kwargs):
        """States at every grid time (leading dim num_steps); the last is the solution.

        `x` may be a tuple of tensors (the likelihood integrates (x, Δlog p) together).
        """
        is_tuple = isinstance(x, tuple)
        ref = x[0] if is_tuple else x
        n, device = ref.size(0), ref.device

        def fn(t, state):
            return self.drift(state, torch.ones(n, device=device, dtype=ref.dtype) * t, model_fn, **model_kwargs)

        t = time_grid(self.t0, self.t1, self.num_steps, device).to(ref.dtype)
        atol = [self.atol] * len(x) if is_tuple else [self.atol]
        rtol = [self.rtol] * len(x) if is_tuple else [self.rtol]
        options = None
        if is_adaptive(self.method):
            # An adaptive step may otherwise overshoot the last output time and evaluate the model
            # past t1; VP's σ_t is NaN beyond t = 1, which the release's sampler runs into.
            options = {"step_t": t[-1:]}
        return self._odeint(fn, x, t, method=self.method, atol=atol, rtol=rtol, options=options)


class SDE:
    """Integrate dx = drift dt + sqrt(2 w_t) dW forward in time on a fixed grid.

    The list returned holds the state after each of the num_steps − 1 steps.
    """

    def __init__(self, drift, diffusion, *, t0, t1, num_steps, sampler_type):
        if not t0 < t1:
            raise ConfigError(f"the SDE sampler integrates forward in time; got t0={t0} >= t1={t1}")
        if sampler_type not in ("Euler", "Heun"):
            raise ConfigError(f"SDE method {sampler_type!r} is not one of Euler, Heun")
        if num_steps < 2:
            raise ConfigError(f"SDE sampling needs num_steps >= 2, got {num_steps}")
        self.t = torch.linspace(t0, t1, num_steps)
        self.dt = self.t[1] - self.t[0]
        self.drift, self.diffusion = drift, diffusion
        self.sampler_type = sampler_type

    def _noise(self, x, generator):
        if generator is None:
            return torch.randn(x.size()).to(x)
        return torch.randn(x.size(), generator=generator, device=generator.device).to(x)

    def _euler_maruyama(self, x, t, model_fn, generator, **kwargs):
        dw = self._noise(x, generator) * torch.sqrt(self.dt)
        t = torch.ones(x.size(0)).to(x) * t
        mean_x = x + self.drift(x, t, model_fn, **kwargs) * self.dt
        return mean_x + torch.sqrt(2 * self.diffusion(x, t)) * dw

    def _heun(self, x, t, model_fn, generator, **kwargs):
        # Stochastic Heun (Karras et al. 2022, Alg. 2 with the churn as the diffusion term): noise
        # first, then a trapezoidal deterministic step from the noised point.
        dw = self._noise(x, generator) * torch.sqrt(self.dt)
        t_cur = torch.ones(x.size(0)).to(x) * t
        xhat = x + torch.sqrt(2 * self.diffusion(x, t_cur)) * dw
        k1 = self.drift(xhat, t_cur, model_fn, **kwargs)
        xp = xhat + self.dt * k1
        k2 = self.drift(xp, t_cur + self.dt, model_fn, **kwargs)
        return xhat + 0.5 * self.dt * (k1 + k2)

    def sample(self, init, model_fn, generator=None, progress=False, **model_kwargs):
        """States after each step, from `init` at t0."""
        step = self._euler_maruyama if self.sampler_type == "Euler" else self._heun
        times = self.t[:-1]
        if progress:
            from dit_trainer.progress import progress_bar

            times = progress_bar(times)
        x, samples = init, []
        for ti in times:
            with torch.no_grad():
                x = step(x, ti, model_fn, generator, **model_kwargs)
            samples.append(x)
        return samples
