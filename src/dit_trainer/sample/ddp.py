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
    add_sampling_arguments(p, cfg_scale=1.5)
    p.set_defaults(func=run)


def chunk_labels(num_samples: int, num_classes: int, seed: int) -> np.ndarray:
    """Labels covering the classes uniformly: 0..K-1 repeated, in a seeded order."""
    labels = np.arange(num_samples) % num_classes
    return np.random.default_rng([int(seed), 1]).permutation(labels).astype(np.int64)


def chunk_seed(seed: int, chunk: int) -> int:
    """The sampling seed of chunk `chunk`: independent of the rank that samples it."""
    return int(np.random.default_rng([int(seed), 2, int(chunk)]).integers(0, 2**62))


def _dist():
    """(rank, world size, barrier, from_rank0): from_rank0(x) gives every rank rank 0's x."""
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if dist.is_initialized():
        def from_rank0(obj):
            box = [obj]
            dist.broadcast_object_list(box, src=0)
            return box[0]

        return dist.get_rank(), dist.get_world_size(), dist.barrier, from_rank0
    return 0, 1, lambda: None, lambda obj: obj


def _same_path(value):
    """A path flag as an absolute path when it names something here (./x, x and /abs/x are one), else as given."""
    return str(Path(value).expanduser().resolve()) if value and Path(value).expanduser().exists() else value


def _resolved(ckpt) -> str:
    """The checkpoint `--ckpt` names, absolute; as given when there is none (opening it then says why on every rank)."""
    from dit_trainer import checkpoint
    from dit_trainer.errors import CheckpointError

    try:
        return str(checkpoint.open(ckpt).path)
    except CheckpointError:
        return ckpt


# Recorded since chunks name the checkpoint they came from; older records lack them and cannot be checked.
_RESUME_KEYS = ("weights", "ckpt_manifest", "vae", "vae_dtype", "image_size", "num_classes")


def check_resume(parts: Path, old: dict, settings: dict, ckpt_arg):
    """Why the chunks in `parts` (recorded as `old`) cannot be continued with `settings`, in one line, or None."""
    if any(k not in old for k in _RESUME_KEYS):
        return (f"{parts} holds chunks of an unfinished run by an older dit-trainer, which did not record the checkpoint "
                f"folder it resolved {old.get('ckpt')!r} to; delete {parts} (its chunks cannot be checked) or pass "
                f"another --npz")
    if old.get("ckpt") != settings["ckpt"]:
        return (f"{parts} holds chunks sampled from {old.get('ckpt')}, but --ckpt {ckpt_arg} is now {settings['ckpt']} "
                f"(a newer checkpoint?); pass --ckpt {old.get('ckpt')} to finish that run, delete {parts}, or pass "
                f"another --npz")
    if old.get("ckpt_manifest") != settings["ckpt_manifest"]:
        # Same folder name, other files: a run restarted into the same output_dir wrote this step again.
        return (f"{parts} holds chunks sampled from {settings['ckpt']} before it was rewritten (its manifest.json "
                f"differs); delete {parts} or pass another --npz")
    differ = [f"{k} {old.get(k)!r} then, {settings.get(k)!r} now" for k in {**old, **settings}
              if old.get(k) != settings.get(k)]
    if differ:
        return (f"{parts} holds chunks of an unfinished run with other settings ({'; '.join(differ)}); rerun with "
                f"those settings to finish it, delete {parts}, or pass another --npz")
    return None


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
    from dit_trainer import checkpoint
    from dit_trainer.sample.cli import (check_args, check_cfg_channels, load_sampling_model, note_adaptive_steps,
                                        sampler_options)
    from dit_trainer.sample.decode import _no_vae_error, load_decoder, to_images
    from dit_trainer.sample.images import save_grid, save_npz, to_uint8
    from dit_trainer.sample.sampling import as_objective, sample_latents

    check_args(args)
    rank, world, barrier, from_rank0 = _dist()
    device = resolve_device(args.device, "--device")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    keep_freed_memory_on(device, args.keep_freed_memory == "true")
    # One checkpoint for every rank, even when the run saves a newer one while the ranks start.
    reader = checkpoint.open(from_rank0(_resolved(args.ckpt) if rank == 0 else None), flag="--ckpt")
    ckpt = str(reader.path)
    model, cfg = load_sampling_model(args, reader)
    check_cfg_channels(args, model)
    model.to(device)
    objective = as_objective(cfg, model)
    sampler = objective.check_sampler(args.sampler or objective.samplers[0])
    decoder = load_decoder(cfg, args.vae, device, args.vae_dtype)
    if decoder[0] is None and model.in_channels not in (1, 3):
        raise _no_vae_error(model.in_channels)
    options = sampler_options(args, objective, sampler)
    if rank == 0:
        note_adaptive_steps(args, sampler, cfg)
    out = Path(args.npz)
    parts = out.with_name(out.name + ".parts")
    # What the samples depend on: the checkpoint folder it resolved to, and (beside the sampler) the flags that
    # change them; image size and classes as the model got them (the flags matter for weights files only).
    settings = {"ckpt": ckpt, "ckpt_manifest": reader.manifest_digest(), "weights": args.weights,
                "model": cfg.model.name, "image_size": cfg.data.image_size, "num_classes": model.num_classes,
                "vae": _same_path(args.vae), "vae_dtype": args.vae_dtype,
                "objective": objective.name, "sampler": sampler,
                "steps": args.steps, "cfg_scale": args.cfg_scale, "cfg_channels": args.cfg_channels,
                "dtype": args.dtype, "seed": args.seed, "num_samples": args.num_samples,
                "batch_size": args.batch_size, **{k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}}
    refused = None
    if rank == 0:
        parts.mkdir(parents=True, exist_ok=True)
        record = parts / "settings.json"
        if record.is_file():
            try:
                old = json.loads(record.read_text())
                if not isinstance(old, dict):
                    raise ValueError
            except (ValueError, UnicodeDecodeError):
                old = None
                refused = f"{record} is damaged; delete {parts} (its chunks cannot be checked) or pass another --npz"
            if old is not None:
                refused = check_resume(parts, old, settings, args.ckpt)
        if refused is None:
            tmp = record.with_name(record.name + ".tmp")
            tmp.write_text(json.dumps(settings, indent=1))
            os.replace(tmp, record)
    # Decided once and told to every rank, so all of them stop with the same line instead of waiting on rank 0.
    refused = from_rank0(refused)
    if refused:
        raise ConfigError(refused)

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
