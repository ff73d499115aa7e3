"""Tests of eval.py: the estimators, the bootstrap, the rank split, the data counts, and the CLI.

Three kinds:
  - the estimators against brute force and hand-derived values (pass@k by enumerating subsets,
    maj@k ties worked out by hand, avg@k as the mean of the correctness matrix);
  - slow reference versus fast: a scripted engine evaluated on 1 process and on 2 to 4 simulated
    ranks (threads sharing a fake all_gather) must give the same per-problem results;
  - end-to-end runs of `python eval.py` (its `main`) on the tiny default model, on the official
    AIME 2024 parquet and on the tiny task, plus `eval.py compare` on their reports.

The end-to-end tests use the shipped model (assets/tiny-base). EVAL_TEST_MODEL=DIR points them at
another HF directory (for example one built with `python -m tasks.tiny_base --steps 20 --out DIR`).

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_eval.py
"""

import dataclasses
import itertools
import json
import math
import os
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import eval as ev  # noqa: E402
import rollout  # noqa: E402
import train  # noqa: E402
from evaluation import measure, reports  # noqa: E402
from plumbing import checkpoints, cli, distributed, policy  # noqa: E402
from task import Dataset, Problem, Task, load_task, task_spec  # noqa: E402
from tasks.tiny import TinyTask  # noqa: E402

FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIXTURES = Path(__file__).resolve().parent / "fixtures"  # small public datasets (fixtures/README.md)
AIME_PARQUET = FIXTURES / "aime2024_dapo_eval.parquet"
TEST_MODEL = os.environ.get("EVAL_TEST_MODEL", "")  # '' = the shipped default, assets/tiny-base


# --- pass@k --------------------------------------------------------------------------------------


@FEW
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_enumeration_of_subsets(nck):
    n, c, k = nck
    answers = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(answers[i] for i in s) for s in subsets) / len(subsets)
    assert ev.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_hand_values():
    assert ev.pass_at_k(4, 1, 4) == 1.0  # every 4-subset of 4 samples holds the correct one
    assert ev.pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 = c / n
    assert ev.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # C(2,2)/C(4,2) = 1/6 draws miss both
    assert ev.pass_at_k(32, 0, 32) == 0.0
    assert ev.pass_at_k(1000, 1, 1) == pytest.approx(1e-3)  # large n stays exact (product form)
    for bad in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(ValueError):
            ev.pass_at_k(*bad)


# --- avg@k and the per-problem scores -----------------------------------------------------------------


def _records(correct: np.ndarray) -> list[dict]:
    return [{"correct": row.tolist(), "maj_correct": bool(row.mean() > 0.5)} for row in correct]


@FEW
@given(st.integers(1, 6), st.integers(1, 6), st.randoms(use_true_random=False))
def test_avg_at_k_is_mean_of_correctness_matrix(P, k, rnd):
    correct = np.array([[rnd.random() < 0.4 for _ in range(k)] for _ in range(P)])  # (P, k)
    scores = ev.problem_scores(_records(correct))
    assert ev.avg_at_k(correct) == pytest.approx(correct.mean())
    assert scores[f"avg@{k}"].mean() == pytest.approx(correct.mean())
    assert scores["pass@1"].mean() == pytest.approx(correct.mean())  # pass@1 estimator = c / n
    assert set(scores) >= {f"pass@{j}" for j in range(1, k + 1)}
    for j in range(1, k):  # pass@j never decreases with j
        assert np.all(scores[f"pass@{j + 1}"] >= scores[f"pass@{j}"] - 1e-12)


# --- maj@k and its tie rule ---------------------------------------------------------------------------


def test_majority_vote_plain_majority():
    assert ev.majority_vote(["7", "8", "8"]) == 1  # "8" has 2 votes; its first sample is index 1
    assert ev.majority_vote([None, None, None, "4"]) == 3  # unextracted answers do not vote


def test_majority_vote_ties_go_to_earliest_first_occurrence():
    assert ev.majority_vote(["3", "5", "5", "3"]) == 0  # 2-2 tie; "3" appears first (index 0)
    assert ev.majority_vote(["5", "3", "3", "5"]) == 0  # same votes, other order: "5" wins
    assert ev.majority_vote([None, "5", None, "3", "3", "5"]) == 1  # 2-2 tie; "5" first at index 1
    assert ev.majority_vote(["1", "2", "3"]) == 0  # all tied at one vote: the first sample's answer
    assert ev.majority_vote([None, None]) is None
    assert ev.majority_vote([]) is None


def test_maj_at_k_takes_the_verdict_of_the_winning_answer():
    assert ev.maj_at_k(["3", "5", "5", "3"], [False, True, True, False]) is False  # tie -> "3", wrong
    assert ev.maj_at_k(["5", "3", "3", "5"], [True, False, False, True]) is True  # tie -> "5", right
    assert ev.maj_at_k(["7", "8", "8"], [True, False, False]) is False  # one right answer is outvoted
    assert ev.maj_at_k([None, None, "4"], [False, False, True]) is True
    assert ev.maj_at_k([None, None], [False, False]) is False  # nothing extracted: wrong


# --- maj@k votes by answer class: answers the verifier judges equal vote together ---------------------


def test_math_mode_vote_groups_equal_values():
    """facebookresearch/deepconf#15: truth 1/2 and the answers \\frac{1}{2}, 0.5, 1/2, 3, 3. On raw
    strings the two 3s win (wrong); by the verifier's equality the three spellings of 1/2 win (right)."""
    preds = ["\\frac{1}{2}", "0.5", "1/2", "3", "3"]
    correct = [True, True, True, False, False]
    assert ev.maj_at_k(preds, correct) is False  # the old vote, on strings
    classes = ev.answer_classes(preds, measure.same_answer("math"))
    assert classes == [0, 0, 0, 1, 1]
    assert ev.maj_at_k(classes, correct) is True
    more = ["3", None, "\\dfrac12", "0.50", "x", "\\sqrt{4}", "2", "3"]
    assert ev.answer_classes(more, measure.same_answer("math")) == [0, None, 1, 1, 2, 3, 3, 0]  # 2 = sqrt 4
    assert ev.majority_vote(ev.answer_classes(more, measure.same_answer("math"))) == 0  # a 2-2-2 tie: 3 comes first


def test_evaluate_votes_by_class_in_math_mode():
    script = {"p0": (["Answer: \\frac{1}{2}", "Answer: 0.5", "Answer: 1/2", "Answer: 3", "Answer: 3"], "Answer: 3")}
    data = Dataset([Problem("p0", [{"role": "user", "content": "p0"}], "1/2")], [[ord(c) for c in "p0"]], "scripted", "0")
    params = dataclasses.replace(PARAMS, n=5)
    res = ev.evaluate(ScriptedEngine(script), FakeTokenizer(), data, params, dataclasses.replace(CFG, verifier="math"), Task())
    (rec,) = res["per_problem"]
    assert (rec["maj_correct"], rec["maj_pred"], rec["classes"], rec["distinct_answers"]) == \
        (True, "\\frac{1}{2}", [0, 0, 0, 1, 1], 2)
    assert res["metrics"]["maj@5"] == 1.0 and res["settings"]["maj_equality"].startswith("math-verify")


@FEW
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)) | st.none(), min_size=1, max_size=12))
def test_answer_classes_are_the_equivalence_classes(fractions):
    """Answers "a/b" with equality by value (a stand-in for the verifier's): classes are exactly the
    value classes, numbered by first appearance; the winner's class has the most votes."""
    from fractions import Fraction

    preds = [None if f is None else f"{f[0]}/{f[1]}" for f in fractions]
    value = lambda text: Fraction(*map(int, text.split("/")))  # noqa: E731
    classes = ev.answer_classes(preds, lambda rep, new: value(rep) == value(new))
    seen = list(dict.fromkeys(value(p) for p in preds if p is not None))
    assert classes == [None if p is None else seen.index(value(p)) for p in preds]
    assert ev.answer_classes(preds) == [None if p is None else list(dict.fromkeys(q for q in preds if q)).index(p) for p in preds]
    winner = ev.majority_vote(classes)
    votes = Counter(c for c in classes if c is not None)
    assert (winner is None) == (not votes) and (winner is None or votes[classes[winner]] == max(votes.values()))


# --- bootstrap ----------------------------------------------------------------------------------------


def test_bootstrap_interval_contains_mean_and_collapses_on_constants():
    rng = np.random.default_rng(0)
    x = rng.random(30)  # (P,)
    lo, hi = ev.bootstrap_ci(x, n_boot=500, level=0.95, seed=1)
    assert lo < x.mean() < hi
    assert hi - lo < 4 * x.std() / math.sqrt(30)  # about 2 * 1.96 standard errors wide
    lo, hi = ev.bootstrap_ci(np.full(10, 0.25), n_boot=200, level=0.95, seed=1)
    assert lo == hi == pytest.approx(0.25)
    with pytest.raises(ValueError):
        ev.bootstrap_ci(np.array([]), n_boot=10, level=0.95, seed=0)


def test_paired_bootstrap_needs_a_real_difference():
    rng = np.random.default_rng(0)
    base = rng.random(30)  # (P,) problem difficulty dominates the spread
    same = ev.paired_bootstrap(base, base, n_boot=500, level=0.95, seed=0)
    assert same["diff"] == 0 and not same["excludes_zero"]
    better = ev.paired_bootstrap(base + 0.05, base, n_boot=500, level=0.95, seed=0)
    assert better["diff"] == pytest.approx(0.05) and better["excludes_zero"]  # paired: tiny shift is clear
    noisy = ev.paired_bootstrap(base + rng.normal(0, 0.3, 30), base, n_boot=500, level=0.95, seed=0)
    assert noisy["lo"] < noisy["diff"] < noisy["hi"]
    with pytest.raises(ValueError):
        ev.paired_bootstrap(base, base[:5], n_boot=10, level=0.95, seed=0)


# --- splitting problems across ranks -----------------------------------------------------------------


@FEW
@given(st.integers(1, 40), st.integers(1, 9))
def test_shard_then_unshard_is_identity_with_equal_work(n, world):
    shards = [distributed.shard(n, r, world) for r in range(world)]
    assert len({len(idx) for idx, _ in shards}) == 1  # every rank makes the same generate calls
    parts = [[i for i in idx[:real]] for idx, real in shards]
    assert sorted(i for p in parts for i in p) == list(range(n))  # each problem exactly once
    assert distributed.unshard(parts, world) == list(range(n))


# --- evaluate() with a scripted engine --------------------------------------------------------------------


class FakeTokenizer:
    """One character per token id."""

    chat_template = "fake"

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))



class ScriptedEngine(rollout.Engine):
    """Answers from a script keyed by problem id; truncates at the token budget like a real engine."""

    name, version, seeded = "scripted", "1", True

    def __init__(self, script):
        super().__init__()
        self.script, self.prompts_seen, self.requests = script, 0, []

    def generate(self, prompts, params):
        self.prompts_seen += len(prompts)
        self.requests.append((params.seed, params.temperature, [list(p) for p in prompts]))
        out = []
        for p in prompts:
            sampled, greedy = self.script["".join(map(chr, p))]
            texts = [greedy] if params.temperature == 0 else sampled[: params.n]
            out.append([rollout.Sample([ord(c) for c in t[: params.max_new_tokens]],
                                       "length" if len(t) > params.max_new_tokens else "stop") for t in texts])
        return out


SCRIPT = {  # id: (4 sampled answers, greedy answer); ground truths 5, 7, 9
    "p0": (["Answer: 5", "Answer: 5", "Answer: 3", "no idea"], "Answer: 5"),  # c=2, maj "5" right
    "p1": (["Answer: 1", "Answer: 7", "Answer: 1", "Answer: 7"], "Answer: 2"),  # c=2, tie -> "1", wrong
    "p2": (["x" * 50] * 4, "x"),  # c=0, all truncated at 40, nothing extracted
}
PROBLEMS = [Problem(pid, [{"role": "user", "content": pid}], ans) for pid, ans in (("p0", "5"), ("p1", "7"), ("p2", "9"))]
DATA = Dataset(PROBLEMS, [[ord(c) for c in p.id] for p in PROBLEMS], "scripted", "0")  # prompt = the id's characters
CFG = train.Config(eval_k=4, max_response_len=40)
PARAMS = rollout.SamplingParams(n=4, max_new_tokens=40, temperature=1.0, top_p=0.7, seed=0)


def test_evaluate_hand_computed_metrics():
    # Called exactly as train.py calls it (no greedy pass), then with greedy.
    res = ev.evaluate(ScriptedEngine(SCRIPT), FakeTokenizer(), DATA, PARAMS, CFG, Task())
    m = res["metrics"]
    assert {"avg@4", "pass@1", "pass@2", "pass@4", "maj@4", "mean_length", "truncated_frac", "gen_seconds"} <= set(m)
    assert "greedy_pass@1" not in m
    assert m["avg@4"] == pytest.approx(4 / 12) == pytest.approx(np.mean(res["correct"]))
    assert m["pass@2"] == pytest.approx((5 / 6 + 5 / 6 + 0) / 3)  # 1 - C(2,2)/C(4,2) = 5/6 twice, then 0
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["maj@4"] == pytest.approx(1 / 3)  # only p0; p1's tie goes to the wrong "1"
    assert m["truncated_frac"] == pytest.approx(4 / 12)
    assert m["mean_length_correct"] == pytest.approx(9.0)
    p0, p1, p2 = res["per_problem"]
    assert (p0["maj_pred"], p1["maj_pred"], p2["maj_pred"]) == ("5", "1", None)
    assert p2["reasons"] == {"no_answer": 4} and p2["truncated_frac"] == 1.0
    for name, (lo, hi) in res["ci"].items():
        assert lo <= m[name] + 1e-12 and m[name] <= hi + 1e-12
    rows = res["length_table"]
    assert sum(r["samples"] for r in rows) == 12 and rows[-1]["samples"] == 4 and rows[-1]["accuracy"] == 0.0
    s = res["settings"]
    assert (s["n_problems"], s["k"], s["temperature"], s["top_p"], s["max_new_tokens"], s["seed"]) == (3, 4, 1.0, 0.7, 40, 0)
    assert s["verifier"] == "dapo" and s["verifier_version"] and s["commit"] and s["engine"] == "scripted 1"
    # cost: tokens 34 (9+9+9+7), 36, 160 (truncated at 40); diversity per problem: answers {5, 5, 3, none}: 2 distinct,
    # 1.5 bits, one duplicate response of 4; {1, 7, 1, 7}: 2, 1 bit, 2 duplicates; 4 identical unextracted: 0, 0 bits, 3
    assert m["tokens_per_problem"] == pytest.approx(230 / 3) and m["tokens_per_problem_p90"] == pytest.approx(36 + 0.8 * 124)
    assert m["seconds_per_problem"] == pytest.approx(m["gen_seconds"] / 3)
    assert [p0["distinct_answers"], p1["distinct_answers"], p2["distinct_answers"]] == [2, 2, 0]
    assert m["distinct_answers"] == pytest.approx(4 / 3) and m["answer_entropy_bits"] == pytest.approx(2.5 / 3)
    assert m["duplicate_response_frac"] == pytest.approx((0.25 + 0.5 + 0.75) / 3)

    g = ev.evaluate(ScriptedEngine(SCRIPT), FakeTokenizer(), DATA, PARAMS, CFG, Task(), greedy=True)
    assert g["metrics"]["greedy_pass@1"] == pytest.approx(1 / 3)
    assert [r["greedy_correct"] for r in g["per_problem"]] == [True, False, False]


@pytest.mark.parametrize("world, tp", [(2, 1), (3, 1), (4, 1), (2, 2), (4, 2)])
def test_ranks_split_and_gather_like_one_process(world, tp, monkeypatch):
    """2-4 simulated ranks (threads; all_gather replaced by a barrier) == 1 process; with tp = 2 the
    ranks of an engine group ([0, 1], [2, 3]) ask their engine for the same problems."""
    one = ev.evaluate(ScriptedEngine(SCRIPT), FakeTokenizer(), DATA, PARAMS, CFG, Task(), greedy=True)
    slots, barrier = [None] * world, threading.Barrier(world)

    def fake_all_gather(obj, dist):
        slots[dist.rank] = obj
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out

    monkeypatch.setattr(distributed, "all_gather_objects", fake_all_gather)
    engines, results = [ScriptedEngine(SCRIPT) for _ in range(world)], [None] * world
    for e in engines:
        e.tp = tp

    def run(r):
        results[r] = ev.evaluate(engines[r], FakeTokenizer(), DATA, PARAMS, CFG, Task(), greedy=True,
                                 dist=distributed.Dist(r, world))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len({e.prompts_seen for e in engines}) == 1  # same generate work on every rank (padding)
    for res in results:
        assert res["per_problem"] == one["per_problem"]
        assert {k: v for k, v in res["metrics"].items() if "seconds" not in k and "per_s" not in k} == \
            {k: v for k, v in one["metrics"].items() if "seconds" not in k and "per_s" not in k}
        assert res["settings"]["world_size"] == world and res["settings"]["engine_groups"] == world // tp
    if tp > 1:
        assert all(engines[r].requests == engines[r - r % tp].requests for r in range(world))
        assert world == tp or engines[0].requests != engines[tp].requests


# --- inputs: datasets and the checkpoint's config -----------------------------------------------------


def _load(spec, limit: int = 0):
    """(problems, info) of an evaluation set as eval.py reads it (distinct problems, prompts checked)."""
    data = load_task(task_spec("", spec)).load(spec, policy.load_tokenizer(""), train.Config(), held_out=True, limit=limit)
    return data.problems, {"dataset": data.name, "dataset_hash": data.hash, **data.info}


def test_aime_parquet_has_30_problems_with_32_rows_each():
    problems, info = _load(str(AIME_PARQUET))
    assert len(problems) == 30 and len({p.id for p in problems}) == 30
    assert info["dataset_rows"] == 960 and info["rows_per_problem"] == 32
    assert info["dataset"] == str(AIME_PARQUET)
    assert all(p.answer.isdigit() for p in problems)
    five, _ = _load(str(AIME_PARQUET), limit=5)
    assert [p.id for p in five] == [p.id for p in problems[:5]]
    jsonl, info = _load(str(FIXTURES / "aime2024.jsonl"))
    assert len(jsonl) == 30 and info["rows_per_problem"] == 1
    assert [p.answer for p in jsonl] and {p.answer for p in jsonl} == {p.answer for p in problems}


def test_missing_data_names_the_fix(tmp_path):
    """A --data that is neither a generated task's name nor a file gets a message naming what to pass."""
    for spec in (str(tmp_path / "missing.jsonl"), "aime2024_dapo_eval", str(tmp_path)):
        with pytest.raises(FileNotFoundError, match="pass --data/--eval_data a .parquet or .jsonl path, or one of the "
                                                     r"generated tasks \['arith', 'tiny'\]"):
            Task().read(spec, train.Config(), held_out=True)
    with pytest.raises(ValueError, match="data 'tiny' is generated by the task tasks.tiny:TinyTask, not by Task"):
        Task().read("tiny", train.Config(), held_out=True)


def test_checkpoint_settings_are_used_and_flags_override(tmp_path):
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    saved = {"config": {"max_response_len": 77, "max_prompt_len": 300, "instruction": "none", "verifier": "dapo-official",
                        "prompt_truncation": "left", "trust_remote_code": True, "lr": 0.5, "not_a_field_any_more": 1}}
    (run / "final" / "dapo_run.json").write_text(json.dumps(saved))
    model_dir = ev.resolve_model(str(run))  # a run directory means its final/
    assert model_dir == run / "final"
    cfg, source = ev.checkpoint_settings(model_dir, ev.EvalConfig(k=8))
    assert (cfg.max_response_len, cfg.max_prompt_len, cfg.instruction, cfg.verifier, cfg.prompt_truncation) == \
        (77, 300, "none", "dapo-official", "left")
    assert source.endswith("dapo_run.json")
    assert cfg.trust_remote_code is False  # a JSON file must not switch on running model code
    cfg, _ = ev.checkpoint_settings(model_dir, ev.EvalConfig(max_new_tokens=5, verifier="dapo", instruction="dapo"))
    assert (cfg.max_response_len, cfg.verifier, cfg.instruction) == (5, "dapo", "dapo")
    foreign = tmp_path / "hf"
    foreign.mkdir()
    with pytest.raises(ValueError, match="--max_new_tokens"):
        ev.checkpoint_settings(foreign, ev.EvalConfig())  # budget unknown: refuse to guess
    with pytest.raises(ValueError, match="--verifier"):
        ev.checkpoint_settings(foreign, ev.EvalConfig(max_new_tokens=5, verifier="nope"))
    with pytest.raises(FileNotFoundError):
        ev.resolve_model(str(foreign))


def test_a_checkpoint_from_before_the_task_flag_keeps_its_task_and_options(tmp_path):
    """Configs saved before --task carried the tiny task's options as tiny_* fields: eval.py and a resume
    read them as TinyTask's task_args (only the ones that differ from its defaults, only on --data tiny)."""
    old = {"data": "tiny", "tiny_train_size": 20000, "tiny_heldout_size": 64, "tiny_heldout_seed": 3, "verifier": "dapo"}
    new = checkpoints.upgrade_config(old)
    assert not any(k.startswith("tiny_") for k in new)
    assert json.loads(new["task_args"]) == {"heldout_size": 64, "heldout_seed": 3}
    assert json.loads(checkpoints.upgrade_config({**old, "tiny_heldout_size": 256, "tiny_heldout_seed": 0})["task_args"]) == {}
    assert "task_args" not in checkpoints.upgrade_config({**old, "data": "x.parquet"})  # a file's run: the options were unused
    assert checkpoints.upgrade_config({"task_args": '{"train_size": 5}', "tiny_train_size": 9}) == {"task_args": '{"train_size": 5}'}
    # the defaults the migration drops are the tiny task's (if TinyTask's change, old runs must spell theirs out)
    assert {new: default for new, default in checkpoints._TINY_FIELDS.values()} == {
        k: getattr(TinyTask(), k) for k in ("train_size", "heldout_size", "heldout_seed")}
    run = tmp_path / "old" / "final"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "dapo_run.json").write_text(json.dumps({"config": old}))
    settings, _ = ev.checkpoint_settings(run, ev.EvalConfig())
    task = load_task(task_spec(settings.task, settings.data), settings.task_args)
    assert task == TinyTask(heldout_size=64, heldout_seed=3)


EVAL_REFUSED = [  # (argv, the start of the one error line): one row per rule of eval.check_eval_config and compare
    (["--limit", "-1"], "--limit must be >= 0"),
    (["--k", "0"], "--k must be >= 1"),
    (["--top_p", "0"], "--top_p must be in (0, 1]"),
    (["--top_p", "1.5"], "--top_p must be in (0, 1]"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--temperature", "inf"], "--temperature must be >= 0"),
    (["--max_new_tokens", "-1"], "--max_new_tokens must be >= 0"),
    (["--max_prompt_len", "-1"], "--max_prompt_len must be >= 0"),
    (["--prompt_truncation", "right"], "--prompt_truncation must be error, left or skip ('' = the checkpoint's)"),
    (["--instruction", "chat"], "--instruction must be dapo, none or a template holding {problem}"),
    (["--verifier", "loose"], "--verifier must be one of"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--engine", "sglang"], "--engine must be auto, hf or vllm"),
    (["--vllm_tp", "0"], "--vllm_tp must be >= 1"),
    (["--engine_max_batch", "0"], "--engine_max_batch must be >= 1"),
    (["--device", "tpu"], "--device must be auto, cpu or cuda"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--n_boot", "0"], "--n_boot must be >= 1"),
    (["--ci_level", "1"], "--ci_level must be in (0, 1)"),
    (["--k", "x"], "argument --k: invalid int value"),
    (["--paraphrases", "tiny:0"], "--paraphrases 'tiny:0': expected 'tiny' or 'tiny:K' with K in 1..5"),
    (["compare", "EMPTY", "EMPTY"], "compare: EMPTY is not an eval.py report (no settings with k)"),
    (["compare", "MISSING", "MISSING"], "compare: 'MISSING' is not a file"),
    (["compare", "EMPTY", "EMPTY", "--ci_level", "0"], "--ci_level must be in (0, 1)"),
    (["compare", "EMPTY", "EMPTY", "--seed", "-2"], "--seed must be >= 0"),
]


@pytest.mark.parametrize("argv,message", EVAL_REFUSED, ids=[" ".join(a) for a, _ in EVAL_REFUSED])
def test_bad_evaluation_input_is_one_line(argv, message, capsys, tmp_path):
    (tmp_path / "empty.json").write_text("{}")  # what `eval.py compare {} {}` read: a JSON object, but no report
    paths = {"EMPTY": str(tmp_path / "empty.json"), "MISSING": str(tmp_path / "missing.json")}
    argv = [paths.get(a, a) for a in argv]
    try:
        code = cli.run_cli(ev.main, argv + (["--limit", "2"] if argv[0] != "compare" and "--limit" not in argv else []))
    except SystemExit as e:  # argparse's own errors exit inside the parser (cli.ArgumentParser)
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    message = message.replace("EMPTY", paths["EMPTY"]).replace("MISSING", paths["MISSING"])
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {message}"), err


def test_vllm_tp_must_divide_the_processes(capsys):
    assert cli.run_cli(ev.main, ["--engine", "vllm", "--vllm_tp", "2", "--k", "1", "--limit", "1"]) == 2
    assert "error: --vllm_tp 2 must be >= 1 and divide the number of processes (1)" in capsys.readouterr().err


def test_model_settings_mirror_train_config():
    """eval.ModelSettings reads train.Config's fields back from dapo_run.json: same names, same
    defaults, and the shipped tiny base records exactly those defaults."""
    defaults = train.Config()
    for f in dataclasses.fields(ev.ModelSettings):
        if f.name != "model":
            assert getattr(defaults, f.name) == f.default, f.name
    shipped = json.loads((ev.DEFAULT_MODEL / "dapo_run.json").read_text())["config"]
    assert shipped == {k: getattr(defaults, k) for k in shipped}


def test_paper_deviations_lists_each_difference():
    _, info = _load(str(AIME_PARQUET))
    paper = {**reports.PAPER_PROTOCOL, **info}
    assert reports.paper_deviations(paper) == []
    dev = reports.paper_deviations({**paper, "verifier": "dapo", "k": 4})
    assert len(dev) == 2 and any(d.startswith("verifier") for d in dev)
    _, info = _load(str(FIXTURES / "dapo_math_17k_64.jsonl"))  # not AIME 2024
    assert reports.paper_deviations({**paper, **info}) == [
        f"dataset: {info['dataset']!r} (paper AIME 2024, one of ['aime2024.jsonl', 'aime2024_dapo_eval.parquet'])"]


# --- end to end: the real entry point on the tiny model ----------------------------------------------


def _model_args() -> list[str]:
    path = Path(TEST_MODEL) if TEST_MODEL else ev.DEFAULT_MODEL
    if not (path / "config.json").exists():
        pytest.fail(f"no model at {path}: build it with `python -m tasks.tiny_base` (or set EVAL_TEST_MODEL=DIR)")
    # An explicit budget works for any model directory (one without dapo_run.json needs it).
    # The transformers engine explicitly: these tests check eval's logic and the HF path; with vLLM
    # installed "auto" would pick it (tests/test_vllm.py covers that engine).
    return (["--model", TEST_MODEL] if TEST_MODEL else []) + ["--engine", "hf"]


@pytest.mark.engine  # transformers: eval.py end to end
def test_end_to_end_aime_parquet(tmp_path, capsys):
    out = tmp_path / "aime"
    ev.main(_model_args() + ["--data", str(AIME_PARQUET), "--limit", "5", "--k", "2", "--max_new_tokens", "16",
                             "--n_boot", "200", "--out", str(out)])
    rep = json.loads((out / "report.json").read_text())
    s = rep["settings"]
    assert (s["n_problems"], s["k"], s["n_samples"], s["max_new_tokens"]) == (5, 2, 2, 16)
    assert (s["temperature"], s["top_p"], s["seed"], s["greedy"]) == (1.0, 0.7, 0, True)
    assert (s["dataset_rows"], s["rows_per_problem"]) == (960, 32)
    assert s["verifier"] == "dapo" and s["verifier_version"] and s["commit"] and s["engine"].startswith("hf-decode")
    assert s["model"] and s["config_source"] and s["template_hash"]
    assert len(rep["per_problem"]) == 5 and all(len(r["correct"]) == 2 for r in rep["per_problem"])
    assert all(max(r["lengths"]) <= 16 for r in rep["per_problem"])
    assert {"avg@2", "pass@1", "pass@2", "maj@2", "greedy_pass@1", "gen_seconds"} <= set(rep["metrics"])
    assert any(d.startswith("k:") for d in rep["paper_deviations"])
    md = (out / "report.md").read_text()
    for section in ("## Settings", "## Metrics", "## Length and correctness", "## Per problem", "paper's Table 1"):
        assert section in md
    assert "avg@2" in capsys.readouterr().out


@pytest.mark.engine  # transformers: eval.py end to end
def test_end_to_end_tiny_task_and_compare(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    common = _model_args() + ["--data", "tiny", "--limit", "12", "--k", "4", "--max_new_tokens", "40", "--n_boot", "200"]
    res = ev.main(common + ["--out", str(a)])
    m, correct = res["metrics"], np.array(res["correct"])  # (12, 4)
    assert correct.shape == (12, 4) and m["avg@4"] == pytest.approx(correct.mean())
    assert 0.0 < m["avg@4"] < 1.0  # the tiny base policy is right on part of its own task
    assert m["pass@4"] >= m["pass@1"] and res["ci"]["avg@4"][0] <= m["avg@4"] <= res["ci"]["avg@4"][1]
    ev.main(common + ["--seed", "1", "--greedy", "false", "--out", str(b)])
    capsys.readouterr()
    cmp = ev.main(["compare", str(a / "report.json"), str(b / "report.json"), "--n_boot", "200"])
    printed = capsys.readouterr().out
    assert "avg@4" in printed and "CI" in printed and "seed differs" in printed
    assert set(cmp["metrics"]) == {"avg@4", "pass@4", "maj@4", "format_error", "exact_form", "tokens_per_problem",
                                   "distinct_answers", "answer_entropy_bits",
                                   "duplicate_response_frac"}  # greedy only when both reports have it
    r = cmp["metrics"]["avg@4"]
    assert r["lo"] <= r["diff"] <= r["hi"] and r["diff"] == pytest.approx(r["a"] - r["b"])
    self_cmp = ev.main(["compare", str(a / "report.json"), str(a / "report.json"), "--n_boot", "50"])
    assert self_cmp["metrics"]["greedy_pass@1"]["diff"] == 0 and not self_cmp["metrics"]["avg@4"]["excludes_zero"]
    other = json.loads((a / "report.json").read_text())
    other["per_problem"] = other["per_problem"][:-1]
    (tmp_path / "short.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="same problem ids"):
        ev.main(["compare", str(a / "report.json"), str(tmp_path / "short.json")])
