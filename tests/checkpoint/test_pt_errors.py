"""A .pt that does not load says why: damaged (re-download/restore) or needing code (convert), in one line."""

import io
import os

import pytest
import torch

from dit_trainer.checkpoint import load_pt, load_weights
from dit_trainer.errors import CheckpointError


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _pt(**extra) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(64), **extra}, buf)
    return buf.getvalue()


def _refused(path, needle):
    with pytest.raises(CheckpointError, match=needle) as info:
        load_pt(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    return str(info.value)


def test_truncated_is_damaged_not_a_format_question(tmp_path):
    path = tmp_path / "DiT.pt"
    raw = _pt()
    path.write_bytes(raw[: len(raw) // 2])
    msg = _refused(path, "damaged or truncated.*re-download it or restore it from another checkpoint")
    assert "safetensors" not in msg
    with pytest.raises(CheckpointError, match="damaged or truncated"):
        load_weights(path)  # what dit sample, dit convert and model.weights_path go through


def test_garbled_global_name_is_damage(tmp_path):
    # A flipped byte in a tensor's rebuild function reads as a refused "global" to torch.
    path = tmp_path / "flip.pt"
    path.write_bytes(_pt().replace(b"_rebuild_tensor_v2", b"_rebuild_tensor_v3"))
    _refused(path, "damaged or truncated")


def test_code_in_a_foreign_file_is_convert_advice(tmp_path):
    path = tmp_path / "evil.pt"
    path.write_bytes(_pt(hook=_Payload()))
    _refused(path, r"needs code to unpickle \((posix|nt)\.system\), which a weights-only load refuses; "
                   "if you trust its source, convert it to safetensors")


def test_code_in_our_checkpoint_says_use_another(tmp_path):
    step = tmp_path / "checkpoints" / "step-00000020"
    step.mkdir(parents=True)
    (step / "trainer_state.pt").write_bytes(_pt(hook=_Payload()))
    _refused(step / "trainer_state.pt", r"needs code to unpickle.*never writes code.*use another checkpoint")


@pytest.mark.parametrize("raw,needle", [(b"", "is empty"), (b"<html>404</html>", "is not a torch file")])
def test_empty_or_other_file(tmp_path, raw, needle):
    path = tmp_path / "x.pt"
    path.write_bytes(raw)
    _refused(path, needle)
