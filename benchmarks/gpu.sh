#!/usr/bin/env bash
# The GPU benchmarks and checks, in one script for a lent CUDA machine (`make bench-gpu` here):
# GPT-124M bf16 training MFU (eager, then compiled with a profile, then compiled at batch 32) and
# generation against Hugging Face, the CUDA-only correctness checks, what the input checks'
# verdicts cost a step (deferred against at once), a Lightning fit on the GPU in bf16-mixed,
# ViT / DeiT / Mixer against timm at batch 8 (long repetitions) and at a GPU's batch (ViT-S width,
# 12 blocks, batch 128, bf16), every family's table on CUDA. Each step has its own time limit, so one that
# hangs does not take the others with it; logs go to $LOG_DIR (default runs/bench-gpu). Steps by name as arguments (default: all but autotune32):
#   train generate t5generate checks compiled compiled32 compiled64 autotune32 syncs fit vision8 vision summary
# (compiled64: batch 64 x 1,024, llm.c's micro-batch on an H100; autotune32: inductor's
# max-autotune-no-cudagraphs, Triton GEMM templates timed against cuBLAS, at batch 32; both only
# each library's labels= path; autotune32 runs only by name: its compilation outlasted 300 s on an
# H100, where cuBLAS won 13 of the 14 GEMM shapes.)
# Exit status: the number of steps that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # unitok from this checkout, installed or not
PY=${PYTHON:-python3}
LOG=${LOG_DIR:-runs/bench-gpu}
mkdir -p "$LOG"
failed=0
STEPS=${*:-train generate t5generate checks compiled compiled32 compiled64 syncs fit vision8 vision summary}
step() {  # step NAME SECONDS COMMAND...: run one step (if asked for), log it, count a failure
  local name=$1 limit=$2; shift 2
  [[ " $STEPS " == *" $name "* ]] || return 0
  echo "=== $name ($(date +%T))"
  timeout "$limit" "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  tail -n 14 "$LOG/$name.log"
  [ "$rc" -eq 0 ] || { echo "!!! $name exited $rc"; failed=$((failed + 1)); }
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv | tee "$LOG/gpu.txt"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
GPT124=(--device cuda --d-model 768 --n-layers 12 --n-heads 12 --vocab-size 50304 --context-length 1024)
step train 120 $PY benchmarks/gpt_vs_hf.py "${GPT124[@]}" --precision bf16 --batch-size 16 \
  --seq-len 1024 --skip-generate --fused-adamw
step generate 150 $PY benchmarks/gpt_vs_hf.py "${GPT124[@]}" --skip-train --new-tokens 128 --compile-decode
# T5 (the CPU benchmark's D=256, 4 layers): greedy and beam search, eager and through the compiled step
step t5generate 150 $PY benchmarks/t5_vs_hf.py --device cuda --compile-decode --train-steps 1 --repeats 3
step checks 240 $PY benchmarks/cuda_checks.py
step compiled 240 $PY benchmarks/gpt_vs_hf.py "${GPT124[@]}" --precision bf16 --batch-size 16 \
  --seq-len 1024 --skip-generate --fused-adamw --compile --profile 30
step compiled32 150 $PY benchmarks/gpt_vs_hf.py "${GPT124[@]}" --precision bf16 --batch-size 32 \
  --seq-len 1024 --skip-generate --fused-adamw --compile --repeats 3
step compiled64 150 $PY benchmarks/gpt_vs_hf.py "${GPT124[@]}" --precision bf16 --batch-size 64 \
  --seq-len 1024 --skip-generate --fused-adamw --compile --default-only --repeats 3
step autotune32 600 $PY benchmarks/gpt_vs_hf.py "${GPT124[@]}" --precision bf16 --batch-size 32 \
  --seq-len 1024 --skip-generate --compile --compile-mode max-autotune-no-cudagraphs --default-only --repeats 3
step syncs 200 $PY benchmarks/deferred_checks.py
step fit 120 $PY -c "import sys; from tasks.cli import main; main(sys.argv[1:])" fit \
  --config configs/vit/digits.yaml --trainer.precision bf16-mixed --trainer.max_steps 300 \
  --trainer.default_root_dir runs/bench-gpu/vit_digits --trainer.callbacks+=tasks.Compile
step vision8 150 $PY benchmarks/vision_vs_timm.py --device cuda --train-steps 20 --infer-batches 40 --repeats 7
step vision 200 $PY benchmarks/vision_vs_timm.py --device cuda --precision bf16 --batch-size 128 --depth 12 \
  --vit-dim 384 --vit-heads 6 --train-steps 5 --infer-batches 10 --repeats 5
step summary 180 $PY benchmarks/summary.py --device cuda --threads 4
echo "=== $failed step(s) failed"
exit "$failed"
