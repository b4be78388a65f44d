"""`diffusers` for a PixArt: a folder `PixArtAlphaPipeline` / `PixArtSigmaPipeline.from_pretrained` loads
and samples with no code of ours: `model_index.json`, `transformer/` (PixArtTransformer2DModel),
`text_encoder/` (T5EncoderModel) beside `tokenizer/`, `vae/` and `scheduler/`.

The scheduler is the DDIM of our `--sampler ddim` (DiT's betas, epsilon, no clipping, the last step
to alpha 1, timesteps 0, T/N, 2T/N, ... as diffusers' `leading` spacing and our "ddimN" respacing both
place them when N divides T), so for the same prompt, seed and steps the pipeline gives our images:
its starting noise is a CPU generator's first draw, ours too; its unconditional half is the encoding
of "" (or the negative prompt), which caption dropout trained here; the VAE divides by the scaling
factor ours divides by. Read back, such a folder (or a released one) is our model, its text encoder
and VAE, to sample or fine-tune.
"""

from pathlib import Path

from dit_trainer.convert.model_bundle import Bundle
from dit_trainer.errors import CheckpointError, ConfigError

VERSION = "0.28.0"  # the oldest diffusers with PixArtTransformer2DModel and PixArtSigmaPipeline
TRANSFORMER = "PixArtTransformer2DModel"
PIPELINES = {"alpha": "PixArtAlphaPipeline", "Sigma": "PixArtSigmaPipeline"}
# The pipelines' max_sequence_length defaults: the releases' caption lengths.
MAX_SEQUENCE_LENGTH = {"PixArtAlphaPipeline": 120, "PixArtSigmaPipeline": 300}
BINNED_SIZES = {"PixArtAlphaPipeline": (32, 64, 128), "PixArtSigmaPipeline": (32, 64, 128, 256)}


def is_pixart(model: dict) -> bool:
    """Whether a model-config dict names a PixArt."""
    from dit_trainer.models import get_spec

    try:
        return get_spec(model["name"]).family == "pixart"
    except (ConfigError, KeyError):
        return False


def is_pixart_folder(src) -> bool:
    """Whether `src` is a diffusers folder (a pipeline's, or its transformer/) holding a PixArtTransformer2DModel."""
    for config in (Path(src) / "transformer" / "config.json", Path(src) / "config.json"):
        if config.is_file():
            from dit_trainer.convert.pipeline_folder import read_json

            return read_json(config).get("_class_name") == TRANSFORMER
    return False


def pipeline_class(model: dict) -> str:
    """The diffusers pipeline of a PixArt model-config dict: PixArtSigmaPipeline for a Sigma, else alpha's."""
    from dit_trainer.models.pixart.sizes import release

    return PIPELINES[release(model["name"]).version]


def _meta_model(model: dict):
    import torch

    from dit_trainer.convert.model_config import build_dit

    with torch.device("meta"):
        return build_dit(model)


def _fixed_positions(model):
    """The sin-cos position table `model` (built on meta) computes, which diffusers recomputes."""
    import torch

    from dit_trainer.models.layers import get_2d_sincos_pos_embed

    grid = model.input_size // model.patch_size
    table = get_2d_sincos_pos_embed(model.pos_embed.shape[-1], grid, model.interpolation_scale)
    return torch.from_numpy(table).float().unsqueeze(0)


def check_exportable(bundle: Bundle, model, pipeline: str) -> None:
    """One-line refusals of what the pipeline cannot compute as we do."""
    from dit_trainer.convert.hf_diffusers import POS_EMBED_ATOL

    if bundle.latent_mean is not None:
        raise ConfigError(f"{bundle.source} was trained on per-channel normalised latents (data.latent_mean/std), "
                          f"and {pipeline} decodes latents / scaling_factor only; sample it with dit sample")
    if model.micro_conditions and (pipeline != "PixArtAlphaPipeline" or model.input_size != 128):
        raise ConfigError(f"{bundle.source} takes micro-conditions (resolution, aspect ratio), which {pipeline} "
                          f"passes only to a model of 128x128 latents (PixArt-alpha 1024); this one's are "
                          f"{model.input_size}x{model.input_size}, so sample it with dit sample")
    if not bundle.text_encoder:
        raise ConfigError(f"{bundle.source} records no text encoder, and {pipeline} encodes its prompts with one; "
                          "pass --text-encoder DIR_OR_ID (the T5 its captions were encoded with)")
    from dit_trainer.text_encoders import resolve_folders

    kind = resolve_folders(bundle.text_encoder)[3].get("model_type")
    if kind != "t5":
        raise ConfigError(f"{bundle.source}'s text encoder {bundle.text_encoder} is a {kind!r} model, and {pipeline} "
                          "encodes prompts with T5 (T5EncoderModel); sample it with dit sample")
    stored = bundle.state_dict.get("pos_embed")
    if stored is not None:
        diff = float((stored.float() - _fixed_positions(model)).abs().max())
        if not diff <= POS_EMBED_ATOL:
            raise CheckpointError(f"{bundle.source}: pos_embed differs from PixArt's fixed sin-cos table by up to "
                                  f"{diff:.3g}; diffusers recomputes that table, so these weights cannot be exported")


def write(bundle: Bundle, out) -> Path:
    """Export PixArt `bundle` as a diffusers PixArtAlphaPipeline / PixArtSigmaPipeline folder at `out`."""
    from safetensors.torch import save_file

    from dit_trainer.convert.hf_diffusers import load_vae_model
    from dit_trainer.convert.pipeline_folder import scheduler_config, write_json
    from dit_trainer.models.pixart.state_dict import diffusers_config, to_diffusers
    from dit_trainer.text_encoders import copy_text_encoder

    out = Path(out)
    pipeline = pipeline_class(bundle.model)
    model = _meta_model(bundle.model)
    check_exportable(bundle, model, pipeline)
    vae = load_vae_model(bundle, pipeline)
    if bundle.scaling_factor is not None:
        vae.register_to_config(scaling_factor=float(bundle.scaling_factor))  # what the pipeline divides by
    text = copy_text_encoder(bundle.text_encoder, out)
    write_json(out / "model_index.json", {
        "_class_name": pipeline, "_diffusers_version": VERSION, "scheduler": ["diffusers", "DDIMScheduler"],
        "text_encoder": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", text["tokenizer_class"]],
        "transformer": ["diffusers", TRANSFORMER], "vae": ["diffusers", type(vae).__name__]})
    scheduler = {**scheduler_config(bundle.diffusion), "timestep_spacing": "leading", "_diffusers_version": VERSION}
    write_json(out / "scheduler" / "scheduler_config.json", scheduler)
    write_json(out / "transformer" / "config.json",
               {"_class_name": TRANSFORMER, "_diffusers_version": VERSION, **diffusers_config(model)})
    state = {k: v.detach().contiguous().clone() for k, v in to_diffusers(bundle.state_dict).items()}
    save_file(state, str(out / "transformer" / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    vae.save_pretrained(str(out / "vae"), safe_serialization=True)
    return out


def call_notes(bundle: Bundle) -> list:
    """How to call the exported pipeline so that it samples as `dit sample --sampler ddim` does."""
    pipeline = pipeline_class(bundle.model)
    size = int(bundle.model["input_size"])
    args = ["num_inference_steps=N (N dividing the scheduler's 1000 steps)", "generator=torch.Generator().manual_seed(SEED)"]
    from dit_trainer.text_encoders.encoder import KINDS

    length = bundle.text_max_length or KINDS["t5"][1]  # 0 or None: what the encoder was loaded with, T5's default
    if length != MAX_SEQUENCE_LENGTH[pipeline]:
        args.append(f"max_sequence_length={length}")
    if size not in BINNED_SIZES[pipeline]:
        args.append("use_resolution_binning=False")
    return [f"note: {pipeline}.from_pretrained(OUT)(prompt, {', '.join(args)}) samples as dit sample --sampler ddim "
            f"--steps N --seed SEED does; it lowercases and strips prompts (so write them that way here too)"]


def _name(version: str, sample_size: int) -> str:
    from dit_trainer.models.pixart.sizes import RELEASES

    found = [r for r in RELEASES if r.version == version and r.resolution == sample_size * 8]
    return (found or [r for r in RELEASES if r.version == version])[0].name


def model_from_config(cfg: dict, version: str, source) -> dict:
    """Our PixArt model-config dict from a PixArtTransformer2DModel config.json (every option explicit)."""
    want = {"norm_type": "ada_norm_single", "activation_fn": "gelu-approximate", "norm_elementwise_affine": False}
    for key, value in want.items():
        if cfg.get(key, value) != value:
            raise CheckpointError(f"{source}: {key} is {cfg.get(key)!r}, not {value!r}; only PixArt transformers "
                                  "convert")
    try:
        heads, hidden = int(cfg["num_attention_heads"]), int(cfg["num_attention_heads"]) * int(cfg["attention_head_dim"])
        size, in_channels = int(cfg["sample_size"]), int(cfg.get("in_channels", 4))
        out_channels = int(cfg.get("out_channels") or in_channels)
        scale = cfg.get("interpolation_scale")
        micro = cfg.get("use_additional_conditions")
        model = {"name": _name(version, size), "input_size": size, "in_channels": in_channels,
                 "learn_sigma": out_channels == 2 * in_channels, "depth": int(cfg["num_layers"]), "hidden_size": hidden,
                 "num_heads": heads, "mlp_ratio": 4.0, "text_hidden_size": int(cfg["caption_channels"]),
                 # diffusers' defaults where the config leaves them out (the released alpha configs do)
                 "interpolation_scale": float(scale if scale is not None else max(size // 64, 1)),
                 "micro_conditions": bool(micro if micro is not None else size == 128)}
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{source} has no valid {err.args[0]!r}; is it a PixArt transformer config?") from None
    if int(cfg.get("patch_size", 2)) != 2 or int(cfg.get("cross_attention_dim", hidden)) != hidden:
        raise CheckpointError(f"{source}: patch_size {cfg.get('patch_size')} / cross_attention_dim "
                              f"{cfg.get('cross_attention_dim')} are not a PixArt's (2, the width {hidden})")
    return model


def read(src) -> Bundle:
    """A Bundle from a PixArt pipeline folder (or its transformer/ alone): our weights, the folder's text
    encoder, VAE and scheduler."""
    from dit_trainer.convert.hf_diffusers import bundle_latent_stats, transformer_tensors
    from dit_trainer.convert.model_config import check_fits
    from dit_trainer.convert.pipeline_folder import diffusion_from_scheduler, read_json, transformer_dir
    from dit_trainer.models.pixart.state_dict import from_diffusers

    root = Path(src)
    tdir = transformer_dir(src, "diffusers")
    tcfg = read_json(tdir / "config.json")
    sd = transformer_tensors(root, tdir)
    index = read_json(root / "model_index.json") if (root / "model_index.json").is_file() else {}
    pipeline = index.get("_class_name", "PixArtAlphaPipeline")
    version = "Sigma" if pipeline == "PixArtSigmaPipeline" else "alpha"
    model = model_from_config(tcfg, version, tdir / "config.json")
    ours = {**from_diffusers(sd), "pos_embed": _fixed_positions(_meta_model(model))}
    check_fits(ours, model, tdir)
    sched = root / "scheduler" / "scheduler_config.json"
    diffusion = diffusion_from_scheduler(read_json(sched), sched) if sched.is_file() else None
    vae_cfg = root / "vae" / "config.json"
    config = read_json(vae_cfg) if vae_cfg.is_file() else {}
    scaling = config.get("scaling_factor", 0.18215) if vae_cfg.is_file() else None
    text = str(root.resolve()) if (root / "text_encoder").is_dir() else None
    return Bundle(state_dict=ours, model=model, vae=str(root / "vae") if (root / "vae").is_dir() else None,
                  **bundle_latent_stats(config, scaling), scaling_factor=scaling,
                  diffusion=diffusion or {"num_timesteps": 1000, "noise_schedule": "linear"},
                  text_encoder=text, text_max_length=MAX_SEQUENCE_LENGTH.get(pipeline), source=str(root))
