"""The symptom metrics of bench/symptoms.py's pairs: what each boundary's failure looks like in a finished run.

Each sym_* reads one finished train.py run: {"dir", "metrics" (metrics.jsonl rows), "rollouts" (rollouts.jsonl,
every field), "cfg", "evals" ({name: eval.py report.json})} and returns (value, steps, per-step values, extras).
value is what a pair's difference broken - repaired is computed on; the per-step series is what symptom.png
overlays. SYMPTOMS maps a metric's name to its function, what its value means, and the direction expected of
the broken arm. The detectors (repeated_line, on_track, repetitive, ...) read the tiny task's worked answers.
"""

from __future__ import annotations

import re
import statistics
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from evaluation import diagnosis  # noqa: E402  (long_wrong_fracs: report.py's own reading of long wrong answers)
from plumbing import policy  # noqa: E402  (load_tokenizer: the repository's own, as the trainer loads it)
from tasks import tiny  # noqa: E402  (column_solution: the reference worked answer)

_LOAD_LOCK = threading.Lock()


LAST = 5  # rollout steps averaged for the end-of-run values (report.py's DIAG_WINDOW)


def _col(metrics: list[dict], key: str) -> list:
    return [m.get(key) for m in metrics]


def _tail_mean(values: list, n: int = LAST) -> float | None:
    vals = [v for v in values[-n:] if v is not None]
    return statistics.fmean(vals) if vals else None


def _by_step(rollouts: list[dict], pick, agg) -> tuple[list[int], list]:
    """(steps, agg(rollouts of that step selected by pick)) for every step with rollouts."""
    steps = sorted({r["step"] for r in rollouts})
    return steps, [agg([r for r in rollouts if r["step"] == s and pick(r)]) for s in steps]


def _share(rs: list[dict], pred) -> float | None:
    return sum(1 for r in rs if pred(r)) / len(rs) if rs else None


def repeated_line(text: str) -> bool:
    """A response that writes one of its non-empty lines twice (a loop): the repetitive answers of paper 3.3."""
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    return len(lines) != len(set(lines))


def reference_solution(prompt: str) -> str | None:
    """The tiny task's worked answer to a rollout's prompt ("What is a+b?"), or None for another task."""
    m = re.search(r"What is ([0-9]+)\+([0-9]+)\?", prompt)
    return tiny.column_solution(int(m.group(1)), int(m.group(2))) if m else None


def collapse_repeats(text: str) -> str:
    """The text with every line that repeats the line before it dropped ("a\na\nb" -> "a\nb"); a cut last line is kept."""
    out: list[str] = []
    for line in text.split("\n"):
        if not out or line != out[-1]:
            out.append(line)
    return "\n".join(out)


def on_track(r: dict) -> bool:
    """A truncated tiny rollout that is so far the right worked answer, up to repeated lines: a larger budget
    would have let it finish right (if it stops looping)."""
    ref = reference_solution(r["prompt"])
    return bool(r["truncated"]) and ref is not None and ref.startswith(collapse_repeats(r["response"]))


def sym_entropy(run: dict):
    """exploration: policy/entropy (nats per response token, before the update), mean of the last steps."""
    ms = run["metrics"]
    ent = _col(ms, "policy/entropy")
    extras = {"entropy_first": _tail_mean(ent[:LAST], LAST), "clipfrac_high_mean": mean_or_none(_col(ms, "policy/clipfrac_high")),
              "clipfrac_low_mean": mean_or_none(_col(ms, "policy/clipfrac_low"))}
    cfg = run["cfg"] or {}
    if cfg.get("model") and Path(cfg["model"]).is_dir():  # the base that sampled step 0
        extras["clip_room"] = clip_room(Path(cfg["model"]), run["rollouts"], cfg.get("temperature", 1.0))
    return _tail_mean(ent), [m["step"] for m in ms], ent, extras


def clip_room(model_dir: Path, rollouts: list[dict], temperature: float, eps_high: tuple = (0.2, 0.28)) -> dict:
    """Where Clip-Higher can act: the response tokens of step 0's trained rollouts with a positive advantage, scored
    by the policy that sampled them (the base, at the run's temperature).

    The upper bound clips a token with A > 0 once pi / pi_old > 1 + eps_high, so a token with pi_old above
    1 / (1 + eps_high) can never reach it (pi <= 1): raising eps_high from 0.2 to 0.28 only frees tokens below
    1/1.2 = 0.83, and it matters most for the low-probability ones the paper calls exploration tokens (paper 3.1:
    with eps 0.2 a token at 0.01 can rise to 0.012, one at 0.9 to 1.0). Returns the share of those tokens below
    1 / (1 + eps) for each eps, below 0.5 and below 0.1, their count, the mean probability, and how many rollouts
    were skipped because their text does not tokenize back to the logged token counts ({} without a positive-advantage
    rollout at step 0). Probabilities in [0, 1], from forward.sequence_logprobs (the trainer's pass, float32).

    Raises FileNotFoundError / ValueError as policy.load_policy (no model directory, a head that should be tied is not)."""
    import torch

    from plumbing import forward

    pos = [r for r in rollouts if r["step"] == 0 and r["kept"] and (r["advantage"] or 0.0) > 0]
    if not pos:
        return {}
    probs, skipped = [], 0
    with _LOAD_LOCK:  # runs of a pair are read side by side (bench/symptoms.py --jobs): one load at a time
        # The trainer's own loader (it checks that a tied head is tied: SmolLM2's is; a plain from_pretrained in two
        # threads at once once left one run's head freshly initialized) and the trainer's log-prob pass.
        model, tok = policy.load_policy(str(model_dir), torch.device("cpu"))
        for r in pos:
            p = tok(r["prompt"], add_special_tokens=False)["input_ids"]
            q = tok(r["response"], add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if r["finish_reason"] == "stop" else [])
            if (len(p), len(q)) != (r["prompt_tokens"], r["response_tokens"]):  # the text does not give back its tokens
                skipped += 1
                continue
            probs += forward.sequence_logprobs(model, p, q, temperature=temperature).double().exp().tolist()
    n = len(probs)
    if not n:
        return {"skipped_rollouts": skipped}
    out = {f"below_1/(1+{e})": sum(x < 1 / (1 + e) for x in probs) / n for e in eps_high}
    return out | {"below_0.5": sum(x < 0.5 for x in probs) / n, "below_0.1": sum(x < 0.1 for x in probs) / n,
                  "tokens": n, "mean_prob": statistics.fmean(probs), "skipped_rollouts": skipped}


def sym_zero_adv(run: dict):
    """contrast: share of the trained responses whose advantage is 0 (a group all right or all wrong), per step."""
    trained = [r for r in run["rollouts"] if r["kept"]]
    steps, share = _by_step(trained, lambda r: True, lambda rs: _share(rs, lambda r: abs(r["advantage"] or 0.0) < 1e-6))
    n_opt = sum(m.get("policy/optimizer_steps", 0) for m in run["metrics"])
    effective = sum(1 for r in trained if abs(r["advantage"] or 0.0) >= 1e-6)
    extras = {"effective_per_optimizer_step": effective / max(n_opt, 1), "optimizer_steps": n_opt}
    return mean_or_none(share), steps, share, extras


def repetitive(r: dict) -> bool:
    """A rollout that writes more than its problem needs by repeating itself. On the tiny task: more working lines than
    the problem has columns (its reference's lines; a loop is the only way the bases here write more), so two equal
    columns ("11+11") are no loop; elsewhere: a line written twice (repeated_line)."""
    ref = reference_solution(r["prompt"])
    if ref is None:
        return repeated_line(r["response"])
    work = [ln for ln in r["response"].split("\n") if ln.strip() and not ln.startswith("Answer")]
    return len(work) > ref.count("\n")


def sym_long_wrong(run: dict):
    """credit: share of the wrong training answers that loop (`repetitive`), per step; mean of the last steps."""
    steps, share = _by_step(run["rollouts"], lambda r: not r["correct"], lambda rs: _share(rs, repetitive))
    ms = run["metrics"]
    extras = {"wrong_len_last": _tail_mean(_col(ms, "length/wrong_mean")), "correct_len_last": _tail_mean(_col(ms, "length/correct_mean")),
              "repetitive_share_all_last": _tail_mean(_by_step(run["rollouts"], lambda r: True, lambda rs: _share(rs, repetitive))[1]),
              "repetitive_share_correct_last": _tail_mean(_by_step(run["rollouts"], lambda r: bool(r["correct"]),
                                                                   lambda rs: _share(rs, repetitive))[1])}
    return _tail_mean(share), steps, share, extras


def sym_long_wrong_share(run: dict):
    """credit: per step, the share of the wrong answers in groups with a right one that are at least
    diagnosis.LONG_WRONG_RATIO times as long as their group's longest right answer (report.py's
    length/long_wrong_frac: under the sample-level mean each token of such an answer weighs at most 1/LONG_WRONG_RATIO
    as much as a token of that right answer); value: the mean over every step, the window report.py's check reads.
    Extras: sym_long_wrong's (the looping share of wrong answers as repetitive_wrong_last, and the lengths).
    Shares in [0, 1]; value None when no step has a wrong answer beside a right one. Source: paper section 3.3 (a
    sample-level loss under-penalises long low-quality answers). Raises KeyError for a rollout record without step,
    group_id, correct or response_tokens (rollouts.jsonl has them all)."""
    fracs = diagnosis.long_wrong_fracs(run["rollouts"])
    steps = sorted(fracs)
    share = [fracs[s] for s in steps]
    looping, _, _, extras = sym_long_wrong(run)
    return mean_or_none(share), steps, share, {"repetitive_wrong_last": looping} | extras


def sym_budget(run: dict):
    """budget: share of the training rollouts truncated while still right so far (tiny: a prefix of the
    reference worked answer), per step; the value is its mean over the last steps.

    These are the answers a larger budget would have let finish right, which truncation scored as wrong
    punishes. Extras: the held-out view of the final policy (budget_completion: of its samples truncated
    at the training budget, the share right at the larger one, same samples), the direct (unreasoned,
    'Answer: N' alone) share of the last steps, truncation and length."""
    steps, share = _by_step(run["rollouts"], lambda r: True, lambda rs: _share(rs, on_track))
    ev = run["evals"]
    extras = budget_completion(ev["eval"], ev["eval-long"]) if "eval" in ev and "eval-long" in ev else {}
    if "eval-long" in ev:
        extras["heldout_avg_at_long_budget"] = ev["eval-long"]["metrics"][next(k for k in ev["eval-long"]["metrics"] if k.startswith("avg@"))]
    ms = run["metrics"]
    direct = _by_step(run["rollouts"], lambda r: True, lambda rs: _share(rs, lambda r: "\n" not in r["response"].strip()))[1]
    extras |= {"truncated_last": _tail_mean(_col(ms, "length/truncated_frac")), "length_last": _tail_mean(_col(ms, "length/mean")),
               "direct_share_first": _tail_mean(direct[:LAST]), "direct_share_last": _tail_mean(direct)}
    return _tail_mean(share), steps, share, extras


def budget_completion(short: dict, long: dict) -> dict:
    """Of the held-out samples truncated at the training budget, the share right at the larger budget.

    short, long: eval.py report.json of one policy on the same problems, k and seed at two budgets (the
    streams are per sample, so a sample's first tokens agree: a truncated one is continued, not redrawn).
    """
    pairs = [(t, c_long, c) for a, b in zip(short["per_problem"], long["per_problem"])
             for t, c, c_long in zip(a["truncated"], a["correct"], b["correct"])]
    trunc = [p for p in pairs if p[0]]
    return {"truncated_heldout": len(trunc) / len(pairs), "truncated_right_at_long": (sum(p[1] for p in trunc) / len(trunc)
                                                                                      if trunc else None),
            "long_minus_short": (sum(p[1] for p in pairs) - sum(p[2] for p in pairs)) / len(pairs)}


def mean_or_none(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


SYMPTOMS = {  # metric name: (function, what the value is, direction: +1 if the broken arm should be higher)
    "entropy_last": (sym_entropy, "policy/entropy, mean of the last 5 steps (nats/token)", -1),
    "zero_adv_share": (sym_zero_adv, "share of trained responses with advantage 0, mean over steps", +1),
    "repetitive_wrong_last": (sym_long_wrong, "share of wrong training answers that loop, last 5 steps", +1),
    "long_wrong_share": (sym_long_wrong_share, f"share of wrong answers >= {diagnosis.LONG_WRONG_RATIO}x their group's "
                         "longest right one, mean over steps", +1),
    "on_track_truncated_last": (sym_budget, "share of training rollouts truncated while right so far, last 5 steps", -1),
}
