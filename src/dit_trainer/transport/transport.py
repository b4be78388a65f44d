"""`Transport`: one interpolant and what the network predicts on it, with the SiT release's loss.

The release draws t and the noise x0 inside `training_losses`; here both are arguments, so the
trainer can draw them for the whole global batch from its own seeded generator (every parallel
layout and a resume then see the same numbers). Everything else (the loss of each prediction and
weighting, the time intervals that avoid the paths' singular ends, the conversions to velocity and
score) follows willisma/SiT's `transport/` package.
"""

import math

import torch

from dit_trainer.errors import ConfigError
from dit_trainer.transport.path import PATHS, expand_t_like_x

PREDICTIONS = ("velocity", "score", "noise")
LOSS_WEIGHTS = (None, "velocity", "likelihood")


def mean_flat(x):
    """Mean over every dimension but the batch."""
    return torch.mean(x, dim=list(range(1, x.dim())))


class Transport:
    """An interpolant (`path_type`) with a model that predicts `prediction` on it."""

    def __init__(self, *, path_type, prediction, loss_weight, train_eps, sample_eps):
        self.path_type = path_type
        self.path = PATHS[path_type]()
        self.prediction = prediction
        self.loss_weight = loss_weight
        self.train_eps = train_eps
        self.sample_eps = sample_eps

    # -- time intervals ---------------------------------------------------------------------------

    def check_interval(self, train_eps, sample_eps, *, diffusion_form="SBDM", sde=False, reverse=False,
                       eval=False, last_step_size=0.0):
        """(t0, t1) to train or integrate on, kept away from the ends where the path is singular.

        VP: α_t underflows and σ̇_t blows up at t = 1, so stop at 1 − eps. Linear and GVP with a
        score or noise model (or any SDE): the score is singular at both ends, so start at eps and
        stop at 1 − eps; an SDE with a final step stops at 1 − last_step_size instead.
        """
        t0, t1 = 0, 1
        eps = sample_eps if eval else train_eps
        end = 1 - eps if (not sde or last_step_size == 0) else 1 - last_step_size
        if self.path_type == "VP":
            t1 = end
        elif self.prediction != "velocity" or sde:
            t0 = eps if (diffusion_form == "SBDM" and sde) or self.prediction != "velocity" else 0
            t1 = end
        if reverse:
            t0, t1 = 1 - t0, 1 - t1
        return t0, t1

    def train_interval(self):
        """(t0, t1) that training draws t from."""
        return self.check_interval(self.train_eps, self.sample_eps)

    # -- training ---------------------------------------------------------------------------------

    def plan(self, t, x0, x1):
        """(t, x_t, u_t) on this path."""
        return self.path.plan(t, x0, x1)

    def loss_from_output(self, output, x1, t, x0):
        """Per-sample loss (B,) of a model output at x_t = α_t x1 + σ_t x0, as the release weighs it."""
        if output.shape != x1.shape:
            raise ValueError(f"model output has shape {tuple(output.shape)}, the data {tuple(x1.shape)}")
        if self.prediction == "velocity":
            # The velocity loss is unweighted whatever loss_weight says, as in the release.
            return mean_flat((output - self.path.ut(t, x0, x1)) ** 2)
        _, half_g2 = self.path.drift(x1, t)
        sigma_t, _ = self.path.sigma(expand_t_like_x(t, x1))
        if self.loss_weight == "velocity":
            weight = (half_g2 / sigma_t) ** 2
        elif self.loss_weight == "likelihood":
            weight = half_g2 / sigma_t**2
        else:
            weight = 1
        if self.prediction == "noise":
            return mean_flat(weight * (output - x0) ** 2)
        # The score of x_t given x0 is −x0/σ_t; the release scales the residual by σ_t.
        return mean_flat(weight * (output * sigma_t + x0) ** 2)

    def training_losses(self, model_fn, x1, t, x0, model_kwargs=None):
        """{"loss": (B,), "pred": model output} for data x1 at the given times t and noise x0."""
        _, xt, _ = self.plan(t, x0, x1)
        output = model_fn(xt, t, **(model_kwargs or {}))
        return {"loss": self.loss_from_output(output, x1, t, x0), "pred": output}

    # -- what the model output means --------------------------------------------------------------

    def velocity_from_output(self, output, x, t):
        """The probability-flow ODE's velocity at (x, t) from a model output."""
        if self.prediction == "velocity":
            return output
        f, half_g2 = self.path.drift(x, t)
        score = output
        if self.prediction == "noise":
            score = output / -self.path.sigma(expand_t_like_x(t, x))[0]
        return -f + half_g2 * score

    def score_from_output(self, output, x, t):
        """∇log p_t(x) from a model output."""
        if self.prediction == "noise":
            return output / -self.path.sigma(expand_t_like_x(t, x))[0]
        if self.prediction == "score":
            return output
        return self.path.score_from_velocity(output, x, t)

    def get_drift(self):
        """drift(x, t, model_fn, **kwargs): the ODE's velocity field."""

        def drift(x, t, model_fn, **kwargs):
            out = self.velocity_from_output(model_fn(x, t, **kwargs), x, t)
            if out.shape != x.shape:
                raise ValueError(f"model output {tuple(out.shape)} does not match its input {tuple(x.shape)}")
            return out

        return drift

    def get_score(self):
        """score(x, t, model_fn, **kwargs)."""
        return lambda x, t, model_fn, **kwargs: self.score_from_output(model_fn(x, t, **kwargs), x, t)

    def prior_logp(self, z):
        """log N(z; 0, I) per sample, in nats."""
        n = z[0].numel()
        return -n / 2.0 * math.log(2 * math.pi) - (z.flatten(1) ** 2).sum(dim=1) / 2.0


def create_transport(path_type="Linear", prediction="velocity", loss_weight=None, train_eps=None, sample_eps=None):
    """A `Transport` with the SiT release's defaults for the epsilons.

    VP: train_eps 1e-5, sample_eps 1e-3. Linear/GVP with score or noise prediction: 1e-3 both.
    Linear/GVP with velocity prediction are stable on all of [0, 1], so both are 0; the release
    ignores a value passed there, here it is an error. Unlike the release, an epsilon left None
    gets its default even when the other one is given.
    """
    if path_type not in PATHS:
        raise ConfigError(f"transport.path_type {path_type!r} is not one of {', '.join(PATHS)}")
    if prediction not in PREDICTIONS:
        raise ConfigError(f"transport.prediction {prediction!r} is not one of {', '.join(PREDICTIONS)}")
    if loss_weight not in LOSS_WEIGHTS:
        raise ConfigError(f"transport.loss_weight {loss_weight!r} is not one of None, velocity, likelihood")
    for key, eps in (("train_eps", train_eps), ("sample_eps", sample_eps)):
        if eps is None:
            continue
        if not 0 <= eps < 0.5:  # NaN fails too
            raise ConfigError(f"transport.{key} is {eps!r}; it must be in [0, 0.5): t stays eps away from the ends")
        if eps != 0 and path_type != "VP" and prediction == "velocity":
            raise ConfigError(f"transport.{key} {eps} has no effect: {path_type} with velocity prediction trains and "
                              f"samples on all of [0, 1] (as in SiT); drop it, or use path VP or a score/noise prediction")
    if path_type == "VP":
        train_eps = 1e-5 if train_eps is None else train_eps
        sample_eps = 1e-3 if sample_eps is None else sample_eps
    elif prediction != "velocity":
        train_eps = 1e-3 if train_eps is None else train_eps
        sample_eps = 1e-3 if sample_eps is None else sample_eps
    else:
        train_eps, sample_eps = 0, 0
    return Transport(path_type=path_type, prediction=prediction, loss_weight=loss_weight,
                     train_eps=train_eps, sample_eps=sample_eps)
