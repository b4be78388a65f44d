"""What keeping the images for REPA costs the data: disk per image, and items/s through a shuffled
DataLoader over `dit extract`-style shards with and without their crops (`--keep-images`).

    python benchmarks/repa_data.py [--num 2048] [--image-size 256] [--batch-size 256] [--workers 2] [--epochs 2]

The shards are written directly (random latents of SD-VAE's 4x(size/8)^2 shape in float16, mean and
std for both flips, and random uint8 crops) with the writers `dit extract` uses, so no VAE runs.
Every epoch reads every item in a random order; the first epoch of each loader warms the page cache
and is not timed. Disk is counted from the files; at ImageNet scale (1,281,167 images) it scales
linearly. Writes to a temporary folder and deletes it.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

from dit_trainer.data import shards as sh
from dit_trainer.data.extract import finish_shards
from dit_trainer.data.shard_images import SUFFIX, ImageSidecar
from dit_trainer.data.shards import LatentShards
from _common import machine

IMAGENET = 1_281_167


def write(root: str, num: int, size: int, shard_size: int = 1024) -> None:
    """Shards of `num` random items (both flips, mean and std, float16) with their uint8 crops."""
    rng = np.random.default_rng(0)
    latent = (4, size // 8, size // 8)
    names = [sh.shard_name(i, -(-num // shard_size)) for i in range(-(-num // shard_size))]
    for i, name in enumerate(names):
        n = min(shard_size, num - i * shard_size)
        writer = sh.ShardWriter(root, name, n, (2, 2, *latent), "float16")
        kept = ImageSidecar(root, name, n, size)
        writer.add(rng.standard_normal((n, 2, 2, *latent), dtype=np.float32) * 0.1, rng.integers(0, 1000, n))
        kept.add(rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8))
        writer.close(skipped=[], rank=0, **kept.close())
    finish_shards(root, names, [str(c) for c in range(1000)], "synthetic", 0.18215, 0.0, size, True, "mean_std",
                  "float16", latent, root, images=[size, size, 3])


def rate(root: str, images: bool, batch: int, workers: int, epochs: int) -> float:
    ds = LatentShards(root, random_flip=True)
    ds.return_images = images
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0)),
                                            batch, drop_last=True)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=workers)
    for _ in loader:  # warm: page cache and workers' mmaps
        pass
    n, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for batch_items in loader:
            n += len(batch_items["x"] if isinstance(batch_items, dict) else batch_items[0])
    return n / (time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num", type=int, default=2048)
    ap.add_argument("--image-size", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="repa_data_")
    try:
        write(root, args.num, args.image_size)
        files = os.listdir(root)
        images = sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith(SUFFIX))
        latents = sum(os.path.getsize(os.path.join(root, f)) for f in files
                      if f.endswith(".npy") and not f.endswith(SUFFIX) and not f.endswith(".labels.npy"))
        plain = rate(root, False, args.batch_size, args.workers, args.epochs)
        kept = rate(root, True, args.batch_size, args.workers, args.epochs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per = args.num
    print(f"# {machine(torch.device('cpu'))}; torch {torch.__version__}")
    print(f"# {args.num} items at {args.image_size} px, batch {args.batch_size}, {args.workers} workers, "
          f"{args.epochs} timed epochs (shuffled, random flips, page cache warm)")
    print(f"# command: python benchmarks/repa_data.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print("| shards | bytes/item | ImageNet (1.28M) | items/s |")
    print("|:--|--:|--:|--:|")
    print(f"| latents (both flips, mean+std, fp16) | {latents / per:,.0f} | {latents / per * IMAGENET / 1e9:,.0f} GB | "
          f"{plain:,.0f} |")
    print(f"| latents + crops (`--keep-images`) | {(latents + images) / per:,.0f} | "
          f"{(latents + images) / per * IMAGENET / 1e9:,.0f} GB | {kept:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
