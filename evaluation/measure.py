"""A model's answers sampled, scored by the task's reward and summarised: `evaluate`, and the two
measurements the training loop takes with it (`held_out` before and after training, `probe` every
--probe_every steps).

`python eval.py` (the command) and train.py both call these; what each metric means and how this
departs from the paper's evaluation is eval.py's docstring. Pure measurement: no files are written
here (evaluation/reports.py writes report.json and report.md).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

import rollout
import verifier
from rollout import SamplingParams
from task import FORMAT_ERRORS, Dataset, Task
from evaluation.estimators import MAJ_TIE_RULE, answer_classes, bootstrap_ci, maj_at_k, majority_vote, problem_scores
from plumbing import distributed, policy
from plumbing.distributed import Dist, rank_seed, shard, unshard
from plumbing.policy import repo_commit


# --- generation and scoring -----------------------------------------------------------------------------


def _score(problem, group, tokenizer, cfg, task: Task) -> tuple[list[str], list]:
    """(decoded responses, their verdicts): the task's reward call, as in training."""
    texts = [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in group]
    return texts, task.verdicts(texts, problem, cfg)


def same_answer(mode: str):
    """The verifier's own equality of two extracted answers, for the vote (estimators.answer_classes).

    "dapo" and "dapo-official" extract canonical strings (the integer without leading zeros or
    separators; the official normalisation) and judge by string equality, so `==` is their
    equality. "math" judges equivalence (math-verify in a worker process, under the verifier's
    timeout): `new` equals `rep` when verifier.score judges the response "Answer: new" right
    against the ground truth `rep`. A comparison that times out is "not equal" (a class of its
    own), and so is any answer against a representative that math-verify cannot read as a ground
    truth (verifier.score raises ValueError for it); identical strings are always equal.
    """
    if mode != "math":
        return lambda rep, new: rep == new

    def same(rep: str, new: str) -> bool:
        if rep == new:
            return True
        try:
            return verifier.score(f"Answer: {new}", rep, mode="math").correct
        except ValueError:  # rep is no value math-verify can parse as a ground truth: only its own string equals it
            return False

    return same


def _problem_record(problem, group, scores, greedy, same, texts=None) -> dict:
    """Everything the report needs about one problem (k samples, plus the greedy one if any; with
    `texts`, each sample's response text, verdict and finish reason under "samples").

    same: the vote's answer equality (`same_answer`). "classes" holds each sample's answer class
    (None: nothing extracted) and "response_class" each sample's class of identical token ids."""
    correct = [s.correct for s in scores]
    lengths = [len(s.token_ids) for s in group]
    preds = [s.pred for s in scores]
    mean_of = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
    classes = answer_classes(preds, same)
    winner = majority_vote(classes)
    rec = {
        "id": problem.id, "answer": problem.answer, "accuracy": float(np.mean(correct)), "n_correct": int(sum(correct)),
        "tokens": int(sum(lengths)), "distinct_answers": len({c for c in classes if c is not None}),
        "mean_length": float(np.mean(lengths)),
        "mean_length_correct": mean_of([n for n, c in zip(lengths, correct) if c]),
        "mean_length_wrong": mean_of([n for n, c in zip(lengths, correct) if not c]),
        "truncated_frac": float(np.mean([s.truncated for s in group])),
        "maj_pred": None if winner is None else preds[winner], "maj_correct": maj_at_k(classes, correct),
        "reasons": dict(Counter(s.reason for s in scores)),
        "correct": correct, "lengths": lengths, "truncated": [s.truncated for s in group], "preds": preds,
        "classes": classes, "response_class": answer_classes([tuple(s.token_ids) for s in group]),
    }
    if texts is not None:
        rec["samples"] = [{"response": t, "correct": sc.correct, "pred": sc.pred, "reason": sc.reason,
                           "tokens": len(smp.token_ids), "finish_reason": smp.finish_reason}
                          for t, sc, smp in zip(texts, scores, group)]
    if greedy is not None:
        (g_sample,), (g_score,) = greedy
        rec.update(greedy_correct=g_score.correct, greedy_pred=g_score.pred, greedy_reason=g_score.reason,
                   greedy_length=len(g_sample.token_ids), greedy_truncated=g_sample.truncated)
    return rec


def evaluate(engine, tokenizer, data: Dataset, params: SamplingParams, cfg, task: Task, *, dist: Dist = Dist(),
             greedy: bool = False, n_boot: int = 2000, ci_level: float = 0.95, keep_samples: bool = False) -> dict:
    """Sample params.n answers per problem, score them with the task's reward, summarise with intervals.

    Args:
        engine: a rollout.Engine.
        tokenizer: the policy's tokenizer (decodes responses for the verifier).
        data: problems and their prompt token ids (task.Task.load), one per distinct problem.
        params: k = params.n samples per problem, the response budget, temperature, top_p; its
            seed is the sampler seed (per engine group, see `rank_seed`) and the bootstrap seed.
        cfg: what the task reads (verifier, instruction, ...) and `model`, `max_prompt_len`
            for the report's settings: a train.Config, or eval.py's ModelSettings.
        task: the task whose `score` judges each response (the same as in training).
        dist: this process's place under torchrun; every rank must call with the same data and
            receives all results (all_gather). Engine group g (ranks [g*tp, (g+1)*tp) with
            tp = engine.tp) generates its `shard` of the problems; only its first rank's results
            are kept.
        greedy: also decode greedily once per problem (greedy_pass@1).
        keep_samples: keep each sample's text and verdict in per_problem[i]["samples"].

    Returns:
        {"metrics": {avg@k, pass@1..pass@k, maj@k, [greedy_pass@1], mean_length, ...},
         "ci": {metric: [lo, hi]}, "per_problem": [record per problem], "length_table": [...],
         "settings": {...}, "correct": (P, k) list of lists}

    Raises:
        ValueError: no problems, or k < 1.
    """
    k = params.n
    if not len(data) or k < 1:
        raise ValueError(f"evaluate needs problems and k >= 1, got {len(data)} problems and k={k}")
    tp = engine.tp
    n_groups, my_group = dist.world // tp, dist.rank // tp
    idx, n_real = shard(len(data), my_group, n_groups)
    mine = [data.problems[i] for i in idx]
    prompts = [data.prompt_ids[i] for i in idx]  # (P_rank,) lists of token ids, tokenised once
    seed = params.seed  # the bootstrap's seed, and the sampler's with one engine group
    params = dataclasses.replace(params, seed=rank_seed(seed, my_group, n_groups))
    samples, gen_s = rollout.timed_generate(engine, prompts, params)  # (P_rank, k) Samples
    greedy_samples, greedy_s = [None] * len(mine), 0.0
    if greedy:
        greedy_samples, greedy_s = rollout.timed_generate(engine, prompts, dataclasses.replace(params, n=1, temperature=0.0))
    records, same = [], same_answer(cfg.verifier)
    scored = n_real if dist.rank % tp == 0 else 0  # a group's other ranks hold copies: scored once, by its first rank
    for p, group, g in list(zip(mine, samples, greedy_samples))[:scored]:  # padding dropped (see `shard`)
        greedy_scored = None if g is None else (g, _score(p, g, tokenizer, cfg, task)[1])
        texts, scores = _score(p, group, tokenizer, cfg, task)
        records.append(_problem_record(p, group, scores, greedy_scored, same, texts if keep_samples else None))
        records[-1].update(format_error=[s.reason in FORMAT_ERRORS for s in scores],  # no single well-formed answer
                           exact_form=[task.exact_form(t, cfg) for t in texts])  # the last line exactly "Answer: N"
    parts = distributed.all_gather_objects((records, gen_s, greedy_s), dist)
    records = unshard([part[0] for part in parts[::tp]], n_groups)

    metrics, ci = summarize(records, n_boot=n_boot, ci_level=ci_level, seed=seed)
    gen_s = max(part[1] for part in parts)  # the slowest rank's wall time
    metrics.update(gen_seconds=gen_s, seconds_per_problem=gen_s / len(records),
                   gen_tokens_per_s=sum(r["tokens"] for r in records) / max(gen_s, 1e-9))
    if greedy:
        metrics["greedy_gen_seconds"] = max(part[2] for part in parts)
    settings = {
        "model": cfg.model or str(policy.DEFAULT_MODEL.relative_to(policy.REPO)), "n_problems": len(records),
        "n_samples": k, "k": k, "temperature": params.temperature, "top_p": params.top_p, "seed": seed,
        "max_new_tokens": params.max_new_tokens, "max_prompt_len": cfg.max_prompt_len, "instruction": cfg.instruction,
        "few_shot": getattr(cfg, "few_shot", ""),
        "template_hash": task.template_hash(tokenizer, cfg), "verifier": cfg.verifier,
        "verifier_version": verifier.VERSION, "engine": f"{engine.name} {engine.version}", "engine_seeded": engine.seeded,
        "greedy": greedy, "world_size": dist.world, "engine_groups": n_groups, "n_boot": n_boot, "ci_level": ci_level,
        "commit": repo_commit(),
        "pass_at_k": "unbiased 1 - C(n-c,k)/C(n,k), n = k samples per problem (Chen et al. 2021)",
        "maj_tie_rule": MAJ_TIE_RULE, "maj_equality": "string" if cfg.verifier != "math" else "math-verify (verifier.score)",
    }
    return {"metrics": metrics, "ci": ci, "per_problem": records, "length_table": length_table(records, params.max_new_tokens),
            "settings": settings, "correct": [r["correct"] for r in records]}


# --- measurements during a training run (train.py): held-out before and after, the probe set -------------


def held_out(engine, tokenizer, data, cfg, task, dist: Dist, tag: str) -> dict:
    """Held-out avg@k, pass@k, maj@k and lengths during training, as heldout/* metrics ({} without data).

    cfg: train.Config (eval_k, eval_temperature, eval_top_p, max_response_len, seed,
    heldout_seed_offset). The same settings and seed before and after training.
    """
    if not data:
        return {}
    params = SamplingParams(n=cfg.eval_k, max_new_tokens=cfg.max_response_len, temperature=cfg.eval_temperature,
                            top_p=cfg.eval_top_p, seed=cfg.seed + cfg.heldout_seed_offset)
    res = evaluate(engine, tokenizer, data, params, cfg, task, dist=dist)
    out = {f"heldout/{k}": v for k, v in res["metrics"].items()}
    out["heldout/n_problems"], out["heldout/k"] = len(data), cfg.eval_k
    out["heldout/trained_problems"] = trained = data.info.get("trained_problems", 0)  # --allow_heldout_overlap
    if dist.main:
        print(f"[held-out {tag}] " + " ".join(f"{k}={v:.3f}" for k, v in out.items() if isinstance(v, float))
              + (f" ({trained} of these {len(data)} problems were trained on)" if trained else ""), flush=True)
    return out


def probe(engine, tokenizer, data, cfg, task, dist: Dist, step: int, seed: int) -> tuple[dict, list[dict]]:
    """The fixed probe set during training (held-out prompts that never enter training), sampled
    with the held-out settings at request seed `seed`; returns probe/* metrics and one record per rollout."""
    params = SamplingParams(n=cfg.eval_k, max_new_tokens=cfg.max_response_len, temperature=cfg.eval_temperature,
                            top_p=cfg.eval_top_p, seed=seed)
    res = evaluate(engine, tokenizer, data, params, cfg, task, dist=dist, keep_samples=True)
    records = [{"step": step, "policy_version": step, "prompt_id": p["id"], "sample_index": si, "response": s["response"],
                "ground_truth": p["answer"], "correct": s["correct"], "pred": s["pred"], "verifier_reason": s["reason"],
                "response_tokens": s["tokens"], "finish_reason": s["finish_reason"], "seed": seed,
                "verifier_version": verifier.VERSION} for p in res["per_problem"] for si, s in enumerate(p["samples"])]
    m = res["metrics"]
    return {f"probe/avg@{cfg.eval_k}": m[f"avg@{cfg.eval_k}"], "probe/format_error": m["format_error"],
            "probe/exact_form": m["exact_form"], "probe/mean_length": m["mean_length"],
            "probe/n_problems": len(data), "time/probe": m["gen_seconds"]}, records


def summarize(records: list[dict], *, n_boot: int, ci_level: float, seed: int) -> tuple[dict, dict]:
    """Metrics over problems and their bootstrap intervals: ({name: value}, {name: [lo, hi]}).

    The per-problem metrics (`problem_scores`: accuracy, tokens per problem, diversity) get
    intervals; the length metrics are over all samples and are None when no sample is correct (or
    wrong); tokens_per_problem_p90 is the 90th percentile over problems of a problem's k samples' tokens.
    """
    scores = problem_scores(records)  # {metric: (P,)}
    names = list(scores)
    lo, hi = bootstrap_ci(np.stack([scores[m] for m in names], 1), n_boot=n_boot, level=ci_level, seed=seed)  # (M,)
    lengths = np.array([n for r in records for n in r["lengths"]])  # (P*k,) tokens
    correct = np.array([c for r in records for c in r["correct"]], dtype=bool)  # (P*k,)
    metrics = {m: float(scores[m].mean()) for m in names}
    metrics.update({
        "tokens_per_problem_p90": float(np.quantile([r["tokens"] for r in records], 0.9)),
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
