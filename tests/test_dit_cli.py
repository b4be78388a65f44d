"""`dit`'s entry point: a command that joined a process group leaves it when it has finished."""

import torch.distributed as dist
import yaml

import dit_trainer.train
from dit_trainer.cli import main


class _JoinsAGroup:
    """Stands in for a trainer: joins a one-rank gloo group as torchrun's ranks do, then trains."""

    is_main = True
    step = 1

    def train(self):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return {}


def test_train_leaves_the_process_group_it_joined(tmp_path, monkeypatch):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": "DiT-S/2"}, "output_dir": str(tmp_path / "run")}))
    monkeypatch.setattr(dit_trainer.train, "build_trainer", lambda settings: _JoinsAGroup())
    try:
        assert main(["train", "--config", str(config)]) == 0
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
