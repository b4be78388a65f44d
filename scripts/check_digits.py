#!/usr/bin/env python
"""Acceptance check for the digits demo: does each sample look like the digit it was asked for?

Usage: python scripts/check_digits.py DIR [--min 0.8]

DIR holds `samples.npz` with `images` (N×1×S×S floats in [-1, 1]) and `labels` (N ints). A
classifier fit on the real 8×8 digits labels each box-downsampled sample; the share it labels as
the requested class is printed per class and overall. Exits 1 when the overall share is below
--min, 2 when the input is unusable.
"""

import argparse
import os
import sys

import numpy as np


def _fail(message: str) -> int:
    print(f"check_digits: error: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    """Score DIR/samples.npz and return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", metavar="DIR", help="demo output folder holding samples.npz")
    parser.add_argument("--min", type=float, default=0.8, dest="min_share",
                        help="lowest passing overall share (default 0.8)")
    args = parser.parse_args(argv)

    from dit_trainer.data.digits import (
        classify_images, digits_classifier, load_digit_arrays, upsample_digits,
    )
    from dit_trainer.errors import DitError

    path = os.path.join(args.dir, "samples.npz")
    if not os.path.isfile(path):
        return _fail(f"{path} does not exist; run the demo first or pass its output folder")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "images" not in npz or "labels" not in npz:
                return _fail(f"{path} needs arrays 'images' and 'labels', has {sorted(npz.files)}")
            images, labels = npz["images"], npz["labels"]
    except (OSError, ValueError) as err:
        return _fail(f"cannot read {path} ({err}); re-run the demo")
    if images.ndim == 3:
        images = images[:, None]
    if images.ndim != 4 or images.shape[1] != 1 or images.shape[2] != images.shape[3] or images.shape[2] < 8:
        return _fail(f"{path}: images have shape {images.shape}, expected N×1×S×S with S >= 8")
    labels = labels.reshape(-1)
    if len(labels) != len(images) or len(images) == 0:
        return _fail(f"{path}: {len(images)} images but {len(labels)} labels; expected one label per image")
    if labels.dtype.kind not in "iu" or labels.min() < 0 or labels.max() > 9:
        return _fail(f"{path}: labels must be integers 0..9")
    labels = labels.astype(np.int64)

    try:
        clf = digits_classifier()
        nonfinite = int((~np.isfinite(images.reshape(len(images), -1))).any(axis=1).sum())
        pred = classify_images(images, clf)
        # The same classifier on held-out real digits sent through the samples' path (upsampled to S,
        # then box-downsampled) is the ceiling the samples can reach.
        real8, real_labels = load_digit_arrays()
        held = clf.holdout_indices_
        size = images.shape[-1]
        ref = float((classify_images(upsample_digits(real8[held], size), clf) == real_labels[held]).mean())
    except DitError as err:
        return _fail(str(err))

    print(f"{path}: {len(images)} samples, {size}x{size}")
    if nonfinite:
        print(f"warning: {nonfinite} samples contain NaN or inf (scored as blanks)")
    print("class  samples  correct  share")
    for c in range(10):
        mask = labels == c
        if mask.any():
            hits = int((pred[mask] == c).sum())
            print(f"{c:>5}  {int(mask.sum()):>7}  {hits:>7}  {hits / mask.sum():.3f}")
        else:
            print(f"{c:>5}  {0:>7}  {'-':>7}  {'-':>5}")
    overall = float((pred == labels).mean())
    print(f"overall share labelled as their own class: {overall:.3f} (need >= {args.min_share:.2f})")
    print(
        f"reference: classifier accuracy on {len(held)} held-out real digits: "
        f"{clf.holdout_accuracy_:.3f} at 8x8, {ref:.3f} via {size}x{size}"
    )
    passed = overall >= args.min_share
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
