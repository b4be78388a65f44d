#!/usr/bin/env bash
# Run tests_mindspore/ (MindSpore backend, aligned with the PyTorch path) in the environment that
# scripts/mindspore_env.sh built. About 1-3 minutes on two CPU cores.
set -euo pipefail
VENV_DIR=${1:?usage: scripts/run_mindspore_tests.sh VENV_DIR}
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# MindSpore's CPU kernels and torch each start a thread pool per core; keep them from fighting.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec "$VENV_DIR/bin/python" -m pytest -q -p no:cacheprovider tests_mindspore "${@:2}"
