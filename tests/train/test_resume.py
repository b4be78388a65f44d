"""train.resume: which checkpoint a run resumes from, and refusing one it cannot continue: a bare step name,
another objective, and the lines a resume prints."""

import subprocess
import sys

import pytest
import yaml
from tests.train.trainer_helpers import run_config

from dit_trainer.config import build_config, config_yaml
from dit_trainer.errors import ConfigError
from dit_trainer.train import DiTTrainer
from dit_trainer.train.resume import check_same_model


def _cfg(tmp_path, steps, **sections):
    return run_config(tmp_path, steps, keep=0, **sections)


def test_bare_step_name_and_the_steps_that_exist(tmp_path):
    DiTTrainer(_cfg(tmp_path, 4)).train()
    with pytest.raises(ConfigError) as err:
        DiTTrainer(_cfg(tmp_path, 6, checkpoint={"resume_from": "step-00000003"})).maybe_resume()
    assert "it holds steps 2, 4" in str(err.value) and "\n" not in str(err.value)
    trainer = DiTTrainer(_cfg(tmp_path, 6, checkpoint={"resume_from": "step-00000002"}))
    assert trainer.maybe_resume().name == "step-00000002" and trainer.step == 2


def test_resume_says_where_from(tmp_path, capsys):
    DiTTrainer(_cfg(tmp_path, 2)).train()
    capsys.readouterr()
    DiTTrainer(_cfg(tmp_path, 3)).train()
    assert f"resuming from step 2 ({tmp_path / 'run' / 'checkpoints' / 'step-00000002'})" in capsys.readouterr().out


def _checkpoint(tmp_path, **sections):
    folder = tmp_path / "step-00000002"
    folder.mkdir()
    (folder / "config.yaml").write_text(config_yaml(build_config(_cfg(tmp_path, 2, **sections))))
    return folder


@pytest.mark.parametrize("old,new,key", [
    ({}, {"objective": "transport"}, "objective diffusion but this run sets transport"),
    ({"diffusion": {"noise_schedule": "linear"}}, {"diffusion": {"noise_schedule": "cosine"}}, "diffusion.noise_schedule"),
    ({"objective": "transport"}, {"objective": "transport", "transport": {"prediction": "noise"}}, "transport.prediction"),
])
def test_another_objective_is_refused(tmp_path, old, new, key):
    folder = _checkpoint(tmp_path, **old)
    with pytest.raises(ConfigError) as err:
        check_same_model(build_config(_cfg(tmp_path, 4, **new)), folder)
    assert key in str(err.value) and "output_dir" in str(err.value) and "\n" not in str(err.value)


def test_changed_optimizer_and_sampling_keys_still_resume(tmp_path):
    folder = _checkpoint(tmp_path)
    check_same_model(build_config(_cfg(tmp_path, 4, optim={"lr": 3e-4}, logging={"sample_steps": 10})), folder)
    # A config written before the objective existed is a diffusion run.
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    del saved["objective"], saved["transport"]
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    check_same_model(build_config(_cfg(tmp_path, 4)), folder)


def test_trainer_refuses_another_schedule(tmp_path):
    DiTTrainer(_cfg(tmp_path, 2)).train()
    with pytest.raises(ConfigError, match="diffusion.noise_schedule linear but this run sets cosine"):
        DiTTrainer(_cfg(tmp_path, 4, diffusion={"noise_schedule": "cosine"})).train()


def test_fallback_warning_is_one_line():
    code = "from dit_trainer.train.resume import warn; warn('skipping checkpoint step-00000004: damaged')"
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert err == "warning: skipping checkpoint step-00000004: damaged\n"
