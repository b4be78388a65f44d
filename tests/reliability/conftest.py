import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).parents[1]
# The tiny-run helpers live beside the trainer tests, the shard writer beside the data tests.
sys.path.insert(0, str(TESTS / "train"))
sys.path.insert(0, str(TESTS / "data"))

# The trainer tests' one-thread fixture (tiny tensors: threads cost more than they gain), reused.
_spec = importlib.util.spec_from_file_location("train_conftest", TESTS / "train" / "conftest.py")
_train_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_train_conftest)
_one_thread = _train_conftest._one_thread
