import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: on a shared 2-core machine, intra-op threads only add hand-offs
    (the digits test ran 8x slower with 2 threads under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
