"""The one writer of FID batches (`arr_0` uint8 N×H×W×3, `arr_1` labels: the ADM evaluator's format),
for `dit sample --npz` (one process) and `dit sample-ddp` (every rank of a torchrun launch).

The N samples are cut into chunks of `--batch-size`; chunk c has its own seed (from `--seed` and c)
and its own labels (a seeded permutation of the classes repeated, so every class appears N/K times).
Rank r of W samples chunks r, r + W, ...; each finished chunk is a file (in `NPZ.parts/`, removed once
the .npz is written), so an interrupted run (or one relaunched on another number of ranks, or by the
other command) samples only what is missing, and the result depends on neither.
"""

import json
import os
import shutil
import time
from collections import namedtuple
from pathlib import Path

import numpy as np

from dit_trainer.errors import ConfigError

CHUNK_FMT = "chunk-{:06d}.npz"

# (rank, world size, barrier, from_rank0): from_rank0(x) gives every rank rank 0's x.
Ranks = namedtuple("Ranks", "rank world barrier from_rank0")
ONE_PROCESS = Ranks(0, 1, lambda: None, lambda obj: obj)


def chunk_labels(num_samples: int, classes, seed: int) -> np.ndarray:
    """Labels covering `classes` (a count K for 0..K-1, or a list of class ids) uniformly: repeated, in a seeded order."""
    ids = np.arange(classes) if isinstance(classes, (int, np.integer)) else np.asarray(list(classes), dtype=np.int64)
    labels = ids[np.arange(num_samples) % len(ids)]
    return np.random.default_rng([int(seed), 1]).permutation(labels).astype(np.int64)


def chunk_seed(seed: int, chunk: int) -> int:
    """The sampling seed of chunk `chunk`: independent of the rank that samples it."""
    return int(np.random.default_rng([int(seed), 2, int(chunk)]).integers(0, 2**62))


def rank_chunks(num_samples: int, batch_size: int, rank: int = 0, world: int = 1) -> range:
    """The chunks rank `rank` of `world` samples."""
    return range((num_samples + batch_size - 1) // batch_size)[rank::world]


def _same_path(value):
    """A path flag as an absolute path when it names something here (./x, x and /abs/x are one), else as given."""
    return str(Path(value).expanduser().resolve()) if value and Path(value).expanduser().exists() else value


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


def _settings(args, reader, run, classes) -> dict:
    """What the samples depend on: the checkpoint folder it resolved to, and (beside the sampler) the flags
    that change them; image size and classes as the model got them (the flags matter for weights files only)."""
    settings = {"ckpt": str(reader.path), "ckpt_manifest": reader.manifest_digest(), "weights": args.weights,
                "model": run.cfg.model.name, "image_size": run.cfg.data.image_size, "num_classes": run.model.num_classes,
                "vae": _same_path(args.vae), "vae_dtype": args.vae_dtype,
                "objective": run.objective.name, "sampler": run.sampler,
                "steps": args.steps, "cfg_scale": args.cfg_scale, "cfg_channels": args.cfg_channels,
                "dtype": getattr(args, "dtype", "fp32"), "seed": args.seed, "num_samples": args.num_samples,
                "batch_size": args.batch_size,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in run.options.items()}}
    if classes is not None:  # only when chosen, so records of all classes read as before
        settings["classes"] = [int(c) for c in classes]
    return settings


def _open_parts(parts: Path, settings: dict, ckpt_arg, ranks) -> None:
    """Rank 0 checks the record of an unfinished run and writes this one's; every rank stops on a refusal."""
    refused = None
    if ranks.rank == 0:
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
                refused = check_resume(parts, old, settings, ckpt_arg)
        if refused is None:
            tmp = record.with_name(record.name + ".tmp")
            tmp.write_text(json.dumps(settings, indent=1))
            os.replace(tmp, record)
    # Decided once and told to every rank, so all of them stop with the same line instead of waiting on rank 0.
    refused = ranks.from_rank0(refused)
    if refused:
        raise ConfigError(refused)


def write_fid_batch(args, reader, run, compiled=False, ranks=ONE_PROCESS, classes=None) -> Path:
    """Sample this rank's missing chunks of `args.npz`, then (rank 0) assemble the .npz and a preview PNG.

    `reader` is the `checkpoint.open` reader of the model; `run` holds model, cfg, objective, sampler,
    options (the sampler's), decoder and device; `classes` limits the labels to those ids."""
    import torch
    from tqdm.auto import tqdm

    from dit_trainer.sample.decode import to_images
    from dit_trainer.sample.images import save_grid, save_npz, to_uint8
    from dit_trainer.sample.sampling import sample_latents

    out = Path(args.npz)
    parts = out.with_name(out.name + ".parts")
    settings = _settings(args, reader, run, classes)
    _open_parts(parts, settings, args.ckpt, ranks)

    labels = chunk_labels(args.num_samples, run.model.num_classes if classes is None else classes, args.seed)
    todo = [c for c in rank_chunks(args.num_samples, args.batch_size, ranks.rank, ranks.world)
            if not (parts / CHUNK_FMT.format(c)).is_file()]
    device = run.device
    amp = (torch.autocast(device.type, dtype=torch.bfloat16) if settings["dtype"] == "bf16"
           else torch.autocast(device.type, enabled=False))
    desc = "sample" if ranks.world == 1 else f"sample rank {ranks.rank}"
    bar = tqdm(todo, desc=desc, disable=args.no_progress or ranks.rank != 0, dynamic_ncols=True)
    done, t0 = 0, time.perf_counter()
    for c in bar:
        y = labels[c * args.batch_size:(c + 1) * args.batch_size]
        with amp:
            latents = sample_latents(run.model, run.objective, y, cfg_scale=args.cfg_scale, sampler=run.sampler,
                                     steps=args.steps, seed=chunk_seed(args.seed, c), device=device,
                                     cfg_channels=args.cfg_channels, compile=compiled, **run.options)
        images = to_uint8(to_images(latents.float(), *run.decoder))
        if images.shape[-1] == 1:
            images = np.repeat(images, 3, axis=-1)  # the FID network reads RGB
        _save_chunk(parts / CHUNK_FMT.format(c), images, y)
        done += len(y)
        bar.set_postfix(img_per_s=f"{done * ranks.world / (time.perf_counter() - t0):.2f}")
    ranks.barrier()
    if ranks.rank == 0:
        images, y_all = [], []
        for c in rank_chunks(args.num_samples, args.batch_size):
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
    ranks.barrier()
    return out
