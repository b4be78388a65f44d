"""`dit extract`: encode an image folder once with a frozen VAE into packed latent shards.

Shard i always holds images [i·S, (i+1)·S) of the sorted listing, whatever the number of ranks, so
shard names cannot collide across ranks, a resumed or re-partitioned run rebuilds exactly the same
shards, and the union of a multi-rank run equals a one-process run. Batches never straddle a shard,
so each shard is encoded from the same batches every time.
"""

import datetime
import glob
import hashlib
import json
import math
import os
import sys
import time
from typing import Dict, List, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader

from dit_trainer.data import checksums
from dit_trainer.data import shards as sh
from dit_trainer.data.encode import encode_rows
from dit_trainer.data.images import ImageFiles, list_image_folder
from dit_trainer.vae import latent_stats
from dit_trainer.vae.autoencoder import has_posterior, latent_shape, load_vae, resolve_dtype, scaling
from dit_trainer.data.extract_text import CaptionPart
from dit_trainer.data.shard_images import ImageSidecar
from dit_trainer.data.shard_text import NULL_FILE
from dit_trainer.errors import DataError
from dit_trainer.npy import open_memmap
from dit_trainer.progress import progress_bar
from dit_trainer.fs import disk_error, refuse_existing, write_error_text

# What a failed write raises: OSError, or a RuntimeError where a library words a full disk its own way.
WRITE_ERRORS = (OSError, RuntimeError)

PLAN = "extract.json"
SKIPPED = "skipped.txt"


class _Dist:
    """Rank, world size and barrier; torch.distributed (gloo) only when launched with torchrun."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.owned = False
        if self.world > 1 and not torch.distributed.is_initialized():
            # Gloo suffices for barriers and works on CPU-only hosts; ranks that finish early wait
            # at the final barrier, hence the long timeout.
            from dit_trainer.parallel.process_group import init_process_group

            init_process_group("gloo", timeout=datetime.timedelta(hours=12))
            self.owned = True

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def close(self) -> None:
        if self.owned:
            torch.distributed.destroy_process_group()


def _collate(items):
    indices = [i for i, arr, _ in items if arr is not None]
    images = np.stack([arr for _, arr, _ in items if arr is not None]) if indices else None
    errors = [(i, err) for i, arr, err in items if arr is None]
    return indices, images, errors


def _batches(shard_ids: List[int], shard_size: int, total: int, batch_size: int):
    for s in shard_ids:
        stop = min((s + 1) * shard_size, total)
        for start in range(s * shard_size, stop, batch_size):
            yield list(range(start, min(start + batch_size, stop)))


def _own(out) -> bool:
    """Whether `out` is an extract's folder (its plan is there): resumed or refused by the plan, never
    written over as a stranger's."""
    return os.path.isfile(os.path.join(out, PLAN))


def _discard(out: str) -> None:
    """Remove an earlier extract's files from `out` (--overwrite over other settings); other files stay."""
    names = [PLAN, SKIPPED, sh.MANIFEST, NULL_FILE]
    for path in glob.glob(os.path.join(glob.escape(out), "shard-*")) + [os.path.join(out, n) for n in names]:
        if os.path.isfile(path):
            os.remove(path)


def _check_plan(out: str, plan: Dict, rank: int, overwrite: bool = False) -> None:
    path = os.path.join(out, PLAN)
    if os.path.isfile(path) and overwrite and rank == 0:
        try:
            with open(path, encoding="utf-8") as f:
                same = all(json.load(f).get(k) == v for k, v in plan.items())
        except (OSError, ValueError, AttributeError):
            same = False
        if not same:
            print(f"dit extract: --overwrite: replacing the extract in {out}, made with other settings",
                  file=sys.stderr)
            _discard(out)
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, json.JSONDecodeError) as err:
            raise DataError(f"cannot read {path} ({err}); delete it (and the shards beside it) to start over") from None
        for key, value in plan.items():
            if old.get(key) != value:
                raise DataError(
                    f"{path}: {out} was extracted with {key}={old.get(key)!r}, this run has {value!r}; "
                    f"pass another --out, or --overwrite to replace that extract"
                )
    elif rank == 0:
        sh._atomic_json(path, plan)


def _device(name) -> torch.device:
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DataError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DataError(f"--device {name} but this machine has no usable CUDA device; use cpu or leave --device out")
    if device.type == "cuda" and device.index is None:
        # One GPU per rank: a bare "cuda" would put every rank on GPU 0.
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def _files_digest(paths: List[str], labels: np.ndarray, root: str) -> str:
    digest = hashlib.sha256()
    for path, label in zip(paths, labels.tolist()):
        digest.update(f"{os.path.relpath(path, root)}\t{label}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def run_extract(data_path, vae, image_size: int, out, batch_size: int = 32, shard_size: int = 2048,
                vae_dtype: str = "fp32", dtype: str = "float16", flips: bool = True, posterior: str = "mean_std",
                workers: int = 4, device=None, on_bad_image: str = "skip", seed: int = 0,
                progress: bool = True, overwrite: bool = False, keep_images: bool = False, text_encoder=None,
                text_max_length: int = 0, text_dtype: str = "auto", empty_captions: str = "error") -> Dict:
    """Encode `data_path` into shards under `out`; returns this rank's counts and images/s. An `out`
    holding files of no extract, or an extract of other settings, is refused unless `overwrite`.
    `keep_images`: each shard also keeps the uint8 crops it encoded (for REPA's encoder).
    `text_encoder`: `data_path` is captioned images (`data.captions`) and each shard also keeps the
    text encoder's outputs for its captions (`shard_text`); `text_max_length` 0 is the encoder's default."""
    if posterior not in sh.POSTERIOR_KINDS:
        raise DataError(f"posterior {posterior!r} is not one of {sh.POSTERIOR_KINDS}")
    if on_bad_image not in ("skip", "stop"):
        raise DataError(f"on_bad_image {on_bad_image!r} must be 'skip' or 'stop'")
    if image_size < 8 or batch_size < 1 or shard_size < 1:
        raise DataError("--image-size must be >= 8, --batch-size and --shard-size >= 1")
    if not overwrite:
        refuse_existing(out, "--out", DataError, own=_own)
    dist = _Dist()
    try:
        return _extract(dist, os.fspath(data_path), os.fspath(vae), int(image_size), os.fspath(out),
                        batch_size, shard_size, vae_dtype, dtype, flips, posterior, workers, device,
                        on_bad_image, seed, progress, overwrite, keep_images,
                        (text_encoder, text_max_length, text_dtype, empty_captions) if text_encoder else None)
    except WRITE_ERRORS as err:
        if not disk_error(err):
            raise
        # This process's half-written arrays and markers (`*.tmpPID`) go; finished shards stay for the rerun.
        for leftover in glob.glob(os.path.join(glob.escape(os.fspath(out)), f"*.tmp{os.getpid()}")):
            os.remove(leftover)
        raise DataError(f"{write_error_text(out, err, exact=True)}; finished shards are kept: free space, "
                        "then rerun the same command to go on") from None
    finally:
        dist.close()


def _extract(dist, data_path, vae_name, image_size, out, batch_size, shard_size, vae_dtype, dtype, flips,
             posterior, workers, device, on_bad_image, seed, progress, overwrite=False, keep_images=False, text=None):
    if os.path.isdir(os.path.expanduser(vae_name)):
        # Recorded in the manifest for `dit sample`, which may run from another directory.
        vae_name = os.path.abspath(os.path.expanduser(vae_name))
    torch_dtype = resolve_dtype(vae_dtype)
    # The VAE loads before anything is written: a wrong --vae must not record a plan that then
    # refuses the corrected command.
    device = _device(device)
    captions = CaptionPart(data_path, *text, device, dtype, dist.rank) if text else None
    if captions is None:
        paths, labels, class_names = list_image_folder(data_path)
        files, where = ImageFiles(paths, image_size), lambda i: os.path.relpath(paths[i], data_path)
        listing = {"files_sha256": _files_digest(paths, labels, data_path), "num_images": len(paths)}
    else:
        paths, class_names, files, where, listing = captions.listing.images, None, captions.files(image_size), \
            captions.where, captions.plan()
        labels = np.zeros(len(paths), dtype=np.int64)  # one class: the caption is the condition
    model = load_vae(vae_name, torch_dtype, device)
    if not has_posterior(model) and posterior != "sample":
        # A deterministic encoder's std is 0: one stored latent per image says it all, in half the bytes.
        posterior = "sample"
        if dist.rank == 0:
            print(f"dit extract: {type(model).__name__} encodes without a posterior; storing its latents "
                  "(posterior sample)", file=sys.stderr)
    os.makedirs(out, exist_ok=True)
    plan = {
        "data_path": data_path if "://" in data_path else os.path.abspath(data_path), **listing, "vae": vae_name, "vae_dtype": str(torch_dtype).replace("torch.", ""),
        "image_size": image_size, "shard_size": shard_size, "flips": bool(flips), "posterior": posterior,
        "dtype": dtype, "seed": int(seed) if posterior == "sample" else None,
        **({"images": True} if keep_images else {}),
    }
    if dist.rank == 0:
        _check_plan(out, plan, 0, overwrite)
    dist.barrier()
    if dist.rank != 0:
        _check_plan(out, plan, dist.rank)

    sf, shift = scaling(model)
    shape = latent_shape(model, image_size)
    num_shards = math.ceil(len(paths) / shard_size)
    names = [sh.shard_name(i, num_shards) for i in range(num_shards)]
    pending = [i for i in range(num_shards) if not sh.shard_done(out, names[i])]
    # Everyone must list pending shards before anyone writes, or ranks would split different lists.
    dist.barrier()
    mine = pending[dist.rank * len(pending) // dist.world:(dist.rank + 1) * len(pending) // dist.world]
    todo = sum(min((s + 1) * shard_size, len(paths)) - s * shard_size for s in mine)

    loader = DataLoader(
        files, batch_sampler=list(_batches(mine, shard_size, len(paths), batch_size)),
        num_workers=workers, collate_fn=_collate, pin_memory=device.type == "cuda",
        persistent_workers=False, prefetch_factor=4 if workers > 0 else None,
    )
    bar = progress_bar(total=todo, unit="img", desc=f"extract rank {dist.rank}/{dist.world}" if dist.world > 1 else "extract",
                       disable=not progress or dist.rank != 0, mininterval=1.0, file=sys.stderr)
    num_flips = 2 if flips else 1
    entry = (num_flips, 2 if posterior == "mean_std" else 1, *shape)
    writer: Optional[sh.ShardWriter] = None
    kept: Optional[ImageSidecar] = None
    text_writer = None
    skipped: List = []
    encoded = 0
    start = time.perf_counter()
    for indices, images, errors in loader:
        seen = len(indices) + len(errors)
        shard = ((indices or [e[0] for e in errors])[0]) // shard_size
        if writer is None or writer.name != names[shard]:
            if writer is not None:
                _close(writer, skipped, dist.rank, kept, text_writer)
            capacity = min((shard + 1) * shard_size, len(paths)) - shard * shard_size
            writer, skipped = sh.ShardWriter(out, names[shard], capacity, entry, dtype), []
            kept = ImageSidecar(out, names[shard], capacity, image_size) if keep_images else None
            text_writer = captions.sidecar(out, names[shard], capacity) if captions else None
        if images is not None:
            latents, bad = encode_rows(model, images, indices, num_flips, posterior, seed, sf, shift, batch_size)
            errors = errors + [(indices[j], "VAE output is NaN or inf (try --vae-dtype fp32)") for j in bad]
            keep = [j for j in range(len(indices)) if j not in bad]
            writer.add(latents[keep], labels[[indices[j] for j in keep]])
            if kept is not None:
                kept.add(images[keep])
            if captions is not None:
                captions.add(text_writer, [indices[j] for j in keep])
            encoded += len(keep)
        for index, err in sorted(errors):
            if on_bad_image == "stop":
                named = captions.where(index) if captions else paths[index]
                raise DataError(f"{named}: {err}; fix or remove it, or pass --on-bad-image skip")
            skipped.append([where(index), err])
        bar.update(seen)
    if writer is not None:
        _close(writer, skipped, dist.rank, kept, text_writer)
    bar.close()
    seconds = time.perf_counter() - start
    dist.barrier()
    if dist.rank == 0:
        finish_shards(out, names, class_names, vae_name, sf, shift, image_size, flips, posterior, dtype, shape, data_path,
                      latent_norm=latent_stats.auto_norm(model),
                      images=[image_size, image_size, 3] if keep_images else None,
                      text=captions.finish(out) if captions else None)
    dist.barrier()
    return {"rank": dist.rank, "shards": len(mine), "images": encoded, "seconds": seconds,
            "images_per_s": encoded / seconds if seconds > 0 else 0.0}


def _close(writer, skipped, rank, kept=None, text_writer=None) -> None:
    """Write a shard, its marker carrying the per-channel sums of exactly the values stored (and the
    checksums of the images kept beside them, with `kept`, and of its text files, with `text_writer`)."""
    sums = latent_stats.channel_sums(writer.data[:writer.count])
    writer.close(skipped=skipped, rank=rank, latent_sums=sums, **(kept.close() if kept else {}),
                 **(text_writer.close() if text_writer else {}))


def _shard_sums(out, marker) -> dict:
    """A shard's per-channel sums: its marker's, else (a shard written before they were kept) from its file."""
    if "latent_sums" in marker or not marker["count"]:
        return marker.get("latent_sums") or {"n": 0}
    return latent_stats.channel_sums(open_memmap(os.path.join(out, f"{marker['name']}.npy")))


def finish_shards(out, names, class_names, vae_name, sf, shift, image_size, flips, posterior, dtype, shape, data_path,
                  latent_norm=None, images=None, text=None):
    """Once every shard in `names` is written: drop leftovers, list skipped images, write the manifest
    (with the latents' per-channel statistics and how training uses them when `latent_norm` is given,
    with `images`, the H×W×3 shape of the images kept beside the latents, and with `text`, the record of
    the text encoder's outputs beside them, `shard_text`)."""
    markers = []
    for name in names:
        if not sh.shard_done(out, name):
            raise DataError(f"{out}/{name} was not written; re-run `dit extract` with the same arguments to finish it")
        markers.append(sh.read_shard_marker(out, name))
    # Every rank is past its last write, so leftovers of interrupted runs can go, and so can the
    # zero-row files that earlier versions wrote for shards whose every image was skipped.
    empty = [f"{m['name']}{suffix}" for m in markers if not m["count"] for suffix in (".npy", ".labels.npy")]
    for leftover in glob.glob(os.path.join(out, "shard-*.tmp*")) + [os.path.join(out, name) for name in empty]:
        if os.path.exists(leftover):
            os.remove(leftover)
    skipped = [row for m in markers for row in m.get("skipped", [])]
    with open(os.path.join(out, SKIPPED), "w", encoding="utf-8") as f:
        f.writelines(f"{path}\t{err}\n" for path, err in skipped)
    stats = {}
    if latent_norm is not None:
        merged = latent_stats.merge(_shard_sums(out, m) for m in markers)
        if merged is not None:
            stats = {"latent_norm": latent_norm, "latent_mean": merged[0], "latent_std": merged[1]}
    manifest = sh.write_manifest(
        out, count=sum(m["count"] for m in markers), latent_shape=list(shape), dtype=dtype,
        num_classes=len(class_names) if class_names else 1, class_names=class_names, vae=vae_name, scaling_factor=sf,
        shift_factor=shift, image_size=image_size, flips=bool(flips), posterior=posterior,
        shards=[sh.manifest_entry(m) for m in markers if m["count"]],
        skipped=len(skipped), source=data_path if "://" in data_path else os.path.abspath(data_path), **stats,
        **({"images": images} if images else {}),
        **({"text": text} if text else {}),
    )
    checksums.stamp_written(out, manifest["shards"])
    if skipped:
        print(f"dit extract: skipped {len(skipped)} unreadable images, listed in {os.path.join(out, SKIPPED)}",
              file=sys.stderr)
    return manifest
