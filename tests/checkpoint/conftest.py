import sys
from pathlib import Path

import pytest

# The tiny-run helpers live beside the trainer tests.
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one thread (tests/conftest.py's one_thread)."""
