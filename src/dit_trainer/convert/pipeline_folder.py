"""What diffusers' and ppdiffusers' DiTPipeline folders share: model_index.json with id2label,
the DDIM scheduler config, and the transformer config <-> our model config."""

import json
from pathlib import Path

from dit_trainer.convert.model_config import DIFFUSERS_CONVENTION, RELEASE_CONVENTION, convention_of, model_config, shape_of
from dit_trainer.errors import CheckpointError, ConfigError
from dit_trainer.models.dit.config import block_options, refuse_block_options


def read_json(path) -> dict:
    """A JSON file's object, or a one-line error naming it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist; is {path.parent} complete?")
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise CheckpointError(f"{path} is not valid JSON ({err})") from None


def transformer_dir(src, library: str = "diffusers") -> Path:
    """The folder holding the transformer's config.json: `src`/transformer, or `src` itself."""
    root = Path(src)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a folder"
        raise CheckpointError(f"{src} {what}; pass a {library} DiTPipeline folder (model_index.json, transformer/, vae/)")
    tdir = root / "transformer" if (root / "transformer").is_dir() else root
    if not (tdir / "config.json").is_file():
        raise CheckpointError(f"{tdir / 'config.json'} does not exist; is {src} a {library} DiTPipeline folder?")
    return tdir


def write_json(path, obj) -> None:
    """Write `obj` as indented JSON, creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def id2label(class_names, num_classes) -> dict:
    """model_index.json's id2label: the class names, or the ids themselves for unnamed classes."""
    if class_names is None:
        from dit_trainer.class_names import imagenet_class_names

        class_names = imagenet_class_names() if num_classes == 1000 else [str(i) for i in range(num_classes)]
    if len(class_names) != num_classes:
        raise ConfigError(f"{len(class_names)} class names for a model of {num_classes} classes")
    return {str(i): name for i, name in enumerate(class_names)}


def class_names_from(index: dict, num_classes: int):
    """Class names from model_index.json's id2label (None when absent or unnamed)."""
    table = index.get("id2label") or {}
    names = [table.get(str(i)) for i in range(num_classes)]
    if any(n is None for n in names) or names == [str(i) for i in range(num_classes)]:
        return None
    return names


def transformer_config(model: dict, class_name: str) -> dict:
    """The DiT transformer's config.json (diffusers' and ppdiffusers' field names) for our model."""
    refuse_block_options(block_options(model), f"{class_name} (diffusers, ppdiffusers)", model.get("name", "the model"))
    shape = shape_of(model)
    if shape["mlp_ratio"] != 4.0:
        raise ConfigError(f"mlp_ratio {shape['mlp_ratio']}: diffusers' DiT has a fixed MLP ratio of 4")
    if not float(model.get("class_dropout_prob", 0.1)) > 0:
        raise ConfigError("the model has no null class (class_dropout_prob 0); diffusers' DiT always has one")
    in_channels = int(model.get("in_channels", 4))
    return {
        "_class_name": class_name,
        "num_attention_heads": shape["num_heads"],
        "attention_head_dim": shape["hidden_size"] // shape["num_heads"],
        "in_channels": in_channels,
        "out_channels": in_channels * 2 if model.get("learn_sigma", True) else in_channels,
        "num_layers": shape["depth"],
        "dropout": 0.0,
        "norm_num_groups": 32,
        "attention_bias": True,
        "sample_size": int(model["input_size"]),
        "patch_size": shape["patch_size"],
        "activation_fn": "gelu-approximate",
        "num_embeds_ada_norm": int(model.get("num_classes", 1000)),
        "upcast_attention": False,
        "norm_type": "ada_norm_zero",
        "norm_elementwise_affine": False,
        # diffusers reads norm_eps for the MLP's LayerNorm only, as our mlp_norm_eps.
        "norm_eps": float(convention_of(model)["mlp_norm_eps"]),
    }


def model_from_transformer_config(cfg: dict, source, convention="diffusers") -> dict:
    """Our model config from a DiT transformer config.json; records the timestep convention the
    weights are to be run under (diffusers': what the pipeline computed; release: the original DiT's)."""
    checks = {"norm_type": "ada_norm_zero", "activation_fn": "gelu-approximate", "norm_elementwise_affine": False}
    for key, want in checks.items():
        if cfg.get(key, want) != want:
            raise CheckpointError(f"{source}: {key} is {cfg.get(key)!r}, not {want!r}; only DiT transformers convert")
    try:
        heads, head_dim = int(cfg["num_attention_heads"]), int(cfg["attention_head_dim"])
        in_channels = int(cfg.get("in_channels", 4))
        out_channels = int(cfg.get("out_channels") or in_channels)
        conv = dict(DIFFUSERS_CONVENTION if convention == "diffusers" else RELEASE_CONVENTION)
        # A recorded norm_eps is what the weights ran with; a config without one (the Hub's DiT folders)
        # gets the chosen convention's: diffusers' default 1e-5, or the release's 1e-6.
        if "norm_eps" in cfg:
            conv["mlp_norm_eps"] = float(cfg["norm_eps"])
        return model_config(int(cfg["num_layers"]), heads * head_dim, heads, int(cfg["patch_size"]),
                            int(cfg["sample_size"]), in_channels, int(cfg.get("num_embeds_ada_norm") or 1000),
                            learn_sigma=out_channels == 2 * in_channels, class_dropout_prob=0.1, **conv)
    except KeyError as err:
        raise CheckpointError(f"{source} has no {err.args[0]!r}; is it a DiT transformer config?") from None


def scheduler_config(diffusion: dict) -> dict:
    """The DDIM scheduler the release samples with: our beta schedule, epsilon prediction, no clipping."""
    steps = int(diffusion.get("num_timesteps", 1000))
    schedule = diffusion.get("noise_schedule", "linear")
    if schedule == "linear":
        scale = 1000 / steps  # ADM's linear schedule stretches to other step counts this way
        betas = {"beta_schedule": "linear", "beta_start": scale * 1e-4, "beta_end": scale * 0.02}
    elif schedule == "cosine":
        betas = {"beta_schedule": "squaredcos_cap_v2", "beta_start": 1e-4, "beta_end": 0.02}
    else:
        raise ConfigError(f"noise_schedule {schedule!r} has no diffusers scheduler; linear and cosine export")
    return {"_class_name": "DDIMScheduler", "num_train_timesteps": steps, **betas, "clip_sample": False,
            "prediction_type": "sample" if diffusion.get("predict_xstart") else "epsilon",
            "set_alpha_to_one": True, "steps_offset": 0, "trained_betas": None}


def diffusion_from_scheduler(cfg: dict, source) -> dict:
    """Our diffusion settings from a scheduler_config.json."""
    steps = int(cfg.get("num_train_timesteps", 1000))
    schedule = {"linear": "linear", "squaredcos_cap_v2": "cosine"}.get(cfg.get("beta_schedule", "linear"))
    if schedule is None:
        raise CheckpointError(f"{source}: beta_schedule {cfg.get('beta_schedule')!r} is not linear or squaredcos_cap_v2")
    if schedule == "linear":
        scale = 1000 / steps
        start, end = float(cfg.get("beta_start", 1e-4)), float(cfg.get("beta_end", 0.02))
        if abs(start - scale * 1e-4) > 1e-9 or abs(end - scale * 0.02) > 1e-9:
            raise CheckpointError(f"{source}: linear betas {start}..{end} are not DiT's 1e-4..0.02")
    return {"num_timesteps": steps, "noise_schedule": schedule,
            "predict_xstart": cfg.get("prediction_type", "epsilon") == "sample"}
