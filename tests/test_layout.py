"""The package's shape: one trainer class, no import cycles, a generic parallel/ (the project's
layout checker, which CI places beside the checkout), and a CLI of existing commands only."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT.parent / "shared" / "tools" / "check_layout.py"


@pytest.mark.skipif(not CHECKER.is_file(), reason="the layout checker lives in ../shared beside the checkout")
def test_layout_checker_passes():
    out = subprocess.run([sys.executable, str(CHECKER)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 import cycles, 0 problems" in out.stdout


def test_cli_lists_only_commands_that_exist():
    import importlib

    from dit_trainer.cli import COMMAND_MODULES, build_parser

    for name in COMMAND_MODULES:
        assert hasattr(importlib.import_module(name), "add_commands"), name
    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"train", "sample", "demo", "extract", "data"} <= set(commands)


def test_one_trainer_for_every_world_size():
    from dit_trainer.train import DiTTrainer

    assert "__new__" not in vars(DiTTrainer) and DiTTrainer.__subclasses__() == []
