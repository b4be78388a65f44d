#!/usr/bin/env bash
# Build the MindSpore test environment from nothing: a venv at VENV_DIR with MindSpore 2.10 (CPU),
# numpy<2 (MindSpore 2.10 needs it), and the CPU build of torch 2.13 for the PyTorch reference
# (torch 2.13 runs with numpy 1.26). dit-trainer itself is not installed: the tests put src/ first
# on PYTHONPATH. Takes about 4 minutes here (MindSpore's wheel is 800 MB).
set -euo pipefail
VENV_DIR=${1:?usage: scripts/mindspore_env.sh VENV_DIR}
python3 -m venv "$VENV_DIR"
"$VENV_DIR/bin/python" -m pip install --upgrade pip >/dev/null
"$VENV_DIR/bin/python" -m pip install "mindspore==2.10.0" "numpy<2" pytest pyyaml tqdm safetensors
# torch with numpy<2 held, pinned like .ci/run pins it (the CPU build; a bare requirement can pull CUDA).
"$VENV_DIR/bin/python" -m pip install "torch==2.13.0" "numpy<2"
"$VENV_DIR/bin/python" -c "import mindspore, numpy, torch; print('mindspore', mindspore.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"
