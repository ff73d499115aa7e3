"""Evaluation: avg@k, unbiased pass@k, maj@k, greedy pass@1, and what exactly was measured.

    python eval.py --data tiny --k 4                                  # the tiny base policy, tiny task
    python eval.py --model runs/default --data tiny --k 4 --out runs/default/eval
    python eval.py --model DIR --data tests/fixtures/aime2024_dapo_eval.parquet --verifier dapo-official --out OUT
    torchrun --nproc_per_node=8 eval.py --model DIR --data tests/fixtures/aime2024_dapo_eval.parquet --out OUT
    python eval.py compare A/report.json B/report.json                # paired: does A beat B?
    python eval.py report RUN_DIR [RUN_DIR2] [--out DIR]              # plots, report.md, diagnosis of a training run

What the paper measured (paper section 4.1 and Table 1): avg@32 on AIME 2024, the mean accuracy
over 32 sampled answers per problem (temperature 1.0, top_p 0.7; the official file repeats each of
the 30 problems 32 times and scores one sample per row, which is the same number; that file is
committed as tests/fixtures/aime2024_dapo_eval.parquet). avg@k is not greedy pass@1 and not
pass@k. Here:

  * avg@k: mean of the (problems, k) correctness matrix.
  * pass@j, for every j <= k: the unbiased estimator 1 - C(n - c, j) / C(n, j) with n = k samples
    per problem (Chen et al., 2021, arXiv 2107.03374, eq. 1), never the biased "first j samples"
    count (docs/PITFALLS.md, failure 11). pass@1 equals avg@k by construction.
  * maj@k: majority vote over the extracted answers (tie rule in `majority_vote`).
  * greedy_pass@1: one more generation pass at temperature 0 (`--greedy`, on in this CLI).
  * a 95% bootstrap interval over problems for each, and `compare` for a paired difference.

Prompts are rebuilt from what the checkpoint saved (final/dapo_run.json: instruction, verifier,
max_response_len, max_prompt_len), never from this file's defaults; flags override and the
report says which.

How this file departs from the paper's evaluation (each is recorded in the report's settings):
  1. The verifier is the checkpoint's (default "dapo", verifier.py's fixed rule). The paper scored
     with the official rule: pass --verifier dapo-official to compare with its table; the report
     lists every setting that differs from the paper's protocol.
  2. Problems are deduplicated by id and k samples drawn per problem, instead of one sample per
     repeated row; for the official AIME file (32 rows per id) and k = 32 the estimator is the same.
  3. pass@j, maj@k, greedy pass@1 and the intervals are additions; the paper reports avg@32 only.
  4. Under torchrun rank r generates problems r::world with its own seed (`rank_seed`), so the
     drawn samples depend on the number of processes (not on anything else).

Run reports, `python eval.py report RUN_DIR [RUN_DIR2] [--out DIR]` (default RUN_DIR/report): PNG
plots of a training run's metrics.jsonl and rollouts.jsonl (a second run is overlaid, labelled by
its directory name; the length heatmap and the stacked phase times get one panel per run), report.md
(run identity, config differences, held-out before/after next to the resource envelope, length x
correctness, rollout age) and diagnosis.json. `diagnose` names which of DAPO's four boundaries a run
crossed (exploration, contrast, credit, reward) and the switch that addresses it; its thresholds are
the constants of that section, each with its reason, and report.md prints them as a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import plumbing
import rollout
import train
import verifier

DEFAULT_MODEL = train.REPO / "assets" / "tiny-base"
# The published evaluation (paper section 4.1: AIME 2024, avg@32, temperature 1.0, top_p 0.7, 20480-token
# responses, scored by the official rule), for the report's "differs from the paper" list.
PAPER_PROTOCOL = {"n_problems": 30, "k": 32, "temperature": 1.0, "top_p": 0.7, "max_new_tokens": 20480,
                  "verifier": "dapo-official"}
# AIME 2024 as the paper evaluated it: train.file_hash (sha256[:16]) of the official DAPO file
# (eval/aime-2024.parquet of github.com/BytedTsinghua-SIA/DAPO) and of its 30-row JSONL copy, both in tests/fixtures.
PAPER_DATASET_HASHES = {"12154e38a716d12d": "aime2024_dapo_eval.parquet", "2cf5f0b3e4265b88": "aime2024.jsonl"}
MAJ_TIE_RULE = ("most frequent extracted answer; unextracted (None) answers do not vote; a tie goes to the "
                "answer whose first occurrence comes earliest in sample order; no extracted answer = wrong")


# --- plumbing: config ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalConfig:
    """Every setting of `python eval.py`. Empty / 0 means "what the checkpoint saved"."""

    model: str = train.F("", "HF model directory or a run directory (its final/ is used); '' = assets/tiny-base")
    data: str = train.F("tiny", "'tiny', a .parquet (DAPO layout) or a .jsonl with problem/answer")
    k: int = train.F(32, "[k] samples per problem (paper: 32 on AIME 2024)")
    temperature: float = train.F(1.0, "sampling temperature (paper evaluation 1.0)")
    top_p: float = train.F(0.7, "nucleus top_p (paper evaluation 0.7)")
    max_new_tokens: int = train.F(0, "response budget in tokens; 0 = the checkpoint's max_response_len (paper 20480)")
    max_prompt_len: int = train.F(0, "prompt budget in tokens; 0 = the checkpoint's. A longer prompt is cut from the left "
                                  "when the checkpoint trained with --prompt_truncation left, else it is an error")
    instruction: str = train.F("", "'dapo' | 'none'; '' = the checkpoint's")
    verifier: str = train.F("", f"answer rule, one of {verifier.MODES}; '' = the checkpoint's (paper: dapo-official)")
    limit: int = train.F(0, "evaluate the first N distinct problems (0 = all)")
    seed: int = train.F(0, "seeds the sampler (per rank, see rank_seed) and the bootstrap")
    greedy: bool = train.F(True, "also decode greedily (temperature 0) for greedy_pass@1")
    engine: str = train.F("auto", "auto | hf | vllm; auto = vllm when `import vllm` works, else hf")
    device: str = train.F("auto", "auto | cpu | cuda (hf engine)")
    trust_remote_code: bool = train.F(False, "run model code from the model directory (never taken from a saved config)")
    n_boot: int = train.F(2000, "bootstrap resamples of the problems for each interval")
    ci_level: float = train.F(0.95, "coverage of the bootstrap intervals")
    out: str = train.F("", "directory for report.json and report.md ('' = print only)")


def parse_args(argv: list[str] | None) -> EvalConfig:
    ap = plumbing.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(EvalConfig):
        if f.type in ("bool", bool):
            ap.add_argument(f"--{f.name}", type=plumbing.parse_bool, default=f.default, metavar="BOOL",
                            help=f"{f.metadata['help']} (default {f.default})")
        else:
            ap.add_argument(f"--{f.name}", type=type(f.default), default=f.default, help=f"{f.metadata['help']} (default {f.default!r})")
    return EvalConfig(**vars(ap.parse_args(argv)))


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
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired comparison needs two (P,) arrays over the same problems, got {a.shape} and {b.shape}")
    lo, hi = bootstrap_ci(a - b, n_boot=n_boot, level=level, seed=seed)
    return {"a": float(a.mean()), "b": float(b.mean()), "diff": float((a - b).mean()), "lo": float(lo), "hi": float(hi),
            "excludes_zero": bool(lo > 0 or hi < 0)}


# --- plumbing: splitting problems across ranks ---------------------------------------------------


def shard(n: int, rank: int, world: int) -> tuple[list[int], int]:
    """Problem indices rank `rank` generates: (indices, how many are real).

    Rank r takes problems r::world, padded with copies of problem 0 up to ceil(n / world), so
    every rank makes the same number of generate calls (transformers' synced_gpus under FSDP hangs
    otherwise). Results of the padding are dropped before the gather.
    """
    if not (0 <= rank < world and n >= 1):
        raise ValueError(f"shard needs 0 <= rank < world and n >= 1, got rank={rank}, world={world}, n={n}")
    real = list(range(rank, n, world))
    return real + [0] * (-(-n // world) - len(real)), len(real)


def unshard(parts: list[list], world: int) -> list:
    """Inverse of `shard`: parts[r] holds rank r's real results in order; returns them in problem order."""
    out = [None] * sum(map(len, parts))
    for r, part in enumerate(parts):
        for j, x in enumerate(part):
            out[r + j * world] = x
    return out


def rank_seed(seed: int, rank: int, world: int) -> int:
    """Sampler seed of one rank's request: `seed` itself on one process, else a hash of (seed, rank)."""
    if world == 1:
        return seed
    return int.from_bytes(hashlib.sha256(f"eval-{seed}-{rank}".encode()).digest()[:4], "little")


# --- generation and scoring -----------------------------------------------------------------------------


def _score_group(problem, group, tokenizer, mode: str) -> list:
    texts = [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in group]
    return verifier.score_batch(texts, [problem.answer] * len(texts), mode=mode)


def _problem_record(problem, group, scores, greedy) -> dict:
    """Everything the report needs about one problem (k samples, plus the greedy one if any)."""
    correct = [s.correct for s in scores]
    lengths = [len(s.token_ids) for s in group]
    preds = [s.pred for s in scores]
    mean_of = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
    winner = majority_vote(preds)
    rec = {
        "id": problem.id, "answer": problem.answer, "accuracy": float(np.mean(correct)), "n_correct": int(sum(correct)),
        "mean_length": float(np.mean(lengths)),
        "mean_length_correct": mean_of([n for n, c in zip(lengths, correct) if c]),
        "mean_length_wrong": mean_of([n for n, c in zip(lengths, correct) if not c]),
        "truncated_frac": float(np.mean([s.truncated for s in group])),
        "maj_pred": None if winner is None else preds[winner], "maj_correct": maj_at_k(preds, correct),
        "reasons": dict(Counter(s.reason for s in scores)),
        "correct": correct, "lengths": lengths, "truncated": [s.truncated for s in group], "preds": preds,
    }
    if greedy is not None:
        (g_sample,), (g_score,) = greedy
        rec.update(greedy_correct=g_score.correct, greedy_pred=g_score.pred, greedy_reason=g_score.reason,
                   greedy_length=len(g_sample.token_ids), greedy_truncated=g_sample.truncated)
    return rec


def evaluate(engine, tokenizer, problems, cfg, *, seed: int, build_prompt, greedy: bool = False,
             n_boot: int = EvalConfig.n_boot, ci_level: float = EvalConfig.ci_level, rank: int = 0, world: int = 1) -> dict:
    """Sample cfg.eval_k answers per problem, score them, and summarise with intervals.

    Args:
        engine: a rollout.Engine.
        tokenizer: the policy's tokenizer (decodes responses for the verifier).
        problems: train.Problem list, one per distinct problem (train.dedupe_by_id).
        cfg: a train.Config; uses eval_k, eval_temperature, eval_top_p, max_response_len (the
            response budget in tokens), verifier, model, instruction.
        seed: sampler seed (see `rank_seed`) and bootstrap seed.
        build_prompt: the function that turned problems into prompts during training, so the
            evaluation prompt is the training prompt.
        greedy: also decode greedily once per problem (greedy_pass@1).
        rank, world: this process's place under torchrun; every rank must call with the same
            problems, generates its `shard`, and receives all results (all_gather). Default: one
            process generates everything.

    Returns:
        {"metrics": {avg@k, pass@1..pass@k, maj@k, [greedy_pass@1], mean_length, ...},
         "ci": {metric: [lo, hi]}, "per_problem": [record per problem], "length_table": [...],
         "settings": {...}, "correct": (P, k) list of lists}

    Raises:
        ValueError: no problems, or k < 1.
    """
    k = cfg.eval_k
    if not problems or k < 1:
        raise ValueError(f"evaluate needs problems and eval_k >= 1, got {len(problems)} problems and k={k}")
    idx, n_real = shard(len(problems), rank, world)
    mine = [problems[i] for i in idx]
    prompts = [build_prompt(p, tokenizer, cfg) for p in mine]  # (P_rank,) lists of token ids
    params = rollout.SamplingParams(n=k, max_new_tokens=cfg.max_response_len, temperature=cfg.eval_temperature,
                                    top_p=cfg.eval_top_p, seed=rank_seed(seed, rank, world))
    t0 = time.perf_counter()
    samples = engine.generate(prompts, params)  # (P_rank, k) Samples
    gen_s = time.perf_counter() - t0
    greedy_samples, greedy_s = [None] * len(mine), 0.0
    if greedy:
        t0 = time.perf_counter()
        greedy_samples = engine.generate(prompts, dataclasses.replace(params, n=1, temperature=0.0))  # (P_rank, 1)
        greedy_s = time.perf_counter() - t0
    records = []
    for p, group, g in list(zip(mine, samples, greedy_samples))[:n_real]:  # padding dropped (see `shard`)
        greedy_scored = None if g is None else (g, _score_group(p, g, tokenizer, cfg.verifier))
        records.append(_problem_record(p, group, _score_group(p, group, tokenizer, cfg.verifier), greedy_scored))
    parts = train.all_gather_objects((records, gen_s, greedy_s), train.Dist(rank, world))
    records = unshard([part[0] for part in parts], world)

    metrics, ci = summarize(records, n_boot=n_boot, ci_level=ci_level, seed=seed)
    gen_s = max(part[1] for part in parts)  # the slowest rank's wall time
    metrics.update(gen_seconds=gen_s, gen_tokens_per_s=sum(sum(r["lengths"]) for r in records) / max(gen_s, 1e-9))
    if greedy:
        metrics["greedy_gen_seconds"] = max(part[2] for part in parts)
    settings = {
        "model": cfg.model or str(DEFAULT_MODEL.relative_to(train.REPO)), "n_problems": len(records),
        "n_samples": k, "k": k, "temperature": cfg.eval_temperature, "top_p": cfg.eval_top_p, "seed": seed,
        "max_new_tokens": cfg.max_response_len, "max_prompt_len": cfg.max_prompt_len, "instruction": cfg.instruction,
        "template_hash": train.template_hash(tokenizer, cfg), "verifier": cfg.verifier,
        "verifier_version": verifier.VERSION, "engine": f"{engine.name} {engine.version}", "engine_seeded": engine.seeded,
        "greedy": greedy, "world_size": world, "n_boot": n_boot, "ci_level": ci_level, "commit": repo_commit(),
        "pass_at_k": "unbiased 1 - C(n-c,k)/C(n,k), n = k samples per problem (Chen et al. 2021)",
        "maj_tie_rule": MAJ_TIE_RULE,
    }
    return {"metrics": metrics, "ci": ci, "per_problem": records, "length_table": length_table(records, cfg.max_response_len),
            "settings": settings, "correct": [r["correct"] for r in records]}


def summarize(records: list[dict], *, n_boot: int, ci_level: float, seed: int) -> tuple[dict, dict]:
    """Metrics over problems and their bootstrap intervals: ({name: value}, {name: [lo, hi]}).

    Accuracy metrics (`problem_scores`) get intervals; the length metrics are over all samples and
    are None when no sample is correct (or wrong).
    """
    scores = problem_scores(records)  # {metric: (P,)}
    names = list(scores)
    lo, hi = bootstrap_ci(np.stack([scores[m] for m in names], 1), n_boot=n_boot, level=ci_level, seed=seed)  # (M,)
    lengths = np.array([n for r in records for n in r["lengths"]])  # (P*k,) tokens
    correct = np.array([c for r in records for c in r["correct"]], dtype=bool)  # (P*k,)
    metrics = {m: float(scores[m].mean()) for m in names}
    metrics.update({
        "mean_length": float(lengths.mean()),
        "mean_length_correct": float(lengths[correct].mean()) if correct.any() else None,
        "mean_length_wrong": float(lengths[~correct].mean()) if (~correct).any() else None,
        "truncated_frac": float(np.mean([t for r in records for t in r["truncated"]])),
    })
    return metrics, {m: [float(lo[i]), float(hi[i])] for i, m in enumerate(names)}


def length_table(records: list[dict], max_new_tokens: int) -> list[dict]:
    """Accuracy by response length: four equal bins of the budget, then the truncated responses.

    Returns rows {"bin", "samples", "share", "accuracy" (None for an empty bin)}.
    """
    lengths = np.array([n for r in records for n in r["lengths"]])  # (P*k,) tokens
    correct = np.array([c for r in records for c in r["correct"]], dtype=bool)  # (P*k,)
    trunc = np.array([t for r in records for t in r["truncated"]], dtype=bool)  # (P*k,)
    edges = [round(max_new_tokens * q / 4) for q in range(5)]
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        last = hi == edges[-1]
        sel = ~trunc & (lengths >= lo) & ((lengths <= hi) if last else (lengths < hi))  # (P*k,)
        rows.append((f"[{lo}, {hi}{']' if last else ')'}", sel))
    rows.append((f"truncated (hit {max_new_tokens})", trunc))
    return [{"bin": name, "samples": int(sel.sum()), "share": float(sel.mean()),
             "accuracy": float(correct[sel].mean()) if sel.any() else None} for name, sel in rows]


def paper_deviations(settings: dict) -> list[str]:
    """Each setting that differs from the paper's AIME 2024 avg@32 protocol, as 'name: ours (paper x)'."""
    out = [f"{key}: {settings.get(key)!r} (paper {want!r})" for key, want in PAPER_PROTOCOL.items() if settings.get(key) != want]
    if settings.get("dataset_hash") not in PAPER_DATASET_HASHES:
        out.append(f"dataset: {settings.get('dataset')!r} (paper AIME 2024, one of {sorted(PAPER_DATASET_HASHES.values())})")
    return out


# --- plumbing: inputs ----------------------------------------------------------------------------------


def repo_commit() -> str:
    """`git rev-parse HEAD` of this repository (+"-dirty" with uncommitted changes), else "unknown"."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=train.REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=train.REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):  # no git binary, or a hung filesystem
        return "unknown"
    if head.returncode != 0:  # not a repository, or no commit yet
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def resolve_model(spec: str) -> Path:
    """The HF model directory: '' is the tiny base policy; a run directory means its final/."""
    path = Path(spec) if spec else DEFAULT_MODEL
    if (path / "final" / "dapo_run.json").exists():
        path = path / "final"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"--model {spec or str(path)!r}: no config.json there; pass an HF model directory or a run "
                                f"directory holding final/ (the default model is built by `python tiny.py build`)")
    return path


def checkpoint_config(model_dir: Path, ecfg: EvalConfig) -> tuple[train.Config, str]:
    """train.Config the checkpoint was trained with (final/dapo_run.json), eval flags applied on top.

    Returns (config, where its prompt and budget settings came from).

    Raises:
        ValueError: a model other than the tiny default without dapo_run.json and without
            --max_new_tokens (its response budget is unknown; the paper used 20480).
    """
    saved = model_dir / "dapo_run.json"
    fields = {f.name for f in dataclasses.fields(train.Config)}
    if saved.exists():
        base = {k: v for k, v in json.loads(saved.read_text())["config"].items() if k in fields}
        source = str(saved)
    elif model_dir.resolve() == DEFAULT_MODEL.resolve() or ecfg.max_new_tokens:
        base, source = {}, "train.Config defaults (no dapo_run.json)"
    else:
        raise ValueError(f"{model_dir} has no dapo_run.json, so its response budget is unknown: pass --max_new_tokens "
                         f"(paper 20480) and check --instruction / --verifier")
    overrides = {"max_response_len": ecfg.max_new_tokens, "max_prompt_len": ecfg.max_prompt_len,
                 "instruction": ecfg.instruction, "verifier": ecfg.verifier}
    base.update({k: v for k, v in overrides.items() if v})
    base.update(model=str(model_dir), eval_k=ecfg.k, eval_temperature=ecfg.temperature, eval_top_p=ecfg.top_p,
                eval_limit=ecfg.limit, seed=ecfg.seed, device=ecfg.device, trust_remote_code=ecfg.trust_remote_code)
    cfg = train.Config(**base)
    if cfg.verifier not in verifier.MODES:
        raise ValueError(f"--verifier must be one of {verifier.MODES}, got {cfg.verifier!r}")
    return cfg, source


def resolve_data(spec: str) -> str:
    """'tiny' or the path of an existing .jsonl / .parquet file.

    Raises:
        FileNotFoundError: anything else, naming the fix.
    """
    if spec == "tiny" or Path(spec).is_file():
        return spec
    raise FileNotFoundError(f"--data {spec!r}: no such file; pass 'tiny' or the path of a .jsonl/.parquet file (the "
                            "official AIME 2024 evaluation file is tests/fixtures/aime2024_dapo_eval.parquet)")


def load_eval_set(spec: str, cfg: train.Config, limit: int = 0) -> tuple[list, dict]:
    """Distinct problems of a dataset, counted by id (the official AIME file has 32 rows per id).

    Returns (problems, info) with info = {"dataset", "dataset_hash", "dataset_rows",
    "rows_per_problem"}; rows_per_problem is the repeat count when all ids repeat equally, else a
    {count: ids} histogram.
    """
    rows, name, data_hash = train.load_problems(resolve_data(spec), cfg, held_out=True)
    repeats = Counter(Counter(p.id for p in rows).values())  # {rows per id: how many ids}
    problems = train.dedupe_by_id(rows)[: limit or None]
    rows_per = next(iter(repeats)) if len(repeats) == 1 else {str(c): n for c, n in sorted(repeats.items())}
    return problems, {"dataset": name, "dataset_hash": data_hash, "dataset_rows": len(rows), "rows_per_problem": rows_per}


def make_engine(choice: str, model_dir: Path, cfg: train.Config, seed: int, device):
    """(engine, tokenizer) for --engine auto | hf | vllm.

    auto picks vLLM when `import vllm` works, else transformers.
    vLLM holds prompt + response budget tokens, capped at the model's position limit.
    """
    if choice not in ("auto", "hf", "vllm"):
        raise ValueError(f"--engine must be auto, hf or vllm, got {choice!r}")
    try:
        import vllm  # noqa: F401

        has_vllm = True
    except ImportError:
        has_vllm = False
    if choice == "vllm" and not has_vllm:
        raise ValueError("--engine vllm: `import vllm` failed (README \"Install\"); use --engine hf")
    if choice == "vllm" or (choice == "auto" and has_vllm):
        tokenizer = train.load_tokenizer(str(model_dir), trust_remote_code=cfg.trust_remote_code)
        max_len = train.engine_max_len(str(model_dir), cfg.max_prompt_len + cfg.max_response_len)
        return rollout.VLLMEngine(str(model_dir), tokenizer, seed=seed, max_model_len=max_len), tokenizer
    model, tokenizer = train.load_policy(str(model_dir), device, trust_remote_code=cfg.trust_remote_code)
    return rollout.HFEngine(model, tokenizer), tokenizer


# --- plumbing: reports ----------------------------------------------------------------------------------


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def render_markdown(res: dict) -> str:
    """report.md: settings, metrics with intervals, paper deviations, length table, per-problem table."""
    s, m, ci = res["settings"], res["metrics"], res["ci"]
    out = ["# Evaluation report", "", "## Settings", ""]
    out += [f"- {key}: `{val}`" for key, val in s.items()]
    dev = paper_deviations(s)
    out += ["", "## Comparable with the paper's Table 1 (AIME 2024 avg@32)?", ""]
    out += [f"- differs: {d}" for d in dev] if dev else ["- yes: every protocol setting matches"]
    level = round(100 * s["ci_level"])
    out += ["", "## Metrics", "", f"| metric | value | {level}% bootstrap CI over problems |", "|---|---:|---|"]
    out += [f"| {k} | {_fmt(v)} | {'[' + _fmt(ci[k][0]) + ', ' + _fmt(ci[k][1]) + ']' if k in ci else ''} |" for k, v in m.items()]
    out += ["", "## Length and correctness", "", "| response length (tokens) | samples | share | accuracy |", "|---|---:|---:|---:|"]
    out += [f"| {r['bin']} | {r['samples']} | {_fmt(r['share'])} | {_fmt(r['accuracy'])} |" for r in res["length_table"]]
    greedy = s["greedy"]
    out += ["", "## Per problem", "", "| id | accuracy | correct/k | maj | " + ("greedy | " if greedy else "")
            + "mean length | length correct | length wrong | truncated | verifier reasons |",
            "|---|---:|---:|---|" + ("---|" if greedy else "") + "---:|---:|---:|---:|---|"]
    for r in res["per_problem"]:
        reasons = " ".join(f"{k}:{v}" for k, v in sorted(r["reasons"].items()))
        out.append(f"| {r['id']} | {_fmt(r['accuracy'])} | {r['n_correct']}/{len(r['correct'])} | {r['maj_correct']} | "
                   + (f"{r['greedy_correct']} | " if greedy else "")
                   + f"{_fmt(r['mean_length'])} | {_fmt(r['mean_length_correct'])} | {_fmt(r['mean_length_wrong'])} | "
                   f"{_fmt(r['truncated_frac'])} | {reasons} |")
    return "\n".join(out) + "\n"


def write_report(res: dict, out_dir: str | Path) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({**res, "paper_deviations": paper_deviations(res["settings"])}, indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(res))


def compare(a: dict, b: dict, *, n_boot: int, level: float, seed: int) -> dict:
    """Paired comparison of two reports on the same problems: {"metrics": {name: paired_bootstrap}, "warnings"}.

    Compares avg@k, pass@k (k = n), maj@k, and greedy_pass@1 when both reports have it.

    Raises:
        ValueError: the reports do not cover the same problem ids with the same k.
    """
    ids_a, ids_b = [r["id"] for r in a["per_problem"]], [r["id"] for r in b["per_problem"]]
    if sorted(ids_a) != sorted(ids_b) or a["settings"]["k"] != b["settings"]["k"]:
        raise ValueError(f"compare needs the same problem ids and k: A has {len(ids_a)} problems, k={a['settings']['k']}; "
                         f"B has {len(ids_b)}, k={b['settings']['k']}; rerun both with the same --data/--limit/--k")
    order = {pid: i for i, pid in enumerate(ids_b)}
    sa, sb = problem_scores(a["per_problem"]), problem_scores([b["per_problem"][order[pid]] for pid in ids_a])
    k = a["settings"]["k"]
    names = [m for m in (f"avg@{k}", f"pass@{k}", f"maj@{k}", "greedy_pass@1") if m in sa and m in sb]
    # Differences that change what was measured, or which samples were drawn (seed, world_size).
    keys = ("dataset_hash", "temperature", "top_p", "max_new_tokens", "seed", "world_size", "verifier",
            "verifier_version", "instruction")
    warnings = [f"{key} differs: A {a['settings'].get(key)!r}, B {b['settings'].get(key)!r}"
                for key in keys if a["settings"].get(key) != b["settings"].get(key)]
    return {"n_problems": len(ids_a), "k": k, "level": level, "warnings": warnings,
            "metrics": {m: paired_bootstrap(sa[m], sb[m], n_boot=n_boot, level=level, seed=seed) for m in names}}


def compare_main(argv: list[str]) -> dict:
    ap = plumbing.ArgumentParser(prog="eval.py compare", description="Paired bootstrap over problems: A minus B.")
    ap.add_argument("a", help="report.json of model A")
    ap.add_argument("b", help="report.json of model B")
    ap.add_argument("--n_boot", type=int, default=EvalConfig.n_boot, help="bootstrap resamples of the problems")
    ap.add_argument("--ci_level", type=float, default=EvalConfig.ci_level, help="coverage of the interval")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = ap.parse_args(argv)
    reports = []
    for path in (args.a, args.b):
        if not Path(path).is_file():
            raise FileNotFoundError(f"compare: {path!r} is not a file; pass two report.json files written by "
                                    "`python eval.py ... --out DIR`")
        try:
            reports.append(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"compare: {path} is not a report.json ({e.msg} at line {e.lineno})") from e
    res = compare(*reports, n_boot=args.n_boot, level=args.ci_level, seed=args.seed)
    print(f"A = {args.a}\nB = {args.b}\n{res['n_problems']} problems, k = {res['k']}, paired bootstrap over problems")
    for w in res["warnings"]:
        print(f"WARNING: {w}")
    for m, r in res["metrics"].items():
        verdict = ("A > B" if r["diff"] > 0 else "A < B") if r["excludes_zero"] else "no difference shown (interval contains 0)"
        print(f"{m:>14}: A {r['a']:.3f}  B {r['b']:.3f}  A-B {r['diff']:+.3f}  "
              f"{round(100 * args.ci_level)}% CI [{r['lo']:+.3f}, {r['hi']:+.3f}]  {verdict}")
    return res


# --- diagnosis: which of DAPO's four boundaries failed ------------------------------------------------
#
# DAPO's interventions each guard one boundary of the RL loop (paper section 3): can the policy still explore (3.1 Clip-Higher), does the batch still hold
# contrast (3.2 Dynamic Sampling), is credit spread sensibly over long answers (3.3 token-level loss),
# does the reward tell wrongness from running out of budget (3.4 overlong shaping). `diagnose` reads
# a run's metrics.jsonl history and names the boundary that failed and the switch that addresses it.
# Every threshold below is a module constant; `THRESHOLDS` renders them as the table in report.md.
# Level checks average the last DIAG_WINDOW steps; trend checks compare that to the first
# DIAG_WINDOW steps and need MIN_TREND_STEPS logged steps.

DIAG_WINDOW = 5  # steps averaged at each end of the history: one noisy step neither fires nor hides a finding
MIN_TREND_STEPS = 4  # a trend (entropy fall, length growth) needs two windows of >= 2 steps each
# exploration (paper 3.1, Fig. 2b: without Clip-Higher entropy falls steadily from the first steps)
# Measured here (30 steps of the tiny default, 2 CPU cores): the last 5 steps kept 77% (DAPO) and 71% (--preset grpo)
# of the first 5 steps' entropy, per-step values 0.055-0.148 nats; neither run fires any check below.
ENTROPY_REL_FLOOR = 0.3  # last-window entropy < 30% of the first window's = collapse; the healthy runs above stay > 70%
ENTROPY_ABS_FLOOR = 0.01  # nats/token; ~ one alternative token at 0.13% per position: G samples become near copies
# clipfrac_high below this = the upper clip never binds (a token with old probability above 1/(1+eps_high) cannot
# reach it). Only sets severity: the tiny policy is so peaked that its healthy runs sit at ~1e-4 too.
CLIPFRAC_HIGH_IDLE = 1e-3
# contrast (paper 3.2, Fig. 3b: the share of all-correct groups rises during training)
UNIFORM_GROUPS_MAX = 0.8  # all-correct + all-wrong share above this: < 1 group in 5 carries any advantage
KEPT_FRAC_MIN = 0.2  # with dynamic sampling, below this each trained group costs > 5 generated groups (tiny default: ~0.33)
BUDGET_STEPS_FRAC = 0.5  # the round budget counts as binding when at least half the window's steps used every round
# credit (paper 3.3: under the sample-level mean, tokens of long answers weigh less, so long
# repetitive wrong answers are under-penalised and length grows)
WRONG_CORRECT_LEN_RATIO = 1.5  # wrong answers 50% longer than correct ones (tiny default: 1.1); truncation explains it: reward check
LENGTH_GROWTH_MIN = 1.2  # mean length grew by > 20% between the first and the last window
# reward (paper 3.4: a truncated answer gets the wrong-answer reward without being wrong)
TRUNCATED_FRAC_MAX = 0.1  # more than 1 rollout in 10 hits the token budget: the budget, not the answer, sets rewards
TRUNCATED_WRONG_FRAC_MAX = 0.5  # most "wrong" answers are really "ran out of budget"
VERIFIER_EXCEPTION_FRAC_MAX = 0.01  # verifier timeouts / parse errors above 1% of verdicts: the reward itself is unreliable

THRESHOLDS = [  # (boundary, constant, value, when it fires) for report.md; values read from the constants above
    ("all", "DIAG_WINDOW", DIAG_WINDOW, "steps averaged at each end of the history"),
    ("all", "MIN_TREND_STEPS", MIN_TREND_STEPS, "logged steps needed before trend checks run"),
    ("exploration", "ENTROPY_REL_FLOOR", ENTROPY_REL_FLOOR, "policy/entropy (last window) < this x first window"),
    ("exploration", "ENTROPY_ABS_FLOOR", ENTROPY_ABS_FLOOR, "or policy/entropy (last window) < this, nats/token"),
    ("exploration", "CLIPFRAC_HIGH_IDLE", CLIPFRAC_HIGH_IDLE, "policy/clipfrac_high below this (or eps_high <= eps_low): critical"),
    ("contrast", "UNIFORM_GROUPS_MAX", UNIFORM_GROUPS_MAX, "groups/all_correct_frac + groups/all_wrong_frac above this"),
    ("contrast", "KEPT_FRAC_MIN", KEPT_FRAC_MIN, "or groups/kept_frac below this (dynamic sampling on)"),
    ("contrast", "BUDGET_STEPS_FRAC", BUDGET_STEPS_FRAC,
     "or this share of steps ran groups/gen_rounds = max_gen_rounds; any groups/exhausted: critical"),
    ("credit", "WRONG_CORRECT_LEN_RATIO", WRONG_CORRECT_LEN_RATIO, "length/wrong_mean / length/correct_mean above this"),
    ("credit", "LENGTH_GROWTH_MIN", LENGTH_GROWTH_MIN,
     "and length/mean grew by this factor; only under seq-mean-token-mean (or unknown)"),
    ("reward", "TRUNCATED_FRAC_MAX", TRUNCATED_FRAC_MAX, "length/truncated_frac above this"),
    ("reward", "TRUNCATED_WRONG_FRAC_MAX", TRUNCATED_WRONG_FRAC_MAX, "or length/truncated_frac_wrong above this"),
    ("reward", "VERIFIER_EXCEPTION_FRAC_MAX", VERIFIER_EXCEPTION_FRAC_MAX, "verifier/exceptions / all verdicts above this"),
]

SWITCHES = {  # the config switch that addresses each boundary (train.Config; README "What DAPO changes")
    "exploration": "clip-higher (--eps_high, paper 0.28 > --eps_low 0.2)",
    "contrast": "dynamic sampling (--dynamic_sampling, --gen_prompts_per_round, --max_gen_rounds)",
    "credit": "token-level loss (--loss_agg token-mean)",
    "reward": "soft overlong punishment / overlong filter (--overlong_penalty, --max_response_len, --overlong_buffer)",
    "verifier": "the verifier (--verifier; hand-check with `python verifier.py RUN_DIR/rollouts.jsonl`)",
}


@dataclass(frozen=True)
class Evidence:
    """The numbers behind a finding: one metric at the steps it was read."""

    metric: str
    steps: tuple
    values: tuple


@dataclass(frozen=True)
class Finding:
    """One failed boundary: what fired, how bad, and which switch addresses it."""

    boundary: str  # "exploration" | "contrast" | "credit" | "reward"
    severity: str  # "critical": the switch that addresses it is off, or the batch is short; else "warning"
    message: str
    switch: str
    evidence: tuple  # of Evidence


def _col(rows: list[dict], key: str) -> np.ndarray:
    """(len(rows),) float64 values of `key`; NaN where a row lacks it (skipped steps, older runs)."""
    return np.array([float(r[key]) if r.get(key) is not None else np.nan for r in rows], dtype=float)


def _nanmean(x: np.ndarray) -> float:
    """Mean over finite entries; NaN when there are none (no warning)."""
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def _ev(rows: list[dict], key: str) -> Evidence:
    vals = _col(rows, key)
    return Evidence(key, tuple(int(r.get("step", i)) for i, r in enumerate(rows)), tuple(round(float(v), 6) for v in vals))


def _check_exploration(metrics: list[dict], cfg: dict) -> list[Finding]:
    if len(metrics) < MIN_TREND_STEPS:
        return []
    w = min(DIAG_WINDOW, len(metrics) // 2)
    first, last = metrics[:w], metrics[-w:]
    e0, e1 = _nanmean(_col(first, "policy/entropy")), _nanmean(_col(last, "policy/entropy"))
    if not (np.isfinite(e0) and np.isfinite(e1)) or not (e1 < ENTROPY_REL_FLOOR * e0 or e1 < ENTROPY_ABS_FLOOR):
        return []
    ch = _nanmean(_col(last, "policy/clipfrac_high"))
    clip_off = "eps_high" in cfg and cfg["eps_high"] <= cfg.get("eps_low", 0.2)
    idle = np.isfinite(ch) and ch < CLIPFRAC_HIGH_IDLE
    msg = f"policy entropy fell from {e0:.3g} to {e1:.3g} nats/token ({e1 / max(e0, 1e-12):.0%} of its first {w} steps)"
    if clip_off:
        msg += f"; Clip-Higher is off (eps_high {cfg['eps_high']} <= eps_low {cfg.get('eps_low')}): rare tokens cannot grow"
    if idle:
        msg += f"; the upper clip never binds (clipfrac_high {ch:.2g} < {CLIPFRAC_HIGH_IDLE}): updates only sharpen likely tokens"
    if not (clip_off or idle):
        msg += "; Clip-Higher is on and acting, yet entropy still collapsed: raise --eps_high or lower --lr"
    return [Finding("exploration", "critical" if clip_off or idle else "warning", msg, SWITCHES["exploration"],
                    (_ev(first, "policy/entropy"), _ev(last, "policy/entropy"), _ev(last, "policy/clipfrac_high")))]


def _check_contrast(metrics: list[dict], cfg: dict) -> list[Finding]:
    last = metrics[-DIAG_WINDOW:]
    uniform = _nanmean(_col(last, "groups/all_correct_frac") + _col(last, "groups/all_wrong_frac"))
    kept = _nanmean(_col(last, "groups/kept_frac"))
    exhausted = int(np.nansum(_col(last, "groups/exhausted")))
    ds = cfg.get("dynamic_sampling")  # None: unknown (no config.json)
    rounds, max_rounds = _col(last, "groups/gen_rounds"), cfg.get("max_gen_rounds")
    at_budget = float(np.mean(rounds >= max_rounds)) if max_rounds and ds is not False else 0.0
    why, critical = [], False
    if uniform > UNIFORM_GROUPS_MAX:
        why.append(f"{uniform:.0%} of generated groups are all-correct or all-wrong (zero advantage)")
        critical |= ds is False  # they are trained on: the effective batch is that much smaller
    if ds is not False and kept < KEPT_FRAC_MIN:
        why.append(f"only {kept:.0%} of generated groups are kept: each trained group costs {1 / max(kept, 1e-9):.1f} generated")
    if at_budget >= BUDGET_STEPS_FRAC:
        why.append(f"{at_budget:.0%} of the last {len(last)} steps used all {max_rounds} generation rounds")
    if exhausted:
        why.append(f"the round budget ran out in {exhausted} of the last {len(last)} steps: the batch was short")
        critical = True
    if not why:
        return []
    fix = ("dynamic sampling is off: turn it on" if ds is False else
           "raise --gen_prompts_per_round / --max_gen_rounds, or use data of matching difficulty")
    keys = ("groups/all_correct_frac", "groups/all_wrong_frac", "groups/kept_frac", "groups/gen_rounds", "groups/exhausted")
    return [Finding("contrast", "critical" if critical else "warning", "; ".join(why) + f" ({fix})", SWITCHES["contrast"],
                    tuple(_ev(last, k) for k in keys if any(k in r for r in last)))]


def _check_credit(metrics: list[dict], cfg: dict) -> list[Finding]:
    agg = cfg.get("loss_agg")  # token-level modes weigh every token alike: this pathology is not theirs
    if (agg is not None and agg != "seq-mean-token-mean") or len(metrics) < MIN_TREND_STEPS:
        return []
    w = min(DIAG_WINDOW, len(metrics) // 2)
    first, last = metrics[:w], metrics[-w:]
    wrong, right = _nanmean(_col(last, "length/wrong_mean")), _nanmean(_col(last, "length/correct_mean"))
    growth = _nanmean(_col(last, "length/mean")) / _nanmean(_col(first, "length/mean"))
    trunc_wrong = _nanmean(_col(last, "length/truncated_frac_wrong"))
    # Wrong answers that are long because the budget cut them are the reward boundary's business.
    if not (wrong / right > WRONG_CORRECT_LEN_RATIO and growth > LENGTH_GROWTH_MIN) or trunc_wrong > TRUNCATED_WRONG_FRAC_MAX:
        return []
    msg = (f"wrong answers are {wrong / right:.1f}x as long as correct ones ({wrong:.0f} vs {right:.0f} tokens) and mean length "
           f"grew {growth:.2f}x, under " + ("the sample-level mean (seq-mean-token-mean): each token of a long wrong answer is "
                                           "under-penalised" if agg else "an unknown loss aggregation (no config.json)"))
    return [Finding("credit", "critical" if agg else "warning", msg, SWITCHES["credit"],
                    (_ev(last, "length/wrong_mean"), _ev(last, "length/correct_mean"), _ev(first, "length/mean"),
                     _ev(last, "length/mean")))]


def _check_reward(metrics: list[dict], cfg: dict) -> list[Finding]:
    last = metrics[-DIAG_WINDOW:]
    out = []
    trunc, trunc_wrong = _nanmean(_col(last, "length/truncated_frac")), _nanmean(_col(last, "length/truncated_frac_wrong"))
    if trunc > TRUNCATED_FRAC_MAX or trunc_wrong > TRUNCATED_WRONG_FRAC_MAX:
        msg = (f"{trunc:.0%} of rollouts hit the {cfg.get('max_response_len', '?')}-token budget and {trunc_wrong:.0%} of wrong "
               "answers are truncated: the reward mostly says 'ran out of budget', not 'wrong'")
        if "overlong_penalty" not in cfg:
            severity, msg = "warning", msg + " (no config.json: whether overlong shaping was on is unknown)"
        elif cfg["overlong_penalty"] or cfg.get("overlong_filter"):
            severity, msg = "warning", msg + "; overlong shaping is on, so the budget itself is too small: raise --max_response_len"
        else:
            severity, msg = "critical", msg + ("; truncated answers get the plain wrong-answer reward (a cliff): turn on "
                                               "--overlong_penalty (or --overlong_filter), or raise --max_response_len")
        out.append(Finding("reward", severity, msg, SWITCHES["reward"],
                           (_ev(last, "length/truncated_frac"), _ev(last, "length/truncated_frac_wrong"))))
    reasons = [k for k in {k for r in last for k in r} if k.startswith("verifier/") and k != "verifier/exceptions"]
    verdicts = sum(float(np.nansum(_col(last, k))) for k in reasons)
    exc = float(np.nansum(_col(last, "verifier/exceptions")))
    if verdicts and exc / verdicts > VERIFIER_EXCEPTION_FRAC_MAX:
        out.append(Finding("reward", "critical", f"{exc / verdicts:.1%} of verdicts in the last {len(last)} steps are verifier "
                           "exceptions (timeouts, parse or worker errors): those rollouts are scored as wrong without being judged",
                           SWITCHES["verifier"], (_ev(last, "verifier/exceptions"),)))
    return out


def diagnose(metrics: list[dict], cfg: dict | None) -> list[Finding]:
    """Which of DAPO's four boundaries a run's history crossed, each with the switch that addresses it.

    Pure: reads only its arguments. The thresholds are the module constants above (table:
    `THRESHOLDS`, rendered into report.md).

    Args:
        metrics: metrics.jsonl of a run, one dict per rollout step in step order (README "Metrics");
            missing keys (older runs, skipped steps) are ignored, not read as zeros.
        cfg: the run's train.Config fields (config.json "config"), or None when unknown; severity
            and some checks depend on which switches were on.

    Returns:
        Findings in boundary order exploration, contrast, credit, reward; [] means healthy.

    Raises:
        ValueError: an empty history.
    """
    if not metrics:
        raise ValueError("diagnose needs at least one logged step; metrics.jsonl is empty (did the run crash before step 0?)")
    cfg = cfg or {}
    return [f for check in (_check_exploration, _check_contrast, _check_credit, _check_reward) for f in check(metrics, cfg)]


# --- plumbing: run reports (python eval.py report RUN_DIR [RUN_DIR2] [--out DIR]) ----------------------------

# rollouts.jsonl fields the report reads (rollout.RolloutRecord); the rest (texts) is not kept in memory
ROLLOUT_FIELDS = ("step", "policy_version", "learner_version", "response_tokens", "truncated", "correct", "reward",
                  "verifier_reason", "gen_wall_s", "verifier_version", "dataset_hash")
ENVELOPE_SUMS = ("prompts_generated", "samples_generated", "active_samples", "trained_tokens")  # summed over steps
ENVELOPE_MAXES = ("max_response_len", "max_prompt_len")  # the largest over steps
PHASES = ("time/generate", "time/score", "time/old_logprobs", "time/update", "time/weight_sync")


def _read_jsonl(path: Path, fields: tuple | None = None) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n} is not JSON ({e}); a crash mid-write leaves a partial last line: delete it") from e
            out.append({k: row.get(k) for k in fields} if fields else row)
    return out


def load_run(run_dir: str | Path) -> dict:
    """What train.py wrote to a run directory: {"dir", "meta", "cfg", "metrics", "summary", "rollouts"}.

    Raises:
        FileNotFoundError: no metrics.jsonl (not a run directory).
    """
    d = Path(run_dir)
    if not (d / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{d} has no metrics.jsonl: pass a run directory written by train.py --run_dir")
    meta = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    return {"dir": d, "meta": meta, "cfg": meta.get("config"), "metrics": _read_jsonl(d / "metrics.jsonl"),
            "summary": json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {},
            "rollouts": _read_jsonl(d / "rollouts.jsonl", ROLLOUT_FIELDS) if (d / "rollouts.jsonl").is_file() else None}


def _run_names(runs: list[dict]) -> list[str]:
    """Run dir names; parent/name when two share a name."""
    names = [r["dir"].resolve().name for r in runs]
    if len(set(names)) < len(names):
        names = [f"{r['dir'].resolve().parent.name}/{r['dir'].resolve().name}" for r in runs]
    return names


def _series(run: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one metric over a run, only the steps that logged it."""
    pts = [(m.get("step", i), m[key]) for i, m in enumerate(run["metrics"]) if m.get(key) is not None]
    return np.array([p[0] for p in pts], dtype=float), np.array([p[1] for p in pts], dtype=float)


def _line_plot(runs, names, panels, path: Path, title: str) -> bool:
    """One figure of stacked panels; each panel overlays `(key, label, linestyle)` lines of every run
    (colour = run). Returns False (and writes nothing) when no run logged any of the keys."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not any(len(_series(r, k)[0]) for r in runs for _, lines in panels for k, _, _ in lines):
        return False
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.8 * len(panels)), sharex=True, squeeze=False)
    for ax, (ylabel, lines) in zip(axes[:, 0], panels):
        for ri, (run, name) in enumerate(zip(runs, names)):
            for key, label, style in lines:
                x, y = _series(run, key)
                if len(x):
                    ax.plot(x, y, linestyle=style, color=f"C{ri}", marker="." if len(x) < 30 else None,
                            label=f"{name}: {label}" if len(runs) > 1 else label)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel("rollout step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _length_heatmap(runs, names, path: Path) -> bool:
    """Per-step histogram of response lengths from rollouts.jsonl, one panel per run (heatmaps
    cannot overlay): colour = share of that step's rollouts in the length bin."""
    import matplotlib.pyplot as plt

    have = [(r, n) for r, n in zip(runs, names) if r["rollouts"]]
    if not have:
        return False
    fig, axes = plt.subplots(1, len(have), figsize=(6 * len(have), 3.6), squeeze=False)
    for ax, (run, name) in zip(axes[0], have):
        steps = np.array([x["step"] for x in run["rollouts"]])  # (N,)
        lens = np.array([x["response_tokens"] for x in run["rollouts"]])  # (N,)
        top = max(int((run["cfg"] or {}).get("max_response_len", 0)), int(lens.max()), 1)
        bins = np.linspace(0, top, min(top, 32) + 1)  # (nb + 1,)
        cols = np.arange(steps.min(), steps.max() + 1)  # (S,) every step, empty columns stay 0
        grid = np.zeros((len(bins) - 1, len(cols)))  # (nb, S)
        for j, s in enumerate(cols):
            if (steps == s).any():
                grid[:, j] = np.histogram(lens[steps == s], bins=bins)[0] / (steps == s).sum()
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis",
                       extent=(cols[0] - 0.5, cols[-1] + 0.5, 0, top))
        fig.colorbar(im, ax=ax, label="share of step's rollouts")
        ax.set_title(f"{name}: response length per step")
        ax.set_xlabel("rollout step")
        ax.set_ylabel("response tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _time_plot(runs, names, path: Path) -> bool:
    """Seconds per phase, stacked, one panel per run (stacks cannot overlay) on a shared y axis."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not any(len(_series(r, k)[0]) for r in runs for k in PHASES):
        return False
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 3.6), squeeze=False, sharey=True)
    for ax, run, name in zip(axes[0], runs, names):
        steps = np.array([m.get("step", i) for i, m in enumerate(run["metrics"])], dtype=float)  # (S,)
        ys = [np.nan_to_num(_col(run["metrics"], k)) for k in PHASES]  # 5 x (S,), a missing phase is 0 s
        ax.stackplot(steps, ys, labels=[k.split("/")[1] for k in PHASES])
        ax.set_title(f"{name}: seconds per phase")
        ax.set_xlabel("rollout step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7, loc="upper left")
    axes[0, 0].set_ylabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_plots(runs: list[dict], names: list[str], out: Path) -> tuple[list[str], list[str]]:
    """Every PNG of the report; returns (file names written, notes on plots skipped and why)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    probe_keys = sorted({k for r in runs for m in r["metrics"] for k in m if k.startswith("probe/")})
    probe_acc = [k for k in probe_keys if "@" in k]  # avg@k, pass@k, maj@k: accuracies in [0, 1]
    probe_rest = [k for k in probe_keys if "@" not in k and k not in ("probe/n_problems", "probe/k")]  # lengths, ...
    styles = ["-", "--", ":", "-."]
    plots = {
        "reward.png": ([("train/reward_mean", [("train/reward_mean", "reward mean", "-")]),
                        ("training rollouts", [("train/correct_frac", "correct frac (training data, not accuracy)", "-")])],
                       "training reward and correct fraction"),
        "probe.png": ([("probe accuracy", [(k, k, styles[i % 4]) for i, k in enumerate(probe_acc)])]
                      + ([("probe, other", [(k, k, styles[i % 4]) for i, k in enumerate(probe_rest)])] if probe_rest else []),
                      "probe accuracy (fixed held-out probe set, every K steps)"),
        "length.png": ([("tokens", [("length/mean", "mean", "-"), ("length/median", "median", "--"), ("length/p90", "p90", "-."),
                                    ("length/max", "max", ":")]),
                        ("truncated", [("length/truncated_frac", "truncation rate", "-"),
                                       ("length/truncated_frac_wrong", "truncated share of wrong", "--")])],
                       "response length"),
        "entropy.png": ([("nats/token", [("policy/entropy", "entropy", "-")])], "policy entropy (true entropy, before the update)"),
        "clipfrac.png": ([("fraction of tokens", [("policy/clipfrac_low", "clipfrac_low (1-eps_low, A<0)", "-"),
                                                  ("policy/clipfrac_high", "clipfrac_high (1+eps_high, A>0)", "--")])],
                         "clip fractions"),
        "groups.png": ([("fraction of groups", [("groups/kept_frac", "kept", "-"), ("groups/all_correct_frac", "all correct", "--"),
                                                ("groups/all_wrong_frac", "all wrong", ":")]),
                        ("rounds", [("groups/gen_rounds", "generation rounds", "-"), ("groups/exhausted", "budget exhausted", ":")])],
                       "dynamic sampling: kept groups, uniform groups, generation rounds"),
    }
    written, notes = [], []
    for fname, (panels, title) in plots.items():
        if fname == "probe.png" and not probe_keys:
            notes.append("probe.png skipped: no `probe/*` metrics in metrics.jsonl (an older run, or probes off)")
        elif _line_plot(runs, names, panels, out / fname, title):
            written.append(fname)
        else:
            notes.append(f"{fname} skipped: none of its metrics were logged")
    if _length_heatmap(runs, names, out / "length_hist.png"):
        written.append("length_hist.png")
    else:
        notes.append("length_hist.png skipped: no rollouts.jsonl")
    if _time_plot(runs, names, out / "time.png"):
        written.append("time.png")
    else:
        notes.append("time.png skipped: no time/* metrics")
    return written, notes


def _md_table(header: list[str], rows: list[list], fmt=_fmt) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]


def _raw(x) -> str:
    """A config value as set (1e-06 stays 1e-06; '' is shown as '')."""
    return "''" if x == "" else str(x)


def envelope(run: dict) -> dict:
    """The resource envelope of a run: counts summed over steps, maxima, peak memory, wall time."""
    ms = run["metrics"]
    env = {k: int(np.nansum(_col(ms, f"envelope/{k}"))) for k in ENVELOPE_SUMS}
    env.update({k: int(np.nanmax(_col(ms, f"envelope/{k}"))) if any(f"envelope/{k}" in m for m in ms) else None for k in ENVELOPE_MAXES})
    env["generated_tokens"] = sum(x["response_tokens"] for x in run["rollouts"]) if run["rollouts"] else None
    env["peak_memory_gb"] = float(np.nanmax(_col(ms, "memory/peak_gb"))) if any("memory/peak_gb" in m for m in ms) else None
    env["wall_s"] = run["summary"].get("seconds", round(float(np.nansum(_col(ms, "time/step"))), 1))
    env["rollout_steps"] = len(ms)
    return env


def length_correctness(rollouts: list[dict], budget: int) -> list[list]:
    """Rows [length bucket, rollouts, share, correct frac, truncated frac, verifier reasons, mean gen_wall_s]:
    four equal bins of the budget for finished answers (as eval.length_table), the truncated ones, all."""
    lens = np.array([x["response_tokens"] for x in rollouts])  # (N,)
    trunc = np.array([bool(x["truncated"]) for x in rollouts])  # (N,)
    edges = [round(budget * q / 4) for q in range(5)]
    sels = [(f"[{lo}, {hi}{']' if hi == budget else ')'}", ~trunc & (lens >= lo) & ((lens <= hi) if hi == budget else (lens < hi)))
            for lo, hi in zip(edges[:-1], edges[1:])]
    sels += [(f"truncated (hit {budget})", trunc), ("all", np.ones_like(trunc))]
    rows = []
    for name, sel in sels:
        picked = [x for x, s in zip(rollouts, sel) if s]
        reasons = Counter(x["verifier_reason"] for x in picked)
        rows.append([name, len(picked), float(sel.mean()),
                     float(np.mean([x["correct"] for x in picked])) if picked else None,
                     float(np.mean([x["truncated"] for x in picked])) if picked else None,
                     " ".join(f"{k}:{v}" for k, v in sorted(reasons.items())) or "-",
                     float(np.mean([x["gen_wall_s"] for x in picked])) if picked else None])
    return rows


def age_bucket(age: int) -> tuple[int, str]:
    """(sort key, label) of a rollout age in steps: 0, 1, 2-3, 4-7, ... (powers of two, any staleness).

    Raises:
        ValueError: age < 0 (a rollout trained on before it was generated: broken version records).
    """
    if age < 0:
        raise ValueError(f"rollout age {age} < 0: learner_version < policy_version means a rollout was trained on before it existed")
    if age == 0:
        return 0, "0"
    k = int(age).bit_length() - 1
    return k + 1, str(2**k) if k == 0 else f"{2**k}-{2 ** (k + 1) - 1}"


def age_slices(rollouts: list[dict]) -> list[list]:
    """Rows [age bucket, rollouts, reward mean, correct frac, mean length], age = learner_version - policy_version."""
    groups: dict[tuple, list] = {}
    for x in rollouts:
        groups.setdefault(age_bucket(int(x["learner_version"]) - int(x["policy_version"])), []).append(x)
    return [[label, len(xs), float(np.mean([x["reward"] for x in xs])), float(np.mean([x["correct"] for x in xs])),
             float(np.mean([x["response_tokens"] for x in xs]))] for (_, label), xs in sorted(groups.items())]


def render_run_report(runs: list[dict], names: list[str], findings: list[list[Finding]], plots: list[str], notes: list[str]) -> str:
    """report.md of one run, or two overlaid (an ablation): identity, config, results next to the
    resource envelope, length x correctness, rollout age, plots, diagnosis."""
    cols = names if len(runs) > 1 else ["value"]
    out = [f"# Run report: {' vs '.join(names)}", ""]
    # identity
    ident = ("run_id", "verifier_version", "dataset", "dataset_hash", "template_hash", "engine", "torch", "world_size")
    rows = [["run dir"] + [str(r["dir"]) for r in runs]] + [[k] + [r["meta"].get(k, "-") for r in runs] for k in ident]
    for field_ in ("verifier_version", "dataset_hash"):  # what every rollout says, not only the run's start
        rows.append([f"{field_} in rollouts.jsonl"] + [", ".join(sorted({str(x[field_]) for x in r["rollouts"]})) or "-"
                                                       if r["rollouts"] else "-" for r in runs])
    out += ["## Run identity", ""] + _md_table(["field"] + cols, rows)
    mixed = [n for r, n in zip(runs, names) if r["rollouts"] and len({x["verifier_version"] for x in r["rollouts"]}) > 1]
    out += [f"\n**Warning**: {n} mixes verifier versions across its rollouts; its curves are not comparable step to step." for n in mixed]
    # config
    defaults = dataclasses.asdict(train.Config())
    cfgs = [r["cfg"] or {} for r in runs]
    keys = sorted({k for c in cfgs for k in c} | set(defaults))
    # A field no run has was added to train.Config after these runs: a note, not a difference.
    absent = [k for k in keys if all(k not in c for c in cfgs)] if any(cfgs) else []
    diff = [[k, defaults.get(k, "-")] + [c.get(k, "-") for c in cfgs] for k in keys if k not in absent
            and len({json.dumps(v, sort_keys=True) for v in [defaults.get(k, "-")] + [c.get(k, "-") for c in cfgs]}) > 1]
    out += ["", "## Config: " + ("differences between the runs and the defaults" if len(runs) > 1 else "differences from the defaults"),
            "", "(train.Config defaults of this checkout; `-` = not in that run's config.json)", ""]
    out += _md_table(["field", "default"] + cols, diff, _raw) if diff else ["every field at its default"]
    out += [f"\nNot in any run's config.json (added to train.Config since): {', '.join(absent)}"] if absent else []
    out += ["\n**Warning**: no config.json in " + ", ".join(n for r, n in zip(runs, names) if not r["cfg"])
            + ": diagnosis severities assume nothing about its switches"] if not all(cfgs) else []
    # results next to the envelope
    envs = [envelope(r) for r in runs]
    rows = []
    hk = sorted({k.split("/", 1)[1] for r in runs for k in r["summary"] if k.startswith("heldout/")} - {"n_problems", "k"},
                key=lambda k: (not k.startswith(("avg@", "pass@", "maj@")), k))
    for r_ in runs:
        if not r_["summary"]:
            notes.append(f"{r_['dir']} has no summary.json (the run did not finish): no held-out numbers")
    if hk:
        rows.append(["held-out set"] + [f"{r['summary'].get('heldout/n_problems', '-')} problems x k={r['summary'].get('heldout/k', '-')}"
                                        if "heldout/k" in r["summary"] else "none" for r in runs])
    for k in hk:
        cells = []
        for r in runs:
            a, b = r["summary"].get(f"heldout/{k}"), r["summary"].get(f"heldout_after/{k}")
            cells.append("-" if a is None or b is None else f"{a:.3f} -> {b:.3f} ({b - a:+.3f})")
        rows.append([f"held-out {k}, before -> after (change)"] + cells)
    for key, label in (("train/reward_mean", "training reward, last step (training rollouts, not accuracy)"),
                       ("train/correct_frac", "training correct frac, last step (training rollouts, not accuracy)")):
        rows.append([label] + [_series(r, key)[1][-1] if len(_series(r, key)[1]) else None for r in runs])
    env_labels = {"rollout_steps": "rollout steps", "prompts_generated": "prompts generated", "samples_generated": "samples generated",
                  "active_samples": "active samples (trained on)", "trained_tokens": "trained tokens", "generated_tokens":
                  "generated tokens (rollouts.jsonl)", "max_response_len": "max response length (tokens)", "max_prompt_len":
                  "max prompt length (tokens)", "peak_memory_gb": "peak memory (GB)", "wall_s": "wall time (s)"}
    rows += [[f"envelope: {label}"] + [e[k] for e in envs] for k, label in env_labels.items()]
    out += ["", "## Results and their resource envelope", "",
            "Held-out numbers are problems never trained on (summary.json). Training reward is about the rollouts trained on "
            "and is never accuracy.", ""] + _md_table(["quantity"] + cols, rows)
    # length x correctness, age
    out += ["", "## Response length and correctness (rollouts.jsonl, all generated training rollouts)", ""]
    for r, n in zip(runs, names):
        if not r["rollouts"]:
            out += [f"{n}: no rollouts.jsonl", ""]
            continue
        budget = int((r["cfg"] or {}).get("max_response_len") or max(x["response_tokens"] for x in r["rollouts"]))
        out += ([f"### {n}", ""] if len(runs) > 1 else []) + _md_table(
            ["response length (tokens)", "rollouts", "share", "correct frac", "truncated frac", "verifier reasons",
             "mean gen_wall_s (s, its generation batch)"], length_correctness(r["rollouts"], budget)) + [""]
    out += ["## Rollout age (age = learner_version - policy_version)", ""]
    age_rows = [[n] + row for r, n in zip(runs, names) if r["rollouts"] for row in age_slices(r["rollouts"])]
    out += _md_table(["run", "age bucket", "rollouts", "reward mean", "correct frac", "mean length"], age_rows)
    if age_rows and all(row[1] == "0" for row in age_rows):
        out += ["", "Every rollout has age 0: synchronous (on-policy) rollouts, no staleness."]
    # plots
    out += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""] + [f"- {n}" for n in notes]
    # diagnosis
    out += ["", "## Diagnosis: DAPO's four boundaries", ""]
    for n, fs in zip(names, findings):
        out += [f"### {n}", ""] if len(runs) > 1 else []
        if not fs:
            out += ["healthy: no boundary check fired", ""]
        for f in fs:
            out += [f"- **{f.severity}: {f.boundary}**: {f.message}. Switch: {f.switch}."]
            out += [f"  - evidence `{e.metric}` steps {list(e.steps)}: {', '.join(format(v, '.4g') for v in e.values)}" for e in f.evidence]
        out += [""] if fs else []
    out += ["Thresholds (eval.py constants; level checks use the last DIAG_WINDOW steps, trends compare the first and last):", ""]
    out += _md_table(["boundary", "constant", "value", "fires when"], [list(t) for t in THRESHOLDS])
    return "\n".join(out) + "\n"


def run_report(run_dirs: list[str | Path], out: str | Path | None = None) -> dict:
    """Plots, report.md and diagnosis.json for one run or two (overlaid). Returns {"out", "plots", "notes", "findings"}.

    Raises:
        ValueError: not one or two run directories.
        FileNotFoundError: a directory without metrics.jsonl (load_run).
    """
    if not 1 <= len(run_dirs) <= 2:
        raise ValueError(f"report takes one or two run directories, got {len(run_dirs)}")
    runs = [load_run(d) for d in run_dirs]
    names = _run_names(runs)
    out = Path(out) if out else runs[0]["dir"] / "report"
    out.mkdir(parents=True, exist_ok=True)
    findings = [diagnose(r["metrics"], r["cfg"]) for r in runs]
    plots, notes = write_plots(runs, names, out)
    (out / "report.md").write_text(render_run_report(runs, names, findings, plots, notes))
    (out / "diagnosis.json").write_text(json.dumps({n: [dataclasses.asdict(f) for f in fs] for n, fs in zip(names, findings)},
                                                   indent=2) + "\n")
    return {"out": out, "plots": plots, "notes": notes, "findings": dict(zip(names, findings))}


def report_main(argv: list[str]) -> dict:
    """`python eval.py report RUN_DIR [RUN_DIR2] [--out DIR]`: run_report, then print notes and the diagnosis."""
    ap = plumbing.ArgumentParser(prog="eval.py report", description="Plots, report.md and a diagnosis of one training run, "
                                 "or two overlaid (an ablation).")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a train.py --run_dir; a second one is overlaid on the first")
    ap.add_argument("--out", default="", help="output directory (default: RUN_DIR/report of the first run)")
    args = ap.parse_args(argv)
    if len(args.runs) > 2:
        ap.error(f"one or two run directories, got {len(args.runs)}")
    res = run_report(args.runs, args.out or None)
    for note in res["notes"]:
        print(f"note: {note}")
    for name, fs in res["findings"].items():
        print(f"[{name}] " + ("healthy" if not fs else f"{len(fs)} finding(s)"))
        for f in fs:
            print(f"  {f.severity}: {f.boundary}: {f.message}\n    switch: {f.switch}")
    print(f"wrote {res['out']}/report.md, diagnosis.json and {len(res['plots'])} plots")
    return res


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    import torch

    ecfg = parse_args(argv)
    torch.set_num_threads(1)
    model_dir = resolve_model(ecfg.model)
    cfg, source = checkpoint_config(model_dir, ecfg)
    dist, device = train.init_distributed(cfg)  # torchrun: one process per device, problems split by `shard`
    problems, info = load_eval_set(ecfg.data, cfg, ecfg.limit)  # before the model: a bad --data fails fast
    engine, tokenizer = make_engine(ecfg.engine, model_dir, cfg, ecfg.seed, device)
    res = evaluate(engine, tokenizer, problems, cfg, seed=ecfg.seed, build_prompt=train.build_prompt, greedy=ecfg.greedy,
                   n_boot=ecfg.n_boot, ci_level=ecfg.ci_level, rank=dist.rank, world=dist.world)
    res["settings"].update(config_source=source, **info)
    if not dist.main:
        return None
    for m, v in res["metrics"].items():
        interval = f"  [{res['ci'][m][0]:.3f}, {res['ci'][m][1]:.3f}]" if m in res["ci"] else ""
        print(f"{m:>20}: {_fmt(v)}{interval}")
    print(json.dumps(res["settings"], indent=2))
    for d in paper_deviations(res["settings"]):
        print(f"differs from the paper's protocol: {d}")
    if ecfg.out:
        write_report(res, ecfg.out)
        print(f"wrote {ecfg.out}/report.json and report.md")
    return res


if __name__ == "__main__":
    sys.exit(plumbing.run_cli(main))
