"""Latents/s through a DataLoader: packed shards vs one `.npy` per latent, on the same 4×32×32 data.

    python benchmarks/dataloader.py [--num 10000] [--workers 2] [--batch-size 256] [--epochs 3]
                                    [--extract-images 256] [--json PATH]

Every loader shuffles (random access, as in training) with random flips on; the files are read once
before timing so all runs see a warm page cache. Then `dit extract` encodes synthetic JPEGs with a
tiny random VAE, which times the image pipeline (decode, ADM crop, batching, shard writing) rather
than a real VAE. Writes its data to a temporary folder and deletes it.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

from dit_trainer.data import shards as sh
from dit_trainer.data.latents import NpyLatentFolder
from dit_trainer.data.shards import LatentShards
from dit_trainer.data.tools import convert

SHAPE = (4, 32, 32)


def make_data(root: str, num: int):
    """`num` random latents as per-file .npy (fast-DiT's 1×C×H×W) with a labels.npy beside them."""
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((num, *SHAPE), dtype=np.float32)
    folder = os.path.join(root, "npy")
    os.makedirs(folder)
    for i in range(num):
        np.save(os.path.join(folder, f"{i}.npy"), latents[i][None])
    np.save(os.path.join(folder, "labels.npy"), rng.integers(0, 1000, num))
    return folder, latents


def write_extract_layout(root: str, latents: np.ndarray, shard_size: int) -> str:
    """The same latents in `dit extract`'s default layout: both flips, posterior mean and std, float16."""
    out = os.path.join(root, "extract-layout")
    os.makedirs(out)
    num = len(latents)
    names, counts = [], []
    for s in range(0, num, shard_size):
        chunk = latents[s:s + shard_size]
        rows = np.empty((len(chunk), 2, 2, *SHAPE), dtype=np.float16)
        rows[:, 0, 0], rows[:, 1, 0] = chunk, chunk[..., ::-1]
        rows[:, :, 1] = 0.01
        w = sh.ShardWriter(out, sh.shard_name(s // shard_size, -(-num // shard_size)), len(chunk), rows.shape[1:])
        w.add(rows, np.zeros(len(chunk), dtype=np.int64))
        names.append(w.close()["name"])
        counts.append(len(chunk))
    sh.write_manifest(out, count=num, latent_shape=list(SHAPE), dtype="float16", num_classes=1000,
                      class_names=None, vae=None, scaling_factor=0.18215, image_size=256, flips=True,
                      posterior="mean_std", shards=[{"name": n, "count": c} for n, c in zip(names, counts)])
    return out


def measure(ds, args) -> tuple[float, float]:
    """(latents/s, latents per epoch) over `args.epochs` shuffled epochs after one warm-up epoch."""
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0, drop_last=False)
    for _ in loader:
        pass
    start = time.perf_counter()
    seen = 0
    for _ in range(args.epochs):
        for x, _ in loader:
            seen += len(x)
    return seen / (time.perf_counter() - start), seen / args.epochs


def measure_extract(root: str, num: int, args) -> dict:
    """`dit extract` images/s at 256 px with a tiny random AutoencoderKL on `num` synthetic 500×375 JPEGs."""
    from diffusers import AutoencoderKL
    from PIL import Image

    from dit_trainer.data.extract import run_extract

    rng = np.random.default_rng(0)
    for i in range(num):
        folder = os.path.join(root, "images", f"class{i % 10}")
        os.makedirs(folder, exist_ok=True)
        # Smooth noise compresses like a photo; pure noise would make JPEG decoding unrealistically slow.
        small = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
        Image.fromarray(small).resize((500, 375), Image.BILINEAR).save(os.path.join(folder, f"{i}.jpg"), quality=90)
    torch.manual_seed(0)
    AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                  norm_num_groups=8, sample_size=32, mid_block_add_attention=False,
                  ).save_pretrained(os.path.join(root, "vae"))
    stats = run_extract(os.path.join(root, "images"), os.path.join(root, "vae"), 256, os.path.join(root, "latents"),
                        batch_size=32, workers=args.workers, progress=False)
    # The input side alone: the ceiling extraction reaches when a GPU makes the VAE cheap.
    from dit_trainer.data.extract import _collate
    from dit_trainer.data.images import ImageFiles, list_image_folder

    files = ImageFiles(list_image_folder(os.path.join(root, "images"))[0], 256)
    start = time.perf_counter()
    for _ in DataLoader(files, batch_size=32, num_workers=args.workers, collate_fn=_collate):
        pass
    stats["pipeline_images_per_s"] = len(files) / (time.perf_counter() - start)
    return stats


def main(argv=None) -> None:
    """Build the data, time each loader, print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=10000, help="latents (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per loader")
    parser.add_argument("--shard-size", type=int, default=4096)
    parser.add_argument("--extract-images", type=int, default=256, help="images for the extraction timing; 0 skips it")
    parser.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the numbers to PATH as JSON")
    args = parser.parse_args(argv)
    try:
        root = tempfile.mkdtemp(prefix="dit-bench-", dir=args.dir)
    except OSError as err:
        raise SystemExit(f"dataloader.py: error: cannot make a scratch folder in --dir {args.dir} "
                         f"({err.strerror or err}); pass an existing, writable folder or leave --dir out") from None
    try:
        t = time.perf_counter()
        folder, latents = make_data(root, args.num)
        packed = os.path.join(root, "shards")
        convert(folder, packed, shard_size=args.shard_size, progress=False)
        rich = write_extract_layout(root, latents, args.shard_size)
        setup = time.perf_counter() - t
        rows = [
            ("per-file .npy (NpyLatentFolder, flips)", NpyLatentFolder(folder, random_flip=True)),
            ("shards, converted (float16, flips)", LatentShards(packed, random_flip=True)),
            ("shards, extract layout (float16, stored flips + posterior sample)", LatentShards(rich, random_flip=True)),
        ]
        print(f"# dit-trainer dataloader benchmark, {datetime.date.today().isoformat()}")
        print(f"# {args.num} latents {'x'.join(map(str, SHAPE))}, batch {args.batch_size}, {args.workers} workers, "
              f"shuffle, {args.epochs} timed epochs; {os.cpu_count()} CPUs, {platform.machine()}, "
              f"torch {torch.__version__}, numpy {np.__version__}, load average {os.getloadavg()[0]:.1f} "
              f"(setup {setup:.0f} s)")
        results, numbers = {}, {"num": args.num, "loaders": {}}
        for name, ds in rows:
            results[name], per_epoch = measure(ds, args)
            numbers["loaders"][name] = {"latents_per_s": results[name], "latents_per_epoch": per_epoch}
            print(f"{name:<70} {results[name]:>10,.0f} latents/s")
        base = results[rows[0][0]]
        print(f"{'speed-up of converted shards over per-file':<70} {results[rows[1][0]] / base:>10.1f}x")
        if args.extract_images:
            stats = measure_extract(root, args.extract_images, args)
            name = f"dit extract, tiny VAE, 256 px, flips, batch 32, {args.workers} workers, {stats['images']} images"
            print(f"{name:<70} {stats['images_per_s']:>10,.0f} images/s")
            name = f"  of which image decoding + ADM crop alone, {args.workers} workers"
            print(f"{name:<70} {stats['pipeline_images_per_s']:>10,.0f} images/s")
            numbers["extract"] = {k: stats[k] for k in ("images", "images_per_s", "pipeline_images_per_s")}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(numbers, f, indent=2)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
