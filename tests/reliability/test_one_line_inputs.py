"""The last tracebacks and small untruths of the probe: hardware profiles, truncated diffusers weights,
step counts past any integer, zero counts in `dit plan`, the head count of a non-release width, and
a `--weights` file that is not the published Inception's."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tests.train.trainer_helpers import write_npy_latents

from dit_trainer.cli import main


def _dit(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err.strip()


def _one_line(rc, err, *needles):
    assert rc == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    assert all(n in err for n in needles), err


@pytest.mark.parametrize("text,needle", [
    ("name: x\nmatmul_tflops: [1, 2\n", "is not plain YAML: line 3"),
    ("!!python/object/apply:os.system ['touch PWNED']\n", "could not determine a constructor"),
    ("- 1\n- 2\n", "holds no mapping"),
    ("elementwise_gelem_s: 5\n", "holds no mapping"),
])
def test_broken_hardware_profile_is_one_line(tmp_path, capsys, monkeypatch, text, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hw.yaml").write_text(text)
    _one_line(*_dit(capsys, "plan", "--hardware", "hw.yaml"), "hardware profile hw.yaml", needle,
              "benchmarks/hardware_profile.py")
    assert not (tmp_path / "PWNED").exists()


def test_truncated_diffusers_weights_are_one_line(tmp_path, capsys):
    tdir = tmp_path / "pipe" / "transformer"
    tdir.mkdir(parents=True)
    (tdir / "config.json").write_text(json.dumps({
        "num_attention_heads": 2, "attention_head_dim": 32, "in_channels": 4, "out_channels": 8, "num_layers": 2,
        "patch_size": 2, "sample_size": 8, "num_embeds_ada_norm": 10}))
    save_file({"w": torch.zeros(64, 64)}, str(tdir / "diffusion_pytorch_model.safetensors"))
    whole = (tdir / "diffusion_pytorch_model.safetensors").read_bytes()
    (tdir / "diffusion_pytorch_model.safetensors").write_bytes(whole[: len(whole) // 2])
    _one_line(*_dit(capsys, "convert", "--from", "diffusers", tmp_path / "pipe", "--to", "ours", tmp_path / "out"),
              "diffusion_pytorch_model.safetensors", "download or save")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value,needle", [
    ("1e400", "needs int, got '1e400'"), ("1e30", "needs int, got '1e30'"), ("2.5", "needs int"),
    ("10" * 15, "train.max_steps is 1010"),
])
def test_step_counts_past_any_integer_are_one_line(capsys, value, needle):
    _one_line(*_dit(capsys, "plan", "--train.max_steps", value), "train.max_steps", needle)


@pytest.mark.parametrize("flag", ["--gpus-per-node", "--global-batch-size", "--image-size"])
def test_plan_refuses_zero_counts(capsys, flag):
    _one_line(*_dit(capsys, "plan", "--gpus", "8", flag, "0"), f"{flag} is 0; it must be 1 or more")


def test_non_release_width_takes_the_head_count_it_asks_for(tmp_path):
    """Without model.num_heads the error asks for it; given (as text, as a command line gives it), it is used."""
    from dit_trainer.config import build_config, read_settings
    from dit_trainer.data.loader import DataShapes
    from dit_trainer.errors import ConfigError
    from dit_trainer.models.dit.model import DiT
    from dit_trainer.train.pretrained import PretrainedShapes

    torch.manual_seed(0)
    net = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=96, depth=2, num_heads=2, num_classes=10)
    torch.save(net.state_dict(), tmp_path / "w.pt")
    write_npy_latents(tmp_path / "lat", n=4)
    base = ["--output_dir", tmp_path / "run", "--data.path", tmp_path / "lat", "--train.device", "cpu",
            "--model.weights_path", tmp_path / "w.pt"]

    def config(*extra):
        return build_config(read_settings(None, [str(a) for a in (*base, *extra)]), shapes=DataShapes(first=PretrainedShapes()))

    with pytest.raises(ConfigError, match="set model.num_heads to the one it was trained with"):
        config()
    cfg = config("--model.num_heads", "2")
    assert cfg.model.options["num_heads"] == 2 and cfg.model.options["hidden_size"] == 96
    with pytest.raises(ConfigError, match="model.num_heads"):
        config("--model.num_heads", "two")


def test_inception_weights_of_another_sha256_are_named(tmp_path, capsys, monkeypatch):
    from dit_trainer.errors import CheckpointError
    from dit_trainer.evaluate import inception_weights as iw
    from dit_trainer.evaluate.inception import load_inception

    other = tmp_path / "other.pth"
    other.write_bytes(b"not the published network")
    with pytest.raises(CheckpointError):
        load_inception(other)
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(other) in err and "sha256" in err and iw.INCEPTION_WEIGHTS_FILE in err
    monkeypatch.setattr(iw, "INCEPTION_WEIGHTS_SHA256", hashlib.sha256(other.read_bytes()).hexdigest()[:8] + "0" * 56)
    assert iw.note_other_weights(Path(other)) is False and capsys.readouterr().err == ""
