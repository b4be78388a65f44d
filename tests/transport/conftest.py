import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one thread (tests/conftest.py's one_thread)."""
