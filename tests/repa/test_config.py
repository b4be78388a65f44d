"""The `repa:` section: off by default, and configs/repa_sit_xl2.yaml is REPA's SiT-XL/2 recipe."""

from pathlib import Path

import torch

from dit_trainer.config import Config, build_config
from dit_trainer.models import get_spec
from dit_trainer.repa.config import encoder_size

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "repa_sit_xl2.yaml"


def test_off_by_default_and_absent_from_the_release_model():
    assert Config().repa.enabled is False
    cfg = build_config({"model": {"name": "SiT-XL/2"}})
    with torch.device("meta"):
        model = get_spec("SiT-XL/2").build_model_fn(cfg)
    assert not any(k.startswith("repa") for k in model.state_dict())


def test_the_recipe_is_repas_sit_xl2():
    cfg = build_config(RECIPE)
    r = cfg.repa
    assert (r.enabled, r.coefficient, r.encoder, r.encoder_depth, r.projector_dim) == (True, 0.5, "dinov2_vitb14", 8, 2048)
    assert (cfg.objective, cfg.transport.path_type, cfg.transport.prediction, cfg.transport.t_sampler) == (
        "transport", "Linear", "velocity", "uniform")
    assert (cfg.optim.lr, cfg.optim.max_grad_norm, cfg.train.global_batch_size, cfg.model.learn_sigma) == (
        1e-4, 1.0, 256, False)
    with torch.device("meta"):
        model = get_spec(cfg.model.name).build_model_fn(cfg)
    mlp = model.repa_projector
    assert model.repa_depth == 8 and len(model.blocks) == 28
    assert [(mlp[i].in_features, mlp[i].out_features) for i in (0, 2, 4)] == [(1152, 2048), (2048, 2048), (2048, 768)]
    assert encoder_size(r, model.input_size // model.patch_size) == 224


def test_encoder_overrides_from_the_command_line():
    cfg = build_config(None, ["--repa.enabled", "true", "--repa.encoder_overrides", "{embed_dim: 16, depth: 1, num_heads: 2}"])
    assert cfg.repa.encoder_overrides == {"embed_dim": 16, "depth": 1, "num_heads": 2}


def test_an_unknown_encoder_or_override_is_one_line():
    import pytest

    from dit_trainer.errors import ConfigError

    for repa, word in (({"encoder": "dinov3_vitb16"}, "dinov3_vitb16"), ({"encoder_overrides": {"width": 3}}, "width")):
        with pytest.raises(ConfigError) as err:
            build_config({"repa": {"enabled": True, **repa}})
        assert word in str(err.value) and "\n" not in str(err.value)
