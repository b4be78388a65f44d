"""`dit extract --text-encoder`: latents and the text encoder's outputs in the same checksummed shards,
per rank and resumable, read back as text batches; and the data filling a text model's config."""

import dataclasses
import hashlib
import json
import os
import threading

import numpy as np
import pytest
import torch

from tests.text_helpers import save_tiny_clip, write_captioned_folder
from tests.train.trainer_helpers import save_tiny_vae

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from dit_trainer.cli import main  # noqa: E402
from dit_trainer.data import extract as ex  # noqa: E402
from dit_trainer.data import shards as sh  # noqa: E402
from dit_trainer.data.encode import ENCODE_BATCH  # noqa: E402
from dit_trainer.data.extract import run_extract  # noqa: E402
from dit_trainer.data.text_shards import TextShards, open_shards  # noqa: E402
from dit_trainer.data.tools import verify  # noqa: E402
from dit_trainer.errors import ConfigError, DataError  # noqa: E402
from dit_trainer.text_encoders import load_text_encoder  # noqa: E402

SIZE = 16
SETTINGS = dict(image_size=SIZE, batch_size=2, shard_size=3, workers=0, progress=False, dtype="float32")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("extract_text")
    items = write_captioned_folder(root / "images", count=7)
    (root / "images" / "0003.png").write_bytes(b"\x89PNG broken")  # skipped: the rows after it must stay aligned
    (root / "images" / "0005.txt").write_text("a cat " * 20)  # past CLIP's 16 positions
    vae, clip = save_tiny_vae(root / "vae"), save_tiny_clip(root / "clip")
    out = root / "reference"
    assert main(["extract", "--data-path", str(root / "images"), "--vae", vae, "--image-size", str(SIZE), "--out",
                 str(out), "--batch-size", "2", "--shard-size", "3", "--workers", "0", "--no-progress", "--dtype",
                 "float32", "--text-encoder", clip]) == 0
    captions = [c for k, _, c in items if k != "0003"]
    captions[4] = ("a cat " * 20).strip()
    return {"root": root, "images": str(root / "images"), "vae": vae, "clip": clip, "reference": out,
            "captions": captions}


def _files(root):
    """sha256 of every shard file and the null caption's, by name."""
    names = sorted(n for n in os.listdir(root) if n.startswith("shard-") and n.endswith(".npy")) + ["null_text.safetensors"]
    return {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in names}


def test_manifest_records_the_encoder_and_every_text_file(assets):
    m = sh.read_manifest(assets["reference"])
    text = m["text"]
    assert text["encoder"] == assets["clip"] and text["kind"] == "clip" and text["max_length"] == 16
    assert (text["hidden_size"], text["pooled_size"], text["dtype"], text["storage"]) == (32, 24, "float32", "float32")
    assert text["truncated"] == 1 and text["null"]["file"] == "null_text.safetensors" and m["count"] == 6
    null = (assets["reference"] / "null_text.safetensors").read_bytes()
    assert text["null"]["sha256"] == hashlib.sha256(null).hexdigest() and text["null"]["bytes"] == len(null)
    for entry in m["shards"]:
        for field in ("text_embeds", "text_mask", "text_pooled"):
            data = (assets["reference"] / f"{entry['name']}.{field}.npy").read_bytes()
            assert entry[f"{field}_sha256"] == hashlib.sha256(data).hexdigest() and entry[f"{field}_bytes"] == len(data)
    assert verify(assets["reference"]) == []
    assert json.loads((assets["reference"] / "extract.json").read_text())["text_encoder"]["max_length"] == 16


def test_shards_yield_the_contracts_batch_and_null_text(assets):
    ds = open_shards(assets["reference"])
    assert isinstance(ds, TextShards) and len(ds) == 6 and ds.num_classes is None
    batch = torch.utils.data.default_collate(ds.__getitems__([0, 3, 5]))
    assert set(batch) == {"x", "text_embeds", "text_mask", "text_pooled"}
    assert batch["x"].shape == (3, 4, 8, 8) and batch["text_embeds"].shape == (3, 16, 32)
    assert batch["text_mask"].dtype == torch.int64 and batch["text_pooled"].shape == (3, 24)
    null = ds.null_text()
    assert null["text_embeds"].shape == (16, 32) and null["text_mask"].shape == (16,) and null["text_pooled"].shape == (24,)
    encoder = load_text_encoder(assets["clip"])
    want = encoder.encode([""], pad_to=ENCODE_BATCH)  # as every caption is encoded
    assert all(torch.equal(null[k], want[k][0]) for k in want)


def test_cached_embeddings_are_the_encoders_outputs_bit_for_bit(assets):
    """fp32 storage: each kept image's row is its caption's encoding (the broken image's caption is
    not among them, so a skipped row shifts nothing)."""
    ds = open_shards(assets["reference"])
    stored = torch.utils.data.default_collate(ds.__getitems__(list(range(len(ds)))))
    encoder = load_text_encoder(assets["clip"])
    want = encoder.encode(assets["captions"], pad_to=ENCODE_BATCH)
    for key in want:
        assert torch.equal(stored[key], want[key]), key
    plain = encoder.encode(assets["captions"])  # another batch shape: equal to rounding
    assert torch.allclose(stored["text_embeds"], plain["text_embeds"], atol=1e-5)


def test_a_webdataset_shard_at_an_fsspec_url_extracts_to_the_same_files(assets, tmp_path):
    import fsspec

    from tests.text_helpers import tar_bytes

    folder = assets["root"] / "images"
    members = [(n, (folder / n).read_bytes()) for n in sorted(os.listdir(folder))]
    fsspec.filesystem("memory").pipe("/extract_text/00000.tar", tar_bytes(members))
    run_extract("memory://extract_text/00000.tar", assets["vae"], out=tmp_path, text_encoder=assets["clip"], **SETTINGS)
    assert _files(tmp_path) == _files(assets["reference"]) and verify(tmp_path) == []
    skipped = "memory://extract_text/00000.tar:0003.png"
    assert (tmp_path / "skipped.txt").read_text() == f"{skipped}\tUnidentifiedImageError: cannot identify image file {skipped!r}\n"


def test_resume_after_interrupt_gives_the_same_files(assets, tmp_path, monkeypatch):
    real_close = sh.ShardWriter.close
    closed = []

    def close_then_die(self, **marker):
        result = real_close(self, **marker)
        closed.append(self.name)
        if len(closed) == 1:
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(sh.ShardWriter, "close", close_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_extract(assets["images"], assets["vae"], out=tmp_path, text_encoder=assets["clip"], **SETTINGS)
    monkeypatch.setattr(sh.ShardWriter, "close", real_close)
    assert sh.shard_done(str(tmp_path), "shard-00000") and not (tmp_path / "manifest.json").exists()
    stats = run_extract(assets["images"], assets["vae"], out=tmp_path, text_encoder=assets["clip"], **SETTINGS)
    assert stats["shards"] == 2
    assert _files(tmp_path) == _files(assets["reference"]) and verify(tmp_path) == []
    with pytest.raises(DataError, match="text_encoder="):
        run_extract(assets["images"], assets["vae"], out=tmp_path, text_encoder=assets["clip"], text_max_length=8,
                    **SETTINGS)


class _ThreadRanks:
    """Two extract ranks as threads of this process: rank and world per thread, a shared barrier."""

    def __init__(self, world):
        self.local, self.barrier = threading.local(), threading.Barrier(world)

    def __call__(self):
        owner = self

        class Dist:
            rank, world = owner.local.rank, owner.barrier.parties

            def barrier(self):
                owner.barrier.wait(timeout=120)

            def close(self):
                pass

        return Dist()


def test_two_ranks_write_disjoint_shards_equal_to_one_process(assets, tmp_path, monkeypatch):
    ranks, errors = _ThreadRanks(2), []
    monkeypatch.setattr(ex, "_Dist", ranks)

    def rank(r):
        ranks.local.rank = r
        try:
            run_extract(assets["images"], assets["vae"], out=tmp_path, text_encoder=assets["clip"], **SETTINGS)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            ranks.barrier.abort()
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    by_rank = {}
    for name in ("shard-00000", "shard-00001", "shard-00002"):
        by_rank.setdefault(sh.read_shard_marker(str(tmp_path), name)["rank"], []).append(name)
    assert by_rank == {0: ["shard-00000"], 1: ["shard-00001", "shard-00002"]}
    assert _files(tmp_path) == _files(assets["reference"]) and verify(tmp_path) == []


def test_verify_and_training_refuse_a_damaged_text_file(assets, tmp_path):
    import shutil

    shutil.copytree(assets["reference"], tmp_path / "copy")
    path = tmp_path / "copy" / "shard-00001.text_embeds.npy"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    problems = verify(tmp_path / "copy")
    assert len(problems) == 1 and "shard-00001.text_embeds.npy does not match the sha256" in problems[0]
    with pytest.raises(DataError, match="text_embeds.npy does not match the sha256"):
        open_shards(tmp_path / "copy")


def test_a_bad_caption_on_rerun_stops_in_one_line_and_keeps_the_extract(assets, tmp_path):
    import shutil

    shutil.copytree(assets["images"], tmp_path / "images")
    run_extract(str(tmp_path / "images"), assets["vae"], out=tmp_path / "out", text_encoder=assets["clip"], **SETTINGS)
    before = _files(tmp_path / "out")
    (tmp_path / "images" / "0001.txt").write_bytes(b"\x00\x01binary")
    with pytest.raises(DataError, match=r"0001\.txt: the caption holds a NUL byte"):
        run_extract(str(tmp_path / "images"), assets["vae"], out=tmp_path / "out", text_encoder=assets["clip"],
                    **SETTINGS)
    assert _files(tmp_path / "out") == before and verify(tmp_path / "out") == []


def test_text_shards_fill_the_model_shape_and_a_text_familys_sizes(assets, monkeypatch):
    from dit_trainer.config import build_config
    from dit_trainer.data.loader import DataShapes
    from dit_trainer.models import spec as model_spec

    real = model_spec.get_spec("DiT-S/2")

    @dataclasses.dataclass
    class TextConfig(real.config_cls):
        text_hidden_size: int = 4096
        text_pooled_size: int = 0

    # A text family as the registry will hold one: its config declares the sizes it takes from the data.
    monkeypatch.setitem(model_spec._REGISTRY, "TextDiT-S/2", dataclasses.replace(real, name="TextDiT-S/2",
                                                                                  config_cls=TextConfig))
    source = {"model": {"name": "TextDiT-S/2"}, "data": {"path": str(assets["reference"]), "num_workers": 0}}
    cfg = build_config(source, shapes=DataShapes())
    assert (cfg.model.in_channels, cfg.model.input_size) == (4, 8) and cfg.model.num_classes == 1000
    assert cfg.data.text_encoder == assets["clip"] and cfg.data.text_max_length == 16
    assert cfg.model.options["text_hidden_size"] == 32 and cfg.model.options["text_pooled_size"] == 24
    with pytest.raises(ConfigError, match="data.text_max_length is 120 but .* holds captions of 16 tokens"):
        build_config(source, {"data.text_max_length": 120}, shapes=DataShapes())
