"""The training weights of a sharded checkpoint (dcp/ + ema.safetensors, no model.safetensors): read from dcp/,
never the EMA in their place; and no torch warning at each 1-process DCP save or load."""

import argparse
import warnings

import pytest
import torch
from safetensors.torch import save_file
from tests.train.trainer_helpers import tiny_config

from dit_trainer import checkpoint
from dit_trainer.checkpoint import load_weights
from dit_trainer.checkpoint.sharded import _single_process_quiet, load_sharded_model
from dit_trainer.errors import CheckpointError
from dit_trainer.sample.cli import load_sampling_model
from dit_trainer.train import DiTTrainer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 1-process sharded run of 3 steps at a high EMA rate, so model and EMA differ; its trainer and folder."""
    out = tmp_path_factory.mktemp("sharded") / "run"
    cfg = tiny_config(out, train={"max_steps": 3, "global_batch_size": 4, "ema_decay": 0.5}, optim={"lr": 1e-2},
                      checkpoint={"sharded": True, "save_steps": 3})
    trainer = DiTTrainer(cfg, dataset=torch.utils.data.TensorDataset(torch.randn(8, 4, 8, 8), torch.arange(8) % 10))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    trainer.dcp_warnings = [str(w.message) for w in caught if "single process" in str(w.message)]
    return trainer, out


def _args(weights):
    return argparse.Namespace(weights=weights, model=None, image_size=None, num_classes=1000)


def test_weights_model_reads_dcp_not_the_ema(run):
    trainer, out = run
    step = str(checkpoint.open(out).path)
    assert step.endswith("checkpoints/step-00000003") and not (out / "checkpoints" / "step-00000003" /
                                                                "model.safetensors").exists()
    model, _ = load_sampling_model(_args("model"), step)
    ema, _ = load_sampling_model(_args("ema"), step)
    trained, averaged = trainer.model.state_dict(), trainer.ema.state_dict()
    assert any(not torch.equal(trained[k], averaged[k]) for k in trained)
    for key, value in model.state_dict().items():
        assert torch.equal(value, trained[key]), key
        assert torch.equal(ema.state_dict()[key], averaged[key]), key


def test_load_weights_never_gives_the_ema_for_model(run, tmp_path):
    _, out = run
    with pytest.raises(CheckpointError, match=r"step-00000003 is a sharded checkpoint: its training weights are in "
                                              r"dcp/.*load_sharded_model"):
        load_weights(out, prefer_ema=False)
    # A converted folder keeps the EMA alone; a DiT .pt without its "model" entry likewise.
    (tmp_path / "conv").mkdir()
    save_file({"w": torch.zeros(2)}, str(tmp_path / "conv" / "ema.safetensors"))
    with pytest.raises(CheckpointError, match="holds only ema.safetensors"):
        load_weights(tmp_path / "conv", prefer_ema=False)
    torch.save({"ema": {"w": torch.zeros(2)}}, tmp_path / "ema_only.pt")
    with pytest.raises(CheckpointError, match="EMA weights only"):
        load_weights(tmp_path / "ema_only.pt", prefer_ema=False)
    assert torch.equal(load_weights(tmp_path / "ema_only.pt")["w"], torch.zeros(2))


def test_damaged_shard_is_refused(run, tmp_path):
    import shutil

    _, out = run
    step = tmp_path / "step-00000003"
    shutil.copytree(out / "checkpoints" / "step-00000003", step)
    shard = next(p for p in (step / "dcp").iterdir() if p.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    model, _ = load_sampling_model(_args("ema"), str(step))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        load_sharded_model(step, model)


def test_single_process_dcp_is_quiet_other_warnings_stay(run):
    trainer, _ = run
    assert trainer.dcp_warnings == []  # the save at step 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _single_process_quiet():
            warnings.warn("torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to "
                          "load in a single process.", UserWarning)
            warnings.warn("something else", UserWarning)
    assert [str(w.message) for w in caught] == ["something else"]
