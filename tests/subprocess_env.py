"""The environment for a test's subprocess (a torchrun worker, a script run by python) that imports the tests'
helpers: the repository root first on PYTHONPATH, so `tests.train.trainer_helpers` and the like import
the same way as under pytest (pyproject's `pythonpath = ["."]`)."""

import os
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])


def subprocess_env(**extra):
    """os.environ with ROOT put before any PYTHONPATH it has, and the `extra` variables set."""
    path = [ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}
