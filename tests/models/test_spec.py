"""The model registry (DIT-UT-04)."""

import pytest

from dit_trainer.config import Config, build_config, save_config
from dit_trainer.errors import ConfigError
from dit_trainer.models import DiT, ModelSpec, get_spec, list_specs, register_spec


def test_get_spec_builds_from_mapping_and_config():
    m = get_spec("DiT-S/2").build_model_fn({"input_size": 8, "num_classes": 10, "depth": 1, "model_name": "ignored"})
    assert isinstance(m, DiT) and m.num_classes == 10 and len(m.blocks) == 1
    cfg = Config()
    cfg.model.input_size, cfg.model.options["depth"], cfg.model.learn_sigma = 16, 2, False
    m = get_spec("DiT-S/2").build_model_fn(cfg)
    assert m.input_size == 16 and len(m.blocks) == 2 and m.out_channels == 4
    m = get_spec("DiT-S/2").build_model_fn(cfg.model)
    assert len(m.blocks) == 2


def test_all_dit_names_registered_with_hooks():
    names = list_specs()
    for size in "S B L XL".split():
        for p in (2, 4, 8):
            assert f"DiT-{size}/{p}" in names
    spec = get_spec("DiT-XL/2")
    assert spec.name == "DiT-XL/2" and callable(spec.parallelize_fn) and callable(spec.pipelining_fn)


def test_duplicate_name_fails():
    with pytest.raises(ValueError, match="already registered"):
        register_spec("DiT-S/2", ModelSpec(name="DiT-S/2", build_model_fn=lambda cfg: None))


def test_unknown_name_lists_known():
    with pytest.raises(ConfigError) as err:
        get_spec("DiT-M/2")
    msg = str(err.value)
    assert "DiT-M/2" in msg and "DiT-XL/2" in msg and "\n" not in msg


def test_register_new_spec():
    register_spec("test-tiny", ModelSpec(name="test-tiny", build_model_fn=lambda cfg: "built"))
    assert get_spec("test-tiny").build_model_fn({}) == "built"
    assert get_spec("test-tiny").state_dict_adapter is None


def test_top_level_names():
    import dit_trainer

    assert dit_trainer.get_spec is get_spec
    from dit_trainer.train import DiTTrainer

    assert dit_trainer.DiTTrainer is DiTTrainer
    with pytest.raises(AttributeError):
        dit_trainer.not_a_name


def test_lowercase_names_resolve():
    assert get_spec("dit-s/2") is get_spec("DiT-S/2")


def test_family_options_are_typed_and_checked():
    cfg = build_config({"model": {"name": "DiT-S/2", "depth": "3", "hidden_size": 64, "num_heads": 4}})
    assert cfg.model.options["depth"] == 3 and isinstance(cfg.model.options["depth"], int)
    assert cfg.model.options == {"depth": 3, "hidden_size": 64, "num_heads": 4}
    with pytest.raises(ConfigError, match="model.depth") as err:
        build_config({"model": {"name": "DiT-S/2", "depht": 3}})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="needs int"):
        build_config({"model": {"depth": "deep"}})


def test_family_options_round_trip_through_yaml(tmp_path):
    cfg = build_config({"model": {"name": "DiT-S/2", "depth": 3, "mlp_ratio": 2.0}})
    assert cfg.to_dict()["model"]["depth"] == 3 and "options" not in cfg.to_dict()["model"]
    save_config(cfg, tmp_path / "c.yaml")
    back = build_config(tmp_path / "c.yaml")
    assert back.model.options == cfg.model.options and back.model.options["mlp_ratio"] == 2.0


def test_specs_carry_the_family_hooks():
    spec = get_spec("DiT-B/4")
    assert spec.family == "dit" and spec.config_cls.__name__ == "DiTConfig"
    released = {"module.blocks.0.attn.qkv.weight": 1, "_orig_mod.x_embedder.proj.bias": 2}
    assert spec.state_dict_adapter.from_released(released) == {"blocks.0.attn.qkv.weight": 1, "x_embedder.proj.bias": 2}
