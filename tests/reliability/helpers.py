"""Tiny runs to damage: a run folder of checkpoints, and tampering that keeps the manifest matching."""

from safetensors.torch import load_file, save_file
from tests.train.trainer_helpers import run_config

from dit_trainer.checkpoint import files as ckpt
from dit_trainer.train import DiTTrainer


def train(tmp_path, steps, keep=0, **sections):
    """Train the tiny run in tmp_path/run up to `steps` (a checkpoint every 2 steps); returns the trainer."""
    trainer = DiTTrainer(run_config(tmp_path, steps, keep=keep, **sections))
    trainer.train()
    return trainer


def step_dir(tmp_path, step):
    return tmp_path / "run" / "checkpoints" / f"step-{step:08d}"


def names(tmp_path):
    return [p.name for p in ckpt.list_checkpoints(tmp_path / "run")]


def edit_weights(folder, name, change):
    """Rewrite `name` (a .safetensors) through `change(dict) -> dict` and re-sign the manifest, as a
    careful forger would: only the content checks can tell."""
    path = folder / name
    save_file(change(load_file(str(path))), str(path))
    ckpt.write_manifest(folder)
