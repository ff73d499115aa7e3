"""The estimators of a model's accuracy and diversity: avg@k, unbiased pass@k and maj@k, answer
classes, distinct answers and entropy, bootstrap intervals, paired differences.

Pure functions of correctness matrices, answer labels and per-problem values (numpy), used by
eval.py (measuring a model), evaluation/frontier.py (smaller budgets derived from one sample of k answers),
evaluation/paraphrase.py (the gap between two wordings) and the benchmarks. Tested against brute force and
hand-derived values in tests/test_eval.py and tests/test_frontier.py.
"""

from __future__ import annotations

import math
import operator
from collections import Counter

import numpy as np

MAJ_TIE_RULE = ("answers vote by class (the answers the verifier judges equal, `answer_classes`); unextracted "
                "(None) answers do not vote; a tie goes to the class whose first answer comes earliest in sample "
                "order, and the verdict is that first answer's; no extracted answer = wrong")
MAJ_SUBSET_TIE_RULE = ("maj@j from k samples, j <= k: the mean over all C(k, j) subsets of j samples; a tie in a subset counts "
                       "the share of tied classes that are right (a uniformly random pick; for exchangeable samples "
                       "the same expectation as the earliest-first rule)")
DIVERSITY = ("distinct_answers", "answer_entropy_bits", "duplicate_response_frac")  # diversity_curve's names
MAX_SUBSET_N = 1000  # C(n, j) stays below float64's 1.8e308 for n <= 1020; more samples than this are refused


# --- the estimators ---------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: 1 - C(n - c, k) / C(n, k) (Chen et al., 2021, eq. 1).

    The probability that at least one of k answers drawn without replacement from the n generated
    ones is correct, given c of the n are correct. Computed as a product so it stays exact for
    large n (no huge binomials).

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct answer
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=0}^{k-1} (n - c - i) / (n - i)
    return 1.0 - float(np.prod([(n - c - i) / (n - i) for i in range(k)]))


def avg_at_k(correct: np.ndarray) -> float:
    """avg@k, the paper's avg@32: mean of correct, a (problems, k) bool matrix."""
    return float(np.asarray(correct, dtype=float).mean())


def answer_classes(answers: list[str | None], same=operator.eq) -> list[int | None]:
    """The class of each answer: answers judged equal share a class, numbered by first appearance.

    answers: (k,) extracted answers of one problem's samples, None where nothing was extracted
    (None stays None: it is in no class). same(representative, answer) -> bool: the verifier's
    equality (measure.same_answer; `==` for the integer modes, whose answers are already canonical).
    Each new distinct answer string is compared with the first answer (the representative) of
    each class in order and joins the first that equals it, else opens a class: at most one
    comparison per (distinct string, class), and a tolerance that is not transitive (a decimal
    within 5e-6 of two different values) cannot chain classes together.

    Source of the rule: facebookresearch/deepconf#15 (votes on raw strings split one value
    written as "\\frac{1}{2}", "0.5" and "1/2" into three, so two copies of a wrong "3" win).
    """
    reps: list[str] = []  # (classes,) the first answer of each class
    of: dict[str, int] = {}  # distinct answer string -> its class
    out: list[int | None] = []
    for a in answers:
        if a is not None and a not in of:
            of[a] = next((c for c, rep in enumerate(reps) if same(rep, a)), len(reps))
            if of[a] == len(reps):
                reps.append(a)
        out.append(None if a is None else of[a])
    return out


def majority_vote(preds: list) -> int | None:
    """Index of the sample whose answer wins the vote, or None when no answer was extracted.

    preds: one hashable label per sample, None where nothing was extracted: the answer classes of
    `answer_classes` (so that equal values written differently vote together), or answer strings
    when they are already canonical. Tie rule (MAJ_TIE_RULE): None does not vote; among the labels
    with the most votes, the one that first appears earliest in sample order wins. The returned
    index is that first occurrence. Deterministic and independent of the answer text.
    """
    votes = Counter(p for p in preds if p is not None)
    if not votes:
        return None
    top = max(votes.values())
    return next(i for i, p in enumerate(preds) if p is not None and votes[p] == top)


def maj_at_k(preds: list[str | None], truth_correct: list[bool]) -> bool:
    """maj@k for one problem: whether the majority answer (see `majority_vote`) is correct.

    preds: labels as for `majority_vote` (answer classes). `truth_correct[i]` is the verifier's
    verdict on sample i; the vote takes the verdict of the winning class's first sample. No
    extracted answer at all counts as wrong.
    """
    winner = majority_vote(preds)
    return winner is not None and bool(truth_correct[winner])


# --- smaller budgets from one sample of n answers: means over all subsets (evaluation/frontier.py) ---------------


def _log_comb(n: int) -> np.ndarray:
    """(n+1, n+1) float64: log C(a, b) for 0 <= b <= a <= n, -inf where b > a."""
    lf = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])  # (n+1,) log a!
    a, b = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]  # (n+1, 1), (1, n+1)
    out = np.full((n + 1, n + 1), -np.inf)
    ok = b <= a  # (n+1, n+1)
    out[ok] = (lf[a] - lf[b] - lf[np.maximum(a - b, 0)])[ok]
    return out


def _n_samples(labels: list, per_sample: list, who: str, what: str) -> int:
    """n = len(labels). Raises ValueError unless per_sample has one `what` per sample and 1 <= n <= MAX_SUBSET_N."""
    if len(per_sample) != len(labels) or not 1 <= len(labels) <= MAX_SUBSET_N:
        raise ValueError(f"{who} needs 1..{MAX_SUBSET_N} samples with one {what} each, got {len(labels)} labels and "
                         f"{len(per_sample)} {what}s")
    return len(labels)


def maj_at_j_curve(labels: list, correct: list) -> np.ndarray:
    """Unbiased maj@j for every budget j = 1..n from one problem's n samples: (n,) float64, entry j - 1.

    labels: (n,) answer classes (`answer_classes`; None = nothing extracted, never votes).
    correct: (n,) the verifier's verdicts; a class's verdict is its first sample's (as `maj_at_k`).

    The value is the mean, over all C(n, j) subsets of j of the n samples, of the subset's vote
    being right, a tie counting the share of tied classes that are right (MAJ_SUBSET_TIE_RULE).
    The mean of a symmetric function over all subsets is a U-statistic, unbiased for maj@j of the
    policy, as the pass@k estimator is (Chen et al., 2021, eq. 1). The tie rule has the
    expectation of `maj_at_k`'s earliest-first rule: i.i.d. samples are exchangeable, so each of t
    tied classes comes first with probability 1/t. At j = n it is `maj_at_k` with ties averaged.

    How, exactly and without enumerating subsets: class a wins with v votes when each other class
    gets at most v, t of them exactly v; such subsets number C(s_a, v) times the coefficient of
    x^(j-v) y^t in prod_b [sum_{u<v} C(s_b, u) x^u + C(s_b, v) x^v y], where the classes with
    s_b < v and the unextracted samples contribute (1 + x)^(their count). Each counts 1/(t+1).

    Raises:
        ValueError: labels and correct differ in length, no sample, or n > MAX_SUBSET_N.
    """
    n = _n_samples(labels, correct, "maj_at_j_curve", "verdict")
    sizes = Counter(lab for lab in labels if lab is not None)
    verdict: dict = {}
    for lab, c in zip(labels, correct):
        if lab is not None:
            verdict.setdefault(lab, bool(c))
    n_none = n - sum(sizes.values())
    wins = np.zeros(n + 1)  # (n+1,) tie-weighted count of right votes among the subsets of each size
    for a, s_a in sizes.items():
        if not verdict[a]:
            continue
        rest = [s for b, s in sizes.items() if b != a]
        for v in range(1, s_a + 1):
            tied = [s for s in rest if s >= v]  # the classes that can reach v votes
            free = n_none + sum(s for s in rest if s < v)  # samples that can never outvote v
            ways = np.zeros((len(tied) + 1, n + 1))  # (t, x): x samples from `tied`, none above v, t at exactly v
            ways[0, 0] = 1.0
            for s in tied:
                grown = np.zeros_like(ways)
                for u in range(v):
                    grown[:, u:] += math.comb(s, u) * ways[:, : n + 1 - u]
                grown[1:, v:] += math.comb(s, v) * ways[:-1, : n + 1 - v]
                ways = grown
            weighted = (ways / np.arange(1, len(tied) + 2)[:, None]).sum(0)  # (n+1,) each tie counts 1/(t+1)
            others = np.convolve(weighted, [math.comb(free, y) for y in range(free + 1)])[: n + 1]  # (<= n+1,)
            wins[v: v + len(others)] += math.comb(s_a, v) * others[: n + 1 - v]
    totals = np.array([float(math.comb(n, j)) for j in range(1, n + 1)])  # (n,)
    return wins[1:] / totals


def _hit_curve(sizes: list[int], n: int, lc: np.ndarray) -> np.ndarray:
    """(n,): sum over groups of the chance that a j-subset of the n samples holds one of the
    group's s samples, 1 - C(n - s, j) / C(n, j), for j = 1..n (the expected number of groups hit);
    lc: _log_comb(n)."""
    j = np.arange(1, n + 1)  # (n,)
    out = np.zeros(n)
    for s, mult in Counter(sizes).items():
        miss = np.where(j <= n - s, np.exp(lc[n - s, np.minimum(j, n - s)] - lc[n, j]), 0.0)  # (n,)
        out += mult * (1.0 - miss)
    return out


def diversity_curve(labels: list, responses: list) -> dict[str, np.ndarray]:
    """Expected diversity of j samples, for every budget j = 1..n, from one problem's n samples.

    labels: (n,) answer classes (`answer_classes`, None = nothing extracted). responses: (n,) a
    hashable per sample whose equality means "the same response" (its token ids as a tuple).

    Returns {name: (n,) float64, entry j - 1}, each the mean over all C(n, j) subsets of j samples
    (unbiased for the policy's value at j samples; at j = n the observed value):
      distinct_answers: the number of answer classes among the j (an unextracted answer is none);
      answer_entropy_bits: the entropy, in bits, of the j answers' distribution, "no extracted
          answer" counted as one outcome (0 = all the same; log2 j = all different);
      duplicate_response_frac: the share of the j responses that repeat one of the others,
          1 - (distinct responses) / j.
    Exact: hypergeometric counts of each class in a j-subset, no enumeration.

    Raises:
        ValueError: labels and responses differ in length, no sample, or n > MAX_SUBSET_N.
    """
    n = _n_samples(labels, responses, "diversity_curve", "response")
    sizes = list(Counter(lab for lab in labels if lab is not None).values())
    outcomes = sizes + ([n - sum(sizes)] if sum(sizes) < n else [])  # "no answer" is one outcome of the entropy
    lc = _log_comb(n)
    j = np.arange(1, n + 1)[:, None]  # (n, 1) subset sizes
    entropy = np.zeros(n)
    for s, mult in Counter(outcomes).items():
        x = np.arange(1, s + 1)[None, :]  # (1, s) samples of this outcome in the subset (x = 0 adds nothing)
        ok = (x <= j) & (j - x <= n - s)  # (n, s)
        log_p = lc[s, x] + lc[n - s, np.clip(j - x, 0, n - s)] - lc[n, j]  # (n, s) hypergeometric log-pmf
        share = x / j  # (n, s)
        entropy += mult * np.where(ok, np.exp(np.where(ok, log_p, 0.0)) * -share * np.log2(share), 0.0).sum(1)
    return {"distinct_answers": _hit_curve(sizes, n, lc), "answer_entropy_bits": entropy,
            "duplicate_response_frac": 1.0 - _hit_curve(list(Counter(responses).values()), n, lc) / j[:, 0]}


def problem_scores(records: list[dict]) -> dict[str, np.ndarray]:
    """Per-problem value of every metric with an interval: {name: (P,) float64}; each metric is its mean.

    records: per-problem dicts from measure.evaluate (fields correct (k bools), maj_correct, and
    greedy_correct when the greedy pass ran; lengths (k token counts) and classes /
    response_class (k labels) when present: reports written before these fields lack them).
    Names: avg@k, pass@1..pass@k, maj@k, [greedy_pass@1], [format_error], [exact_form], [tokens_per_problem],
    [DIVERSITY at k].
    All problems must have the same k.

    Raises:
        ValueError: the problems have different k, or k = 0.
    """
    correct = np.array([r["correct"] for r in records], dtype=bool)  # (P, k)
    if correct.ndim != 2 or correct.shape[1] < 1:
        raise ValueError(f"every problem needs the same k >= 1 samples, got a matrix of shape {correct.shape}")
    P, k = correct.shape
    c = correct.sum(1)  # (P,) correct samples per problem
    out = {f"avg@{k}": correct.mean(1)}  # (P,)
    for j in range(1, k + 1):
        out[f"pass@{j}"] = np.array([pass_at_k(k, int(ci), j) for ci in c])  # (P,)
    out[f"maj@{k}"] = np.array([r["maj_correct"] for r in records], dtype=float)  # (P,)
    if all("greedy_correct" in r for r in records):
        out["greedy_pass@1"] = np.array([r["greedy_correct"] for r in records], dtype=float)  # (P,)
    for name in ("format_error", "exact_form"):  # share of a problem's samples (measure.evaluate's per-sample flags)
        if all(name in r for r in records):
            out[name] = np.array([np.mean(r[name]) for r in records], dtype=float)  # (P,)
    if all("lengths" in r for r in records):
        out["tokens_per_problem"] = np.array([sum(r["lengths"]) for r in records], dtype=float)  # (P,) all k samples
    if all("classes" in r and "response_class" in r for r in records):
        at_k = [diversity_curve(r["classes"], r["response_class"]) for r in records]
        out.update({name: np.array([d[name][-1] for d in at_k]) for name in DIVERSITY})  # (P,) each, at j = k
    return out


def bootstrap_ci(values: np.ndarray, *, n_boot: int, level: float, seed: int) -> tuple:
    """Percentile bootstrap interval of mean(values), resampling problems with replacement.

    values: (P,) one number per problem (accuracy, pass@j estimate, ...), or (P, M) to resample the
    same problems for M columns at once (then the bounds are (M,) arrays). This is uncertainty over
    which problems were drawn; within a problem pass@j is still the unbiased estimator, not a
    bootstrap over samples (docs/PITFALLS.md, failure 11).

    Returns (lo, hi) at coverage `level`. Raises ValueError: no problem, n_boot < 1, or level not in (0, 1).
    """
    values = np.asarray(values, dtype=float)
    if len(values) == 0 or n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"bootstrap needs >= 1 problem, n_boot >= 1, 0 < level < 1; got {len(values)}, {n_boot}, {level}")
    P = len(values)
    # How often each problem is drawn in each resample; a matrix product then gives every mean
    # without materialising (n_boot, P, M) values.
    counts = np.random.default_rng(seed).multinomial(P, np.full(P, 1 / P), size=n_boot)  # (n_boot, P)
    means = counts @ values / P  # (n_boot,) or (n_boot, M)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return lo, hi


def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, n_boot: int, level: float, seed: int) -> dict:
    """Difference mean(a) - mean(b) of two models on the same problems, with a paired interval.

    a, b: (P,) per-problem values, problem i in the same position in both. Each resample draws
    problems once and takes both models' values on them, so problem difficulty cancels out.
    Returns {"a", "b", "diff", "lo", "hi", "excludes_zero"}.

    Raises:
        ValueError: a and b are not (P,) arrays of the same length (or bootstrap_ci's errors).
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired comparison needs two (P,) arrays over the same problems, got {a.shape} and {b.shape}")
    lo, hi = bootstrap_ci(a - b, n_boot=n_boot, level=level, seed=seed)
    return {"a": float(a.mean()), "b": float(b.mean()), "diff": float((a - b).mean()), "lo": float(lo), "hi": float(hi),
            "excludes_zero": bool(lo > 0 or hi < 0)}
