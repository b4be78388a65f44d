"""The CLI and the config explain themselves: help with every key, --print-config, aliases, --version."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import dit_trainer
from dit_trainer.cli import build_parser, main
from dit_trainer.config.doc import config_docs, markdown

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model.name", "DiT-S/4", "--model.depth", "2", "--model.hidden_size", "64", "--model.num_heads", "4",
        "--data.path", "digits", "--data.digits_size", "8", "--data.num_workers", "0", "--train.device", "cpu",
        "--logging.progress", "false", "--logging.tensorboard", "false"]


def test_dit_help_does_not_import_torch():
    code = ("import sys, dit_trainer.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr


def test_train_help_lists_every_key_with_type_default_and_meaning(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for doc in config_docs():
        assert f"--{doc.key}" in text
        assert doc.help, f"{doc.key} has no comment in config.py"
    assert "AdamW learning rate [float, default: 0.0001]" in text
    assert "optim keys:" in text and "--model.num_heads" in text  # sections, then the family's options


def test_every_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["sample", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    # Flags with a plain default show it; those a run may recommend say where the default comes from.
    assert "(default: 50000)" in text and "(default: the run's sample.cfg_scale, else 4.0)" in text


def test_version(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"dit-trainer {dit_trainer.__version__}"


def test_print_config_merges_and_exits(capsys, tmp_path):
    assert main(["train", *TINY, "--lr", "3e-4", "--global-batch-size", "16", "--results-dir", str(tmp_path / "r"),
                 "--print-config"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["optim"]["lr"] == 3e-4 and cfg["train"]["global_batch_size"] == 16
    assert cfg["output_dir"] == str(tmp_path / "r") and cfg["model"]["depth"] == 2
    assert cfg["model"]["input_size"] == 8 and cfg["model"]["num_classes"] == 10  # from the digits
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("alias,key", [("--learning_rate", "optim.lr"), ("--ckpt-every", "checkpoint.save_steps"),
                                       ("--log-every", "logging.log_steps"),
                                       ("--num-sampling-steps", "logging.sample_steps")])
def test_aliases(capsys, alias, key):
    assert main(["train", *TINY, alias, "7", "--print-config"]) == 0
    section, name = key.split(".")
    assert yaml.safe_load(capsys.readouterr().out)[section][name] == 7


def test_resume_from_step_and_path(tmp_path):
    out = ["--output_dir", str(tmp_path), "--train.global_batch_size", "2", "--checkpoint.save_steps", "1"]
    assert main(["train", *TINY, *out, "--train.max_steps", "2"]) == 0
    from dit_trainer.config import build_config
    from dit_trainer.train import DiTTrainer

    for value in ("1", str(tmp_path / "checkpoints" / "step-00000001")):
        trainer = DiTTrainer(build_config(None, [*TINY, *out, "--checkpoint.resume_from", value]))
        assert trainer.maybe_resume().name == "step-00000001" and trainer.step == 1
    assert main(["train", *TINY, *out, "--checkpoint.resume_from", "9"]) == 2


def test_dir_shows_public_names():
    names = dir(dit_trainer)
    assert {"DiTTrainer", "get_spec", "build_config", "create_diffusion"} <= set(names)


def test_checked_in_config_reference_matches():
    assert (ROOT / "docs" / "config.md").read_text() == markdown(), (
        "docs/config.md is stale: run python -m dit_trainer.config.doc docs/config.md")


def test_parser_builds_with_every_command():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {"train", "sample", "demo", "extract", "data", "plot"} <= set(sub.choices)
