"""The one writer of FID batches (`arr_0` uint8 N×H×W×3, `arr_1` labels: the ADM evaluator's format),
for `dit sample --npz` (one process) and `dit sample-ddp` (every rank of a torchrun launch).

The N samples are cut into chunks of `--batch-size`; chunk c has its own seed (from `--seed` and c)
and its own labels (a seeded permutation of the classes repeated, so every class appears N/K times;
for a text-to-image model the labels index its prompts, `--prompts FILE`'s lines, covered alike).
Rank r of W samples chunks r, r + W, ...; each finished chunk is a file (in `NPZ.parts/`, removed once
the .npz is written), so an interrupted run (or one relaunched on another number of ranks, or by the
other command) samples only what is missing, and the result depends on neither.

It replaces nothing it did not write: an existing .npz (or preview .png) that is not its own finished
work of the same settings is refused in one line unless `overwrite`; its own finished work of the same
settings is reported as done. More samples are not appended to a finished batch, since every chunk's
labels depend on the number of samples: that is a refusal too. One writer per .npz: a second one at
once is refused (an advisory lock in `NPZ.parts/`).
"""

import errno
import json
import os
import shutil
import time
from collections import namedtuple
from pathlib import Path
import numpy as np

from dit_trainer.errors import ConfigError
from dit_trainer.sample.settings import SampleSettings

CHUNK_FMT = "chunk-{:06d}.npz"
LOCK_NAME = ".writer.lock"


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


def differences(old: dict, settings: dict) -> list:
    """"key OLD then, NEW now" for each setting that differs (settings compared as JSON holds them)."""
    new = json.loads(json.dumps(settings))
    return [f"{k} {old.get(k)!r} then, {new.get(k)!r} now" for k in {**old, **new} if old.get(k) != new.get(k)]


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
    differ = differences(old, settings)
    if differ:
        return (f"{parts} holds chunks of an unfinished run with other settings ({'; '.join(differ)}); rerun with "
                f"those settings to finish it, delete {parts}, or pass another --npz")
    return None


def _save_chunk(path: Path, images: np.ndarray, labels: np.ndarray, nfe: float) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, images=images, labels=labels, nfe=np.float64(nfe))
    os.replace(tmp, path)


def _settings(job: SampleSettings, reader, run, classes) -> dict:
    """What the samples depend on: the checkpoint folder it resolved to, and (beside the sampler) the settings
    that change them; image size and classes as the model got them (the flags matter for weights files only)."""
    settings = {"ckpt": str(reader.path), "ckpt_manifest": reader.manifest_digest(), "weights": job.weights,
                "model": run.cfg.model.name, "image_size": run.cfg.data.image_size, "num_classes": run.model.num_classes,
                "vae": _same_path(job.vae), "vae_dtype": job.vae_dtype,
                "objective": run.objective.name, "sampler": run.sampler,
                "steps": job.steps, "cfg_scale": job.cfg_scale, "cfg_channels": job.cfg_channels,
                **_guidance_settings(job, run),
                "dtype": job.dtype, "seed": job.seed, "num_samples": job.num_samples,
                "batch_size": job.batch_size,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in run.options.items()}}
    if classes is not None:  # only when chosen, so records of all classes read as before
        settings["classes"] = [int(c) for c in classes]
    return {**settings, **_prompt_settings(job, run)}


def _prompt_settings(job: SampleSettings, run) -> dict:
    """A text model's prompts (their count and digest: a prompt set can be COCO's 30k), negative prompt and
    text encoder, recorded only for text models (class batches read as before)."""
    prompts = getattr(run, "prompts", None)
    if prompts is None:
        return {}
    import hashlib

    digest = hashlib.sha256(json.dumps(list(prompts), ensure_ascii=False).encode()).hexdigest()[:16]
    encoder = run.encoder
    return {"num_prompts": len(prompts), "prompts_sha256": digest, "negative_prompt": job.negative_prompt or "",
            "text_encoder": _same_path(encoder.name), "text_max_length": encoder.max_length,
            "text_dtype": str(encoder.dtype).replace("torch.", "")}


def _guidance_settings(job: SampleSettings, run) -> dict:
    """Autoguidance and the guidance interval, recorded only where used (older records read as before)."""
    out = {}
    guide_reader = getattr(run, "guide_reader", None)
    if guide_reader is not None:
        out.update(guide=str(guide_reader.path), guide_manifest=guide_reader.manifest_digest(),
                   guide_scale=job.guide_scale)
    if job.guidance_interval is not None:
        out["guidance_interval"] = [float(v) for v in job.guidance_interval]
    return out


def recorded_settings(path: Path):
    """The settings an .npz of this writer records, or None for any other file (never unpickled)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if "settings" not in f.files or "arr_0" not in f.files:
                return None
            old = json.loads(str(f["settings"]))
    except (OSError, ValueError, UnicodeDecodeError, EOFError):
        return None
    return old if isinstance(old, dict) else None


def check_target(out: Path, settings: dict, overwrite: bool):
    """("done", line) when `out` is this writer's finished batch of `settings`; ("refuse", line) when `out` or its
    preview is something else and `overwrite` is off; (None, None) to go on."""
    preview = out.with_suffix(".png")
    old = recorded_settings(out) if out.exists() else None
    if old is not None and not differences(old, settings):
        return "done", (f"{out} already holds the {settings['num_samples']} samples of these settings; nothing to do "
                        f"(pass --overwrite to sample them again)")
    if overwrite:
        return None, None
    if old is not None:
        more = (" (more samples are not appended: every chunk's labels depend on --num-samples)"
                if old.get("num_samples") != settings["num_samples"] else "")
        return "refuse", (f"--npz {out} holds a finished batch of other settings ({'; '.join(differences(old, settings))})"
                          f"{more}; pass --overwrite to replace it, or another --npz")
    if out.exists() or out.is_symlink():
        return "refuse", (f"--npz {out} already exists and is not a batch this command wrote; pass --overwrite to "
                          f"replace it, or another --npz")
    if preview.exists() or preview.is_symlink():
        return "refuse", (f"{preview} (where the --npz preview goes) already exists; pass --overwrite to replace it, "
                          f"or another --npz")
    return None, None


def _lock(parts: Path, out: Path):
    """An open file descriptor holding the advisory lock of `parts`; a ConfigError naming `out` when another holds it."""
    import fcntl

    fd = os.open(parts / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(f"--npz {out} is being written by another dit sample or sample-ddp right now; wait for "
                              f"it to finish (then rerun to see it done) or pass another --npz") from None
        return None  # a file system without flock: go on unlocked, as before
    return fd


def _unlock(fd) -> None:
    if fd is not None:
        os.close(fd)  # closing drops the flock


def _open_parts(parts: Path, out: Path, settings: dict, job: SampleSettings, ranks):
    """Rank 0 checks the target and the record of an unfinished run, takes the writer's lock and writes this
    run's record; every rank gets the same outcome: "done", a refusal (raised), or the lock (rank 0) to go on."""
    state, line, fd = None, None, None
    if ranks.rank == 0:
        state, line = check_target(out, settings, job.overwrite)
        if state is None:
            try:
                parts.mkdir(parents=True, exist_ok=True)
                fd = _lock(parts, out)
                state, line = _check_record(parts, settings, job.ckpt)
            except ConfigError as err:
                state, line = "refuse", str(err)
            if state == "refuse":
                _unlock(fd)
    # Decided once and told to every rank, so all of them stop with the same line instead of waiting on rank 0.
    state, line = ranks.from_rank0((state, line))
    if state == "refuse":
        raise ConfigError(line)
    if state == "done" and ranks.rank == 0:
        print(line)
    return state, fd


def _check_record(parts: Path, settings: dict, ckpt_arg):
    """("refuse", line) when `parts` holds chunks that cannot be continued; else records `settings` there."""
    record = parts / "settings.json"
    if record.is_file():
        try:
            old = json.loads(record.read_text())
            if not isinstance(old, dict):
                raise ValueError
        except (ValueError, UnicodeDecodeError):
            return "refuse", f"{record} is damaged; delete {parts} (its chunks cannot be checked) or pass another --npz"
        refused = check_resume(parts, old, settings, ckpt_arg)
        if refused:
            return "refuse", refused
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps(settings, indent=1))
    os.replace(tmp, record)
    return None, None


def write_fid_batch(job: SampleSettings, reader, run, compiled=False, ranks=ONE_PROCESS, classes=None) -> Path:
    """Sample this rank's missing chunks of `job.npz`, then (rank 0) assemble the .npz and a preview PNG.

    `reader` is the `checkpoint.open` reader of the model; `run` holds model, cfg, objective, sampler,
    options (the sampler's), decoder and device; `classes` limits the labels to those ids."""
    out = Path(job.npz)
    parts = out.with_name(out.name + ".parts")
    settings = _settings(job, reader, run, classes)
    state, fd = _open_parts(parts, out, settings, job, ranks)
    if state == "done":
        return out
    try:
        _sample_chunks(job, run, parts, settings, compiled, ranks, classes)
        ranks.barrier()
        if ranks.rank == 0:
            _assemble(job, parts, out, settings)
    finally:
        _unlock(fd)
    ranks.barrier()
    return out


def _sample_chunks(job: SampleSettings, run, parts: Path, settings: dict, compiled, ranks, classes) -> None:
    """Sample and save this rank's chunks that are not on disk yet."""
    import torch
    from dit_trainer.progress import progress_bar

    from dit_trainer.sample.decode import to_images
    from dit_trainer.sample.images import adm_images

    # A text model's labels index its prompts: each prompt covered as evenly as a class.
    prompts = getattr(run, "prompts", None)
    count = len(prompts) if prompts is not None else run.model.num_classes
    labels = chunk_labels(job.num_samples, count if classes is None else classes, job.seed)
    todo = [c for c in rank_chunks(job.num_samples, job.batch_size, ranks.rank, ranks.world)
            if not (parts / CHUNK_FMT.format(c)).is_file()]
    device = run.device
    amp = (torch.autocast(device.type, dtype=torch.bfloat16) if settings["dtype"] == "bf16"
           else torch.autocast(device.type, enabled=False))
    desc = "sample" if ranks.world == 1 else f"sample rank {ranks.rank}"
    bar = progress_bar(todo, desc=desc, disable=not job.progress or ranks.rank != 0, dynamic_ncols=True)
    done, t0 = 0, time.perf_counter()
    for c in bar:
        y = labels[c * job.batch_size:(c + 1) * job.batch_size]
        counter = {}
        with amp:
            rows = y if prompts is None else [prompts[i] for i in y]
            latents = run.sample(rows, chunk_seed(job.seed, c), compiled, counter=counter)
        images = adm_images(to_images(latents.float(), *run.decoder))
        _save_chunk(parts / CHUNK_FMT.format(c), images, y, counter.get("nfe", 0))
        done += len(y)
        bar.set_postfix(img_per_s=f"{done * ranks.world / (time.perf_counter() - t0):.2f}")


def _assemble(job: SampleSettings, parts: Path, out: Path, settings: dict) -> None:
    """Join the chunks into the .npz and its preview, then drop the chunks."""
    from dit_trainer.sample.images import from_adm_images, save_grid, save_npz

    images, y_all, nfe = [], [], []
    for c in rank_chunks(job.num_samples, job.batch_size):
        with np.load(parts / CHUNK_FMT.format(c)) as f:
            images.append(f["images"])
            y_all.append(f["labels"])
            if "nfe" in f.files:  # chunks of an older version count none
                nfe.append(float(f["nfe"]) * len(f["labels"]))
    arr = np.concatenate(images)
    # Network evaluations per sample (cond, null-label and guide passes each count one): what sampling cost.
    extra = {"nfe": np.float64(sum(nfe) / len(arr))} if len(nfe) == len(images) else None
    save_npz(out, arr, np.concatenate(y_all), settings=settings, extra=extra)
    save_grid(from_adm_images(arr[:64]), out.with_suffix(".png"), nrow=8)
    # The chunks only serve resuming an interrupted run; the .npz now holds them all.
    shutil.rmtree(parts)
    print(f"wrote {len(arr)} samples to {out} (preview {out.with_suffix('.png')})")
