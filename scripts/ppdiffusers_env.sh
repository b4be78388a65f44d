#!/usr/bin/env bash
# Build the separate virtual environment in which ppdiffusers' DiTPipeline loads our export.
# ppdiffusers pins old hub/datasets releases that clash with the main environment, so it lives
# apart. Usage: scripts/ppdiffusers_env.sh [VENV_DIR]   (default /tmp/ppdiffusers-venv)
# Then: VENV_DIR/bin/python scripts/check_ppdiffusers.py --export DIR --ours DIR
set -euo pipefail
VENV="${1:-/tmp/ppdiffusers-venv}"
PYTHON="${PYTHON:-python3}"
start=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# The three pins are what made ppdiffusers 0.29 import: newer huggingface_hub, aistudio-sdk and
# datasets releases removed names it imports.
"$VENV/bin/python" -m pip install --quiet \
    "paddlepaddle==3.3.1" "ppdiffusers==0.29.0" \
    "huggingface_hub==0.25.2" "aistudio-sdk==0.2.6" "datasets==2.21.0"
"$VENV/bin/python" -c "from ppdiffusers import DiTPipeline; print('ppdiffusers DiTPipeline imports')"
echo "built $VENV in $(( $(date +%s) - start )) s"
