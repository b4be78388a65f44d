"""Large-DiT trains under the transport objective through the one trainer (no family-specific code)."""

import torch

from dit_trainer.train import DiTTrainer


def test_large_dit_learns_digits_as_transport(tmp_path):
    torch.set_num_threads(1)
    cfg = {
        "output_dir": str(tmp_path), "objective": "transport",
        "model": {"name": "LargeDiT-600M/2", "input_size": 16, "in_channels": 1, "num_classes": 10, "dim": 96,
                  "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "qk_norm": True, "learn_sigma": False},
        "data": {"path": "digits", "digits_size": 16, "num_workers": 0, "random_flip": False},
        "optim": {"lr": 1e-3, "warmup_steps": 5},
        "train": {"max_steps": 60, "global_batch_size": 32, "mixed_precision": "fp32", "device": "cpu"},
        "checkpoint": {"save_steps": 1000},
        "logging": {"log_steps": 1, "progress": False, "tensorboard": False},
    }
    trainer = DiTTrainer(cfg)
    trainer.train()
    import json

    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 60
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.7 * first, (first, last)
