"""Run on every rank of a 2-rank gloo launch (tests/parallel/_worker.py --text-check): a tiny T5 sharded over
the ranks (FSDP2, inference only) encodes what the whole encoder encodes, when the ranks have different
numbers of captions too; and an image folder's cache encoder under FSDP shards its text encoder and
encodes a batch in which one rank's share is already cached. Writes text-check-RANK.json for the test."""

import datetime
import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist


def assets(root) -> dict:
    """The captioned folder, tiny VAE and tiny T5 the check reads (made once, before the launch)."""
    from tests.text_helpers import save_tiny_t5, write_captioned_folder
    from tests.train.trainer_helpers import save_tiny_vae

    root = Path(root)
    write_captioned_folder(root / "images", count=6)
    return {"images": str(root / "images"), "vae": save_tiny_vae(root / "vae"), "t5": save_tiny_t5(root / "t5")}


def _max_diff(a: dict, b: dict) -> float:
    return max(float(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)).max()) for k in a)


def run(root, out) -> None:
    """The checks on this rank; their numbers go to out/text-check-RANK.json."""
    from dit_trainer.data.encode import encode_text_rows
    from dit_trainer.data.online import open_image_folder
    from dit_trainer.data.online.encoder import encoder_for
    from dit_trainer.data.shard_text import to_storage
    from dit_trainer.parallel.dims import ParallelDims
    from dit_trainer.text_encoders import load_text_encoder, shard_text_encoder
    from tests.text_helpers import WORDS

    paths, rank = json.loads((Path(root) / "assets.json").read_text()), dist.get_rank()
    dims = ParallelDims(dp_shard=2, world_size=2)
    dims.build_mesh("cpu", datetime.timedelta(seconds=60))  # a missing call fails the check in a minute, not 30
    whole = load_text_encoder(paths["t5"], "fp32", "cpu", 12)
    sharded = shard_text_encoder(load_text_encoder(paths["t5"], "fp32", "cpu", 12), dims.mesh["dp_shard"])
    local = sum(p.to_local().numel() for p in sharded.model.parameters())
    # Rank 0 encodes 40 captions (two calls of 32), rank 1 five (one call): rank 1 joins rank 0's second call.
    captions = [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(1 + i % 4)) for i in range(40 if rank == 0 else 5)]
    got, want = encode_text_rows(sharded, captions), encode_text_rows(whole, captions)
    result = {"encode_diff": _max_diff(got, want), "rows": len(got["text_embeds"]), "local_params": local,
              "total_params": sum(p.numel() for p in whole.model.parameters())}

    # The trainer's path: an image folder's cache encoder under FSDP; the second batch finds rank 1's share cached.
    text = {"encoder": paths["t5"], "max_length": 12, "dtype": "fp32", "empty": "error"}
    cache = Path(out) / "text-check-cache"
    dataset = open_image_folder(paths["images"], vae=paths["vae"], image_size=16, device="cpu", cache_dir=str(cache),
                                text=text)
    stage = encoder_for(dataset, "cpu", dims, progress=False)
    first = [0, 1] if rank == 0 else [2, 3]
    stage(dataset.__getitems__(first))
    stage.flush()
    dist.barrier()
    dataset.rescan()
    second = [4, 5] if rank == 0 else first  # rank 1's share is in the cache now: nothing of its own to encode
    batch = stage(dataset.__getitems__(second))
    rows = to_storage(encode_text_rows(whole, [dataset.captions[i] for i in second]), dataset.text, "the check")
    result.update(stage_sharded=dataset.text_model.group is not None,
                  stage_diff=_max_diff({k: batch[k] for k in rows}, rows), stage_rows=len(batch["text_embeds"]))
    (Path(out) / f"text-check-{rank}.json").write_text(json.dumps(result))


def write_assets(root) -> Path:
    """Make the assets under `root` and record where they are; returns `root`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "assets.json").write_text(json.dumps(assets(root)))
    return root


if __name__ == "__main__":  # pragma: no cover - the worker imports run()
    raise SystemExit("run through tests/parallel/_worker.py --text-check")
