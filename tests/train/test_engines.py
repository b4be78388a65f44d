"""`backend` picks the engine at the entry points (`build_trainer`, `dit train`); `DiTTrainer` is the
torch engine alone (the MindSpore engine itself is tested in tests_mindspore/, in its own environment)."""

import importlib.util

import pytest

from dit_trainer.config import backend_of, build_config
from dit_trainer.errors import ConfigError
from dit_trainer.train import DiTTrainer, build_trainer


def test_backend_defaults_to_torch_and_is_saved():
    assert build_config({}).backend == "torch"
    assert build_config({"backend": "mindspore"}).to_dict()["backend"] == "mindspore"
    assert backend_of({"backend": "mindspore"}) == "mindspore" and backend_of({}) == "torch"


def test_unknown_backend_is_one_line_error():
    for make in (DiTTrainer, build_trainer, build_config):
        with pytest.raises(ConfigError, match="backend 'jax' is not one of torch, mindspore"):
            make({"backend": "jax"})


def test_dit_trainer_refuses_another_engine_and_names_the_entry_that_picks_it():
    with pytest.raises(ConfigError, match="build_trainer") as err:
        DiTTrainer({"backend": "mindspore", "model_name": "DiT-S/2"})
    assert "\n" not in str(err.value)


@pytest.mark.skipif(importlib.util.find_spec("mindspore") is not None, reason="MindSpore is installed here")
def test_mindspore_backend_without_mindspore_says_how_to_install():
    with pytest.raises(ConfigError, match=r"dit-trainer\[mindspore\]") as err:
        build_trainer({"backend": "mindspore", "model_name": "DiT-S/2"})
    assert "\n" not in str(err.value)
