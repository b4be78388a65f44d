"""Every user mistake is one line on stderr and exit code 2, never a traceback."""

import pytest
import torch
import yaml

from dit_trainer.checkpoint import save_checkpoint
from dit_trainer.cli import main
from dit_trainer.config import Config
from dit_trainer.models import get_spec

# A tiny model on the bundled digits: valid unless the test breaks one value.
TINY = ["--model.name", "DiT-S/4", "--model.depth", "2", "--model.hidden_size", "64", "--model.num_heads", "4",
        "--data.path", "digits", "--data.digits_size", "8", "--data.num_workers", "0", "--train.device", "cpu",
        "--train.max_steps", "0", "--logging.progress", "false", "--logging.tensorboard", "false"]


def one_line_error(capsys, argv, *needles):
    """Run `dit ARGV` in-process: exit code 2, one stderr line holding every needle, no traceback."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("key,value,allowed", [
    ("train.global_batch_size", "0", "positive"),
    ("checkpoint.save_steps", "0", "positive"),
    ("logging.log_steps", "-5", "positive"),
    ("train.grad_accum_steps", "0", "positive"),
    ("diffusion.num_timesteps", "0", "positive"),
    ("train.max_steps", "-1", "0 or more"),
    ("train.ema_decay", "1.5", "[0, 1]"),
    ("train.ema_decay", "nan", "[0, 1]"),
    ("optim.beta1", "1", "[0, 1)"),
    ("optim.beta2", "-0.1", "[0, 1)"),
    ("optim.lr", "-1", "positive"),
    ("model.depth", "0", "positive"),
    ("model.hidden_size", "-64", "positive"),
    ("model.class_dropout_prob", "1", "[0, 1)"),
    ("diffusion.noise_schedule", "cosin", "linear|cosine|sigmoid"),
    ("diffusion.timestep_sampler", "loss", "uniform|loss-second-moment"),
    ("train.mixed_precision", "fp8", "bf16|fp16|fp32"),
    ("train.activation_checkpointing", "some", "none|full|selective"),
    ("objective", "flow", "diffusion"),
    ("train.device", "gpu", "auto, cpu, cuda"),
])
def test_impossible_value_is_one_line(capsys, key, value, allowed):
    one_line_error(capsys, ["train", *TINY, f"--{key}", value], key, value, allowed)


def test_heads_must_divide_hidden(capsys):
    one_line_error(capsys, ["train", *TINY, "--model.num_heads", "5"], "model.num_heads 5", "hidden_size 64")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda(capsys):
    one_line_error(capsys, ["train", *TINY, "--train.device", "cuda"], "train.device", "no usable CUDA")


def test_unknown_key_lists_its_section_only(capsys):
    err = one_line_error(capsys, ["train", *TINY, "--optim.zzzz", "1"], "optim.zzzz", "optim.lr", "optim.beta2")
    assert "train.max_steps" not in err


def test_lowercase_model_name_resolves(tmp_path):
    assert main(["train", *TINY, "--model.name", "dit-s/4", "--output_dir", str(tmp_path)]) == 0


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny 1-channel checkpoint (config.yaml + ema.safetensors)."""
    cfg = Config()
    cfg.model.name, cfg.model.input_size, cfg.model.in_channels, cfg.model.num_classes = "DiT-S/4", 8, 1, 3
    cfg.model.options.update(depth=1, hidden_size=32, num_heads=2)
    cfg.data.path = "digits"
    model = get_spec(cfg.model.name).build_model_fn(cfg)
    files = {"ema.safetensors": model.state_dict(), "config.yaml": yaml.safe_dump(cfg.to_dict(), sort_keys=False)}
    return str(save_checkpoint(tmp_path_factory.mktemp("run"), 1, files))


@pytest.mark.parametrize("args,needles", [
    (["--cfg-scale", "-2"], ["--cfg-scale", ">= 1"]),
    (["--cfg-scale", "nan"], ["--cfg-scale", ">= 1"]),
    (["--per-class", "0"], ["--per-class", "1 or more"]),
    (["--cfg-channels", "4"], ["--cfg-channels 4", "1 channels"]),
    (["--class-names", "cat"], ["cat"]),
])
def test_sample_mistakes(capsys, ckpt, tmp_path, args, needles):
    one_line_error(capsys, ["sample", "--ckpt", ckpt, "--steps", "2", "--device", "cpu", "--no-progress",
                            "--out", str(tmp_path / "g.png"), *args], *needles)


def test_sample_patch_does_not_divide_input(capsys, tmp_path):
    weights = tmp_path / "ema.safetensors"
    weights.write_bytes(b"")  # never read: the shapes are refused first
    one_line_error(capsys, ["sample", "--ckpt", str(weights), "--model", "DiT-S/4", "--image-size", "16"],
                   "--image-size 16", "patch size 4")


def test_rerun_with_another_model_in_output_dir(capsys, tmp_path):
    out = ["--output_dir", str(tmp_path), "--train.max_steps", "1", "--train.global_batch_size", "2"]
    assert main(["train", *TINY, *out]) == 0
    capsys.readouterr()
    one_line_error(capsys, ["train", *TINY, *out, "--model.hidden_size", "32", "--model.num_heads", "2",
                            "--train.max_steps", "2"], "another output_dir", "--checkpoint.resume false")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_extract_on_cuda_without_cuda(capsys, tmp_path):
    from PIL import Image

    (tmp_path / "images").mkdir()
    Image.new("RGB", (16, 16)).save(tmp_path / "images" / "a.png")
    one_line_error(capsys, ["extract", "--data-path", str(tmp_path / "images"), "--vae", str(tmp_path / "vae"),
                            "--image-size", "64", "--out", str(tmp_path / "out"), "--device", "cuda"],
                   "--device cuda", "no usable CUDA")
    assert not (tmp_path / "out").exists()
