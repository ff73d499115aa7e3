"""Tests of the cost frontier: the subset estimators, diversity, evaluation/frontier.py and `eval.py frontier`.

  - maj@j and the diversity curves against brute force (every subset enumerated) on small n, and
    maj@j's unbiasedness exactly: its expectation over every possible draw of n answers equals
    maj@j of the policy under the earliest-first vote (every j-sequence enumerated);
  - diversity on hand-made samples: all equal, all distinct, ties in the vote;
  - frontier.build on scripted reports: the budgets, the crossing, the table; `eval.py frontier`
    on report files and on the tiny base policy, and a bad --models entry in one line.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_frontier.py
"""

import itertools
import json
import math
import os
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import eval as ev  # noqa: E402
from evaluation import estimators as est  # noqa: E402
from evaluation import frontier  # noqa: E402
from plumbing import cli  # noqa: E402

FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
labels_and_verdicts = st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.lists(st.none() | st.integers(0, 3), min_size=n, max_size=n), st.lists(st.booleans(), min_size=n, max_size=n),
    st.lists(st.integers(0, 3), min_size=n, max_size=n)))


# --- the subset estimators against brute force ---------------------------------------------------------


def brute_maj(labels, correct, j) -> float:
    """Mean over every j-subset of its vote being right, a tie counting the right share of the tied classes."""
    verdict = {}
    for lab, c in zip(labels, correct):
        if lab is not None:
            verdict.setdefault(lab, c)
    total = []
    for subset in itertools.combinations(range(len(labels)), j):
        votes = Counter(labels[i] for i in subset if labels[i] is not None)
        top = max(votes.values(), default=0)
        tied = [lab for lab, v in votes.items() if v == top]
        total.append(sum(verdict[lab] for lab in tied) / len(tied) if votes else 0.0)
    return float(np.mean(total))


@FEW
@given(labels_and_verdicts)
def test_maj_at_j_matches_enumeration_of_subsets(case):
    labels, correct, _ = case
    curve = est.maj_at_j_curve(labels, correct)
    assert curve.shape == (len(labels),)
    for j in range(1, len(labels) + 1):
        assert curve[j - 1] == pytest.approx(brute_maj(labels, correct, j), abs=1e-12)


@pytest.mark.parametrize("probs, n", [((0.5, 0.3, 0.2), 4), ((0.3, 0.3, 0.2, 0.2), 4), ((0.25, 0.4, 0.35), 5)])
def test_maj_at_j_is_unbiased_for_the_earliest_first_vote(probs, n):
    """Answers 0..m-1 drawn i.i.d. with `probs`, answer 0 right. Over every sequence of n answers
    (weighted by its probability), the estimator's mean equals maj@j of the policy: the chance that
    `majority_vote` (ties to the earliest) picks answer 0 among j fresh answers, every j-sequence enumerated."""
    m = len(probs)
    prob = lambda seq: math.prod(probs[a] for a in seq)  # noqa: E731
    for j in range(1, n + 1):
        truth = sum(prob(seq) for seq in itertools.product(range(m), repeat=j) if seq[ev.majority_vote(list(seq))] == 0)
        mean = sum(prob(seq) * est.maj_at_j_curve(list(seq), [a == 0 for a in seq])[j - 1]
                   for seq in itertools.product(range(m), repeat=n))
        assert mean == pytest.approx(truth, abs=1e-12), j


def brute_diversity(labels, responses, j) -> tuple[float, float, float]:
    rows = []
    for subset in itertools.combinations(range(len(labels)), j):
        answers = Counter(labels[i] for i in subset)  # None (no answer) is one outcome of the entropy
        rows.append((len([a for a in answers if a is not None]), -sum(v / j * math.log2(v / j) for v in answers.values()),
                     1 - len({responses[i] for i in subset}) / j))
    return tuple(np.mean(rows, axis=0))


@FEW
@given(labels_and_verdicts)
def test_diversity_matches_enumeration_of_subsets(case):
    labels, _, responses = case
    div = est.diversity_curve(labels, responses)
    for j in range(1, len(labels) + 1):
        got = tuple(div[name][j - 1] for name in est.DIVERSITY)
        assert got == pytest.approx(brute_diversity(labels, responses, j), abs=1e-12)


def test_diversity_and_vote_on_hand_made_samples():
    same = est.diversity_curve([0] * 4, [0] * 4)  # all equal: one answer, no entropy, every repeat a duplicate
    assert same["distinct_answers"].tolist() == [1, 1, 1, 1] and np.allclose(same["answer_entropy_bits"], 0)
    assert same["duplicate_response_frac"] == pytest.approx([0, 1 / 2, 2 / 3, 3 / 4])
    apart = est.diversity_curve([0, 1, 2, 3], [0, 1, 2, 3])  # all distinct: j answers, log2 j bits, no duplicate
    assert apart["distinct_answers"] == pytest.approx([1, 2, 3, 4])
    assert apart["answer_entropy_bits"] == pytest.approx(np.log2([1, 2, 3, 4]))
    assert np.allclose(apart["duplicate_response_frac"], 0)
    nothing = est.diversity_curve([None] * 3, [0, 1, 2])  # nothing extracted: no answer, one outcome
    assert np.allclose(nothing["distinct_answers"], 0) and np.allclose(nothing["answer_entropy_bits"], 0)
    # ties in the vote: 2-2 between a right and a wrong answer counts 1/2 at j = 4; at j = 2 the
    # subsets are {r, r} (1 of 6), {w, w} (1), and 4 mixed 1-1 ties (1/2 each): (1 + 2) / 6
    tie = est.maj_at_j_curve(["r", "w", "r", "w"], [True, False, True, False])
    assert tie == pytest.approx([1 / 2, 1 / 2, 1 / 2, 1 / 2])
    assert ev.maj_at_k(["r", "w", "r", "w"], [True, False, True, False]) is True  # the report's vote: earliest first
    # r, w, w, none: j = 2: {r, w} x2 ties (1/2 each), {r, none} right, the other 3 wrong: 2/6; j = 3: {r, w, none} x2
    # ties, {r, w, w} and {w, w, none} wrong: 1/4; j = 4: w wins
    three = est.maj_at_j_curve(["r", "w", "w", None], [True, False, False, False])
    assert three == pytest.approx([1 / 4, 1 / 3, 1 / 4, 0.0])
    with pytest.raises(ValueError, match="one verdict each"):
        est.maj_at_j_curve([0, 1], [True])


# --- frontier.build on scripted reports -------------------------------------------------------------------


def report(model: str, rows: list[tuple[list, list, list]]) -> dict:
    """An eval.py report with the fields the frontier reads: per problem (classes, verdicts, lengths)."""
    per = [{"id": f"p{i}", "correct": c, "maj_correct": ev.maj_at_k(lab, c), "classes": lab, "lengths": n,
            "response_class": list(range(len(lab)))} for i, (lab, c, n) in enumerate(rows)]
    return {"settings": {"k": len(rows[0][0]), "model": model, "temperature": 1.0, "seed": 0}, "per_problem": per}


# base: right on p0 once in 4 (a plurality of wrong answers), always wrong on p1; trained: right on both, once each
BASE = report("base", [([0, 1, 1, 2], [True, False, False, False], [10, 10, 10, 10]),
                       ([0, 0, 1, 1], [False, False, False, False], [20, 20, 20, 20])])
TRAINED = report("trained", [([0, 0, 0, 0], [True] * 4, [5, 5, 5, 5]), ([0, 0, 0, 1], [True, True, True, False], [5] * 4)])


def test_build_derives_every_budget_and_the_crossing():
    res = frontier.build([BASE, TRAINED], ["base", "trained"], [1, 2, 4], [None, None], n_boot=100, level=0.95, seed=0)
    b, t = res["models"]["base"], res["models"]["trained"]
    assert [r["k"] for r in b["rows"]] == [1, 2, 4]
    assert [r["tokens"][0] for r in b["rows"]] == pytest.approx([15, 30, 60])  # j x (10 + 20) / 2
    assert [r["pass"][0] for r in b["rows"]] == pytest.approx([1 / 8, 1 / 4, 1 / 2])  # p0: 1/4, 1/2, 1; p1: 0
    assert b["rows"][0]["maj"][0] == pytest.approx(1 / 8) and b["rows"][2]["maj"][0] == 0.0  # at 4 the two 1s outvote
    assert t["avg@1"][0] == pytest.approx(7 / 8) and t["tokens_per_sample"] == 5.0
    assert [r["distinct_answers"][0] for r in b["rows"]][-1] == pytest.approx((3 + 2) / 2)
    for cell in (b["rows"][1]["pass"], t["avg@1"]):
        assert cell[1] <= cell[0] <= cell[2]
    by = {c["metric"]: c for c in res["crossings"]}
    assert by["pass@k"]["k"] is None and by["maj@k"]["k"] is None  # 1/2 at most: never 7/8
    # paired, per problem at k = 4: pass [1, 0] - avg@1 [1, 3/4] reaches 0 when only p0 is drawn; maj [0, 0] never does
    assert by["pass@k"]["paired_diff"]["diff"] == pytest.approx(-3 / 8) and by["pass@k"]["k_not_shown_worse"] == 4
    assert by["maj@k"]["paired_diff"]["hi"] < 0 and by["maj@k"]["k_not_shown_worse"] is None
    md = frontier.markdown(res)
    assert "| base | 4 | 60.0 |" in md and "stays below trained's avg@1 0.875 up to k = 4" in md
    weak = report("weak", [([0] * 4, [False] * 4, [1] * 4), ([0, 1, 2, 3], [True, False, False, False], [1] * 4)])
    low = frontier.build([BASE, weak], ["base", "weak"], [1, 2, 4], [None, None], n_boot=50, level=0.9, seed=0)
    by = {c["metric"]: c for c in low["crossings"]}  # weak's avg@1 is 1/8: the base reaches it at once
    assert (by["pass@k"]["k"], by["maj@k"]["k"], by["pass@k"]["tokens_per_problem"]) == (1, 1, 15)
    assert by["pass@k"]["paired_diff"]["diff"] == 0 and by["pass@k"]["k_not_shown_worse"] == 1  # [1/4, 0] - [0, 1/4]
    with pytest.raises(ValueError, match="needs 8 samples per problem"):
        frontier.build([BASE, TRAINED], ["base", "trained"], [8], [None, None], n_boot=10, level=0.9, seed=0)


def test_training_cost_reads_the_run(tmp_path):
    (tmp_path / "final").mkdir()
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "envelope/samples_generated": 192,
                                                                 "envelope/trained_tokens": 1000}) + "\n" for s in range(2)))
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps({"response_tokens": n}) + "\n" for n in (30, 12)))
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 2, "seconds": 9.5}))
    cost = frontier.training_cost(str(tmp_path / "final"))
    assert cost == {"run_dir": str(tmp_path), "steps": 2, "seconds": 9.5, "samples_generated": 384, "trained_tokens": 2000,
                    "generated_tokens": 42}
    assert frontier.training_cost(str(ev.DEFAULT_MODEL)) is None


# --- eval.py frontier -------------------------------------------------------------------------------------


def test_frontier_cli_on_reports_writes_table_and_plot(tmp_path, capsys):
    paths = []
    for name, rep in (("base", BASE), ("trained", TRAINED)):
        (tmp_path / name).mkdir()
        paths.append(str(tmp_path / name / "report.json"))
        (tmp_path / name / "report.json").write_text(json.dumps(rep))
    res = ev.main(["frontier", "--models", *paths, "--k", "4", "1", "2", "--out", str(tmp_path / "out"), "--n_boot", "50"])
    assert res["ks"] == [1, 2, 4] and list(res["models"]) == ["base", "trained"]
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"frontier.json", "frontier.md", "frontier.png"}
    assert (tmp_path / "out" / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert "| trained | 1 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--models", "MISSING", "--k", "1"], "--models entry 2 'MISSING': no config.json there"),
    (["--models", "BAD_JSON", "--k", "1"], "--models entry 2: BAD_JSON is not a report.json"),
    (["--models", "BASE_JSON", "--k", "0"], "--k takes budgets >= 1"),
    (["--models", "BASE_JSON", "--k", "2", "--model", "x"], "eval.py frontier takes its models from --models"),
    (["--models", "BASE_JSON", "--k", "2", "--top_p", "0"], "--top_p must be in (0, 1]"),
])
def test_frontier_bad_input_is_one_line(argv, message, tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "base.json").write_text(json.dumps(BASE))
    names = {"MISSING": str(tmp_path / "nope"), "BAD_JSON": str(tmp_path / "bad.json"), "BASE_JSON": str(tmp_path / "base.json")}
    argv = [names.get(a, a) for a in argv]
    argv.insert(1, names["BASE_JSON"])  # the first entry is a good one: the error names the second
    code = cli.run_cli(ev.main, ["frontier", *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    for key, path in names.items():
        message = message.replace(key, path)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {message}"), err


def test_frontier_samples_each_model_once_at_the_largest_k(tmp_path, capsys):
    out = tmp_path / "out"
    res = ev.main(["frontier", "--models", str(ev.DEFAULT_MODEL), str(ev.DEFAULT_MODEL), "--k", "1", "3", "--data", "tiny",
                   "--limit", "4", "--engine", "hf", "--n_boot", "50", "--out", str(out)])
    a, b = (json.loads((out / name / "report.json").read_text()) for name in ("1-tiny-base", "2-tiny-base"))
    assert a["settings"]["k"] == b["settings"]["k"] == 3 and a["settings"]["greedy"] is False
    assert a["per_problem"] == b["per_problem"]  # the same model, settings and seed: the same samples
    rows = res["models"]["1-tiny-base"]["rows"]
    assert [r["k"] for r in rows] == [1, 3] and rows[1]["tokens"][0] == pytest.approx(a["metrics"]["tokens_per_problem"])
    assert rows[1]["pass"][0] == pytest.approx(a["metrics"]["pass@3"])
    assert (out / "frontier.png").is_file() and "1-tiny-base" in capsys.readouterr().out
