"""Config: YAML, overrides, the RFC dict, and one-line errors naming the closest key."""

import pytest
import yaml

from dit_trainer.config import Config, build_config, parse_overrides, save_config
from dit_trainer.errors import ConfigError

REQUIRED = ["model.name", "data.path", "train.max_steps", "train.global_batch_size", "train.seed", "optim.lr",
            "optim.weight_decay", "checkpoint.save_steps", "checkpoint.save_total_limit", "output_dir"]


def _get(cfg, key):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_required_names_exist():
    cfg = Config()
    for key in REQUIRED:
        _get(cfg, key)  # AttributeError fails the test


def test_paper_defaults():
    cfg = Config()
    assert cfg.optim.lr == 1e-4 and cfg.optim.weight_decay == 0
    assert cfg.train.ema_decay == 0.9999 and cfg.train.global_batch_size == 256


def test_yaml_then_overrides(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"model": {"name": "DiT-B/4"}, "optim": {"lr": 2e-4}}))
    cfg = build_config(tmp_path / "c.yaml", ["--optim.lr", "3e-4", "--train.max_steps=7", "--train.compile", "true",
                                           "--logging.sample_classes", "1,2,3", "--data.path", "none"])
    assert cfg.model.name == "DiT-B/4" and cfg.optim.lr == 3e-4 and cfg.train.max_steps == 7
    assert cfg.train.compile == "true" and cfg.logging.sample_classes == [1, 2, 3] and cfg.data.path is None


def test_save_and_reload(tmp_path):
    cfg = build_config(None, ["--model.name", "DiT-L/2", "--train.seed", "5"])
    save_config(cfg, tmp_path / "c.yaml")
    assert build_config(tmp_path / "c.yaml") == cfg


def test_rfc_flat_dict():
    cfg = build_config({"model_name": "DiT-S/2", "weights_path": None, "lr": 1e-4, "weight_decay": 0, "num_timesteps": 1000})
    assert cfg.model.name == "DiT-S/2" and cfg.model.weights_path is None
    assert cfg.optim.lr == 1e-4 and cfg.diffusion.num_timesteps == 1000


@pytest.mark.parametrize("override,closest", [("--optim.lrr", "optim.lr"), ("--train.max_step", "train.max_steps"),
                                              ("--chekpoint.save_steps", "checkpoint.save_steps")])
def test_unknown_key_names_closest(override, closest):
    with pytest.raises(ConfigError) as err:
        build_config(None, [override, "1"])
    assert closest in str(err.value) and "\n" not in str(err.value)


def test_unknown_yaml_key(tmp_path):
    (tmp_path / "c.yaml").write_text("model:\n  nmae: DiT-S/2\n")
    with pytest.raises(ConfigError, match="model.name"):
        build_config(tmp_path / "c.yaml")


@pytest.mark.parametrize("key,value", [("train.max_steps", "ten"), ("train.compile", "maybe"), ("optim.lr", "fast")])
def test_bad_values(key, value):
    with pytest.raises(ConfigError, match=key):
        build_config(None, [f"--{key}", value])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        build_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        build_config(tmp_path / "bad.yaml")


def test_override_without_value():
    with pytest.raises(ConfigError, match="no value"):
        parse_overrides(["--optim.lr"])


def test_shipped_configs_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "configs"
    files = sorted(root.glob("*.yaml"))
    assert {"demo_digits.yaml", "dit_s2_latents.yaml", "dit_xl2_imagenet256.yaml"} <= {f.name for f in files}
    for f in files:
        build_config(f)
    xl = build_config(root / "dit_xl2_imagenet256.yaml")
    assert (xl.model.name, xl.optim.lr, xl.optim.weight_decay, xl.train.global_batch_size, xl.train.ema_decay) == (
        "DiT-XL/2", 1e-4, 0.0, 256, 0.9999)
    fast = build_config(root / "sit_xl2_imagenet256_accelerated.yaml")
    assert (fast.objective, fast.train.routing_keep, fast.transport.t_sampler, fast.transport.direction_loss_weight) == (
        "transport", 0.5, "logit-normal", 1.0)
    assert {k: fast.model.options[k] for k in ("norm", "mlp", "rope", "qk_norm")} == {
        "norm": "rmsnorm", "mlp": "swiglu", "rope": True, "qk_norm": True}


def test_nested_dict():
    cfg = build_config({"train": {"seed": 3}, "output_dir": "x"})
    assert cfg.train.seed == 3 and cfg.output_dir == "x"


@pytest.mark.parametrize("args,needle", [
    (["--optim.learnig_rate", "1e-3"], "did you mean 'optim.lr'?"),  # a synonym, not model.learn_sigma
    # A model key that belongs to another section points there, not at a model key spelt alike.
    (["--model.learnig_rate", "1e-3"], "did you mean 'optim.lr'?"),
    (["--model.batch_size", "8"], "did you mean 'train.global_batch_size'?"),
    (["--model.n_layers", "2"], "model.n_layers is a LargeDiT key; DiT's is 'model.depth'"),
    (["--model.name", "LargeDiT-600M/2", "--model.depth", "2"], "model.depth is a DiT key; LargeDiT's is 'model.n_layers'"),
    (["--model.name", "LargeDiT-600M/2", "--model.hidden_size", "64"], "LargeDiT's is 'model.dim'"),
])
def test_suggestions_follow_synonyms_and_families(args, needle):
    with pytest.raises(ConfigError) as err:
        build_config(None, args)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_misspelt_section_in_yaml_names_it(tmp_path):
    (tmp_path / "c.yaml").write_text("trian:\n  max_steps: 5\n")
    with pytest.raises(ConfigError) as err:
        build_config(tmp_path / "c.yaml")
    assert str(err.value) == "unknown config key 'trian'; did you mean 'train'?"


def test_yaml_errors_say_where():
    import yaml

    from dit_trainer.typed import yaml_problem

    with pytest.raises(yaml.YAMLError) as err:
        yaml.safe_load("model: [unclosed\n")
    assert yaml_problem(err.value) == ("line 2, column 1: expected ',' or ']', but got '<stream end>' "
                                       "(while parsing a flow sequence from line 1, column 8)")
    with pytest.raises(ConfigError, match="line 1, column 6: expected") as err:
        build_config(None, ["--logging.sample_classes", "[1, 2"])  # was a yaml traceback
    assert "\n" not in str(err.value)


def test_broken_config_file_says_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  name: [DiT-S/2\n")
    with pytest.raises(ConfigError) as err:
        build_config(str(bad), [])
    message = str(err.value)
    assert str(bad) in message and "line 3, column 1" in message and "from line 2, column 9" in message
    assert "\n" not in message


@pytest.mark.parametrize("name, heads, hint", [("DiT-S/2", 2, "use 64 or 68"), ("SiT-S/2", 6, "use 60 or 72")])
def test_hidden_size_not_a_multiple_of_4_is_one_line(name, heads, hint):
    # The 2-D sin-cos position table needs it; before, model building failed with a shape mismatch.
    with pytest.raises(ConfigError) as err:
        build_config(None, ["--model.name", name, "--model.hidden_size", "66", "--model.num_heads", str(heads)])
    text = str(err.value)
    assert "model.hidden_size 66" in text and "multiple of 4" in text and hint in text and "\n" not in text


def test_objective_auto_follows_the_model():
    # SiT's releases are transport models; the rest are trained as diffusion unless the config says.
    assert build_config(None, ["--model.name", "SiT-S/2"]).objective == "transport"
    assert build_config(None, ["--model.name", "DiT-S/2"]).objective == "diffusion"
    assert build_config(None, ["--model.name", "DiT-S/2", "--objective", "transport"]).objective == "transport"
    # a name set on the command line after a file decides; so does one set on a Config built in code
    assert build_config(None, ["--model.name", "DiT-S/2", "--model.name", "SiT-B/4"]).objective == "transport"
    cfg = Config()
    cfg.model.name = "SiT-B/4"
    assert build_config(cfg).objective == "transport"
    # once built, a config names its objective: the run's config.yaml says what it trained
    assert "objective: transport" in __import__("dit_trainer.config", fromlist=["x"]).config_yaml(build_config(cfg))
    assert build_config({"objective": "diffusion", "model": {"name": "SiT-S/2", "learn_sigma": False}}).objective \
        == "diffusion"


def test_sit_under_learned_sigma_diffusion_is_one_line():
    # Before, training failed inside the diffusion loss on an output-shape assertion.
    with pytest.raises(ConfigError) as err:
        build_config(None, ["--model.name", "SiT-S/2", "--objective", "diffusion"])
    text = str(err.value)
    assert "SiT-S/2" in text and "objective transport" in text and "DiT-S/2" in text and "\n" not in text


def test_a_config_passed_in_is_taken_as_it_is_and_left_unchanged():
    source = build_config({"model": {"name": "DiT-S/4"}, "optim": {"lr": 3e-4}})
    built = build_config(source, overrides=["--train.max_steps", "7"])
    assert (built.model.name, built.optim.lr, built.train.max_steps) == ("DiT-S/4", 3e-4, 7)
    assert built is not source and source.train.max_steps == Config().train.max_steps
