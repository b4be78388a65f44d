"""Files that try to change the process, or to hang it: BUILD onto allowed classes in DCP metadata,
FIFOs and devices where a regular file belongs."""

import os
import pathlib
import threading

import numpy as np
import pytest
import torch
from tests.reliability.helpers import step_dir, train
from tests.train.trainer_helpers import run_config

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.checkpoint.safe_dcp import read_metadata_file
from dit_trainer.config import build_config
from dit_trainer.data.images import list_image_folder
from dit_trainer.data.labels import read_labels_file
from dit_trainer.data.latents import read_npy_header
from dit_trainer.data.shards import read_manifest
from dit_trainer.errors import DitError
from dit_trainer.evaluate.npz import npz_keys
from dit_trainer.train import DiTTrainer

# GLOBAL pathlib.PosixPath, then BUILD (None, {"__truediv__": collections.OrderedDict}) onto the class.
REWIRE_PATH = (b"\x80\x02cpathlib\nPosixPath\nN}X\x0b\x00\x00\x00__truediv__ccollections\nOrderedDict\ns\x86b.")


def _plant(folder, payload):
    (folder / "dcp" / ".metadata").write_bytes(payload)
    ckpt.write_manifest(folder)  # re-signed: only the unpickler stands in the way


def test_build_onto_an_allowed_class_changes_nothing(tmp_path, capsys):
    path = tmp_path / ".metadata"
    path.write_bytes(REWIRE_PATH)
    with pytest.raises(DitError, match="BUILD on PosixPath refused"):
        read_metadata_file(path)
    assert pathlib.PosixPath.__truediv__ is not __import__("collections").OrderedDict
    assert str(pathlib.Path("/a") / "b") == "/a/b"


def test_refused_metadata_falls_back_in_one_line(tmp_path, capsys):
    train(tmp_path, 4, checkpoint={"save_steps": 2, "sharded": True, "save_total_limit": 0})
    _plant(step_dir(tmp_path, 4), REWIRE_PATH)
    capsys.readouterr()
    with pytest.warns(UserWarning) as record:
        trainer = DiTTrainer(run_config(tmp_path, 6, checkpoint={"save_steps": 2, "sharded": True}))
        assert trainer.maybe_resume().name == "step-00000002"  # the intact previous one, as documented
    assert any("BUILD on PosixPath refused" in str(w.message) for w in record)
    assert "Traceback" not in capsys.readouterr().err  # torch's logged tracebacks no longer precede ours


def _fifo(path):
    os.mkfifo(path)
    return path


def test_fifo_as_weights_does_not_hang_resume(tmp_path):
    train(tmp_path, 4)
    newest = step_dir(tmp_path, 4)
    (newest / "manifest.json").unlink()  # a checkpoint without manifest: only the loader looks
    (newest / "ema.safetensors").unlink()
    fifo = _fifo(newest / "ema.safetensors")
    found = {}

    def resume():
        with pytest.warns(UserWarning, match="FIFO"):
            found["path"] = DiTTrainer(run_config(tmp_path, 6, keep=0)).maybe_resume()

    worker = threading.Thread(target=resume, daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release the blocked reader, then fail
        pytest.fail("resume blocked in open() on a FIFO")
    assert found["path"].name == "step-00000002"


@pytest.mark.parametrize("reader,name", [
    (ckpt.load_safetensors, "ema.safetensors"), (ckpt.load_pt, "optimizer.pt"),
    (read_metadata_file, ".metadata"), (build_config, "config.yaml"), (read_npy_header, "00000.npy"),
    (lambda p: read_labels_file(p, ["a"]), "labels.json"), (read_manifest, "manifest.json"), (npz_keys, "ref.npz"),
])
def test_fifo_is_refused_in_one_line(tmp_path, reader, name):
    path = _fifo(tmp_path / name)
    with pytest.raises(DitError, match="is a FIFO") as err:
        reader(str(path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("layout", ["flat", "classes"])
def test_fifo_in_an_image_folder_is_refused(tmp_path, layout):
    folder = tmp_path / "images" / ("cat" if layout == "classes" else "")
    folder.mkdir(parents=True)
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "a.png")
    _fifo(folder / "x.png")
    with pytest.raises(DitError, match="x.png .*is a FIFO"):
        list_image_folder(tmp_path / "images")


def test_character_device_is_refused(tmp_path):
    with pytest.raises(DitError, match="character device"):
        ckpt.load_pt("/dev/zero")  # would read forever
    assert torch.zeros(1).sum() == 0
