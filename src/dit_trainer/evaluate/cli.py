"""`dit eval`: FID, sFID, IS, precision and recall of a samples .npz, or reference statistics of an image or latent folder.

    dit eval --samples samples.npz --ref VIRTUAL_imagenet256_labeled.npz [--weights FILE]
    dit eval --ref-from-images DIR --out REF.npz [--image-size 256]
    dit eval --ref-from-latents SHARDS --out REF.npz [--vae ID_OR_DIR]
    dit eval --network digits --samples samples.npz --ref digits
"""

import json

from dit_trainer.errors import ConfigError
from dit_trainer.host_memory import keep_freed_memory_on


def add_commands(sub) -> None:
    """Register `dit eval`."""
    p = sub.add_parser("eval", help="FID / sFID / IS / precision / recall of samples.npz against a reference batch",
                       description="Measure samples (arr_0: uint8 N×H×W×3) against a reference .npz in the ADM "
                                   "evaluator's layout, or build such a reference from an image or latent folder.")
    p.add_argument("--samples", help="samples .npz with arr_0 uint8 N×H×W×3")
    p.add_argument("--ref", help="reference .npz (mu, sigma, mu_s, sigma_s and/or arr_0), or 'digits' "
                                 "for scikit-learn's digits with --network digits")
    p.add_argument("--ref-from-images", metavar="DIR", help="build a reference from this image folder (with --out)")
    p.add_argument("--ref-from-latents", metavar="DIR",
                   help="build a reference from latents (dit extract's shards, a .npy folder) decoded by their VAE "
                        "(with --out)")
    p.add_argument("--vae", help="VAE id or folder that decodes --ref-from-latents (default: the one its manifest "
                                 "records)")
    p.add_argument("--out", help="where --ref-from-images/--ref-from-latents write the reference .npz")
    p.add_argument("--image-size", type=int, default=256, help="ADM center crop for --ref-from-images (default 256)")
    p.add_argument("--network", choices=("inception", "digits"), default="inception",
                   help="feature network (default inception; digits: the demo's shipped digit network)")
    p.add_argument("--weights", help="Inception weights file (default: torch-fidelity's "
                                     "weights-inception-2015-12-05-6726825d.pth, fetched into torch's hub cache on "
                                     "first use and sha256-checked)")
    p.add_argument("--batch-size", type=int, default=None, help="images per batch (default 64; 512 for digits)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="network precision (default fp32; report fp32 numbers)")
    p.add_argument("--device", default=None, help="torch device (default cuda if available, else cpu)")
    p.add_argument("--workers", type=int, default=0, help="image-loading workers for --ref-from-images")
    p.add_argument("--on-bad-image", choices=("skip", "stop"), default="skip",
                   help="--ref-from-images skips unreadable images and lists them in OUT's .skipped.txt, or stops")
    p.add_argument("--pr-features", type=int, default=10_000,
                   help="--ref-from-images/--ref-from-latents keep this many random images' features for "
                        "precision/recall")
    p.add_argument("--is-splits", type=int, default=None, metavar="N",
                   help="Inception Score over N equal splits (torch-fidelity's; it uses 10); default: splits of "
                        "5,000 samples, the last holding the rest, as the ADM evaluator")
    p.add_argument("--pr-dtype", choices=("fp16", "fp32"), default="fp16",
                   help="precision/recall distances in float16 as the ADM evaluator computes them (default), "
                        "or float32")
    p.add_argument("--no-pr", action="store_true",
                   help="skip precision/recall (the slowest metric: its k-NN compares every pair of samples)")
    p.add_argument("--json", metavar="OUT", help="also write the metrics as JSON here")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out or --json file (by default it is kept and nothing is measured)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    """Run `dit eval` with parsed arguments."""
    from dit_trainer.evaluate.evaluator import evaluate, reference_from_images

    for flag in ("batch_size", "pr_features", "image_size"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} is {value}; it must be 1 or more")
    if args.workers < 0:
        raise ConfigError(f"--workers is {args.workers}; it must be 0 or more")
    from dit_trainer.fs import check_output_path, refuse_existing, staged_file

    # Before minutes of feature extraction: a path that cannot be written would lose them, and a file
    # already there is the user's until --overwrite says otherwise.
    if args.out:
        check_output_path(args.out, "--out", ConfigError, suffixes=(".npz",))
    if args.json:
        check_output_path(args.json, "--json", ConfigError)
    for flag, path in (("--out", args.out), ("--json", args.json)):
        if path and not args.overwrite:
            refuse_existing(path, flag, ConfigError)
    keep_freed_memory_on(args.device)
    if args.ref_from_images and args.ref_from_latents:
        raise ConfigError("pass one of --ref-from-images and --ref-from-latents")
    if args.vae and not args.ref_from_latents:
        raise ConfigError("--vae decodes --ref-from-latents; samples are measured as images")
    source = args.ref_from_images or args.ref_from_latents
    if source:
        flag = "--ref-from-images" if args.ref_from_images else "--ref-from-latents"
        if args.samples or args.ref:
            raise ConfigError(f"{flag} builds a reference; run --samples/--ref as a separate command")
        if not args.out:
            raise ConfigError(f"{flag} needs --out REF.npz")
        if args.ref_from_images:
            stats = reference_from_images(args.ref_from_images, args.out, args.network, args.weights, args.image_size,
                                          args.batch_size, args.dtype, args.device, not args.no_progress, args.workers,
                                          args.pr_features, on_bad_image=args.on_bad_image)
        else:
            from dit_trainer.evaluate.latent_reference import reference_from_latents

            stats = reference_from_latents(args.ref_from_latents, args.out, args.vae, args.network, args.weights,
                                           args.batch_size, args.dtype, args.device, not args.no_progress,
                                           args.pr_features)
        print(f"wrote {args.out}: {stats.mu.shape[0]}-d pool and {stats.mu_s.shape[0]}-d spatial statistics "
              f"({stats.network}), {len(stats.features)} pool features kept for precision/recall")
        return 0
    if not args.samples or not args.ref:
        raise ConfigError("dit eval needs --samples FILE.npz and --ref REF.npz (or --ref-from-images DIR / "
                          "--ref-from-latents DIR with --out REF.npz)")
    result = evaluate(args.samples, args.ref, args.network, args.weights, args.batch_size, args.dtype, args.device,
                      progress=not args.no_progress, is_splits=args.is_splits, pr_dtype=args.pr_dtype,
                      pr=not args.no_pr)
    label = "Inception Score" if result["network"] == "inception" else "Inception Score (digit network)"
    print(f"{label}: {result['inception_score']:.4f} ± {result['inception_score_std']:.4f}")
    print(f"FID: {result['fid']:.4f}")
    print(f"sFID: {result['sfid']:.4f}")
    if result["precision"] is None:
        print(f"Precision/Recall: skipped ({result['pr_skipped']})")
    else:
        print(f"Precision: {result['precision']:.4f}")
        print(f"Recall: {result['recall']:.4f}")
    if args.json:
        with staged_file(args.json) as tmp:
            tmp.write_text(json.dumps(result, indent=2) + "\n")
    return 0
