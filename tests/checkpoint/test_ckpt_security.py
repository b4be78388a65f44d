"""A run folder handed over by someone else must never run code: planted pickles in a DCP checkpoint."""

import io
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from tests.train.trainer_helpers import tiny_config

from dit_trainer.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, read_metadata_file
from dit_trainer.errors import CheckpointError
from dit_trainer.train import DiTTrainer


class _Payload:
    """Unpickling this touches a marker file: a stand-in for arbitrary code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _sharded_run(tmp_path, steps=2):
    cfg = tiny_config(tmp_path / "run", train={"max_steps": steps, "global_batch_size": 4},
                      checkpoint={"sharded": True, "save_steps": 1})
    trainer = DiTTrainer(cfg, dataset=torch.utils.data.TensorDataset(torch.randn(8, 4, 8, 8), torch.arange(8) % 10))
    trainer.train()
    return cfg


def test_planted_dcp_metadata_runs_no_code(tmp_path):
    cfg = _sharded_run(tmp_path)
    marker = tmp_path / "pwned"
    ck = tmp_path / "run" / "checkpoints" / "step-00000002"
    (ck / "dcp" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata: refused"):
        DiTTrainer(cfg).load_checkpoint(ck)
    assert not marker.exists()
    # Resuming skips it (with a warning) and takes the previous checkpoint: still no code ran.
    trainer = DiTTrainer(cfg, dataset=torch.utils.data.TensorDataset(torch.randn(8, 4, 8, 8), torch.arange(8) % 10))
    with pytest.warns(UserWarning, match="step-00000002"):
        assert trainer.maybe_resume().name == "step-00000001"
    assert trainer.step == 1 and not marker.exists()


def test_real_metadata_reads(tmp_path):
    _sharded_run(tmp_path, steps=1)
    md = read_metadata_file(tmp_path / "run" / "checkpoints" / "step-00000001" / "dcp" / ".metadata")
    assert "model.x_embedder.proj.weight" in md.state_dict_metadata


def test_planted_byte_item_runs_no_code(tmp_path):
    # torch's DefaultLoadPlanner unpickles byte items with weights_only=False; ours must not.
    marker = tmp_path / "pwned"
    # DCP saves any non-tensor value as a byte item: the planted one pickles a call to os.system.
    dcp.save({"trainer": _Payload(marker), "w": torch.zeros(2)}, checkpoint_id=str(tmp_path / "dcp"))
    assert not marker.exists()
    state = {"trainer": io.BytesIO(), "w": torch.ones(2)}
    with pytest.raises(CheckpointError, match=r"trainer refused: it needs code to unpickle \((posix|nt)\.system\)"):
        try:
            dcp.load(state, storage_reader=SafeFileSystemReader(str(tmp_path / "dcp")), planner=SafeLoadPlanner())
        except BaseException as err:  # DCP wraps failures in a BaseException
            cause = getattr(err, "failures", {}).get(0, (err,))[0]
            raise cause from None
    assert not marker.exists()
    # torch's own planner does run it: this is the hole SafeLoadPlanner closes.
    dcp.load({"trainer": io.BytesIO(), "w": torch.ones(2)}, checkpoint_id=str(tmp_path / "dcp"))
    assert marker.exists()


@pytest.mark.parametrize("attack", ["eval", "dotted", "relpath", "not_metadata", "garbage"])
def test_metadata_attacks_refused(tmp_path, attack):
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

    path = tmp_path / ".metadata"
    if attack == "eval":
        data = pickle.dumps(_Payload(tmp_path / "pwned"))
    elif attack == "dotted":
        # A dotted name reaches through an allowed class to something else.
        data = b"\x80\x04\x8c#torch.distributed.checkpoint.metadata\x94\x8c\x13Metadata.__init__\x94\x93\x94."
    elif attack == "relpath":
        md = Metadata({}, storage_data={MetadataIndex("w"): _StorageInfo("../../etc/passwd", 0, 10)})
        data = pickle.dumps(md)
    elif attack == "not_metadata":
        data = pickle.dumps({"state_dict_metadata": {}})
    else:
        data = os.urandom(64)
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        read_metadata_file(path)
    assert "\n" not in str(info.value) and not (tmp_path / "pwned").exists()


def _replace_trainer_state(ck, payload: bytes):
    """Rewrite a sharded checkpoint with `payload` as its pickled trainer state, everything else kept."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    flat = ck / "flat.pt"
    dcp_to_torch_save(str(ck / "dcp"), str(flat))  # our own run: torch's planner is safe on it
    state = torch.load(flat, weights_only=False)
    state["trainer"] = io.BytesIO(payload)
    torch.save(state, flat)
    for f in (ck / "dcp").iterdir():
        f.unlink()
    torch_save_to_dcp(str(flat), str(ck / "dcp"))
    flat.unlink()


@pytest.mark.parametrize("kind", ["code", "damage"])
def test_sharded_trainer_state_refusal_tells_code_from_damage(tmp_path, kind):
    cfg = _sharded_run(tmp_path, steps=1)
    ck = tmp_path / "run" / "checkpoints" / "step-00000001"
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save({"step": 1, "x": _Payload(marker)}, buf)
    payload = buf.getvalue()
    _replace_trainer_state(ck, payload if kind == "code" else payload[: len(payload) // 2])
    with pytest.raises(CheckpointError) as err:
        DiTTrainer(cfg).load_checkpoint(ck)
    msg = str(err.value)
    assert "trainer state refused" in msg and "\n" not in msg and not marker.exists()
    if kind == "code":
        assert "needs code to unpickle" in msg and "system" in msg and "damaged" not in msg
    else:
        assert "is damaged" in msg and "needs code" not in msg
