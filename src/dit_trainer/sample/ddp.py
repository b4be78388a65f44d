"""`dit sample-ddp`: an FID batch (`samples.npz`, `arr_0` uint8 N×H×W×3, the ADM evaluator's
format) sampled by every rank of a torchrun launch, resumable chunk by chunk.

The N samples are cut into chunks of `--batch-size`; chunk c has its own seed (from `--seed` and c)
and its own labels (a seeded permutation of 0..K-1 repeated, so every class appears N/K times).
Rank r samples chunks r, r + W, ...; each finished chunk is a file (in `NPZ.parts/`, removed once
the .npz is written), so an interrupted run (or one relaunched on another number of ranks) samples
only what is missing, and the result does not depend on the number of ranks.
"""

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from dit_trainer.errors import ConfigError

# Registering the command must not import torch (`dit --help` stays fast): `run` imports it.

CHUNK_FMT = "chunk-{:06d}.npz"


def add_commands(subparsers) -> None:
    """Register `dit sample-ddp`."""
    from dit_trainer.sample.cli import add_sampling_arguments

    p = subparsers.add_parser(
        "sample-ddp",
        help="sample an FID batch on every rank of a torchrun launch (resumable .npz)",
        description="Sample N images for FID/IS with classifier-free guidance, split over the ranks of "
                    "`torchrun --nproc_per_node K -m dit_trainer sample-ddp ...` (or one process).",
    )
    p.add_argument("--ckpt", required=True, help="checkpoint dir, run dir, or DiT .pt/.safetensors (with --model)")
    p.add_argument("--npz", default="samples.npz", help="output .npz (default samples.npz)")
    p.add_argument("--num-samples", type=int, default=50000)
    p.add_argument("--batch-size", type=int, default=32, help="samples per chunk (one forward batch per rank)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="network precision while sampling")
    add_sampling_arguments(p)
    p.set_defaults(func=run)


def chunk_labels(num_samples: int, num_classes: int, seed: int) -> np.ndarray:
    """Labels covering the classes uniformly: 0..K-1 repeated, in a seeded order."""
    labels = np.arange(num_samples) % num_classes
    return np.random.default_rng([int(seed), 1]).permutation(labels).astype(np.int64)


def chunk_seed(seed: int, chunk: int) -> int:
    """The sampling seed of chunk `chunk`: independent of the rank that samples it."""
    return int(np.random.default_rng([int(seed), 2, int(chunk)]).integers(0, 2**62))


def _dist():
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), dist.barrier
    return 0, 1, lambda: None


def _save_chunk(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, images=images, labels=labels)
    os.replace(tmp, path)


def run(args) -> int:
    """Sample this rank's missing chunks, then (rank 0) assemble the .npz and a preview PNG."""
    import torch
    from tqdm.auto import tqdm

    from dit_trainer.devices import resolve_device
    from dit_trainer.host_memory import keep_freed_memory_on
    from dit_trainer.sample.cli import check_args, check_cfg_channels, sampler_options
    from dit_trainer.sample.decode import _no_vae_error, load_decoder, to_images
    from dit_trainer.sample.images import save_grid, save_npz, to_uint8
    from dit_trainer.sample.loading import load_model
    from dit_trainer.sample.sampling import as_objective, sample_latents

    check_args(args)
    rank, world, barrier = _dist()
    device = resolve_device(args.device, "--device")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    keep_freed_memory_on(device, args.keep_freed_memory == "true")
    model, cfg = load_model(args.ckpt, args.model, args.image_size, args.num_classes, prefer_ema=args.weights == "ema")
    check_cfg_channels(args, model)
    model.to(device)
    objective = as_objective(cfg, model)
    sampler = objective.check_sampler(args.sampler or objective.samplers[0])
    decoder = load_decoder(cfg, args.vae, device, args.vae_dtype)
    if decoder[0] is None and model.in_channels not in (1, 3):
        raise _no_vae_error(model.in_channels)
    options = sampler_options(args, sampler)
    out = Path(args.npz)
    parts = out.with_name(out.name + ".parts")
    settings = {"ckpt": str(args.ckpt), "model": cfg.model.name, "objective": objective.name, "sampler": sampler,
                "steps": args.steps, "cfg_scale": args.cfg_scale, "cfg_channels": args.cfg_channels,
                "dtype": args.dtype, "seed": args.seed, "num_samples": args.num_samples,
                "batch_size": args.batch_size, **{k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}}
    if rank == 0:
        parts.mkdir(parents=True, exist_ok=True)
        record = parts / "settings.json"
        if record.is_file():
            old = json.loads(record.read_text())
            differ = [f"{k} {old.get(k)!r} then, {settings.get(k)!r} now" for k in {**old, **settings}
                      if old.get(k) != settings.get(k)]
            if differ:
                raise ConfigError(f"{parts} holds chunks of an unfinished run with other settings "
                                  f"({'; '.join(differ)}); rerun with those settings to finish it, delete {parts}, "
                                  f"or pass another --npz")
        record.write_text(json.dumps(settings, indent=1))
    barrier()

    labels = chunk_labels(args.num_samples, model.num_classes, args.seed)
    chunks = range((args.num_samples + args.batch_size - 1) // args.batch_size)
    todo = [c for c in chunks[rank::world] if not (parts / CHUNK_FMT.format(c)).is_file()]
    from dit_trainer.sample.compile import resolve_sample_compile

    # Decided on this rank's whole share, not what is left of it, so a resumed run decides alike.
    compiled = resolve_sample_compile(args.compile, model, len(chunks[rank::world]), args.steps, device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if args.dtype == "bf16" else torch.autocast(device.type, enabled=False)
    bar = tqdm(todo, desc=f"sample rank {rank}", disable=args.no_progress or rank != 0, dynamic_ncols=True)
    done, t0 = 0, time.perf_counter()
    for c in bar:
        y = labels[c * args.batch_size:(c + 1) * args.batch_size]
        with amp:
            latents = sample_latents(model, objective, y, cfg_scale=args.cfg_scale, sampler=sampler, steps=args.steps,
                                     seed=chunk_seed(args.seed, c), device=device, cfg_channels=args.cfg_channels,
                                     compile=compiled, **options)
        images = to_uint8(to_images(latents.float(), *decoder))
        if images.shape[-1] == 1:
            images = np.repeat(images, 3, axis=-1)  # the FID network reads RGB
        _save_chunk(parts / CHUNK_FMT.format(c), images, y)
        done += len(y)
        bar.set_postfix(img_per_s=f"{done * world / (time.perf_counter() - t0):.2f}")
    barrier()
    if rank == 0:
        images, y_all = [], []
        for c in chunks:
            with np.load(parts / CHUNK_FMT.format(c)) as f:
                images.append(f["images"])
                y_all.append(f["labels"])
        arr = np.concatenate(images)
        save_npz(out, arr, np.concatenate(y_all), settings=settings)
        save_grid(np.ascontiguousarray(arr[:64].transpose(0, 3, 1, 2)).astype(np.float32) / 127.5 - 1,
                  out.with_suffix(".png"), nrow=8)
        # The chunks only serve resuming an interrupted run; the .npz now holds them all.
        shutil.rmtree(parts)
        print(f"wrote {len(arr)} samples to {out} (preview {out.with_suffix('.png')})")
    barrier()
    return 0
