"""The estimators of a model's accuracy: avg@k, unbiased pass@k, maj@k, bootstrap intervals, paired differences.

Pure functions of correctness matrices and per-problem values (numpy), used by eval.py (measuring a
model), paraphrase.py (the gap between two wordings) and the benchmarks. Tested against brute
force and hand-derived values in tests/test_eval.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

MAJ_TIE_RULE = ("most frequent extracted answer; unextracted (None) answers do not vote; a tie goes to the "
                "answer whose first occurrence comes earliest in sample order; no extracted answer = wrong")


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


def majority_vote(preds: list[str | None]) -> int | None:
    """Index of the sample whose answer wins the vote, or None when no answer was extracted.

    Tie rule (MAJ_TIE_RULE): answers that could not be extracted (None) do not vote; among the
    answers with the most votes, the one that first appears earliest in sample order wins. The
    returned index is that first occurrence. Deterministic and independent of the answer text.
    """
    votes = Counter(p for p in preds if p is not None)
    if not votes:
        return None
    top = max(votes.values())
    return next(i for i, p in enumerate(preds) if p is not None and votes[p] == top)


def maj_at_k(preds: list[str | None], truth_correct: list[bool]) -> bool:
    """maj@k for one problem: whether the majority answer (see `majority_vote`) is correct.

    `truth_correct[i]` is the verifier's verdict on sample i; the vote takes the verdict of the
    winning answer's first sample. No extracted answer at all counts as wrong.
    """
    winner = majority_vote(preds)
    return winner is not None and bool(truth_correct[winner])


def problem_scores(records: list[dict]) -> dict[str, np.ndarray]:
    """Per-problem value of every accuracy metric: {name: (P,) float64}; each metric is its mean.

    records: per-problem dicts from `evaluate` (fields correct (k bools), maj_correct, and
    greedy_correct when the greedy pass ran). All problems must have the same k.

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
