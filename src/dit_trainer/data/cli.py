"""`dit extract` and `dit data convert|verify`."""

import os
import sys

from dit_trainer.host_memory import keep_freed_memory_on


def _extract(args) -> int:
    from dit_trainer.data.extract import run_extract

    keep_freed_memory_on(args.device)
    stats = run_extract(
        args.data_path, args.vae, args.image_size, args.out, batch_size=args.batch_size,
        shard_size=args.shard_size, vae_dtype=args.vae_dtype, dtype=args.dtype, flips=not args.no_flips,
        posterior=args.store.replace("-", "_"), workers=args.workers, device=args.device,
        on_bad_image=args.on_bad_image, seed=args.seed, progress=not args.no_progress, overwrite=args.overwrite,
        keep_images=args.keep_images, text_encoder=args.text_encoder, text_max_length=args.text_max_length,
        text_dtype=args.text_dtype, empty_captions=args.empty_captions,
    )
    print(f"dit extract: rank {stats['rank']} encoded {stats['images']} images in {stats['shards']} shards, "
          f"{stats['seconds']:.1f} s ({stats['images_per_s']:.1f} images/s)", file=sys.stderr)
    if stats["rank"] == 0:
        print(os.path.join(args.out, "manifest.json"))
    return 0


def _convert(args) -> int:
    from dit_trainer.data.tools import convert

    m = convert(args.src, args.out, shard_size=args.shard_size, dtype=args.dtype, num_classes=args.num_classes,
                labels_file=args.labels_file, vae=args.vae, scaling_factor=args.scaling_factor,
                image_size=args.image_size, progress=not args.no_progress, unconditional=args.unconditional)
    print(f"dit data convert: {m['count']} latents {tuple(m['latent_shape'])} in {len(m['shards'])} shards "
          f"-> {os.path.join(args.out, 'manifest.json')}", file=sys.stderr)
    return 0


def _verify(args) -> int:
    from dit_trainer.data.shards import read_manifest
    from dit_trainer.data.tools import is_per_file_folder, verify, verify_per_file

    per_file = is_per_file_folder(args.path)
    if per_file:
        problems, ds = verify_per_file(args.path, args.labels_file, args.unconditional, progress=not args.no_progress)
    else:
        problems = verify(args.path, progress=not args.no_progress)
    for line in problems:
        print(f"dit data verify: {line}", file=sys.stderr)
    if problems:
        return 1
    if per_file:
        print(f"dit data verify: ok: {len(ds)} per-file latents {ds.latent_shape}, {ds.num_classes} classes "
              f"(dit train reads them as they are; dit data convert packs them into shards)")
        return 0
    m = read_manifest(args.path)
    text = m.get("text")
    condition = (f"captions encoded by {text['encoder']} ({text['max_length']} tokens x {text['hidden_size']})"
                 if text else f"{m['num_classes']} classes")
    print(f"dit data verify: ok: {m['count']} latents {tuple(m['latent_shape'])} {m['dtype']} in "
          f"{len(m['shards'])} shards, {condition}, flips={m['flips']}, posterior={m['posterior']}")
    return 0


def add_commands(subparsers) -> None:
    """Register `extract` and `data` (with `convert` and `verify`)."""
    p = subparsers.add_parser(
        "extract", help="encode an image folder into latent shards with a frozen VAE",
        description="Encode an ImageFolder once with a frozen VAE (ADM center crop) into packed latent shards. "
                    "Resumable; under torchrun each rank encodes its own shards. The manifest records the latents' "
                    "per-channel mean and std, which training uses for VAEs other than the 4-channel SD ones.")
    p.add_argument("--data-path", required=True,
                   help="image folder: one sub-folder per class, or a flat folder (label 0); with --text-encoder, "
                        "captioned images: a folder with NAME.txt (or NAME.json) beside each image, a JSONL/CSV "
                        "manifest (path, caption) or webdataset .tar shards, local or an fsspec URL")
    from dit_trainer.vae import DEFAULT_VAE

    p.add_argument("--vae", default=DEFAULT_VAE,
                   help="Hub id or save_pretrained folder of a diffusers AutoencoderKL or AutoencoderDC "
                        "(default: %(default)s)")
    p.add_argument("--image-size", type=int, required=True, help="crop size in pixels, e.g. 256 or 512")
    p.add_argument("--out", required=True, help="output folder for shards and manifest.json")
    p.add_argument("--batch-size", type=int, default=32, help="images per VAE batch (each also encoded flipped)")
    p.add_argument("--shard-size", type=int, default=2048, help="images per shard; also the resume granularity")
    p.add_argument("--vae-dtype", choices=("fp32", "bf16"), default="fp32", help="VAE compute dtype")
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                   help="storage dtype; float16 halves disk and page cache, its rounding is below the posterior std")
    p.add_argument("--store", choices=("mean-std", "sample"), default="mean-std",
                   help="posterior mean and std (fresh sample each epoch) or one fixed sample; an AutoencoderDC, "
                        "which has no posterior, stores its latents")
    p.add_argument("--no-flips", action="store_true", help="do not also encode the horizontally flipped image")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="image decoding processes per rank")
    p.add_argument("--device", default=None, help="torch device (default: this rank's GPU, else cpu)")
    p.add_argument("--on-bad-image", choices=("skip", "stop"), default="skip",
                   help="skip unreadable images and list them in OUT/skipped.txt, or stop at the first")
    p.add_argument("--seed", type=int, default=0, help="seed of the stored sample with --store sample")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an --out holding other files (same-named ones are replaced), or replace an "
                        "extract made there with other settings; by default both are refused")
    p.add_argument("--keep-images", action="store_true",
                   help="also keep each encoded crop (uint8) beside its latents: what repa.enabled training reads")
    p.add_argument("--text-encoder", default=None,
                   help="text-to-image: a transformers folder or Hugging Face id of a frozen text encoder (T5, CLIP "
                        "with projection, Gemma 2); each shard also keeps its outputs for the images' captions")
    p.add_argument("--text-max-length", type=int, default=0,
                   help="tokens per caption, longer ones truncated (counted in the log); 0: the encoder's release "
                        "default (T5 120 as PixArt-alpha, Gemma 2 300, CLIP 77)")
    p.add_argument("--text-dtype", choices=("auto", "fp32", "bf16"), default="auto",
                   help="text encoder compute dtype (auto: bf16 on a GPU, fp32 on a CPU)")
    p.add_argument("--empty-captions", choices=("error", "drop"), default="error",
                   help="an image with a missing or empty caption: stop naming it, or leave it out (counted)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_extract)

    d = subparsers.add_parser("data", help="convert or verify latent datasets",
                              description="Convert per-file latents into shards, or verify a shard folder.")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    c = dsub.add_parser("convert", help="pack a .npy latent folder or fast-DiT/PaddleMIX features into shards")
    c.add_argument("src", help="folder of .npy latents, or the fast-DiT features folder (holding imagenet256_features/)")
    c.add_argument("--out", required=True, help="output shard folder")
    c.add_argument("--shard-size", type=int, default=4096, help="latents per shard")
    c.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="storage dtype")
    c.add_argument("--num-classes", type=int, default=None, help="number of classes (default: from the labels)")
    c.add_argument("--labels-file", default=None, help="labels.json|.npy|.txt for a .npy folder (default: found beside it)")
    c.add_argument("--unconditional", action="store_true",
                   help="pack a .npy folder without labels file as one class (default: refused, as dit train does)")
    c.add_argument("--vae", default=None, help="the VAE that made the latents, recorded for `dit sample`")
    c.add_argument("--scaling-factor", type=float, default=0.18215, help="factor the latents were multiplied by")
    c.add_argument("--image-size", type=int, default=None,
                   help="image size the latents came from (default: 8 × latent side)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.set_defaults(func=_convert)
    v = dsub.add_parser("verify", help="check counts, shapes, dtypes, NaN/inf (and the manifest) of a latent folder")
    v.add_argument("path", help="shard folder holding manifest.json, or per-file latents (.npy folder, fast-DiT features)")
    v.add_argument("--labels-file", default=None, help="labels file of a .npy folder (default: found beside it)")
    v.add_argument("--unconditional", action="store_true", help="a .npy folder without labels file is one class")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    v.set_defaults(func=_verify)
