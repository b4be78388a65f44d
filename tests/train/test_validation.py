"""Validation as text-to-image training does it: the loss at 8 fixed noise levels on held-out samples (the
objective's levels, unit weights, one fixed noise per sample), which leaves training's randomness alone and
resumes to the same numbers; a grid of held-out captions or prompts; class-conditional runs log as before
unless they ask."""

import json
import shutil

import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.objective import build_objective
from dit_trainer.train import DiTTrainer
from dit_trainer.train.validation import VAL_LEVELS
from tests.parallel._common import TinyCaptions, TinyLatents, read_losses, tiny_config


def _records(run, key):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if key in r}


def _pixart(out, **sections):
    sections.setdefault("data", {}).setdefault("val_split", 8)
    return tiny_config(out, kind="pixart", train={"max_steps": 2}, checkpoint={"save_steps": 1, "save_total_limit": 0},
                       **sections)


def test_levels_run_from_the_data_to_the_noisiest_for_every_objective():
    from dit_trainer.repa.objective import AlignedObjective

    for objective, first, last in (("diffusion", 0, 875), ("transport", 1.0, 0.125)):
        obj = build_objective(build_config({"objective": objective, "model": {"learn_sigma": False}}))
        times = obj.validation_times(VAL_LEVELS)
        assert len(times) == 8 and float(times[0]) == first and float(times[-1]) == last
        sigma = obj.noise_level(times).double()
        assert torch.all(sigma[1:] > sigma[:-1])  # ever noisier
        noise = torch.randn(8, 4, 2, 2)
        draws = obj.draws_at(times, noise)
        assert torch.equal(draws["noise"], noise) and torch.equal(draws["t"].double(), times.double())
        aligned = AlignedObjective(obj, 0.5)
        assert torch.equal(aligned.validation_times(VAL_LEVELS), times)
        # The plain output is scored without REPA's term (the validation calls the model without its projector).
        x = torch.randn(8, 4, 2, 2)
        assert torch.equal(aligned.validation_loss(x, x, draws), obj.loss(x, x, draws))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny PixArt, 8 of TinyCaptions' 64 samples held out: validated at every step's checkpoint (the default
    cadence), not validated, and the first one's step-1 checkpoint resumed to step 2."""
    root = tmp_path_factory.mktemp("validation")
    DiTTrainer(_pixart(root / "val"), dataset=TinyCaptions()).train()
    DiTTrainer(_pixart(root / "plain", eval={"val_every": 0}), dataset=TinyCaptions()).train()
    shutil.copytree(root / "val" / "checkpoints" / "step-00000001", root / "resumed" / "checkpoints" / "step-00000001")
    trainer = DiTTrainer(_pixart(root / "resumed"), dataset=TinyCaptions())
    trainer.train()
    return root, trainer


def test_validation_leaves_training_alone_and_resumes_to_the_same_numbers(runs):
    root, _ = runs
    val = _records(root / "val", "val_loss")
    assert sorted(val) == [1, 2] and all(len([k for k in r if k.startswith("val_loss_t")]) == 8 for r in val.values())
    # Measuring draws nothing from the step's generator or the RNGs: the same training losses without it.
    assert read_losses(root / "val") == read_losses(root / "plain") and not _records(root / "plain", "val_loss")
    resumed = _records(root / "resumed", "val_loss")
    assert sorted(resumed) == [2] and resumed[2] == val[2]  # fixed levels and noise: the same number after a resume
    assert val[1]["val_loss"] != val[2]["val_loss"]  # it moves with the weights


def test_the_loss_at_each_level_by_hand(runs):
    """Level j: the release's `training_losses` at timestep j * 1000 / 8 over the held-out samples with the
    noise drawn once for all of them, averaged; the mean of the levels is val_loss."""
    root, trainer = runs
    from dit_trainer.train.validation import NOISE_SEED

    held, index = trainer.validation.held, trainer.held_out_index
    assert len(held) == 8 and not set(index.tolist()) & set(trainer.loader.sampler.kept.tolist())
    assert torch.equal(held.x, TinyCaptions().x[index])
    noise = torch.randn(held.x.shape, generator=torch.Generator().manual_seed(NOISE_SEED))
    model, diffusion, cond = trainer.model.eval(), trainer.objective.diffusion, held.cond
    levels = []
    with torch.no_grad():
        for j in range(8):
            t = torch.full((8,), j * 1000 // 8)
            levels.append(float(diffusion.training_losses(model, held.x, t, model_kwargs=cond, noise=noise)["loss"].mean()))
    got = trainer.validation.measure(trainer.model)
    assert [got[f"val_loss_t{j}"] for j in range(8)] == pytest.approx(levels, rel=1e-5)
    assert got["val_loss"] == pytest.approx(sum(levels) / 8, rel=1e-5)
    assert {"step": 2, **got} == _records(root / "resumed", "val_loss")[2]  # the step-2 weights, measured again


def test_class_runs_log_as_before_and_validate_when_asked(tmp_path):
    trainer = DiTTrainer(tiny_config(tmp_path / "dit", train={"max_steps": 2}), dataset=TinyLatents())
    trainer.train()
    assert trainer.cfg.data.val_split is None and trainer.validation.held is None
    assert "held_out" not in trainer.loader.state_dict() and not _records(tmp_path / "dit", "val_loss")
    # Any objective: SiT's transport, 4 samples held out, validated at its checkpoints (every 5 steps).
    sit = tiny_config(tmp_path / "sit", kind="sit", train={"max_steps": 5}, data={"val_split": 4})
    DiTTrainer(sit, dataset=TinyLatents()).train()
    val = _records(tmp_path / "sit", "val_loss")
    assert sorted(val) == [5] and 0 < val[5]["val_loss_t0"] and val[5]["val_loss"] > 0


@pytest.mark.parametrize("sections,message", [
    ({"eval": {"val_every": 2}}, "eval.val_every 2: the validation loss needs held-out data"),
    ({"logging": {"image_steps": 2}}, "draws logging.validation_prompts or held-out captions"),
])
def test_what_has_no_held_out_data_is_one_line(tmp_path, sections, message):
    cfg = tiny_config(tmp_path / "run", kind="pixart", train={"max_steps": 1}, **sections)
    with pytest.raises(ConfigError) as err:
        DiTTrainer(cfg, dataset=TinyCaptions()).train()  # 64 captions: fewer than 100 hold none out by default
    assert message in str(err.value) and "\n" not in str(err.value)


def test_clip_score_is_for_text_models():
    from dit_trainer.condition import ClassCondition
    from dit_trainer.train.eval_prompts import PromptSet

    cfg = build_config({"eval": {"every": 1, "clip_model": "clip"}})
    with pytest.raises(ConfigError, match="eval.clip_model scores samples against their captions"):
        PromptSet.for_run(cfg, ClassCondition(10), None, "cpu")


def test_prompts_are_for_text_models(tmp_path):
    (tmp_path / "prompts.txt").write_text("a cat\n")
    cfg = tiny_config(tmp_path / "run", train={"max_steps": 1}, logging={"validation_prompts": str(tmp_path / "prompts.txt")})
    with pytest.raises(ConfigError, match="logging.validation_prompts is for text-conditioned models"):
        DiTTrainer(cfg, dataset=TinyLatents()).train()


def test_the_grid_draws_held_out_captions_and_prompts(runs, tmp_path):
    from PIL import Image

    from dit_trainer.train.validation import grid_rows
    from tests.text_helpers import save_tiny_t5

    _, trainer = runs
    # No prompts: the first 8 held-out captions, a row each (guided against the null caption).
    trainer.cfg.logging.image_steps, trainer.cfg.logging.sample_steps = 1, 2
    trainer.validation.rows = grid_rows(trainer.cfg, trainer.condition, trainer.validation.held, trainer.device, True)
    assert torch.equal(trainer.validation.rows["text_embeds"], trainer.validation.held.cond["text_embeds"][:8])
    with Image.open(trainer.save_sample_grid(tmp_path / "held.png", per_class=2)) as im:
        assert im.size == (2 + 2 * 10, 2 + 8 * 10)  # 8 rows of 2 samples, 8x8 previews, 2 px apart
    # Prompts: encoded once by the run's text encoder (a tiny T5 as wide as the captions).
    trainer.cfg.data.text_encoder = save_tiny_t5(tmp_path / "t5", hidden=TinyCaptions.width)
    trainer.cfg.data.text_max_length = TinyCaptions.tokens  # what captioned data sets: the null caption's length
    (tmp_path / "prompts.txt").write_text("a cat\n\ntwo blue dogs\n  a digit \n")
    trainer.cfg.logging.validation_prompts = str(tmp_path / "prompts.txt")
    rows = grid_rows(trainer.cfg, trainer.condition, None, trainer.device, True)
    assert rows["text_embeds"].shape == (3, TinyCaptions.tokens, TinyCaptions.width)
    trainer.validation.rows = rows
    with Image.open(trainer.save_sample_grid(tmp_path / "prompts.png")) as im:
        assert im.size == (2 + 10, 2 + 3 * 10)


def test_fid_samples_held_out_captions_against_their_images_with_clip_score(runs, tmp_path, monkeypatch):
    """FID of a text-conditioned model: its held-out captions sampled (each as often, in chunks of fixed seeds),
    against those captions' images; with a local CLIP folder, their CLIP score too."""
    import copy
    import dataclasses

    import numpy as np

    from dit_trainer.train.eval_during_training import TrainingFID
    from tests.text_helpers import WORDS, save_tiny_clip_model

    _, trainer = runs
    cfg = copy.deepcopy(trainer.cfg)
    cfg.output_dir = str(tmp_path / "run")
    cfg.eval.every, cfg.eval.num_samples, cfg.eval.sample_batch_size, cfg.eval.sample_steps = 1, 6, 4, 2
    cfg.eval.network, cfg.eval.clip_model = "digits", save_tiny_clip_model(tmp_path / "clip")
    held = trainer.validation.held
    monkeypatch.setattr(trainer, "cfg", cfg)
    # TinyCaptions keeps encodings only: CLIP score needs the captions' text, which one line asks for.
    with pytest.raises(ConfigError, match="needs the held-out captions' text") as err:
        TrainingFID.for_run(trainer)
    assert "\n" not in str(err.value)
    trainer.validation.prompt_set = dataclasses.replace(held, captions=[f"a {w}" for w in WORDS[:len(held)]])
    fid = TrainingFID.for_run(trainer)
    a = fid.measure(trainer.ema_model(), trainer.objective, 2)
    b = fid.measure(trainer.ema_model(), trainer.objective, 2)
    assert a["fid"] == b["fid"] > 0 and a["clip_score"] == b["clip_score"] and 0 <= a["clip_score"] <= 100
    record = json.loads((tmp_path / "run" / "eval" / "reference.json").read_text())
    assert record["held_out"] == 8 and record["network"] == "digits"
    with np.load(tmp_path / "run" / "eval" / "reference.npz") as z:
        assert z["features"].shape == (8, 64)  # the 8 held-out images, not the training set


def test_an_objective_without_fixed_levels_is_one_line_when_asked():
    import contextlib

    from dit_trainer.objective import Objective
    from dit_trainer.parallel.dims import ParallelDims
    from dit_trainer.train.validation import HeldOut, ValidationLoss

    held = HeldOut(torch.zeros(2, 4, 2, 2), {}, "two samples")
    with pytest.raises(ConfigError, match="has no fixed noise levels to validate at; set eval.val_every 0") as err:
        ValidationLoss(held, Objective(), ParallelDims(), "cpu", contextlib.nullcontext, 2, 1)
    assert "\n" not in str(err.value)
