import sys
from pathlib import Path

# The torchrun worker and the tests share _common.py.
sys.path.insert(0, str(Path(__file__).parent))
