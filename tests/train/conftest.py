import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny tensors: threading costs more than it gains on a loaded 2-core machine.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
