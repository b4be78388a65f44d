"""A PaddleMIX-style model JSON wherever a model config is: `--config`, `model.config_file`, errors."""

import json

import pytest
import yaml

from dit_trainer.config import build_config
from dit_trainer.errors import ConfigError
from dit_trainer.config.model_file import load_model_file

# diffusers-style keys, as PaddleMIX's DiT JSON spells them; a toy size (hidden 2 x 16 = 32).
TINY_JSON = {"_class_name": "DiTTransformer2DModel", "num_layers": 2, "num_attention_heads": 2,
             "attention_head_dim": 16, "sample_size": 8, "patch_size": 2, "in_channels": 4, "out_channels": 8,
             "num_embeds_ada_norm": 10}


@pytest.fixture
def tiny_json(tmp_path):
    path = tmp_path / "paddlemix_dit.json"
    path.write_text(json.dumps(TINY_JSON))
    return path


def test_config_json_is_the_model_section(tiny_json):
    cfg = build_config(tiny_json)
    m = cfg.model
    assert (m.options["depth"], m.options["hidden_size"], m.options["num_heads"]) == (2, 32, 2)
    assert (m.input_size, m.in_channels, m.num_classes, m.learn_sigma) == (8, 4, 10, True)
    assert cfg.train.max_steps == build_config(None).train.max_steps  # the rest keeps the defaults


def test_config_file_key_and_precedence(tiny_json, tmp_path):
    yml = tmp_path / "run.yaml"
    yml.write_text(yaml.safe_dump({"model": {"config_file": str(tiny_json), "depth": 3}, "train": {"max_steps": 5}}))
    cfg = build_config(yml, ["--model.num_classes", "7"])
    # beside-it keys and overrides win; the rest comes from the file; the path is not kept
    assert (cfg.model.options["depth"], cfg.model.num_classes, cfg.model.options["hidden_size"], cfg.model.input_size) == (3, 7, 32, 8)
    assert cfg.model.config_file is None and cfg.train.max_steps == 5
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(cfg.to_dict()))
    assert build_config(saved) == cfg  # config.yaml of the run reads back without the JSON


def test_config_file_from_command_line(tiny_json):
    cfg = build_config(None, ["--model.config_file", str(tiny_json)])
    assert (cfg.model.options["depth"], cfg.model.options["hidden_size"], cfg.model.num_classes) == (2, 32, 10)


def test_our_layout_and_bare_section(tmp_path):
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"model": {"name": "DiT-B/4"}, "optim": {"lr": 3e-4}}))
    cfg = build_config(ours)
    assert cfg.model.name == "DiT-B/4" and cfg.optim.lr == 3e-4
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"name": "DiT-S/4", "depth": 3}))
    assert load_model_file(bare) == {"name": "DiT-S/4", "depth": 3}
    assert build_config(bare).model.options["depth"] == 3


@pytest.mark.parametrize("content,where", [
    ({"foo": 1, "bar": 2}, "--config"),
    ({"num_layers": 2, "num_attention_heads": 2}, "--config"),  # half a PaddleMIX config
    ({"foo": 1}, "--model.config_file"),
    ([1, 2], "--config"),
])
def test_neither_ours_nor_paddlemix_is_one_line(tmp_path, content, where):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError) as err:
        build_config(path) if where == "--config" else build_config(None, [where, str(path)])
    msg = str(err.value)
    assert "odd.json" in msg and "PaddleMIX" in msg and "\n" not in msg


def test_invalid_json_and_missing_file(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"num_layers": 2,')
    with pytest.raises(ConfigError, match="broken.json is not valid JSON"):
        build_config(bad)
    with pytest.raises(ConfigError, match="gone.json does not exist"):
        build_config(None, ["--model.config_file", str(tmp_path / "gone.json")])


def test_cli_error_is_one_line(tmp_path, capsys):
    from dit_trainer.cli import main

    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"hello": "world"}))
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "odd.json" in err and "hello" in err


def test_train_two_steps_from_the_json(tiny_json, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    from dit_trainer.cli import main
    from dit_trainer.convert.model_config import expected_shapes

    data = _npy_latents(tmp_path / "latents", n=8)
    out = tmp_path / "run"
    torch.set_num_threads(1)
    rc = main(["train", "--config", str(tiny_json), "--data.path", str(data), "--output_dir", str(out),
               "--train.max_steps", "2", "--train.global_batch_size", "4", "--train.device", "cpu",
               "--train.mixed_precision", "fp32", "--data.num_workers", "0", "--checkpoint.save_steps", "2",
               "--logging.progress", "false", "--logging.tensorboard", "false", "--logging.log_steps", "1"])
    assert rc == 0 and "step 2" in capsys.readouterr().out
    ckpt = sorted((out / "checkpoints").glob("step-*"))[-1]
    weights = load_file(ckpt / "ema.safetensors")
    want = expected_shapes(load_model_file(tiny_json))
    assert {k: tuple(v.shape) for k, v in weights.items()} == want
    assert want["pos_embed"] == (1, 16, 32) and len({k.split(".")[1] for k in want if k.startswith("blocks.")}) == 2
    saved = yaml.safe_load((ckpt / "config.yaml").read_text())["model"]
    assert saved["depth"] == 2 and saved["hidden_size"] == 32 and saved.get("config_file") is None


def _npy_latents(folder, n, shape=(4, 8, 8), num_classes=10):
    import numpy as np

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        np.save(folder / f"{i:05d}.npy", rng.standard_normal(shape).astype(np.float32))
    (folder / "labels.json").write_text(json.dumps({f"{i:05d}": i % num_classes for i in range(n)}))
    return folder
