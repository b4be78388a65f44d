"""`Sampler`: probability-flow ODE, SDE and ODE likelihood for a `Transport`, as in the SiT release.

Each `sample_*` method returns a function `(z, model_fn, **model_kwargs)`; for the ODE and SDE its
result is the list (or stacked tensor) of states whose last entry is the sample. Where the release
calls the network twice per SDE drift (once for the velocity, once for the score) this calls it
once and derives both from the same output, which gives the same numbers at half the cost.
"""

import math

import torch

from dit_trainer.errors import ConfigError
from dit_trainer.transport.integrators import ODE, SDE
from dit_trainer.transport.path import expand_t_like_x

DIFFUSION_FORMS = ("sigma", "constant", "SBDM", "linear", "decreasing", "increasing-decreasing")
LAST_STEPS = ("Mean", "Tweedie", "Euler", None)


def bits_per_dim(logp, x):
    """Negative log-likelihood in bits per dimension from per-sample log p (nats) of data like x."""
    return -logp / (x[0].numel() * math.log(2))


_to_bits_per_dim = bits_per_dim  # the likelihood's keyword of the same name shadows it there


class Sampler:
    """Samplers for one `Transport`."""

    def __init__(self, transport):
        self.transport = transport
        self.drift = transport.get_drift()
        self.score = transport.get_score()

    # -- SDE --------------------------------------------------------------------------------------

    def _sde_drift_and_diffusion(self, diffusion_form, diffusion_norm):
        path, transport = self.transport.path, self.transport

        def diffusion(x, t):
            return path.diffusion(x, t, form=diffusion_form, norm=diffusion_norm)

        def sde_drift(x, t, model_fn, **kwargs):
            # velocity + w_t·score: the reverse-time SDE with the same marginals (SiT eq. 7).
            out = model_fn(x, t, **kwargs)
            velocity = transport.velocity_from_output(out, x, t)
            if velocity.shape != x.shape:
                raise ValueError(f"model output {tuple(velocity.shape)} does not match its input {tuple(x.shape)}")
            return velocity + diffusion(x, t) * transport.score_from_output(out, x, t)

        return sde_drift, diffusion

    def _last_step(self, sde_drift, last_step, last_step_size):
        if last_step is None:
            return lambda x, t, model_fn, **kwargs: x
        if last_step == "Mean":
            return lambda x, t, model_fn, **kwargs: x + sde_drift(x, t, model_fn, **kwargs) * last_step_size
        if last_step == "Euler":
            return lambda x, t, model_fn, **kwargs: x + self.drift(x, t, model_fn, **kwargs) * last_step_size
        if last_step == "Tweedie":
            path = self.transport.path

            def tweedie(x, t, model_fn, **kwargs):
                # E[x1 | x_t] = (x_t + σ_t²·score) / α_t.
                te = expand_t_like_x(t, x)
                alpha_t, sigma_t = path.alpha(te)[0], path.sigma(te)[0]
                return x / alpha_t + sigma_t**2 / alpha_t * self.score(x, t, model_fn, **kwargs)

            return tweedie
        raise ConfigError(f"SDE last step {last_step!r} is not one of Mean, Tweedie, Euler, None")

    def sample_sde(self, *, sampling_method="Euler", diffusion_form="sigma", diffusion_norm=1.0, last_step="Mean",
                   last_step_size=0.04, num_steps=250):
        """A function (z, model_fn, generator=None, progress=False, **model_kwargs) -> list of states.

        Defaults are the release's `sample.py SDE` ones. The list holds num_steps entries: one per
        grid step and the last step's result (the sample).
        """
        if diffusion_form not in DIFFUSION_FORMS + ("inccreasing-decreasing",):
            raise ConfigError(f"SDE diffusion form {diffusion_form!r} is not one of {', '.join(DIFFUSION_FORMS)}")
        if last_step not in LAST_STEPS:
            raise ConfigError(f"SDE last step {last_step!r} is not one of Mean, Tweedie, Euler, None")
        if last_step is None:
            last_step_size = 0.0
        sde_drift, diffusion = self._sde_drift_and_diffusion(diffusion_form, diffusion_norm)
        t0, t1 = self.transport.check_interval(self.transport.train_eps, self.transport.sample_eps,
                                               diffusion_form=diffusion_form, sde=True, eval=True,
                                               reverse=False, last_step_size=last_step_size)
        sde = SDE(sde_drift, diffusion, t0=t0, t1=t1, num_steps=num_steps, sampler_type=sampling_method)
        final = self._last_step(sde_drift, last_step, last_step_size)

        def sample(z, model_fn, generator=None, progress=False, **model_kwargs):
            xs = sde.sample(z, model_fn, generator=generator, progress=progress, **model_kwargs)
            ts = torch.ones(z.size(0), device=z.device) * t1
            with torch.no_grad():
                xs.append(final(xs[-1], ts, model_fn, **model_kwargs))
            return xs

        return sample

    # -- ODE --------------------------------------------------------------------------------------

    def sample_ode(self, *, sampling_method="dopri5", num_steps=50, atol=1e-6, rtol=1e-3, reverse=False):
        """A function (z, model_fn, **model_kwargs) -> (num_steps, *z.shape) states; [-1] is the sample.

        `reverse=True` integrates from data (t = 1) back to noise. For fixed-step methods the
        solver takes num_steps − 1 steps; adaptive methods return num_steps interpolated states.
        """
        t0, t1 = self.transport.check_interval(self.transport.train_eps, self.transport.sample_eps,
                                               sde=False, eval=True, reverse=reverse, last_step_size=0.0)
        return ODE(self.drift, t0=t0, t1=t1, sampler_type=sampling_method, num_steps=num_steps,
                   atol=atol, rtol=rtol).sample

    def sample_ode_likelihood(self, *, sampling_method="dopri5", num_steps=50, atol=1e-6, rtol=1e-3,
                              divergence="hutchinson", bits_per_dim=False):
        """A function (x, model_fn, generator=None, **model_kwargs) -> (log p(x), z).

        Integrates the ODE from data to noise together with the divergence of the velocity
        (instantaneous change of variables): log p(x) = log N(z) − ∫ div v dt, per sample, in
        nats, or in bits per dimension (−log p / (D ln 2)) with `bits_per_dim=True`. The divergence
        is Hutchinson's estimate with Rademacher probes as in the release (one probe per function
        evaluation, drawn from `generator` when given) or, with divergence="exact", the trace of
        the Jacobian (D backward passes; for small D).
        """
        if divergence not in ("hutchinson", "exact"):
            raise ConfigError(f"divergence {divergence!r} is not one of hutchinson, exact")
        drift = self.drift
        probe = {"generator": None}

        def likelihood_drift(state, t, model_fn, **kwargs):
            x, _ = state
            t = torch.ones_like(t) * (1 - t)  # integrate the data end (t = 1) first
            with torch.enable_grad():
                x = x.detach().requires_grad_(True)
                v = drift(x, t, model_fn, **kwargs)
                if divergence == "exact":
                    flat = v.flatten(1)
                    div = torch.zeros(x.size(0), dtype=x.dtype, device=x.device)
                    for i in range(flat.size(1)):
                        g = torch.autograd.grad(flat[:, i].sum(), x, retain_graph=True)[0]
                        div = div + g.flatten(1)[:, i]
                else:
                    g = probe["generator"]
                    device = g.device if g is not None else x.device
                    eps = torch.randint(2, x.size(), generator=g, dtype=x.dtype, device=device).to(x) * 2 - 1
                    grad = torch.autograd.grad(torch.sum(v * eps), x)[0]
                    div = torch.sum(grad * eps, dim=tuple(range(1, x.dim())))
            return -v.detach(), div.detach()

        t0, t1 = self.transport.check_interval(self.transport.train_eps, self.transport.sample_eps,
                                               sde=False, eval=True, reverse=False, last_step_size=0.0)
        ode = ODE(likelihood_drift, t0=t0, t1=t1, sampler_type=sampling_method, num_steps=num_steps,
                  atol=atol, rtol=rtol)

        def likelihood(x, model_fn, generator=None, **model_kwargs):
            probe["generator"] = generator
            init_logp = torch.zeros(x.size(0)).to(x)
            zs, delta_logp = ode.sample((x, init_logp), model_fn, **model_kwargs)
            z, delta_logp = zs[-1], delta_logp[-1]
            logp = self.transport.prior_logp(z) - delta_logp
            return (_to_bits_per_dim(logp, x) if bits_per_dim else logp), z

        return likelihood
