"""`backend` picks the engine inside DiTTrainer (the MindSpore engine itself is tested in
tests_mindspore/, in its own environment)."""

import importlib.util

import pytest

from dit_trainer.config import config_from_dict
from dit_trainer.errors import ConfigError
from dit_trainer.train import DiTTrainer


def test_backend_defaults_to_torch_and_is_saved():
    assert config_from_dict({}).backend == "torch"
    assert config_from_dict({"backend": "mindspore"}).to_dict()["backend"] == "mindspore"


def test_unknown_backend_is_one_line_error():
    with pytest.raises(ConfigError, match="backend 'jax' is not one of torch, mindspore"):
        DiTTrainer({"backend": "jax"})


@pytest.mark.skipif(importlib.util.find_spec("mindspore") is not None, reason="MindSpore is installed here")
def test_mindspore_backend_without_mindspore_says_how_to_install():
    with pytest.raises(ConfigError, match=r"dit-trainer\[mindspore\]") as err:
        DiTTrainer({"backend": "mindspore", "model_name": "DiT-S/2"})
    assert "\n" not in str(err.value)
