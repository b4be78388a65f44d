"""Sampling a text-conditioned model (PixArt) from prompts: the run's frozen text encoder encodes them,
and classifier-free guidance mixes in the encoding of "" (what caption dropout trained, and what
diffusers' PixArt pipelines guide with) or a negative prompt's in its place.

`sample_prompts` is the library call (`dit sample --prompt`, FID batches over a prompt file, `dit demo
--text`, grids during training); `run_text_encoder` finds and loads the encoder a run records.
"""

import os
import sys

import torch

from dit_trainer.condition.text import square_micro_conditions
from dit_trainer.errors import ConfigError, DataError
from dit_trainer.sample.prompt_text import check_prompts


def text_condition(model, cfg=None):
    """The `TextCondition` of a text-conditioned `model` (built from its run's `cfg` when given)."""
    from dit_trainer.condition.text import TextCondition

    keys = tuple(getattr(model, "condition_keys", ("y",)))
    if "text_embeds" not in keys:
        raise ConfigError("this model is class-conditional (it takes class labels), not text-conditioned; sample it "
                          "with --class-labels or --class-names instead of prompts")
    if cfg is not None:
        from dit_trainer.condition import build_condition
        from dit_trainer.models import get_spec

        return build_condition(cfg, get_spec(cfg.model.name), model)
    return TextCondition(keys, 0.0, type(model).__name__, getattr(model, "caption_channels", None))


def micro_conditions(model, n: int, image_size=None, device="cpu") -> dict:
    """The image micro-conditions a model takes (PixArt-alpha 1024: `resolution` (n, 2) height and width in
    pixels, `aspect_ratio` (n, 1) height / width), as diffusers' pipeline gives them; {} for others."""
    keys = getattr(model, "condition_keys", ())
    if "resolution" not in keys:
        return {}
    return square_micro_conditions(keys, n, image_size or model.input_size * 8, device)


def negative_rows(condition, encoder, negative_prompt, n: int, device, micro=None) -> dict:
    """The unconditional rows classifier-free guidance mixes in: the null caption (the encoding of "") for
    no negative prompt or "", else the negative prompt's (one for all, or one per prompt)."""
    if negative_prompt is None or negative_prompt == "":
        if condition.null is None:
            condition.null_from_encoder(encoder, device)
        return condition.unconditional(n, device)
    negatives = check_prompts(negative_prompt, "negative prompts")
    if len(negatives) == 1:
        negatives = negatives * n
    if len(negatives) != n:
        raise ConfigError(f"{len(negatives)} negative prompts for {n} prompts; pass one negative prompt, or one per "
                          "prompt")
    return condition.from_prompts(encoder, negatives, device, **(micro or {}))


@torch.no_grad()
def sample_prompts(model, objective_or_cfg, condition, encoder, prompts, negative_prompt=None, cfg_scale=4.5,
                   image_size=None, device="cpu", **kwargs):
    """Samples in the model's space (latents) for `prompts` (a string or a list): float N×C×H×W.

    `condition` is the model's `TextCondition` (None: built from the model; one bound to training data
    guides with the data's null caption), `encoder` the frozen `TextEncoder` its captions were encoded
    with. With `cfg_scale` != 1 the unconditional half is the encoding of "" (`negative_prompt` None or
    "") or of `negative_prompt` (one string, or one per prompt), as diffusers' PixArt pipelines guide.
    `image_size` (pixels) gives a model with micro-conditions its resolution (default: latent size x 8).
    The other keywords are `sample_latents`' (sampler, steps, seed, guidance, compile, options)."""
    from dit_trainer.sample.sampling import sample_conditioned

    prompts = check_prompts(prompts)
    if condition is None:
        condition = text_condition(model)
    device = torch.device(device)
    micro = micro_conditions(model, len(prompts), image_size, device)
    before = encoder.truncated
    cond = condition.from_prompts(encoder, prompts, device, **micro)
    uncond = None
    if float(cfg_scale) != 1.0:
        uncond = negative_rows(condition, encoder, negative_prompt, len(prompts), device, micro)
    if encoder.truncated > before:  # as training logs its captions': what the model reads is the cut text
        print(f"{encoder.truncated - before} prompt(s) ran past {encoder.max_length} tokens and were cut there "
              "(data.text_max_length)", file=sys.stderr)
    return sample_conditioned(model, objective_or_cfg, condition, cond, uncond, cfg_scale=cfg_scale, device=device,
                              **kwargs)


def text_encoder_name(cfg, override=None, folder=None):
    """The text encoder a run's captions were encoded with: `override` (--text-encoder), else the run's
    `data.text_encoder`, else its shards' manifest; a relative name inside checkpoint `folder` (the
    `text_encoder/` a converted folder carries) is made absolute. None when nothing records one."""
    from dit_trainer.sample.decode import data_manifest

    name = override or cfg.data.text_encoder or ((data_manifest(cfg.data.path) or {}).get("text") or {}).get("encoder")
    if name and not override and folder is not None and not os.path.isabs(os.path.expanduser(str(name))):
        inside = os.path.join(os.fspath(folder), str(name))
        if os.path.isdir(inside):
            return os.path.abspath(inside)
    return name


def run_text_encoder(cfg, override=None, device="cpu", folder=None):
    """The frozen `TextEncoder` that encodes prompts as the run's captions were: its name (see
    `text_encoder_name`), token count (`data.text_max_length`, else the family's release length, as training
    encodes) and dtype (`data.text_dtype`)."""
    from dit_trainer.data.loader import caption_tokens
    from dit_trainer.text_encoders import load_text_encoder

    name = text_encoder_name(cfg, override, folder)
    if not name:
        raise ConfigError(f"the run of {cfg.model.name} records no text encoder (data.text_encoder); pass "
                          "--text-encoder DIR_OR_ID, the one its captions were encoded with")
    try:
        return load_text_encoder(name, cfg.data.text_dtype, device, caption_tokens(cfg))
    except DataError as err:
        where = "--text-encoder" if override else "the run's data.text_encoder"
        raise ConfigError(f"{where}: {err}" + ("" if override else "; or pass --text-encoder DIR_OR_ID")) from None
