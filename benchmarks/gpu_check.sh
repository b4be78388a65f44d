#!/usr/bin/env bash
# GPU readiness check, <= 9 minutes on one GPU: DiT-XL/2 at 256 px (32x32x4 latents, 1000 classes).
#
#   bash benchmarks/gpu_check.sh [LOG_DIR]
#
# 0. gpu_step_check.py: the trainer's step path on the GPU against reading its checks at once.
# 1. train_step.py, bf16 autocast + per-block compile: img/s, MFU against the bf16 matmul peak
#    measured in the same process, peak CUDA memory; batch 32, and batch 128 with and without
#    activation checkpointing (AC) and with token routing (half the tokens through the middle blocks);
#    repa_cost.py: SiT-XL/2's step at batch 128 with REPA (DINOv2-B/14) beside it without.
# 2. gpu_check.py sdpa: the attention kernel bf16 SDPA dispatches to at DiT-XL/2's shapes.
#    sampling.py: DDIM-25 with CFG 4.0 in bf16, img/s of our sampler (latents, no VAE decode).
#    gpu_check.py jvp-attention: which SDPA kernels take MeanFlow's JVP, and their time; meanflow_step.py:
#    SiT-XL/2's MeanFlow step (the JVP and the central difference) beside its flow-matching step, batch 32, bf16.
# 3. With >= 2 GPUs, parallel.py: FSDP2 (torchrun, parallel.dp_shard N) img/s against 1 GPU at 32
#    images per GPU.
# 4. compile_cache.py: DiT-XL/2's first compiled step in a fresh process, cold (empty
#    train.compile_cache) against warm (the same folder again), when the budget leaves time for it.
# Each sub-run is bounded by `timeout`, all of them by GPU_CHECK_BUDGET seconds (default 540); a
# compact summary comes last. Exit 0 when every sub-run finished, 1 when one failed or timed out,
# 2 (with one line) when there is no CUDA GPU.
# Environment: PYTHON (default python3), GPU_CHECK_BUDGET, GPU_CHECK_SAMPLE_BATCH (default 64).

set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
py=${PYTHON:-python3}
budget=${GPU_CHECK_BUDGET:-540}
sample_batch=${GPU_CHECK_SAMPLE_BATCH:-64}

command -v "$py" >/dev/null 2>&1 || { echo "gpu_check: $py not found; set PYTHON to the project's interpreter" >&2; exit 2; }
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore
# TF32 for every float32 cuBLAS matmul of the sub-runs (the matmul peak, the fp32 ops around
# autocast). The trainer also sets torch.backends.cuda.matmul.allow_tf32 on a CUDA device.
export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1

# Fail fast, in one line, without a CUDA GPU (the probe prints the reason on stderr).
info=$(timeout 120 "$py" "$here/gpu_check.py" probe) || exit 2
IFS='|' read -r gpu_name ngpu torch_version cuda_version <<<"$info"

logs=${1:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
mkdir -p "$logs" && : >"$logs/status"
smi=""
if command -v nvidia-smi >/dev/null 2>&1; then
  smi=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
fi
echo "$gpu_name x $ngpu, $torch_version, $cuda_version${smi:+, nvidia-smi: $smi}" >"$logs/gpu"
echo "# gpu_check $(date -u '+%Y-%m-%d %H:%M UTC')  $(cat "$logs/gpu")  budget ${budget}s  logs $logs"

start=$SECONDS
# run NAME LIMIT CMD...: CMD under `timeout`, at most LIMIT seconds and what is left of the budget.
run() {
  local name=$1 limit=$2 left rc
  shift 2
  left=$((budget - (SECONDS - start)))
  if ((left < 20)); then
    echo "$name skipped (budget of ${budget}s spent)" >>"$logs/status"
    return
  fi
  ((limit > left)) && limit=$left
  echo "## $name (limit ${limit}s): ${*#"$py "}"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) echo "$name ok" >>"$logs/status" ;;
    124 | 137) echo "$name timeout (after ${limit}s)" >>"$logs/status" ;;
    *) echo "$name failed (rc $rc)" >>"$logs/status" ;;
  esac
}

run sdpa 30 "$py" "$here/gpu_check.py" sdpa
# The trainer's step on the GPU reads a step's checks a step late (the update masked on the device):
# same losses and weights as reading them at once, a NaN step raises with the weights before it.
run step_check 60 "$py" "$here/gpu_step_check.py"
xl=(--model DiT-XL/2 --input-size 32 --in-channels 4 --num-classes 1000 --device cuda --warmup 2 --steps 10 --peak-reps 2)
# DiT-XL/2's first compiled step takes about a minute on an H200 (57-59 s measured).
run train_b32 150 "$py" "$here/train_step.py" "${xl[@]}" --batch-size 32 --variants bf16+compile
run train_b128 320 "$py" "$here/train_step.py" "${xl[@]}" --batch-size 128 \
  --variants bf16+compile,bf16+compile+ac,bf16+compile+route0.5
# REPA's step (DINOv2-B/14 at 224 px, the projector, the alignment term) beside the plain step, SiT-XL/2 b128.
run repa_b128 150 "$py" "$here/repa_cost.py" --device cuda --model SiT-XL/2 --batch-size 128 --mixed-precision bf16 \
  --encoders dinov2_vitb14 --ac --warmup 2 --steps 5
run sampling 40 "$py" "$here/sampling.py" --no-compile --device cuda --models DiT-XL/2 --batch-sizes "$sample_batch" \
  --dtype bf16 --steps 25 --reps 2 --no-diffusers
# MeanFlow: which SDPA kernels take its JVP and how fast (models/attention.py runs the JVP through math), then
# its step (the JVP and the central difference, guidance folded in) beside SiT-XL/2's flow-matching step at batch 32, peak memory each
# (three trainers alive at once: about 11 GB of weights and optimizer state each).
run jvp_attention 30 "$py" "$here/gpu_check.py" jvp-attention
run meanflow_b32 120 "$py" "$here/meanflow_step.py" --device cuda --model SiT-XL/2 --input-size 32 --in-channels 4 \
  --num-classes 1000 --batch-size 32 --mixed-precision bf16 --warmup 2 --steps 5 \
  --variants "flow,mf separate,mf difference"
if ((ngpu >= 2)); then
  par=(--device cuda --depth 28 --hidden 1152 --heads 16 --input 32 --precision bf16 --warmup 2 --steps 5)
  run fsdp_1 30 "$py" "$here/parallel.py" "${par[@]}" --world-sizes 1 --layouts single --batch 32
  run "fsdp_$ngpu" 60 "$py" "$here/parallel.py" "${par[@]}" --world-sizes "$ngpu" --layouts fsdp --batch $((32 * ngpu))
else
  echo "fsdp skipped (1 GPU; FSDP2 scaling needs >= 2)" >>"$logs/status"
fi

# Last, so the sub-runs above keep their time: a restart's first step, cold against warm.
run compile_cache 150 "$py" "$here/compile_cache.py" --model DiT-XL/2 --device cuda --mixed-precision bf16 \
  --batch-size 32

echo
"$py" "$here/gpu_check.py" summary "$logs"

# The planner against the training sub-runs above: dit plan's predicted peak memory and img/s of
# DiT-XL/2 at batch 32 and 128 beside train_step.py's measurements (benchmarks/plan_gpu.py).
summary_rc=$?
echo
run plan 60 "$py" "$here/plan_gpu.py" --logs "$logs"
grep '^plan ' "$logs/status"
exit "$summary_rc"
