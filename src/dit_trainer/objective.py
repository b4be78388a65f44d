"""The objective interface (what a train step draws, feeds the network and scores) and its registry.

See docs/design.md, "objectives". An objective is built from the config by `build_objective(cfg)`,
which reads `cfg.objective` ("diffusion" when absent). Implementations live in their packages
(`diffusion/objective.py`, `transport/objective.py`, `meanflow/objective.py`) and are imported only when asked for, so this
module imports no torch and no objective package.
"""

from dit_trainer.errors import ConfigError
from dit_trainer.lazy import register_target, resolve


class Objective:
    """Base class: the randomness of a step, the network's input, the per-sample loss, sampling."""

    name = "objective"
    samplers: tuple = ()
    default_sampler = None
    # Whether sampling may guide (classifier-free, autoguidance); False where guidance is trained in (MeanFlow).
    guided_sampling = True
    # Where guidance is trained in: the scale a sample asks for by default (`scale_inputs` takes it).
    trained_scale = 1.0
    # Whether some of a step's network calls run in float32 inside the run's autocast (MeanFlow's JVP): sharded
    # weights are then gathered in float32, and autocast casts them for the other calls.
    float32_calls = False

    def check_condition(self, condition) -> None:
        """A one-line ConfigError where this objective needs what `condition` (a dit_trainer.condition value)
        does not train; none by default."""

    def scale_inputs(self, scale, n, device) -> dict:
        """Where guidance is trained in: the model's keyword arguments that ask `n` samples for guidance scale
        `scale`; by default none, and a scale of 1 only (one-line ConfigError otherwise)."""
        if float(scale) != 1:
            raise ConfigError(f"objective {self.name} samples unguided: its guidance is trained in; sample with a cfg "
                              "scale of 1")
        return {}

    def draw(self, n, sample_shape, generator, device):
        """Every per-sample random value of a step for the whole global batch, from `generator` only."""
        raise NotImplementedError

    def model_input(self, x, draws):
        """(x_t, t_model): what the network sees for clean data x."""
        raise NotImplementedError

    def loss(self, output, x, draws):
        """(n,) per-sample loss of the network's output, weights applied."""
        raise NotImplementedError

    def losses(self, model_fn, x, draws):
        """(n,) per-sample loss of one micro-batch, the network called through `model_fn(x_t, t, **kw)` (the
        step's condition, dropout mask, routing and autocast held; float32 output).

        The train step asks this, so an objective that needs more than one forward (MeanFlow's JVP) owns
        the calls; by default one call on `model_input`, scored by `loss`."""
        x_t, t = self.model_input(x, draws)
        return self.loss(model_fn(x_t, t), x, draws)

    def observe(self, draws, losses):
        """Feed per-sample losses to a loss-aware t sampler; nothing by default."""

    def validation_times(self, k: int):
        """(k,) network times at noise fractions 0, 1/k, ..., (k-1)/k of the way from the data to pure noise:
        the fixed levels a validation loss is measured at (SD3's 8 equally spaced t)."""
        raise NotImplementedError(f"objective {self.name!r} has no fixed noise levels to validate at")

    def draws_at(self, t, noise):
        """The draws of a step at given network times `t` (n,) and noise (n, ...): what `draw` returns,
        without randomness (importance weights 1)."""
        raise NotImplementedError(f"objective {self.name!r} has no fixed noise levels to validate at")

    def validation_loss(self, output, x, draws):
        """(n,) per-sample loss a validation reports: the training loss, without terms the network's
        plain output cannot give (REPA's alignment)."""
        return self.loss(output, x, draws)

    def state_dict(self):
        """Whatever must survive a resume; nothing by default."""
        return {}

    def load_state_dict(self, state):
        """Restore what `state_dict` returned."""

    def check_sampler(self, sampler):
        """`sampler` or the default, refused with a one-line error if this objective lacks it."""
        sampler = sampler or self.default_sampler
        if sampler not in self.samplers:
            raise ConfigError(f"sampler {sampler!r} does not fit objective {self.name!r} (it is not one of "
                              f"{', '.join(self.samplers)}); use one of those")
        return sampler

    def sampler_option_names(self, sampler) -> tuple:
        """The option names `sample(..., sampler=sampler, **options)` accepts; none by default."""
        self.check_sampler(sampler)
        return ()

    def check_options(self, sampler, options) -> None:
        """Options `sampler` does not take are refused with a one-line error."""
        allowed = self.sampler_option_names(sampler)
        unknown = sorted(k for k in options if k not in allowed)
        if unknown:
            raise ConfigError(f"option(s) {', '.join(unknown)} do not apply to the {sampler} sampler; "
                              f"it takes {', '.join(allowed) or 'none'}")

    def noise_level(self, t):
        """The noise level σ of the network's time input `t`: the noise's scale over the signal's in x_t
        (EDM's σ; x_t / signal scale = x + σ·noise), the unit guidance intervals are given in.

        One unit for every objective and schedule, so a published interval carries over: σ is infinite
        at pure noise and 0 at the data."""
        raise NotImplementedError

    def sample(self, model_fn, z, sampler=None, steps=None, model_kwargs=None, progress=False, **options):
        """Samples from initial noise z with model_fn(x, t, **model_kwargs)."""
        raise NotImplementedError


_FACTORIES = {
    "diffusion": "dit_trainer.diffusion.objective:DiffusionObjective.from_config",
    "transport": "dit_trainer.transport.objective:TransportObjective.from_config",
    "meanflow": "dit_trainer.meanflow.objective:MeanFlowObjective.from_config",
}
# Objectives whose network takes a second time input, the interval h (MeanFlow's t - r): the families
# build its embedder for these alone, so every other run's model and state dict stay the release's.
_INTERVAL = {"meanflow"}
# Objectives that can give their network the guidance scale as an input (improved MeanFlow's), with the key of
# their own config section whose value, when set, turns it on; otherwise the model stays as above.
_GUIDANCE_INPUT = {"meanflow": "omega_range"}


def register_objective(name: str, target: str, interval: bool = False, guidance_key: str = None) -> None:
    """Make `cfg.objective: name` build with the factory at "module:attr" (attr may be dotted); `interval`:
    its network takes the interval h as a second time input; `guidance_key`: the key of `cfg.<name>` that,
    when set, gives the network the guidance scale as an input too."""
    register_target(_FACTORIES, name, target, "objective")
    if interval:
        _INTERVAL.add(name)
    if guidance_key:
        _GUIDANCE_INPUT[name] = guidance_key


def takes_interval(cfg) -> bool:
    """Whether the model of `cfg` (a Config; a bare model section has no objective) embeds an interval h."""
    return getattr(cfg, "objective", None) in _INTERVAL


def takes_guidance_scale(cfg) -> bool:
    """Whether the model of `cfg` embeds the guidance scale it is asked for (its objective's key is set)."""
    name = getattr(cfg, "objective", None)
    key = _GUIDANCE_INPUT.get(name)
    if key is None:
        return False
    section = getattr(cfg, name, None)
    if isinstance(section, dict):
        return section.get(key) is not None
    return getattr(section, key, None) is not None


def list_objectives() -> list:
    """Names `cfg.objective` may take."""
    return list(_FACTORIES)


def build_objective(cfg):
    """The objective named by `cfg.objective` ("diffusion" when absent), built from `cfg`."""
    name = getattr(cfg, "objective", None) or "diffusion"
    if name == "auto":  # build_config makes it the model's own; a Config not built there still says auto
        raise ConfigError("objective auto is resolved when the config is built: pass the config through "
                          "dit_trainer.config.build_config, or set `objective:` to one of " + ", ".join(_FACTORIES))
    if name not in _FACTORIES:
        raise ConfigError(f"objective {name!r} is not one of {', '.join(_FACTORIES)}; set `objective:` in the config")
    return resolve(_FACTORIES[name])(cfg)
