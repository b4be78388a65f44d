"""Starting from released or earlier weights (`model.weights_path`): the model takes its shape from
them, and a class count of the user's own starts only the label embedding anew.

The shape is filled in like the data's (`data.loader.DataShapes`, which runs after this fill): the
weights' values win over the defaults, a value the user set that they contradict is a one-line
error, except `model.num_classes`. A run folder or checkpoint of ours records its model in
`config.yaml`; a weights file is read off its tensors by the family's `weights_shape_fn`.
"""

import sys

import torch

from dit_trainer.config.load import set_key
from dit_trainer.typed import coerce
from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.models import get_spec, list_specs
from dit_trainer.models.spec import SHARED_FIELDS, family_options

SHAPE_FIELDS = ("input_size", "in_channels", "num_classes", "learn_sigma")


def _differs(have, value, key) -> bool:
    """Whether the user's `have` (a command line's text until the family types it) is not the weights' `value`."""
    if have is None or value is None or isinstance(have, type(value)):
        return have != value
    return coerce(have, type(value), key) != value


def _recorded(reader, given_name, user_options: dict, source) -> dict:
    """The model keys a checkpoint's config.yaml records, checked against the user's name and options."""
    model = reader.config().model
    if given_name and get_spec(given_name).name != get_spec(model.name).name:
        mine = get_spec(given_name)
        if mine.adopt_weights_fn is not None and mine.family != get_spec(model.name).family:
            # Another family's run: its weights file is read off the tensors, which the family can start from.
            raise ConfigError(f"model.name is {given_name} but {source} is a {model.name} run; to start from its "
                              f"weights set model.weights_path to its weights file, {reader.path / 'ema.safetensors'}")
        raise ConfigError(f"model.name is {given_name} but {source} holds a {model.name}; leave model.name out "
                          "(the weights decide it) or set it to that")
    for key, value in user_options.items():
        if key in model.options and _differs(value, model.options[key], f"model.{key}"):
            raise ConfigError(f"model.{key} is {value} but {source} holds {model.options[key]}; leave model.{key} "
                              "out (the weights decide it)")
    return {"name": given_name or model.name, **{k: getattr(model, k) for k in SHAPE_FIELDS}, **model.options}


def read_weights(path, cfg, given) -> tuple:
    """(the model keys the weights at `path` need, their state dict in our names)."""
    from dit_trainer.checkpoint import open as open_checkpoint

    reader = open_checkpoint(path, "model.weights_path")
    name = cfg.model.name if "model.name" in given else None
    user_options = {k: v for k, v in cfg.model.options.items() if f"model.{k}" in given}
    raw = reader.weights("ema")
    if reader.config_file is not None and reader.config_file.is_file():
        found = _recorded(reader, name, user_options, path)
        return found, get_spec(found["name"]).from_released(raw)
    # The user's family first; without a name, every family that can read weights.
    specs = [get_spec(cfg.model.name)]
    if name is None:
        specs += [get_spec(n) for n in list_specs()]
    tried, first = set(), None
    for spec in specs:
        fn = spec.weights_shape_fn
        if fn is None or fn in tried:
            continue
        tried.add(fn)
        state_dict = spec.from_released(raw)
        try:
            # Typed as the family types them: a command line's "2" is the weights' 2.
            options = family_options(spec.name, user_options)
            return fn(state_dict, name, options, path), state_dict
        except CheckpointError as err:
            first = first or err
        except ConfigError as err:
            if name is not None:  # the family the user named: its error is theirs to fix
                raise
            first = first or err
    raise first or CheckpointError(f"model {cfg.model.name} cannot read its shape from weights; set model.name")


def is_pipeline_folder(path) -> bool:
    """Whether `path` is a diffusers pipeline folder (model_index.json) or a diffusers model folder (config.json
    beside diffusion_pytorch_model*.safetensors)."""
    from pathlib import Path

    p = Path(path)
    return p.is_dir() and ((p / "model_index.json").is_file() or (
        (p / "config.json").is_file() and any(p.glob("diffusion_pytorch_model*.safetensors"))))


def read_pipeline(path, cfg, given) -> tuple:
    """(the model keys, our state dict, the data keys) of a diffusers pipeline or transformer folder (a
    released PixArt, a DiTPipeline): its transformer's config gives every model key, its VAE, text encoder
    and their token count the data's where the user set none."""
    from dit_trainer.convert import read

    bundle = read("diffusers", path)
    model = dict(bundle.model)
    name = cfg.model.name if "model.name" in given else None
    if name is not None and get_spec(name).family != get_spec(model["name"]).family:
        raise ConfigError(f"model.name is {name} but model.weights_path {path} holds a {model['name']}; leave "
                          "model.name out (the weights decide it) or set it to that")
    for key, value in cfg.model.options.items():
        if f"model.{key}" in given and key in model and _differs(value, model[key], f"model.{key}"):
            raise ConfigError(f"model.{key} is {value} but model.weights_path {path} holds {model[key]}; leave "
                              f"model.{key} out (the weights decide it)")
    model["name"] = name or model["name"]
    found = {k: v for k, v in model.items() if k in ("name", *SHAPE_FIELDS) or k not in SHARED_FIELDS}
    data = {"vae": bundle.vae, "scaling_factor": bundle.scaling_factor, "text_encoder": bundle.text_encoder,
            "text_max_length": bundle.text_max_length}
    return found, bundle.state_dict, {k: v for k, v in data.items() if v is not None}


class PretrainedShapes:
    """`build_config`'s first fill (see `DataShapes`): with `model.weights_path`, sets the model keys the
    weights need where the user set none and returns them; `.state_dict` keeps the weights for the trainer.
    A diffusers pipeline folder also gives the data its VAE and text encoder where the user named none
    (data the run trains on that records its own, shards, then wins)."""

    def __init__(self):
        self.state_dict = None

    def __call__(self, cfg, given: frozenset) -> set:
        path = cfg.model.weights_path
        if not path:
            return set()
        if is_pipeline_folder(path):
            found, self.state_dict, data = read_pipeline(path, cfg, given)
            for key, value in data.items():
                if f"data.{key}" not in given:
                    set_key(cfg, f"data.{key}", value)
        else:
            found, self.state_dict = read_weights(path, cfg, given)
        done = set()
        for key, value in found.items():
            dotted = f"model.{key}"
            if dotted not in given:
                done |= set_key(cfg, dotted, value)
                continue
            have = getattr(cfg.model, key) if key in SHARED_FIELDS else cfg.model.options.get(key)
            # A class count of the user's own: the label embedding starts anew (load_pretrained).
            if key not in ("name", "num_classes") and _differs(have, value, dotted):
                raise ConfigError(f"model.{key} is {have} but model.weights_path {path} holds {value}; leave "
                                  f"model.{key} out (the weights decide it)")
        return done


def new_label_table(table: torch.Tensor, rows: int) -> torch.Tensor:
    """A label table of `rows` rows, each the weights' null-class row (their last): at step 0 every label
    gets what the weights learnt without labels, and training moves each class from there, as
    adaLN-Zero starts a new block as the identity."""
    return table[-1:].expand(rows, -1).clone()


def load_pretrained(model, spec, state_dict: dict, source, log: bool = True) -> None:
    """Load `state_dict` into `model`; where only the class count differs, the label embedding starts anew."""
    from dit_trainer.checkpoint import load_into
    from dit_trainer.models.interval import fit_interval
    from dit_trainer.repa.attach import fit_projector

    if spec.adopt_weights_fn is not None:  # another family's weights of this shape (a PixArt from a DiT)
        state_dict = spec.adopt_weights_fn(model, state_dict, source, log=log)
    # A flow model's weights start a MeanFlow model with its zero interval embedding: at step 0 it is that flow model.
    state_dict = fit_interval(model, fit_projector(model, state_dict))
    key = spec.label_embedding
    want = model.state_dict().get(key)
    have = state_dict.get(key)
    if want is not None and have is not None and have.shape != want.shape and have.shape[1:] == want.shape[1:]:
        state_dict = {**state_dict, key: new_label_table(have, want.shape[0]).to(want.dtype)}
        if log:
            print(f"model.weights_path {source} has {have.shape[0] - 1} classes, model.num_classes is "
                  f"{model.num_classes}: the label embedding starts anew (every class from the weights' null-class "
                  f"row); every other tensor is loaded", file=sys.stderr)
    load_into(model, state_dict, source)
