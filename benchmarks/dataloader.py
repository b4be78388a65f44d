"""Latents/s through a DataLoader: packed shards vs one `.npy` per latent, on the same 4×32×32 data.

    python benchmarks/dataloader.py [--num 10000] [--workers 2] [--batch-size 256] [--epochs 3]
                                    [--extract-images 256] [--online-images 1024] [--json PATH]

Every loader shuffles (random access, as in training) with random flips on; the files are read once
before timing so all runs see a warm page cache. Then `dit extract` encodes synthetic JPEGs with a
tiny random VAE, which times the image pipeline (decode, ADM crop, batching, shard writing) rather
than a real VAE. Last, `dit train` on an image folder: the first epoch encodes into the latent
cache, later ones read it, beside the same images precomputed by `dit extract` through the same
loader. Writes its data to a temporary folder and deletes it.
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


def synthetic_jpegs(folder: str, num: int) -> str:
    """`num` 500×375 JPEGs in 10 class folders; smooth noise compresses like a photo (pure noise would
    make JPEG decoding unrealistically slow)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(num):
        sub = os.path.join(folder, f"class{i % 10}")
        os.makedirs(sub, exist_ok=True)
        small = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
        Image.fromarray(small).resize((500, 375), Image.BILINEAR).save(os.path.join(sub, f"{i}.jpg"), quality=90)
    return folder


def tiny_vae(folder: str, levels: int) -> str:
    """A random AutoencoderKL with 8-channel blocks: 2 levels halve the side, 4 divide it by 8 like SD's."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    widths = (8, 16) if levels == 2 else (8,) * levels
    AutoencoderKL(block_out_channels=widths, down_block_types=("DownEncoderBlock2D",) * levels,
                  up_block_types=("UpDecoderBlock2D",) * levels, layers_per_block=1, latent_channels=4,
                  norm_num_groups=8, sample_size=32, mid_block_add_attention=False).save_pretrained(folder)
    return folder


def measure_extract(root: str, num: int, args) -> dict:
    """`dit extract` images/s at 256 px with a tiny random AutoencoderKL on `num` synthetic 500×375 JPEGs."""
    from dit_trainer.data.extract import run_extract

    images = synthetic_jpegs(os.path.join(root, "images"), num)
    stats = run_extract(images, tiny_vae(os.path.join(root, "vae"), 2), 256, os.path.join(root, "latents"),
                        batch_size=32, workers=args.workers, progress=False)
    # The input side alone: the ceiling extraction reaches when a GPU makes the VAE cheap.
    from dit_trainer.data.extract import _collate
    from dit_trainer.data.images import ImageFiles, list_image_folder

    files = ImageFiles(list_image_folder(images)[0], 256)
    start = time.perf_counter()
    for _ in DataLoader(files, batch_size=32, num_workers=args.workers, collate_fn=_collate):
        pass
    stats["pipeline_images_per_s"] = len(files) / (time.perf_counter() - start)
    return stats


def _epochs(loader, epochs: int) -> float:
    """Latents/s of `epochs` whole epochs drawn from a StepLoader."""
    per_epoch = loader.sampler.batches_per_epoch
    start, seen = time.perf_counter(), 0
    for _ in range(epochs * per_epoch):
        x, _ = next(loader)
        seen += len(x)
    return seen / (time.perf_counter() - start)


def measure_online(root: str, num: int, args) -> dict:
    """`dit train --data.path IMAGES` through the trainer's loader: the first epoch (encoding into the
    latent cache), the second (completing it, then reading), later ones (reading it), beside the same
    images precomputed by `dit extract`; a tiny 8×-downsampling VAE at 256 px gives 4×32×32 latents."""
    from dit_trainer.data.extract import run_extract
    from dit_trainer.data.loader import GlobalBatchSampler, StepLoader
    from dit_trainer.data.online import open_image_folder
    from dit_trainer.data.online.encoder import encoder_for

    images = synthetic_jpegs(os.path.join(root, "online-images"), num)
    vae = tiny_vae(os.path.join(root, "vae8"), 4)
    batch = min(args.batch_size, num)

    def loader(ds, stage=None):
        return StepLoader(ds, GlobalBatchSampler(len(ds), batch, seed=0), num_workers=args.workers, stage=stage)

    t = time.perf_counter()
    run_extract(images, vae, 256, os.path.join(root, "extracted"), workers=args.workers, progress=False)
    out = {"images": num, "extract_images_per_s": num / (time.perf_counter() - t)}
    shards = loader(LatentShards(os.path.join(root, "extracted"), random_flip=True))
    _epochs(shards, 1)  # warm the page cache, as the cached epochs below find it
    dataset = open_image_folder(images, vae=vae, image_size=256, device="cpu", cache_dir=os.path.join(root, "cache"))
    online = loader(dataset, encoder_for(dataset, "cpu", progress=False))
    out["first_epoch"] = _epochs(online, 1)
    out["completing_epoch"] = _epochs(online, 1)
    # Both read the same kind of shards through the same loader: interleaved rounds, so a change in
    # the machine's load hits both alike, and the median of each.
    rounds = [(_epochs(shards, args.epochs), _epochs(online, args.epochs)) for _ in range(5)]
    out["precomputed"] = float(np.median([p for p, _ in rounds]))
    out["cached"] = float(np.median([c for _, c in rounds]))
    return out


def main(argv=None) -> None:
    """Build the data, time each loader, print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=10000, help="latents (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per loader")
    parser.add_argument("--shard-size", type=int, default=4096)
    parser.add_argument("--extract-images", type=int, default=256, help="images for the extraction timing; 0 skips it")
    parser.add_argument("--online-images", type=int, default=1024,
                        help="images for the image-folder (online encoding) timing; 0 skips it")
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
        if args.online_images:
            stats = measure_online(root, args.online_images, args)
            print(f"# image folder: {stats['images']} synthetic 500x375 JPEGs, 256 px, tiny 8x VAE, batch "
                  f"{min(args.batch_size, stats['images'])}, {args.workers} workers, through the trainer's loader")
            name = "dit extract of the same images (same VAE, batch 32)"
            print(f"{name:<70} {stats['extract_images_per_s']:>10,.0f} images/s")
            for key, name in (("precomputed", "shards precomputed by dit extract (median of 5 rounds)"),
                              ("first_epoch", "image folder, first epoch (encodes into the cache)"),
                              ("completing_epoch", "image folder, second epoch (completes the cache, then reads)"),
                              ("cached", "image folder, later epochs (reads the cache; median of 5 rounds)")):
                print(f"{name:<70} {stats[key]:>10,.0f} latents/s")
            ratio = stats["cached"] / stats["precomputed"]
            print(f"{'cached / precomputed':<70} {ratio:>10.2f}x")
            numbers["online"] = {**stats, "cached_over_precomputed": ratio}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(numbers, f, indent=2)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
