"""`dit convert --from FORMAT SRC --to FORMAT OUT [--model NAME_OR_JSON] [--vae DIR_OR_ID]`."""

from dit_trainer.convert import READERS, WRITERS


def add_commands(subparsers) -> None:
    """Register `dit convert`."""
    p = subparsers.add_parser(
        "convert",
        help="convert DiT and PixArt weights between released .pt, our runs, diffusers and ppdiffusers pipelines",
        description="Convert a model between formats: dit-pt (a facebookresearch/DiT .pt), ours (a run or "
                    "checkpoint folder), diffusers (DiTPipeline, or PixArtAlphaPipeline / PixArtSigmaPipeline for a "
                    "PixArt) and ppdiffusers (DiTPipeline folders).",
    )
    p.add_argument("--from", dest="src_format", required=True, choices=READERS, help="format of SRC")
    p.add_argument("src", metavar="SRC", help="file or folder to read")
    p.add_argument("--to", dest="dst_format", required=True, choices=WRITERS, help="format of OUT")
    p.add_argument("out", metavar="OUT", help="folder to write")
    p.add_argument("--model", default=None, help="size name such as DiT-XL/2, or a model config file: a PaddleMIX DiT JSON "
                   "(num_layers, num_attention_heads, ...) or our YAML (default: read off the tensors)")
    p.add_argument("--num-heads", type=int, default=None, help="attention heads of a DiT of no release size")
    p.add_argument("--vae", default=None, help="VAE folder or hub id the model's latents came from")
    p.add_argument("--text-encoder", default=None, metavar="DIR_OR_ID",
                   help="text-to-image: the text encoder (T5 for PixArt) its captions were encoded with, overriding the "
                        "one SRC records (exported into the pipeline folder's text_encoder/ and tokenizer/)")
    p.add_argument("--timestep-convention", choices=("diffusers", "release"), default="diffusers",
                   help="importing a pipeline: run it as diffusers computes it (default) or as the original DiT")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT when it already holds files (they are deleted); by default they are kept "
                        "and nothing is written")
    p.add_argument("--without-guide", action="store_true",
                   help="export a run that samples with autoguidance (sample.guide) to diffusers/ppdiffusers, whose "
                        "DiTPipeline holds one transformer: the main model alone, sampled with classifier-free "
                        "guidance only")
    p.set_defaults(func=run)


def check_export(args) -> None:
    """Refuse in one line to drop a run's autoguidance guide silently (a DiTPipeline folder holds one transformer),
    and to convert a MeanFlow run, which no diffusers pipeline samples and no model bundle carries whole."""
    from dit_trainer import checkpoint
    from dit_trainer.errors import ConfigError

    if args.src_format != "ours":
        return
    cfg = checkpoint.open(args.src, flag="SRC").config()
    pipeline = args.dst_format in ("diffusers", "ppdiffusers")
    if cfg is not None and getattr(cfg, "objective", None) == "meanflow":
        if pipeline:
            # Its network takes a second time input and its sampler steps an average velocity: a DiTPipeline's
            # transformer and schedulers would load it and sample something else.
            raise ConfigError(f"{args.src} is a MeanFlow run (objective meanflow), and no custom {args.dst_format} "
                              "pipeline for MeanFlow is written (DiTPipeline's transformer has no interval input, its "
                              "schedulers no MeanFlow step); sample it with dit sample or dit_trainer's DiTPipeline")
        # A bundle carries the network, not the objective that gives it its interval (and scale) input.
        raise ConfigError(f"{args.src} is a MeanFlow run (objective meanflow), which dit convert does not rewrite: its "
                          "model bundles carry no interval input; the run folder itself is what dit sample, "
                          "sample-ddp and dit_trainer's DiTPipeline read")
    if not pipeline or args.without_guide:
        return
    if cfg is not None and cfg.sample.guide is not None:
        raise ConfigError(f"{args.src} samples with autoguidance (sample.guide {cfg.sample.guide}), and a "
                          f"{args.dst_format} DiTPipeline folder holds one transformer; pass --without-guide to export "
                          f"the main model alone, or sample with dit_trainer's DiTPipeline(..., guide=GUIDE_FOLDER)")


def check_paths(src, out, overwrite: bool = False) -> None:
    """One-line errors before reading: OUT must be a folder (new or existing) apart from SRC; writing into
    SRC, or SRC into OUT, would rewrite the source in place (a run folder gains stale root files)."""
    from pathlib import Path

    from dit_trainer.errors import ConfigError
    from dit_trainer.fs import check_output_path, refuse_existing

    check_output_path(out, "OUT", ConfigError, folder=True)
    a, b = Path(src).expanduser().resolve(), Path(out).expanduser().resolve()
    if a == b or a in b.parents or b in a.parents:
        raise ConfigError(f"OUT {out} {'is' if a == b else 'overlaps'} SRC {src}: converting would rewrite the source; "
                          "pass a folder apart from it")
    if not overwrite:  # before the weights are read: OUT's files are the user's until they say otherwise
        refuse_existing(out, "OUT", ConfigError)


SIZE_KEYS = ("depth", "hidden_size", "num_heads", "mlp_ratio", "dim", "n_layers", "n_heads", "n_kv_heads")


def run(args) -> int:
    """Convert and say what was written."""
    from dit_trainer.convert import convert

    check_paths(args.src, args.out, args.overwrite)
    check_export(args)
    out, bundle = convert(args.src_format, args.src, args.dst_format, args.out, model=args.model, vae=args.vae,
                          num_heads=args.num_heads, convention=args.timestep_convention, overwrite=args.overwrite,
                          text_encoder=args.text_encoder)
    extra = {k: v for k, v in bundle.model.items() if k in ("timestep_freq_shift", "mlp_norm_eps")}
    note = f" (timestep convention {extra})" if extra else ""
    # A size name with overrides (a run of DiT-XL/2 at --model.depth 2) is not that size: say what it is.
    sizes = ", ".join(f"{k} {bundle.model[k]}" for k in SIZE_KEYS if k in bundle.model)
    what = "; ".join(filter(None, (sizes, f"{len(bundle.state_dict)} tensors")))
    print(f"wrote {bundle.model['name']} ({what}) as {args.dst_format} to {out}{note}")
    from dit_trainer.convert import pixart_pipeline

    if pixart_pipeline.is_pixart(bundle.model):
        if args.dst_format == "diffusers":
            print(*pixart_pipeline.call_notes(bundle), sep="\n")
        return 0
    if args.dst_format in ("diffusers", "ppdiffusers") and int(bundle.model.get("num_classes", 1000)) != 1000:
        # Their DiTPipeline hard-codes label 1000 as the null class.
        print(f"note: {args.dst_format}' DiTPipeline guides with label 1000 as the null class; this model has "
              f"{bundle.model['num_classes']} classes, so use guidance_scale=1 there (dit_trainer's DiTPipeline guides)")
    return 0
