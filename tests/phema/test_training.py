"""Post-hoc EMA inside training: off by default (the EMA bit for bit, no file); on, it leaves training
untouched, skips where the EMA skips, resumes bit for bit in every checkpoint layout, refuses to resume
profiles a checkpoint never tracked, and its snapshots survive rotation and move aside with an abandoned branch."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from tests.train.trainer_helpers import run_config

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.parallel.ema import ShardedEMA, ema_decay_at
from dit_trainer.train import DiTTrainer

PHEMA = {"phema_stds": [0.05, 0.10], "phema_every": 2, "phema_dtype": "fp32"}


def _cfg(tmp_path, name, steps, sharded=False, save_steps=4, keep=0, **train):
    cfg = run_config(tmp_path, steps, train=train,
                     checkpoint={"save_steps": save_steps, "save_total_limit": keep, "sharded": sharded})
    cfg["output_dir"] = str(tmp_path / name)
    return build_config(cfg)


def _train(tmp_path, name, steps, **kwargs):
    trainer = DiTTrainer(_cfg(tmp_path, name, steps, **kwargs))
    trainer.train()
    return trainer


def _snapshot(path):
    with safe_open(str(path), "pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


def test_off_by_default_the_ema_is_plain_sharded_emas_and_no_file_is_written(tmp_path):
    cfg = _cfg(tmp_path, "off", 5)
    assert cfg.train.phema_stds == []
    trainer = DiTTrainer(cfg)
    assert trainer.phema is None and trainer.update.phema is None and trainer.checkpointer.phema is None
    reference = ShardedEMA(trainer.model_parts)
    trainer.loader = trainer.build_loader()
    for step in range(5):
        trainer.train_step(next(trainer.loader))
        reference.update(ema_decay_at(step, cfg.train.ema_decay, cfg.train.ema_warmup))
    for name, value in reference.shadow.items():
        assert torch.equal(trainer.ema.shadow[name], value), name
    folder = trainer.save_checkpoint()
    assert not (folder / "phema.safetensors").exists() and "phema" not in (folder / "manifest.json").read_text()
    assert not (tmp_path / "off" / "phema").exists()


def test_tracking_leaves_the_weights_and_ema_of_training_untouched(tmp_path):
    off, on = _train(tmp_path, "off", 4), _train(tmp_path, "on", 4, **PHEMA)
    for which in ("model.safetensors", "ema.safetensors"):
        a = load_file(str(tmp_path / "off" / "checkpoints" / "step-00000004" / which))
        b = load_file(str(tmp_path / "on" / "checkpoints" / "step-00000004" / which))
        assert all(torch.equal(a[k], b[k]) for k in a), which
    saved = load_file(str(tmp_path / "on" / "checkpoints" / "step-00000004" / "phema.safetensors"))
    assert sorted({k.partition("/")[0] for k in saved}) == ["std0.050", "std0.100"]
    assert all(torch.equal(saved[f"{label}/{n}"], t) for label, sd in on.phema.state_dict().items() for n, t in sd.items())
    assert off.phema is None


@pytest.mark.parametrize("first,second", [(False, False), (True, True), (False, True)],
                         ids=["full", "sharded", "full-then-sharded"])
def test_resume_is_bitwise_the_uninterrupted_run(tmp_path, first, second):
    whole = _train(tmp_path, "whole", 8, sharded=second, **PHEMA)
    _train(tmp_path, "parts", 4, sharded=first, **PHEMA)
    resumed = _train(tmp_path, "parts", 8, sharded=second, **PHEMA)
    assert resumed.step == 8
    for label, profile in whole.phema.state_dict().items():
        for name, value in profile.items():
            assert torch.equal(resumed.phema.state_dict()[label][name], value), (label, name)
    for name, value in whole.ema.shadow.items():
        assert torch.equal(resumed.ema.shadow[name], value), name
    for step in (2, 4, 6, 8):
        meta_a, a = _snapshot(tmp_path / "whole" / "phema" / f"snapshot-{step:08d}.safetensors")
        meta_b, b = _snapshot(tmp_path / "parts" / "phema" / f"snapshot-{step:08d}.safetensors")
        assert meta_a == meta_b and sorted(a) == sorted(b)
        assert all(torch.equal(a[k], b[k]) for k in a), step


def test_resuming_profiles_a_checkpoint_never_tracked_is_one_line(tmp_path):
    _train(tmp_path, "run", 2, save_steps=2)
    with pytest.raises(ConfigError) as err:
        _train(tmp_path, "run", 4, save_steps=2, **PHEMA)
    text = str(err.value)
    assert "\n" not in text and "step-00000002" in text and "no phema.safetensors" in text
    assert "train.phema_stds" in text and "another output_dir" in text
    _train(tmp_path, "other", 2, save_steps=2, **PHEMA)
    with pytest.raises(ConfigError, match=r"tracks the post-hoc EMA widths \[0.05, 0.1\]"):
        _train(tmp_path, "other", 4, save_steps=2, **{**PHEMA, "phema_stds": [0.05]})
    assert _train(tmp_path, "other", 4, save_steps=2).step == 4  # turned off: the saved profiles stay unread


def test_snapshots_survive_rotation_and_an_abandoned_branch_moves_them_aside(tmp_path):
    _train(tmp_path, "run", 6, save_steps=2, keep=1, **{**PHEMA, "phema_every": 0})
    root = tmp_path / "run"
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["step-00000006"]
    assert sorted(p.name for p in (root / "phema").iterdir()) == [f"snapshot-{s:08d}.safetensors" for s in (2, 4, 6)]
    _train(tmp_path, "branch", 6, save_steps=2, **PHEMA)
    cfg = _cfg(tmp_path, "branch", 4, save_steps=2, **PHEMA)
    cfg.checkpoint.resume_from = "2"
    DiTTrainer(cfg).train()
    phema = tmp_path / "branch" / "phema"
    assert sorted(p.name for p in phema.glob("snapshot-*")) == [f"snapshot-{s:08d}.safetensors" for s in (2, 4)]
    (aside,) = phema.glob("abandoned-*")
    assert sorted(p.name for p in aside.iterdir()) == [f"snapshot-{s:08d}.safetensors" for s in (4, 6)]


class _Batches:
    """Fixed batches; `before(i)` runs before the i-th (0-based) is handed out."""

    def __init__(self, batches, before):
        self.batches, self.i, self.before = batches, 0, before

    def __next__(self):
        self.before(self.i)
        self.i += 1
        return self.batches[self.i - 1]

    def state_dict(self):
        return {}


@pytest.mark.parametrize("mode", ["host", "device"])
def test_a_skipped_step_leaves_the_profiles_on_both_update_paths(tmp_path, mode):
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 4, 8, 8, generator=g), torch.arange(4)) for _ in range(5)]
    # Step 3: by then every profile differs from the weights, so an update that was not skipped would move it.
    batches[2][0][1, 0, 0, 0] = float("nan")
    cfg = _cfg(tmp_path, mode, 5, skip_nonfinite_steps=True, **PHEMA)
    trainer = DiTTrainer(cfg)
    trainer.update.on_device = mode == "device"  # the fused AdamW masks on a CPU too (tests/train/test_update.py)
    seen = []
    trainer.loader = _Batches(batches, lambda i: seen.append(
        {label: {n: t.clone() for n, t in sd.items()} for label, sd in trainer.phema.state_dict().items()}))
    trainer.train()
    assert trainer.skipped_steps == 1
    after_2, after_3, after_4 = seen[2], seen[3], seen[4]
    for label in after_2:
        assert all(torch.equal(after_3[label][n], t) for n, t in after_2[label].items()), label
        assert not torch.equal(after_4[label]["x_embedder.proj.weight"], after_3[label]["x_embedder.proj.weight"])
