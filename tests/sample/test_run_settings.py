"""What sampling takes from a run: the flags first, then the run's `sample:` section, then the release
defaults; the autoguidance guide named by a step of the run or a path, refused in one line when it
does not fit; the guide and guidance recorded with an FID batch."""

import dataclasses
import math

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from dit_trainer import sample as S
from dit_trainer.checkpoint import save_checkpoint
from dit_trainer.cli import main
from dit_trainer.config import build_config
from dit_trainer.models import get_spec
from dit_trainer.sample.decode import load_decoder, to_images
from dit_trainer.sample.images import save_grid
from dit_trainer.sample.run_settings import guide_location, run_folder, step_of_folder
from dit_trainer.sample.settings import resolve

MODEL = {"name": "DiT-S/4", "input_size": 8, "in_channels": 1, "num_classes": 10, "depth": 1, "hidden_size": 32,
         "num_heads": 2, "learn_sigma": False}


def _cfg(sample=None, **model):
    return build_config({"model": {**MODEL, **model}, "data": {"path": "digits", "digits_size": 8},
                         "sample": sample or {}})


def _weights(cfg, seed):
    torch.manual_seed(seed)
    model = get_spec(cfg.model.name).build_model_fn(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _save(run, step, cfg, seed):
    model = _weights(cfg, seed)
    files = {"ema.safetensors": model.state_dict(), "model.safetensors": model.state_dict(),
             "config.yaml": yaml.safe_dump(cfg.to_dict(), sort_keys=False)}
    return save_checkpoint(run, step, files), model


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run with an early checkpoint (step 1, the guide) and the newest (step 2), recommending autoguidance."""
    folder = tmp_path_factory.mktemp("guided") / "run"
    recommended = {"cfg_scale": 1.0, "guide": "1", "guide_scale": 2.5, "guidance_interval": [0.0, ".inf"],
                   "steps": 3, "sampler": "ddim"}
    _, guide = _save(folder, 1, _cfg(recommended), seed=1)
    _, main_model = _save(folder, 2, _cfg(recommended), seed=2)
    return folder, main_model, guide


def _grid(path):
    return np.asarray(Image.open(path))


def _expected(tmp_path, model, guide, name, **kw):
    cfg = _cfg()
    latents = S.sample_latents(model, cfg, [1, 2], sampler="ddim", steps=3, seed=0, guide=guide, **kw)
    return _grid(save_grid(to_images(latents, *load_decoder(cfg)), tmp_path / name, nrow=8))


def test_the_guide_is_a_step_of_the_run_and_the_run_recommends_it(run, tmp_path):
    folder, model, guide = run
    cli = ["sample", "--ckpt", str(folder), "--class-labels", "1", "2", "--device", "cpu", "--no-progress"]
    assert main([*cli, "--out", str(tmp_path / "flags.png"), "--guide", "1", "--guide-scale", "2.5", "--cfg-scale",
                 "1", "--sampler", "ddim", "--steps", "3"]) == 0
    assert main([*cli, "--out", str(tmp_path / "recommended.png")]) == 0
    want = _expected(tmp_path, model, guide, "want.png", cfg_scale=1.0, guide_scale=2.5)
    assert np.array_equal(_grid(tmp_path / "flags.png"), want)
    assert np.array_equal(_grid(tmp_path / "recommended.png"), want)
    # --guide-scale 1 turns the recommended autoguidance off: the main model alone.
    assert main([*cli, "--out", str(tmp_path / "off.png"), "--guide-scale", "1"]) == 0
    assert np.array_equal(_grid(tmp_path / "off.png"), _expected(tmp_path, model, None, "plain.png", cfg_scale=1.0))
    assert not np.array_equal(want, _grid(tmp_path / "off.png"))


def test_recommended_settings_fill_only_what_the_flags_leave_unset():
    def settings(run_cfg, release=4.0, **given):
        return resolve({"ckpt": "x", **given}, run_cfg.sample, release_cfg_scale=release)

    recommending = _cfg({"cfg_scale": 1.5, "guide": "7", "guide_scale": 2.0, "steps": 12})
    a = settings(recommending, steps=40)
    assert (a.cfg_scale, a.guide, a.guide_scale, a.steps, a.guide_origin) == (1.5, "7", 2.0, 40, "sample.guide")
    b = settings(_cfg())  # a run that recommends nothing: the release's
    assert (b.cfg_scale, b.guide, b.guide_scale, b.steps) == (4.0, None, 1.0, None)
    c = settings(_cfg({"ema_std": 0.1}), release=1.5, ema_std="none")
    assert c.ema_std is None and settings(_cfg({"ema_std": 0.1})).ema_std == 0.1
    assert settings(recommending, guide_scale=1.0).guide is None  # weight 1: the recommended guide is off
    with pytest.raises(Exception, match="^--guide needs --guide-scale"):
        settings(_cfg(), guide="3")


def test_guide_paths_and_run_folders(run, tmp_path):
    from dit_trainer import checkpoint

    folder, _, _ = run
    reader = checkpoint.open(folder / "checkpoints" / "step-00000002")
    assert run_folder(reader).resolve() == folder.resolve() and step_of_folder(reader.folder) == 2
    assert step_of_folder(folder / "phema" / "std0.050-step00001200") == 1200
    resolved = folder.resolve()
    assert guide_location("1", reader, "sample.guide") == (resolved / "checkpoints" / "step-00000001", [])
    assert guide_location("50%", reader, "sample.guide")[0] == resolved / "checkpoints" / "step-00000001"
    assert guide_location(str(folder / "checkpoints"), reader, "--guide")[0] == folder / "checkpoints"
    with pytest.raises(Exception, match="other/run does not exist"):
        guide_location("other/run", reader, "sample.guide")  # a config's path: relative to the run folder
    for bad, words in (("0", "no checkpoint of step 0"), ("150%", r"share must lie in \(0%, 100%\]"),
                       ("phema/std0.5@50%", "std0.5 is no post-hoc EMA width"), ("phema/std0.1@half", "phema/stdS@P%")):
        with pytest.raises(Exception, match=words):
            guide_location(bad, reader, "--guide")


@pytest.mark.parametrize("change, words", [({"num_classes": 7}, "has 7 classes but the main model 10"),
                                            ({"input_size": 4}, "takes 1x4x4 inputs but the main model 1x8x8"),
                                            ({"objective": "transport"}, "objective 'transport'")])
def test_a_guide_that_does_not_fit_is_one_line(run, tmp_path, capsys, change, words):
    folder, _, _ = run
    objective = change.pop("objective", "diffusion")
    cfg = build_config({"objective": objective, "model": {**MODEL, **change}, "data": {"path": "digits", "digits_size": 8}})
    other, _ = _save(tmp_path / "other", 5, cfg, seed=3)
    code = main(["sample", "--ckpt", str(folder), "--class-labels", "1", "--guide", str(other), "--guide-scale", "2",
                 "--device", "cpu", "--no-progress", "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and "\n" not in err and err.startswith("dit sample: error: --guide ")
    assert not (tmp_path / "x.png").exists()


def test_a_missing_guide_step_names_keep_steps(run, tmp_path, capsys):
    folder, _, _ = run
    code = main(["sample", "--ckpt", str(folder), "--class-labels", "1", "--guide", "9", "--guide-scale", "2",
                 "--device", "cpu", "--no-progress", "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "step-00000009 does not exist" in err and "checkpoint.keep_steps" in err


def test_an_fid_batch_records_its_guide_and_refuses_to_resume_another(run, tmp_path, capsys):
    folder, _, _ = run
    npz = tmp_path / "s.npz"
    flags = ["--ckpt", str(folder), "--npz", str(npz), "--num-samples", "4", "--batch-size", "2", "--device", "cpu",
             "--no-progress"]
    assert main(["sample-ddp", *flags]) == 0
    with np.load(npz) as f:
        import json

        settings = json.loads(str(f["settings"]))
    assert settings["guide"].endswith("step-00000001") and settings["guide_scale"] == 2.5
    assert settings["guidance_interval"] == [0.0, math.inf] and settings["cfg_scale"] == 1.0
    assert main(["sample-ddp", *flags, "--guide-scale", "3"]) == 2
    err = capsys.readouterr().err
    assert "guide_scale 2.5 then, 3.0 now" in err


def test_keep_steps_survive_rotation(tmp_path):
    cfg = _cfg()
    for step in (1, 2, 3, 4):
        model = _weights(cfg, step)
        save_checkpoint(tmp_path / "run", step, {"ema.safetensors": model.state_dict(),
                                                  "config.yaml": yaml.safe_dump(cfg.to_dict())},
                        keep=2, keep_steps=(1,))
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step-00000001", "step-00000003", "step-00000004"]


def test_a_post_hoc_ema_not_rebuilt_yet_says_how_to_rebuild_it(run, tmp_path, capsys):
    folder, _, _ = run
    code = main(["sample", "--ckpt", str(folder), "--class-labels", "1", "--ema-std", "0.07", "--device", "cpu",
                 "--no-progress", "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "std0.070-step00000002 does not exist" in err and "dit ema" in err and "--at 2" in err
    assert "\n" not in err


def test_a_recommended_ema_width_must_be_one_a_post_hoc_ema_can_have():
    from dit_trainer.errors import ConfigError

    assert _cfg({"ema_std": 0.05}).sample.ema_std == 0.05
    for bad in (0.0, 0.3, float("nan")):
        with pytest.raises(ConfigError, match=r"^sample.ema_std is .*; it must be a post-hoc EMA width sigma_rel in"):
            _cfg({"ema_std": bad})


def _fake_run(root, length, every):
    """A run folder of `length` steps by name only: its final checkpoint and a snapshot every `every` steps and at
    the end (locating reads names; nothing is loaded)."""
    from dit_trainer.checkpoint.reader import CheckpointReader

    (root / "checkpoints" / f"step-{length:08d}").mkdir(parents=True)
    (root / "phema").mkdir()
    for step in sorted({*range(every, length + 1, every), length}):
        (root / "phema" / f"snapshot-{step:08d}.safetensors").touch()
    return CheckpointReader(folder=root / "checkpoints" / f"step-{length:08d}")


@pytest.mark.parametrize("length, every, guide_step", [(1200, 200, 600), (300, 200, 200), (20, 3, 9)])
def test_a_guide_named_by_its_share_of_the_run_fits_runs_of_any_length(tmp_path, length, every, guide_step):
    from dit_trainer.sample.run_settings import locate
    from dit_trainer.sample.settings import SampleSettings

    reader = _fake_run(tmp_path, length, every)
    run = tmp_path.resolve()
    settings = SampleSettings(str(tmp_path), ema_std=0.05, guide="phema/std0.100@50%", guide_origin="sample.guide",
                              guide_scale=2.0)
    found = locate(settings, reader)
    guide = run / "phema" / f"std0.100-step{guide_step:08d}"
    assert found.main == run / "phema" / f"std0.050-step{length:08d}" and found.guide == guide
    # Neither is there yet: both are rebuilt from the run's snapshots, each at its own step.
    assert found.rebuild == ((run, 0.05, length), (run, 0.1, guide_step))
    checkpoint_guide = dataclasses.replace(settings, guide="50%")
    with pytest.raises(Exception, match=f"step-{length // 2:08d} does not exist; keep the guide's step"):
        locate(checkpoint_guide, reader)
    (tmp_path / "checkpoints" / f"step-{length // 2:08d}").mkdir()
    assert locate(checkpoint_guide, reader).guide == run / "checkpoints" / f"step-{length // 2:08d}"


def test_a_post_hoc_ema_with_no_snapshot_to_rebuild_it_from_says_so(tmp_path):
    from dit_trainer.sample.run_settings import locate
    from dit_trainer.sample.settings import SampleSettings

    reader = _fake_run(tmp_path, 10, 4)  # snapshots at 4, 8, 10
    with pytest.raises(Exception, match=r"^--guide \S+/phema/std0.100-step00000006: .* holds no post-hoc EMA "
                                        r"snapshot of step 6 to rebuild it from"):
        locate(SampleSettings("x", guide=str(tmp_path / "phema" / "std0.100-step00000006"), guide_scale=2.0), reader)
