"""A REPA run's projector stays behind: exports to diffusers and ppdiffusers, and sampling, carry the
denoiser's EMA weights only, bit for bit; a run started from its weights keeps or drops the projector."""

import pytest
import torch
from safetensors.torch import load_file
from tests.repa._tiny import TINY_REPA
from tests.repa.test_data import _extract

from dit_trainer.convert import convert
from dit_trainer.repa.attach import drop_projector
from dit_trainer.sample.loading import load_model
from dit_trainer.train import DiTTrainer

pytest.importorskip("diffusers")

MODEL = {"name": "DiT-S/2", "depth": 2, "hidden_size": 32, "num_heads": 2}


def _cfg(out, data, **sections):
    cfg = {"output_dir": str(out), "model": dict(MODEL), "data": {"path": str(data), "num_workers": 0},
           "train": {"global_batch_size": 4, "max_steps": 2, "device": "cpu", "mixed_precision": "fp32"},
           "checkpoint": {"save_steps": 2}, "logging": {"log_steps": 1, "progress": False, "tensorboard": False},
           "repa": dict(TINY_REPA)}
    cfg.update(sections)
    return cfg


@pytest.fixture(scope="module")
def run(tiny_latent_shards, tmp_path_factory):
    shards, vae = tiny_latent_shards
    root = tmp_path_factory.mktemp("repa_export")
    data = _extract(shards.parent / "images", vae, root / "shards", "--keep-images")
    DiTTrainer(_cfg(root / "run", data)).train()
    step = root / "run" / "checkpoints" / "step-00000002"
    ema = load_file(str(step / "ema.safetensors"))
    assert any(k.startswith("repa_projector.") for k in ema)
    return root, step, ema


@pytest.mark.parametrize("fmt", ["diffusers", "ppdiffusers"])
def test_exports_carry_the_denoiser_only(run, fmt):
    root, step, ema = run
    out, bundle = convert("ours", step, fmt, root / fmt)
    assert not any("repa" in k for k in bundle.state_dict)
    back, _ = convert(fmt, out, "ours", root / f"{fmt}_back", convention="release")
    again = load_file(str(back / "ema.safetensors"))
    want = drop_projector(ema)
    assert again.keys() == want.keys()
    assert all(torch.equal(again[k], want[k]) for k in want)


def test_sampling_loads_no_projector(run):
    _, step, ema = run
    model, cfg = load_model(step)
    assert not hasattr(model, "repa_projector") and not cfg.repa.enabled
    state = model.state_dict()
    assert state.keys() == drop_projector(ema).keys()
    assert all(torch.equal(state[k], ema[k]) for k in state)


@pytest.mark.parametrize("repa", [True, False])
def test_a_run_from_repa_weights_keeps_or_drops_the_projector(run, repa):
    root, step, ema = run
    cfg = _cfg(root / f"from_{repa}", root / "shards", model={**MODEL, "weights_path": str(step)})
    if not repa:
        cfg.pop("repa")
    trainer = DiTTrainer(cfg)
    state = trainer.model.state_dict()
    assert any(k.startswith("repa_projector.") for k in state) == repa
    assert all(torch.equal(state[k], ema[k]) for k in state)  # the projector too, where there is one
