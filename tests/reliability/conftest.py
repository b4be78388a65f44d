import sys
from pathlib import Path

import pytest
import torch

# The tiny-run helpers live beside the trainer tests, the shard writer beside the data tests.
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
sys.path.insert(0, str(Path(__file__).parents[1] / "data"))


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny tensors: threading costs more than it gains on a loaded 2-core machine.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
