"""What `dit extract --text-encoder` adds to an extract: the captioned listing instead of a class
folder, the frozen text encoder beside the VAE, each shard's text files, the null caption and the
manifest's `text` record (see `shard_text`).

Captions are read and checked before anything is written (a bad one stops the extract in one line
naming its file), and encoded in batches of a fixed size (`encode.encode_text_rows`), so a caption's
rows are the same bytes whichever shard, rank or command encoded it, the training cache's included.
"""

import sys
from typing import Dict, List

from dit_trainer.data import shard_text
from dit_trainer.data.captions import dropped_line, list_captioned
from dit_trainer.data.captions.files import read_image
from dit_trainer.data.encode import encode_text_rows
from dit_trainer.data.images import ImageFiles


class CaptionPart:
    """The captions and text encoder of one extract: `plan()`, `files()`, `sidecar()`, `add()`, `finish()`."""

    def __init__(self, data_path: str, encoder: str, max_length: int, dtype: str, empty: str, device, storage: str,
                 rank: int = 0):
        from dit_trainer.text_encoders import load_text_encoder

        self.listing = list_captioned(data_path, empty)
        self.empty = empty
        line = dropped_line(self.listing)
        if line and rank == 0:
            print(f"dit extract: {line}", file=sys.stderr)
        self.encoder = load_text_encoder(encoder, dtype, device, max_length or None)
        self.text = shard_text.record(self.encoder, storage)
        self.truncated = self.encoder.count_truncated(self.listing.captions)
        if self.truncated and rank == 0:
            print(f"dit extract: {truncated_line(self.truncated, len(self.listing), self.text['max_length'])}",
                  file=sys.stderr)

    def __len__(self) -> int:
        return len(self.listing)

    def plan(self) -> Dict:
        """What the extract's plan records of the captions and encoder: a resume must read the same."""
        text = {k: self.text[k] for k in ("encoder", "max_length", "dtype", "storage")}
        return {"files_sha256": self.listing.digest(), "num_images": len(self.listing), "text_encoder": text,
                "empty_captions": self.empty}

    def files(self, image_size: int) -> ImageFiles:
        """The images, for the extract's loader workers."""
        return ImageFiles(self.listing.images, image_size, load=read_image)

    def where(self, index: int) -> str:
        """Item `index`'s image as the skip report names it."""
        return self.listing.where(index)

    def sidecar(self, out: str, name: str, capacity: int) -> shard_text.TextSidecar:
        """A shard's text writer."""
        return shard_text.TextSidecar(out, name, capacity, self.text)

    def add(self, writer: shard_text.TextSidecar, indices: List[int]) -> None:
        """Encode the captions of items `indices` (the rows the shard keeps) into `writer`."""
        if indices:
            writer.add(encode_text_rows(self.encoder, [self.listing.captions[i] for i in indices]))

    def finish(self, out: str) -> Dict:
        """Write the null caption's encoding; returns the manifest's `text` record."""
        null = shard_text.write_null(out, encode_text_rows(self.encoder, [""]), self.text)
        return {**self.text, "null": null, "truncated": self.truncated, "empty_captions": self.empty,
                "dropped": self.listing.dropped}


def truncated_line(truncated: int, total: int, max_length: int) -> str:
    """The log line for captions longer than the encoder reads."""
    return f"{truncated} of {total} captions run past {max_length} tokens; the text encoder reads them truncated"
