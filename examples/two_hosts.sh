#!/bin/bash
# `dit train` on two machines without a scheduler: run this on each, with the first machine's
# address (reachable from both) and this machine's rank, 0 on the first and 1 on the second.
# Everything after them goes to `dit train`:
#
#   host-a$ bash examples/two_hosts.sh host-a 0 --config configs/parallel_hsdp.yaml --data.path /shared/latents
#   host-b$ bash examples/two_hosts.sh host-a 1 --config configs/parallel_hsdp.yaml --data.path /shared/latents
#
# output_dir and the data must be on storage both see. When a worker dies, torchrun restarts both
# machines' workers (up to MAX_RESTARTS times) and each restart resumes from the newest finished
# checkpoint. Settings: PROCS_PER_NODE (default: every GPU), RDZV_PORT (29500; open between the
# machines), RUN_ID (the rendezvous' name, the same on both; default dit-two-hosts), MAX_RESTARTS (3).
set -euo pipefail

if [ $# -lt 2 ] || ! [[ $2 =~ ^[01]$ ]]; then
  echo "usage: $0 HEAD_HOST NODE_RANK(0|1) [dit train arguments...]" >&2
  exit 2
fi
head_host=$1
node_rank=$2
shift 2

exec torchrun \
  --nnodes 2 --node-rank "$node_rank" --nproc-per-node "${PROCS_PER_NODE:-gpu}" \
  --rdzv-backend c10d --rdzv-endpoint "$head_host:${RDZV_PORT:-29500}" --rdzv-id "${RUN_ID:-dit-two-hosts}" \
  --max-restarts "${MAX_RESTARTS:-3}" \
  -m dit_trainer train "$@"
