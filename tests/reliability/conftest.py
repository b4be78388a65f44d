# The trainer tests' one-thread fixture (tiny tensors: threads cost more than they gain), reused.
from tests.train.conftest import _one_thread  # noqa: F401
