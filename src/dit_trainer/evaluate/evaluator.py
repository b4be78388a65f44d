"""The measurement: samples .npz + reference -> FID, sFID, IS, precision, recall (the ADM evaluator's set)."""

import itertools
import os
import sys
import time
from pathlib import Path

import torch

from dit_trainer.errors import ConfigError, DataError
from dit_trainer.evaluate.features import extract_features, iter_features
from dit_trainer.evaluate.fid import frechet_distance
from dit_trainer.evaluate.inception_score import ADM_SPLIT_SIZE, inception_score
from dit_trainer.evaluate.memory import check_eval_memory
from dit_trainer.evaluate.npz import IMAGES_KEY, NpzImages, npz_keys
from dit_trainer.evaluate.precision_recall import DISTANCE_DTYPES, precision_recall
from dit_trainer.evaluate.stats import ReferenceStats

NETWORKS = ("inception", "digits")
# Inception at 299 px fills a GPU at 64 (ADM's batch); the digit network is so small that only
# large batches amortise the per-call overhead.
DEFAULT_BATCH = {"inception": 64, "digits": 512}
DIGITS_REF = "digits"  # --ref digits: scikit-learn's real digits, measured on the fly
PR_FEATURES = 10_000  # reference features kept for precision/recall, as many as ADM's reference images


def default_device() -> str:
    """cuda when there is one, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_network(name: str = "inception", weights=None, device="cpu", progress=True):
    """The feature network by name: "inception" (a local weight file, else fetched once) or "digits" (shipped)."""
    if name == "inception":
        from dit_trainer.evaluate.inception import load_inception

        return load_inception(weights, device, progress)
    if name == "digits":
        from dit_trainer.evaluate.digits_net import load_digit_net

        return load_digit_net(weights, device)
    raise ConfigError(f"unknown feature network {name!r}; choose one of {', '.join(NETWORKS)}")


def measure_npz(path, network, batch_size=64, dtype="fp32", device="cpu", progress=True, desc=None):
    """Features of the images in an .npz's arr_0, streamed in batches."""
    images = NpzImages(path)
    return extract_features(network, images.batches(batch_size), batch_size, dtype, device, progress,
                            total=len(images), desc=desc or Path(path).name)


def reference(ref, network, batch_size=64, dtype="fp32", device="cpu", progress=True, pr=True):
    """ReferenceStats for `ref` (an .npz, or "digits"), with pool features when precision/recall can be had
    and is asked for (`pr`)."""
    if str(ref) == DIGITS_REF:
        if network.name != "digits":
            raise ConfigError("--ref digits is measured with the digit network; add --network digits")
        from dit_trainer.evaluate.digits_net import real_digits_uint8

        feats = extract_features(network, real_digits_uint8(), batch_size, dtype, device, progress, desc="real digits")
        return ReferenceStats.from_features(feats, network="digits")
    stats = ReferenceStats.load(ref)
    # A file without statistics is only images, measured below with whichever network is asked for;
    # statistics that name no network are the ADM evaluator's Inception ones.
    measured_by = network.name if stats is None else (stats.network or "inception")
    if measured_by != network.name:
        raise ConfigError(f"{ref} holds {measured_by} features but the samples are measured with "
                          f"--network {network.name}; use the same network for both")
    has_images = IMAGES_KEY in npz_keys(ref)
    if stats is not None and (stats.features is not None or not has_images or not pr):
        return stats
    # ADM's reference batches: statistics of the whole dataset plus images for precision/recall.
    feats = measure_npz(ref, network, batch_size, dtype, device, progress, desc=f"reference {Path(ref).name}")
    if stats is None:
        return ReferenceStats.from_features(feats, network=network.name)
    stats.features = feats.pool
    return stats


def _feature_dims(network, samples, dtype, device) -> tuple:
    """Widths of the pool, spatial and logits features, from the network's pass over the first sample."""
    first = next(iter_features(network, itertools.islice(NpzImages(samples).batches(1), 1), 1, dtype, device,
                               progress=False))
    return tuple(int(getattr(first, k).shape[1]) for k in ("pool", "spatial", "logits"))


def evaluate(samples, ref, network="inception", weights=None, batch_size=None, dtype="fp32", device=None,
             progress=True, is_splits=None, is_split_size=ADM_SPLIT_SIZE, pr_dtype="fp16", k=3, pr=True) -> dict:
    """All five metrics of a samples .npz against a reference; returns a dict of plain values.

    IS over parts of `is_split_size` samples as the ADM evaluator, or `is_splits` equal parts as
    torch-fidelity; precision/recall distances in `pr_dtype` (fp16: ADM's; fp32), or skipped (`pr`
    False). `ref` may be a `ReferenceStats` already fitted (with `reference`), so that several sample
    sets share one. Before the samples are measured, what their features and precision/recall will
    hold is said (with `progress`) and refused with a ResourceError when it cannot fit."""
    device = device or default_device()
    if str(ref) == DIGITS_REF and (network if isinstance(network, str) else network.name) != "digits":
        # Before loading the network: the Inception one would first ask for its weight file.
        raise ConfigError("--ref digits is measured with the digit network; add --network digits")
    if pr_dtype not in DISTANCE_DTYPES:
        raise ConfigError(f"--pr-dtype {pr_dtype!r} is not one of {', '.join(DISTANCE_DTYPES)}")
    if is_splits is not None and (isinstance(is_splits, bool) or not isinstance(is_splits, int) or is_splits < 1):
        raise ConfigError(f"--is-splits must be a positive integer, got {is_splits!r}")
    count = len(NpzImages(samples))  # reads the header only: a bad file fails before any measuring
    need = max(is_splits or 1, k + 1 if pr else 2)
    if count < need:
        splits = f"IS over {is_splits} splits and " if is_splits else ""
        metric = f"precision/recall with k={k}" if pr else "the covariances of FID"
        raise DataError(f"{samples} holds {count} images; {splits}{metric} need at least {need}")
    net = load_network(network, weights, device, progress) if isinstance(network, str) else network
    batch_size = batch_size or DEFAULT_BATCH.get(net.name, 64)
    t0 = time.perf_counter()
    ref_stats = ref if isinstance(ref, ReferenceStats) else reference(ref, net, batch_size, dtype, device,
                                                                      progress, pr)
    pr_ref = ref_stats.features if pr else None
    plan = check_eval_memory(samples, count, _feature_dims(net, samples, dtype, device),
                             None if pr_ref is None else len(pr_ref), device, dtype=pr_dtype)
    if progress:
        print(f"dit eval: {plan}", file=sys.stderr)
    feats = measure_npz(samples, net, batch_size, dtype, device, progress, desc=f"samples {Path(samples).name}")
    sam = ReferenceStats.from_features(feats, network=net.name)
    is_mean, is_std = inception_score(feats.logits, is_splits, is_split_size)
    result = {
        "inception_score": is_mean,
        "inception_score_std": is_std,
        "fid": frechet_distance(sam.mu, sam.sigma, ref_stats.mu, ref_stats.sigma),
        "sfid": frechet_distance(sam.mu_s, sam.sigma_s, ref_stats.mu_s, ref_stats.sigma_s),
        "precision": None,
        "recall": None,
    }
    if pr_ref is not None:
        result["precision"], result["recall"] = precision_recall(pr_ref, feats.pool, k=k, device=device,
                                                                 dtype=pr_dtype)
    result.update({
        "num_samples": len(feats),
        "num_reference_features": None if ref_stats.features is None else len(ref_stats.features),
        "network": net.name, "dtype": dtype, "samples": str(samples),
        "ref": None if isinstance(ref, ReferenceStats) else str(ref),  # a fitted one: its caller names it
        "is_splits": is_splits, "is_split_size": None if is_splits else is_split_size, "pr_dtype": pr_dtype,
        "pr_skipped": None if pr_ref is not None else ("--no-pr" if not pr else "the reference has neither "
                                                                                   "images nor features"),
        "seconds": round(time.perf_counter() - t0, 1),
    })
    return result


def _image_batches(paths, image_size, batch_size, workers, on_bad_image, good, skipped):
    """uint8 batches of the readable images; their indices go to `good`, (index, error) of the rest to `skipped`."""
    import numpy as np
    from torch.utils.data import DataLoader

    from dit_trainer.data.images import ImageFiles

    loader = DataLoader(ImageFiles(paths, image_size), batch_size=batch_size, num_workers=workers,
                        collate_fn=list)
    for batch in loader:
        for index, image, err in batch:
            if image is None:
                if on_bad_image == "stop":
                    raise DataError(f"{paths[index]}: cannot read image ({err}); remove or fix it, "
                                    f"or pass --on-bad-image skip")
                skipped.append((index, err))
        ok = [(index, image) for index, image, _ in batch if image is not None]
        if ok:
            good.extend(index for index, _ in ok)
            yield np.stack([image for _, image in ok])


def skipped_list_path(out) -> Path:
    """Where --ref-from-images lists the images it skipped: beside `out`, as `dit extract` keeps OUT/skipped.txt."""
    out = Path(out)
    return out.with_name(out.stem + ".skipped.txt")


def reference_from_images(folder, out, network="inception", weights=None, image_size=256, batch_size=None,
                          dtype="fp32", device=None, progress=True, workers=0,
                          pr_features: int = PR_FEATURES, seed: int = 0, on_bad_image: str = "skip") -> ReferenceStats:
    """Measure an image folder (ADM center crop to image_size) and write its ReferenceStats to `out`.

    Statistics cover every readable image and are accumulated batch by batch; the pool features of
    a random `pr_features` of them (ADM's reference batches carry 10,000 images) are kept for
    precision/recall. Unreadable images are skipped and listed beside `out` (see `skipped_list_path`),
    or stop the run with on_bad_image="stop".
    """
    import sys

    import numpy as np

    from dit_trainer.data.images import list_image_folder
    from dit_trainer.evaluate.features import iter_features
    from dit_trainer.evaluate.stats import GaussianAccumulator

    if on_bad_image not in ("skip", "stop"):
        raise ConfigError(f"on_bad_image {on_bad_image!r} must be 'skip' or 'stop'")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8:
        raise ConfigError(f"image size must be an integer >= 8, got {image_size!r}")
    device = device or default_device()
    net = load_network(network, weights, device, progress) if isinstance(network, str) else network
    batch_size = batch_size or DEFAULT_BATCH.get(net.name, 64)
    paths = list_image_folder(folder)[0]
    if len(paths) < 2:
        raise DataError(f"{folder} has {len(paths)} image; statistics need at least 2")
    # A folder lists class by class: a random subset, not the first N, keeps every class.
    keep = np.zeros(len(paths), dtype=bool)
    keep[np.random.default_rng(seed).choice(len(paths), min(len(paths), pr_features), replace=False)] = True
    pool, spatial, kept, start = GaussianAccumulator(), GaussianAccumulator(), [], 0
    good, skipped = [], []
    batches = _image_batches(paths, image_size, batch_size, workers, on_bad_image, good, skipped)
    for f in iter_features(net, batches, batch_size, dtype, device, progress, total=len(paths), desc=Path(folder).name):
        pool.update(f.pool)
        spatial.update(f.spatial)
        # Rows are the readable images in order; `good` maps them back to their place in the listing.
        kept.append(f.pool[keep[good[start:start + len(f)]]])
        start += len(f)
    if start < 2:
        raise DataError(f"{folder} has {start} readable image(s) of {len(paths)}; statistics need at least 2")
    stats = ReferenceStats(*pool.result(), *spatial.result(), features=np.concatenate(kept), network=net.name)
    stats.save(out)
    listing = skipped_list_path(out)
    if skipped:
        with open(listing, "w", encoding="utf-8") as f:
            f.writelines(f"{os.path.relpath(paths[i], folder)}\t{err}\n" for i, err in skipped)
        print(f"dit eval: skipped {len(skipped)} unreadable images, listed in {listing}", file=sys.stderr)
    elif listing.is_file():
        listing.unlink()  # a list from an earlier run would describe images that now read
    return stats
