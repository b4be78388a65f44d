import sys
from pathlib import Path

# The tiny-run helpers live beside the trainer tests.
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
