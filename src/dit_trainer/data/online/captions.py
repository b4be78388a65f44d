"""An image folder's latent cache for captioned images (`data.text_encoder`): the captioned listing
names the cache with the text encoder, and the encoder (on the CPU until the trainer's cache encoder
takes it) encodes each caption beside its image's latents, stored as `dit extract --text-encoder`
stores them."""

import os
from typing import Dict, Tuple

import numpy as np

from dit_trainer.data import shard_text
from dit_trainer.data.captions import Captioned, dropped_line, list_captioned
from dit_trainer.data.encode import encode_text_rows
from dit_trainer.data.extract_text import truncated_line
from dit_trainer.data.online import _say, cache as lc


def open_listing(path: str, text: Dict, device_type: str) -> Tuple[Captioned, Dict]:
    """(the captioned listing of `path`, the cache plan's fields naming it and the text encoder).
    `text`: {"encoder", "max_length", "dtype", "empty"} (data.text_*, data.empty_captions)."""
    from dit_trainer.text_encoders import text_dtype_for

    listing = list_captioned(path, text["empty"])
    line = dropped_line(listing)
    if line:
        _say(f"captions: {line}")
    name = text["encoder"]
    if os.path.isdir(os.path.expanduser(name)):
        name = os.path.abspath(os.path.expanduser(name))
    named = {"encoder": name, "identity": lc.vae_identity(name), "max_length": int(text["max_length"] or 0),
             "dtype": text_dtype_for(text["dtype"], device_type), "empty_captions": text["empty"]}
    return listing, {"files_sha256": listing.digest(stamps=True), "text": named}


def attach(dataset, listing: Captioned, plan_text: Dict) -> None:
    """Load the text encoder (CPU) into `dataset` (an ImageFolderLatents), with the null caption's
    encoding written into the cache if it is not there yet."""
    from dit_trainer.text_encoders import load_text_encoder

    encoder = load_text_encoder(plan_text["encoder"], plan_text["dtype"], "cpu", plan_text["max_length"] or None)
    text = shard_text.record(encoder, lc.STORAGE)
    path = os.path.join(dataset.root, shard_text.NULL_FILE)
    with lc.writing(dataset.root, path):
        text["null"] = shard_text.write_null(dataset.root, encode_text_rows(encoder, [""]), text)
    truncated = encoder.count_truncated(listing.captions)
    if truncated:
        _say(f"captions: {truncated_line(truncated, len(listing), text['max_length'])}")
    text.update(truncated=truncated, empty_captions=plan_text["empty_captions"], dropped=listing.dropped)
    dataset.attach_text(encoder, listing.captions, text)


def labels_of(listing: Captioned) -> np.ndarray:
    """The labels a captioned listing's shards keep: all 0, one class (the caption is the condition)."""
    return np.zeros(len(listing), dtype=np.int64)
