"""The loop: end-to-end runs of train.py on the tiny default, and loop-level invariants.

Kinds: an end-to-end run of the real entry point; slow-reference versus fast
equivalence (one micro-batch against many, count against token-budget micro-batching, padded
against packed); the
dynamic-sampling round budget with an engine that never yields contrast.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math

import pytest
import torch

import train
import verifier
from plumbing import distributed, policy
from rollout import Engine, Sample
from task import Dataset, Task
from tasks.tiny import TinyTask


@pytest.fixture(scope="module")
def tiny():
    model, tok = policy.load_policy("", torch.device("cpu"))
    return model, tok


HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One short `python train.py` run shared by the tests that read its outputs (with --tensorboard
    where the package is installed: .ci/run installs it)."""
    run = tmp_path_factory.mktemp("default") / "run"
    train.main(["--run_dir", str(run), "--steps", "2", "--eval_limit", "8", "--eval_k", "2",
                "--prompts_per_step", "8", "--gen_prompts_per_round", "12", "--mini_batch_size", "32",
                "--micro_batch_size", "16", "--tensorboard", str(HAS_TENSORBOARD).lower()])
    return run


@pytest.mark.engine  # transformers: generation, saving and loading final/
def test_end_to_end_tiny_default(default_run):
    """`python train.py` with a few steps: every output a run promises exists and is consistent."""
    run = default_run
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["config"]["steps"] == 2 and cfg["verifier_version"] == verifier.VERSION
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        for key in ("train/reward_mean", "train/correct_frac", "groups/all_correct_frac", "groups/all_wrong_frac",
                    "groups/kept_frac", "groups/gen_rounds", "length/mean", "length/p90", "length/truncated_frac",
                    "policy/entropy", "policy/clipfrac_low", "policy/clipfrac_high", "policy/approx_kl",
                    "policy/grad_norm", "time/generate", "time/update", "memory/peak_gb", "envelope/active_samples"):
            assert key in m and math.isfinite(m[key]), key
        assert -2.0 <= m["train/reward_mean"] <= 1.0
        assert m["policy/optimizer_steps"] == 2  # 8 groups x 8 answers / mini-batch 32
        assert m["envelope/active_samples"] == m["groups/kept"] * 8
        assert 0 <= m["sampler/logprob_absdiff_max"] < 1e-3  # sampler and trainer agree before the update
    rollouts = [json.loads(l) for l in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == sum(m["groups/generated"] for m in metrics) * 8
    r = rollouts[0]
    for key in ("run_id", "policy_version", "verifier_version", "dataset_hash", "seed", "finish_reason", "group_id"):
        assert r[key] not in (None, "")
    kept = [r for r in rollouts if r["kept"]]
    assert kept and all(r["advantage"] is not None for r in kept)
    assert all(r["truncated"] == (r["finish_reason"] == "length") for r in rollouts)
    # A response scored correct states its ground truth on its Answer: line.
    for r in rollouts:
        if r["correct"]:
            assert r["pred"] == r["ground_truth"]
    summary = json.loads((run / "summary.json").read_text())
    assert "heldout/avg@2" in summary and "heldout_after/avg@2" in summary
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(run / "final")
    policy.load_tokenizer(str(run / "final"))  # raises unless the saved tokenizer round-trips text
    base, _ = policy.load_policy("", torch.device("cpu"))
    diff = max((a - b).abs().max().item() for a, b in zip(final.parameters(), base.parameters()))
    assert diff > 0, "two DAPO steps left the weights unchanged"


def _random_batch(tok, n_groups: int, G: int, seed: int) -> train.Batch:
    """A batch with uneven prompt and response lengths and a mix of advantages."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for i in range(n_groups):
        p = torch.randint(4, 30, (int(torch.randint(5, 15, (1,), generator=g)),), generator=g).tolist()
        for _ in range(G):
            prompts.append(p)
            responses.append(torch.randint(4, 30, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist())
    rewards = torch.randint(0, 2, (n_groups * G,), generator=g).float() * 2 - 1
    import dapo

    return train.Batch(prompts, responses, dapo.group_advantages(rewards, G), torch.ones(n_groups * G),
                       torch.arange(n_groups).repeat_interleave(G), [None] * (n_groups * G))


@pytest.mark.parametrize("loss_agg", ["token-mean", "group-token-mean", "seq-mean-token-mean"])
def test_update_is_invariant_to_micro_batching(tiny, loss_agg):
    """One optimizer step with 1 micro-batch, with 5-response micro-batches and with a token budget,
    padded with and without the shared prompt pass or packed, gives the same weights: the
    denominators are those of the whole mini-batch. In float64 (a mathematical equality): the bound
    is far below what a per-micro-batch denominator moves."""
    model0, tok = tiny
    model0 = copy.deepcopy(model0).double()
    batch = _random_batch(tok, n_groups=4, G=4, seed=0)
    base = train.Config(group_size=4, prompts_per_step=4, mini_batch_size=16, loss_agg=loss_agg, lr=1e-2)
    results = []
    for over in (dict(micro_batch_size=16), dict(micro_batch_size=5), dict(micro_batch_tokens=60),
                 dict(micro_batch_size=5, share_prompt_forward=False), dict(pack_micro_batches=True),
                 dict(micro_batch_size=5, pack_micro_batches=True), dict(micro_batch_tokens=60, pack_micro_batches=True)):
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        train.update_policy(model, opt, batch, dataclasses.replace(base, **over), distributed.Dist(), torch.device("cpu"),
                            tok.pad_token_id)
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    start = torch.cat([p.detach().flatten() for p in model0.parameters()])
    assert (results[0] - start).abs().max() > 1e-6  # the step moved the weights
    for r in results[1:]:
        assert torch.allclose(r, results[0], atol=1e-8, rtol=0), (r - results[0]).abs().max()


@pytest.mark.parametrize("surrogate, loss_agg", [("cispo", "token-mean"), ("gspo", "seq-mean-token-mean")])
def test_update_with_each_surrogate_is_invariant_to_micro_batching(tiny, surrogate, loss_agg):
    """The same with --surrogate cispo / gspo and two mini-batches, so that the second one trains
    with ratios away from 1 (bounds tight enough to act): the GSPO stats per response are weighted
    by the pass's share of the responses, and equal for every split too."""
    model0, tok = tiny
    model0 = copy.deepcopy(model0).double()
    batch = _random_batch(tok, n_groups=4, G=4, seed=1)
    base = train.Config(group_size=4, prompts_per_step=4, mini_batch_size=8, loss_agg=loss_agg, lr=1e-2,
                        surrogate=surrogate, cispo_high=1.001, gspo_eps_low=1e-4, gspo_eps_high=1e-4)
    results, stats = [], []
    for over in (dict(micro_batch_size=8), dict(micro_batch_size=3), dict(micro_batch_tokens=40)):
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        stats.append(train.update_policy(model, opt, batch, dataclasses.replace(base, **over), distributed.Dist(),
                                         torch.device("cpu"), tok.pad_token_id))
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert stats[0]["policy/optimizer_steps"] == 2 and stats[0]["policy/approx_kl"] > 0  # mini-batch 2 is off-policy
    key = "policy/seq_clipfrac_low" if surrogate == "gspo" else "policy/clipfrac_high"
    assert stats[0][key] > 0  # the bound acted
    for r, s in zip(results[1:], stats[1:]):
        assert torch.allclose(r, results[0], atol=1e-8, rtol=0), (r - results[0]).abs().max()
        for k in ("policy/clipfrac_low", "policy/clipfrac_high", "policy/seq_clipfrac_low", "policy/seq_clipfrac_high"):
            assert s.get(k) == pytest.approx(stats[0].get(k), abs=1e-6), k  # fractions formed in float32


class _AllWrongEngine(Engine):
    """Answers that are always wrong: every group is all-wrong, dynamic sampling keeps nothing."""

    name, version, seeded = "all-wrong", "0", True

    def generate(self, prompts, params):
        return [[Sample([5, 1], "stop") for _ in range(params.n)] for _ in prompts]

    def sync_weights(self, model, policy_version):
        self.policy_version = policy_version
        return 0.0


@pytest.mark.parametrize("policy", ["error", "partial", "skip"])
def test_dynamic_sampling_round_budget_never_loops_forever(tiny, policy):
    _, tok = tiny
    cfg = train.Config(group_size=4, prompts_per_step=2, gen_prompts_per_round=3, max_gen_rounds=3,
                       mini_batch_size=8, on_exhausted=policy)
    data = _tiny_data(tok, cfg, 20)
    stream = train.PromptStream(len(data), 0)
    if policy == "error":
        with pytest.raises(RuntimeError, match="dynamic sampling kept 0/2 groups after 3 rounds"):
            train.collect_groups(0, _AllWrongEngine(), stream, data, cfg, distributed.Dist(), tok, Task(), [])
        return
    out = train.collect_groups(0, _AllWrongEngine(), stream, data, cfg, distributed.Dist(), tok, Task(), [])
    assert out.kept == [] and out.stats["groups/gen_rounds"] == 3 and out.stats["groups/exhausted"] == 1.0
    assert len(out.generated) == 9 and stream.position == 9


def _tiny_data(tok, cfg, n: int) -> Dataset:
    """The first n training problems of the tiny task, with their prompts."""
    return TinyTask().load("tiny", tok, cfg, held_out=False).head(n)


def test_exhausted_step_returns_unused_buffered_groups_to_the_buffer(tiny):
    """--on_exhausted skip with a staleness buffer: a buffered group that was not trained on stays
    in the buffer for the next step instead of vanishing."""
    _, tok = tiny
    cfg = train.Config(group_size=4, prompts_per_step=2, gen_prompts_per_round=3, max_gen_rounds=1,
                       mini_batch_size=8, on_exhausted="skip", max_rollout_age=2)
    data = _tiny_data(tok, cfg, 20)
    old = train.score_group(data.problems[0], data.prompt_ids[0], [Sample([5, 1], "stop")] * 4, cfg, Task(), tok)
    old.policy_version, old.kept = 0, True
    buffer = [old]
    out = train.collect_groups(1, _AllWrongEngine(), train.PromptStream(len(data), 0), data, cfg, distributed.Dist(), tok,
                               Task(), buffer)
    assert out.kept == [] and out.stats["groups/exhausted"] == 1.0
    assert buffer == [old] and old.kept and out.stats["groups/buffered"] == 1


class _SeededEngine(Engine):
    """Answers that depend only on (seed, prompt, sample index), some right, some wrong; records every request.

    tp: ranks per engine group. `diverge` makes this engine draw other tokens than its group peers
    (what ranks of one tensor-parallel engine given different seeds would do, silently)."""

    name, version, seeded = "seeded", "0", True

    def __init__(self, tok, answers: dict, tp: int = 1, diverge: bool = False):
        super().__init__()
        self.tok, self.answers, self.tp, self.diverge, self.requests = tok, answers, tp, diverge, []

    def generate(self, prompts, params):
        self.requests.append((params.seed, [list(p) for p in prompts]))
        out = []
        for p in prompts:
            right = self.answers[tuple(p)]
            texts = [f"Answer: {right if (params.seed + sum(p) + i + self.diverge) % 3 == 0 else 'x'}"
                     for i in range(params.n)]
            out.append([Sample(self.tok(t, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id], "stop")
                        for t in texts])
        return out


def _collect_on_ranks(world, engines, data, cfg, tok, monkeypatch):
    """collect_groups on `world` simulated ranks (threads; all_gather replaced by a barrier); results or exceptions."""
    import threading

    slots, barrier = [None] * world, threading.Barrier(world)

    def fake_all_gather(obj, dist):
        slots[dist.rank] = obj
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out

    monkeypatch.setattr(distributed, "all_gather_objects", fake_all_gather)
    results = [None] * world

    def run(r):
        try:
            results[r] = train.collect_groups(0, engines[r], train.PromptStream(len(data), 0), data, cfg,
                                              distributed.Dist(r, world), tok, Task(), [])
        except distributed.GroupMismatchError as e:
            results[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def test_engine_groups_share_requests_and_equal_one_process(tiny, monkeypatch):
    """4 ranks in two tensor-parallel engine groups ([0, 1], [2, 3]) with --gen_shards 2 draw the
    rollouts of 1 process with --gen_shards 2: every rank of a group submits the same prompts with
    the same seed (this fails if a group's ranks were given different ones), each shard goes to
    one group, and each group's rollouts are scored once, with the group that generated them."""
    _, tok = tiny
    cfg = train.Config(group_size=4, prompts_per_step=8, gen_prompts_per_round=6, max_gen_rounds=2, mini_batch_size=16,
                       gen_shards=2)
    data = _tiny_data(tok, cfg, 40)
    answers = {tuple(p): pr.answer for p, pr in zip(data.prompt_ids, data.problems)}
    one = train.collect_groups(0, _SeededEngine(tok, answers), train.PromptStream(len(data), 0), data, cfg, distributed.Dist(),
                               tok, Task(), [])
    engines = [_SeededEngine(tok, answers, tp=2) for _ in range(4)]
    ranks = _collect_on_ranks(4, engines, data, cfg, tok, monkeypatch)
    assert engines[0].requests == engines[1].requests and engines[2].requests == engines[3].requests
    assert engines[0].requests and engines[2].requests and engines[0].requests != engines[2].requests
    key = lambda out: [(g.problem.id, g.seed, g.gen_shard, g.gen_round, g.kept, [s.token_ids for s in g.samples])  # noqa: E731
                       for g in out.generated]
    assert one.stats["groups/gen_rounds"] == 2 and {g.gen_group for g in one.generated} == {0}
    for out in ranks:
        assert key(out) == key(one) and [g.problem.id for g in out.kept] == [g.problem.id for g in one.kept]
        assert all(g.gen_group == g.gen_shard == g.gen_shard % 2 for g in out.generated)
        assert {g.gen_group for g in out.generated} == {0, 1}


def test_engine_group_whose_ranks_drew_different_tokens_stops(tiny, monkeypatch):
    _, tok = tiny
    cfg = train.Config(group_size=4, prompts_per_step=8, gen_prompts_per_round=6, mini_batch_size=16, gen_shards=2)
    data = _tiny_data(tok, cfg, 40)
    answers = {tuple(p): pr.answer for p, pr in zip(data.prompt_ids, data.problems)}
    engines = [_SeededEngine(tok, answers, tp=2, diverge=(r == 3)) for r in range(4)]
    for err in _collect_on_ranks(4, engines, data, cfg, tok, monkeypatch):  # every rank stops, none hangs
        assert isinstance(err, distributed.GroupMismatchError)
        assert "ranks [2, 3] (engine group 1) drew different tokens for shard 1" in str(err)


def test_prompt_stream_is_seeded_and_covers_each_epoch():
    a, b = train.PromptStream(7, 3), train.PromptStream(7, 3)
    first = a.take(7)
    assert sorted(first) == list(range(7)) and first == b.take(7)
    assert sorted(a.take(7)) == list(range(7))
    assert train.PromptStream(7, 4).take(7) != first


def test_bad_dataset_rows_are_named(tmp_path):
    cfg = train.Config()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n" + json.dumps({"problem": "2+2?"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl row 1: field 'answer'"):
        Task().read(str(bad), cfg, held_out=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Task().read(str(tmp_path / "missing.jsonl"), cfg, held_out=False)


def test_config_rejects_inconsistent_settings(monkeypatch):
    with pytest.raises(ValueError, match=r"--vllm_tp 2 must be >= 1 and divide the number of processes \(1\)"):
        train.parse_config(["--engine", "vllm", "--vllm_tp", "2"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="--vllm_tp 2 needs --engine vllm"):
        train.parse_config(["--vllm_tp", "2", "--prompts_per_step", "16", "--mini_batch_size", "64"])
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="loss_agg"):
        train.parse_config(["--loss_agg", "mean"])
    with pytest.raises(ValueError, match="eps_low"):
        train.parse_config(["--eps_high", "0.1"])
    with pytest.raises(ValueError, match="mini_batch_size"):
        train.parse_config(["--mini_batch_size", "48"])
    with pytest.raises(ValueError, match="--sampler_logprobs true"):
        train.parse_config(["--offpolicy_objective", "decoupled", "--sampler_logprobs", "false"])


def test_grpo_preset_turns_every_dapo_switch_off():
    cfg = train.parse_config(["--preset", "grpo"])
    assert cfg.eps_high == cfg.eps_low and not cfg.dynamic_sampling and not cfg.overlong_penalty
    assert not cfg.overlong_filter and cfg.loss_agg == "seq-mean-token-mean"


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit):
        train.parse_config(["--help"])
    out = capsys.readouterr().out
    for f in dataclasses.fields(train.Config):
        assert f"--{f.name}" in out


def test_load_policy_turns_dropout_off(tmp_path):
    """A model saved with dropout loads with none: two training-mode passes agree exactly, which the
    first mini-batch's old log-probs (its own detached forward pass) rely on."""
    import shutil

    src = policy.DEFAULT_MODEL
    shutil.copytree(src, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["attention_dropout"] = 0.5
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    from transformers import AutoModelForCausalLM

    ids = torch.randint(2, 80, (4, 24))
    raw = AutoModelForCausalLM.from_pretrained(tmp_path / "m").train()
    assert not torch.equal(raw(input_ids=ids).logits, raw(input_ids=ids).logits)  # dropout is live when loaded plainly
    model, _ = policy.load_policy(str(tmp_path / "m"), torch.device("cpu"))
    model.train()
    assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)


def test_metrics_reach_tensorboard_and_wandb(tmp_path, monkeypatch):
    """--tensorboard and --wandb_project receive every numeric metric of metrics.jsonl at its step,
    plus the held-out evaluation before (step 0) and after (step --steps). Stand-in modules record
    the calls, so this runs without either package; the next test reads a real TensorBoard file."""
    import importlib.machinery
    import sys
    import types

    tb_calls, wb_calls, events = [], [], []

    class Writer:
        def __init__(self, logdir):
            events.append(("tb_dir", logdir))

        def add_scalar(self, key, value, step):
            tb_calls.append((key, value, step))

        def close(self):
            events.append("tb_close")

    class Run:
        def log(self, data, step):
            wb_calls.append((dict(data), step))

        def finish(self):
            events.append("wb_finish")

    tb_mod = types.ModuleType("torch.utils.tensorboard")
    tb_mod.SummaryWriter = Writer
    wb_mod = types.ModuleType("wandb")
    wb_mod.init = lambda **kw: events.append(("wb_init", kw["project"])) or Run()
    for mod in (tb_mod, wb_mod):  # other libraries probe installed packages with importlib.util.find_spec
        mod.__spec__ = importlib.machinery.ModuleSpec(mod.__name__, None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", tb_mod)
    monkeypatch.setitem(sys.modules, "wandb", wb_mod)
    run = tmp_path / "run"
    train.main(["--run_dir", str(run), "--steps", "2", "--eval_limit", "8", "--eval_k", "2", "--prompts_per_step", "4",
                "--gen_prompts_per_round", "6", "--mini_batch_size", "32", "--probe_every", "0", "--tensorboard", "true",
                "--wandb_project", "p"])
    assert ("tb_dir", str(run / "tb")) in events and ("wb_init", "p") in events
    assert "tb_close" in events and "wb_finish" in events
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        nums = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        assert nums and {(k, v, m["step"]) for k, v in nums.items()} <= set(tb_calls)
        assert any(step == m["step"] and nums.items() <= data.items() for data, step in wb_calls)
    summary = json.loads((run / "summary.json").read_text())
    assert ("heldout/avg@2", summary["heldout/avg@2"], 0) in tb_calls
    assert ("heldout/avg@2", summary["heldout_after/avg@2"], 2) in tb_calls
    steps = [step for _, step in wb_calls]
    assert steps == sorted(steps)  # W&B drops a step that goes backwards


def test_tensorboard_event_file_holds_the_metrics(default_run):
    """With the real tensorboard package: the event file reads back with the metrics.jsonl values."""
    if not HAS_TENSORBOARD:
        pytest.skip("pip install tensorboard (.ci/run installs it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = default_run
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    got = [(e.step, e.value) for e in acc.Scalars("train/reward_mean")]
    assert [s for s, _ in got] == [0, 1]
    for (step, value), m in zip(got, metrics):
        assert math.isclose(value, m["train/reward_mean"], rel_tol=1e-6, abs_tol=1e-7)
