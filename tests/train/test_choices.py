"""`train.compile auto`: compiled only where the run repays the compile."""

import pytest
import torch

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.devices import COMPILE_MIN_PARAMS
from dit_trainer.train.choices import AUTO_COMPILE_MIN_STEPS, resolve_compile


def _model(n_params):
    return torch.nn.Linear(n_params, 1, bias=False)  # n_params weights


@pytest.mark.parametrize("choice,expected", [("true", True), ("false", False), (True, True), (False, False)])
def test_explicit_choice_wins(choice, expected):
    cfg = build_config({"train": {"compile": choice, "max_steps": 1}})
    assert cfg.train.compile == str(choice).lower()
    assert resolve_compile(cfg, _model(4), torch.device("cpu"), has_plan=True) is expected


def test_auto_compiles_only_long_runs_of_big_models(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)
    big, small = _model(COMPILE_MIN_PARAMS), _model(COMPILE_MIN_PARAMS - 1)
    long_run = build_config({"train": {"max_steps": AUTO_COMPILE_MIN_STEPS}})
    short_run = build_config({"train": {"max_steps": AUTO_COMPILE_MIN_STEPS - 1}})
    assert long_run.train.compile == "auto"
    cpu = torch.device("cpu")
    assert resolve_compile(long_run, big, cpu, has_plan=True)
    assert not resolve_compile(short_run, big, cpu, has_plan=True)
    assert not resolve_compile(long_run, small, cpu, has_plan=True)
    assert not resolve_compile(long_run, big, cpu, has_plan=False)  # a model family without a plan
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert not resolve_compile(long_run, big, cpu, has_plan=True)  # no C compiler for inductor


def test_bad_choice_is_one_line():
    with pytest.raises(ConfigError, match="train.compile 'sometimes' is not one of auto|true|false"):
        build_config({"train": {"compile": "sometimes"}})


def test_trainer_records_the_decision(tmp_path):
    from dit_trainer.train import DiTTrainer

    trainer = DiTTrainer({"output_dir": str(tmp_path), "model": {"name": "DiT-S/2", "input_size": 8, "depth": 1,
                          "hidden_size": 32, "num_heads": 2, "num_classes": 4}, "train": {"max_steps": 5}})
    assert trainer.cfg.train.compile == "false"  # auto: five steps of a tiny model stay eager


@pytest.mark.parametrize("compile_,ac,expected", [("true", "none", 0.6), ("true", "selective", None),
                                                  ("false", "none", None)])
def test_activation_budget_applies_to_compiled_blocks_without_ac(tmp_path, compile_, ac, expected):
    from torch._functorch import config as functorch_config

    from dit_trainer.train import DiTTrainer

    outside = functorch_config.activation_memory_budget
    trainer = DiTTrainer({"output_dir": str(tmp_path), "model": {"name": "DiT-S/2", "input_size": 8, "depth": 1,
                          "hidden_size": 32, "num_heads": 2, "num_classes": 4},
                          "train": {"max_steps": 5, "compile": compile_, "activation_checkpointing": ac,
                                    "activation_memory_budget": 0.6}})
    with trainer.forward_backward.forward_context():
        # Nothing is compiled yet: the blocks' graphs are partitioned inside their first forward.
        assert functorch_config.activation_memory_budget == (outside if expected is None else expected)
    assert functorch_config.activation_memory_budget == outside


@pytest.mark.parametrize("budget", [0, 1.5])
def test_activation_budget_outside_0_1_is_refused(budget):
    with pytest.raises(ConfigError, match=r"train.activation_memory_budget is .*; it must be a fraction in \(0, 1\]"):
        build_config({"train": {"activation_memory_budget": budget}})


def test_build_config_decides_auto_compile_from_the_model_on_the_meta_device(monkeypatch):
    from dit_trainer.train.choices import RuntimeChoices

    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)
    long_xl = {"model": {"name": "DiT-XL/2"}, "train": {"max_steps": AUTO_COMPILE_MIN_STEPS}}
    assert build_config(long_xl, runtime=RuntimeChoices()).train.compile == "true"  # 675M parameters, never allocated
    short_xl = {**long_xl, "train": {"max_steps": AUTO_COMPILE_MIN_STEPS - 1}}
    assert build_config(short_xl, runtime=RuntimeChoices()).train.compile == "false"
    assert build_config(long_xl).train.compile == "auto"  # without the runtime step the choice stays open
