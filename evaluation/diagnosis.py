"""Which of DAPO's four boundaries a training run crossed, from its metrics.jsonl, and the switch for it.

    from evaluation.diagnosis import diagnose
    findings = diagnose(metrics, cfg)   # [] = healthy; else one Finding per boundary that failed

report.py prints these findings in report.md and writes them to diagnosis.json; this module holds
only the checks, their thresholds (module constants, each with the reason and the runs it was set
from) and the switch that addresses each boundary. Pure functions of a history: no files, no plots.
bench/symptoms.py runs each boundary broken and repaired and checks that the right check fires on
the broken run and not on the repaired one (docs/results.md "The four boundaries, seen"; the
histories of those runs are tests/fixtures/symptoms/, tested in tests/test_report.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# --- the four boundaries ------------------------------------------------------------------------------
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
# Sharpening is not collapse. A policy that learns concentrates on the answers it found: its entropy falls while the
# share of groups with a right answer (1 - groups/all_wrong_frac, over every generated group) keeps rising. Collapse
# (paper 3.1, Fig. 2) is the fall that stops that: the samples become near copies of the mode and problems it has not
# solved stay unsolved. So the relative floor fires only if that share did not rise between the first and the last
# window (by more than SOLVED_RISE_MIN); the absolute floor fires regardless. Until bench/symptoms.py's pairs were
# measured (docs/results.md "The four boundaries, seen") the relative floor alone decided: on the base that sometimes
# loops (0.17 nats/token at step 0; RL removes the loop, which is most of that entropy) every run of the exploration,
# credit and budget pairs, both arms, kept 24-36% of its first window's entropy, so the verdict was set by which side
# of 30% a seed fell (5 of the 6 credit runs were named "exploration, critical"), while the share of groups with a
# right answer rose (credit: +0.02 to +0.24) and held-out pass@16 rose above the base's (0.883 -> 0.898-0.977).
SOLVED_RISE_MIN = 0.0
# contrast (paper 3.2, Fig. 3b: the share of all-correct groups rises during training)
# Dynamic sampling off (or unknown): every generated group is trained on, so the uniform share is the share of the
# batch with advantage 0. Above one half, most of the batch carries no gradient (paper 3.2: the effective number of
# informative prompts shrinks). It was 0.8 until the pairs of bench/symptoms.py were measured
# (docs/results.md "The four boundaries, seen"): in the pilot of its contrast pair the broken run's share was 0.62-1.0 per step and 0.84
# over its last 5 steps, so 0.8 sat inside the seed-to-seed spread, while a half-uniform batch already trains on half.
# With dynamic sampling on, uniform groups never reach the update: their cost is what KEPT_FRAC_MIN reads.
UNIFORM_GROUPS_MAX = 0.5
KEPT_FRAC_MIN = 0.2  # with dynamic sampling, below this each trained group costs > 5 generated groups (tiny default: ~0.33)
BUDGET_STEPS_FRAC = 0.5  # the round budget counts as binding when at least half the window's steps used every round (of > 1)
# A step whose round budget ran out (groups/exhausted) trains on fewer groups than --prompts_per_step. That loses the
# boundary only when the batch is mostly missing: fewer than this share of the wanted groups (groups/kept). Until the
# SmolLM2 contrast pair ran with --max_gen_rounds 3 (docs/results.md "The four boundaries, seen") any short step in the
# window counted, and a binding round budget was a finding on its own: the repaired arm of seed 0, which trained on
# 8-9 mixed groups of the 12 wanted in each of its last 5 steps (all 3 rounds used, most of the rest all right) and
# gained on held-out, was named "critical" beside the arm that trained on all-wrong groups. A mostly
# full batch after every round is a cost (samples per trained group, KEPT_FRAC_MIN), not a lost contrast.
SHORT_BATCH_MIN = 0.5
# credit (paper 3.3: under the sample-level mean, tokens of long answers weigh less, so long
# repetitive wrong answers are under-penalised and length grows)
WRONG_CORRECT_LEN_RATIO = 1.5  # wrong answers 50% longer than correct ones (tiny default: 1.1); truncation explains it: reward check
LENGTH_GROWTH_MIN = 1.2  # mean length grew by > 20% between the first and the last window
# Long wrong answers beside right ones, from rollouts.jsonl (`long_wrong_fracs`, logged per step as
# length/long_wrong_frac by report.py): a wrong answer at least LONG_WRONG_RATIO times as long as the longest right
# answer of its group gets, under the sample-level mean, at most 1/LONG_WRONG_RATIO of the penalty per token that
# token-mean would give its tokens. The length checks above need wrong answers 1.5x longer on average and growing;
# bench/symptoms.py's credit pair (a base that sometimes loops, docs/results.md "The four boundaries, seen") showed
# the symptom without either: under seq-mean-token-mean loops stayed among the wrong answers (0.09-0.12 of them in the
# last 5 steps, against 0.05-0.07 under token-mean) while wrong answers were 1.09-1.12x as long as right ones on
# average and length fell. Its broken runs had 0.14-0.16 of wrong answers 1.2x longer over the run; runs of the
# shipped base, which never writes more lines than a problem needs, have about none.
LONG_WRONG_RATIO = 1.2
LONG_WRONG_FRAC_MAX = 0.1  # more than 1 wrong answer in 10 that long, mean over the run's steps
# reward (paper 3.4: a truncated answer gets the wrong-answer reward without being wrong)
TRUNCATED_FRAC_MAX = 0.1  # more than 1 rollout in 10 hits the token budget: the budget, not the answer, sets rewards
TRUNCATED_WRONG_FRAC_MAX = 0.5  # most "wrong" answers are really "ran out of budget"
# With --overlong_filter on, truncated answers leave the loss (dapo.overlong_filter): no reward scores them as wrong,
# which is this boundary holding, however many there are. Until bench/symptoms.py's budget pair this check warned
# on any run with more than TRUNCATED_FRAC_MAX truncated, filtered or not, so it named the boundary on the repaired
# arm too. A filtered run is flagged only when the filter takes most of the batch out of the loss: then the policy
# learns from too little of what it writes, and the budget itself is too small.
TRUNCATED_FILTERED_MAX = 0.5
VERIFIER_EXCEPTION_FRAC_MAX = 0.01  # verifier timeouts / parse errors above 1% of verdicts: the reward itself is unreliable

THRESHOLDS = [  # (boundary, constant, value, when it fires) for report.md; values read from the constants above
    ("all", "DIAG_WINDOW", DIAG_WINDOW, "steps averaged at each end of the history"),
    ("all", "MIN_TREND_STEPS", MIN_TREND_STEPS, "logged steps needed before trend checks run"),
    ("exploration", "ENTROPY_REL_FLOOR", ENTROPY_REL_FLOOR, "policy/entropy (last window) < this x first window"),
    ("exploration", "ENTROPY_ABS_FLOOR", ENTROPY_ABS_FLOOR, "or policy/entropy (last window) < this, nats/token"),
    ("exploration", "SOLVED_RISE_MIN", SOLVED_RISE_MIN,
     "the relative floor only if 1 - groups/all_wrong_frac rose by no more than this (else: sharpening)"),
    ("exploration", "CLIPFRAC_HIGH_IDLE", CLIPFRAC_HIGH_IDLE, "policy/clipfrac_high below this (or eps_high <= eps_low): critical"),
    ("contrast", "UNIFORM_GROUPS_MAX", UNIFORM_GROUPS_MAX,
     "groups/all_correct_frac + groups/all_wrong_frac above this (dynamic sampling off or unknown)"),
    ("contrast", "KEPT_FRAC_MIN", KEPT_FRAC_MIN, "or groups/kept_frac below this (dynamic sampling on)"),
    ("contrast", "SHORT_BATCH_MIN", SHORT_BATCH_MIN,
     "or a step with groups/exhausted trained fewer than this x --prompts_per_step groups (groups/kept): critical"),
    ("contrast", "BUDGET_STEPS_FRAC", BUDGET_STEPS_FRAC,
     "with such a short batch, named when this share of steps ran groups/gen_rounds = max_gen_rounds (> 1)"),
    ("credit", "WRONG_CORRECT_LEN_RATIO", WRONG_CORRECT_LEN_RATIO, "length/wrong_mean / length/correct_mean above this"),
    ("credit", "LENGTH_GROWTH_MIN", LENGTH_GROWTH_MIN,
     "and length/mean grew by this factor; only under seq-mean-token-mean (or unknown)"),
    ("credit", "LONG_WRONG_RATIO", LONG_WRONG_RATIO, "a wrong answer this many times as long as its group's longest right one"),
    ("credit", "LONG_WRONG_FRAC_MAX", LONG_WRONG_FRAC_MAX,
     "or length/long_wrong_frac (the share of such wrong answers, mean over the steps) above this; same aggregations"),
    ("reward", "TRUNCATED_FRAC_MAX", TRUNCATED_FRAC_MAX, "length/truncated_frac above this"),
    ("reward", "TRUNCATED_WRONG_FRAC_MAX", TRUNCATED_WRONG_FRAC_MAX, "or length/truncated_frac_wrong above this"),
    ("reward", "TRUNCATED_FILTERED_MAX", TRUNCATED_FILTERED_MAX,
     "with --overlong_filter on, only length/truncated_frac above this (the filter drops most of the batch)"),
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


def column(rows: list[dict], key: str) -> np.ndarray:
    """(len(rows),) float64 values of `key`; NaN where a row lacks it (skipped steps, older runs)."""
    return np.array([float(r[key]) if r.get(key) is not None else np.nan for r in rows], dtype=float)


def _nanmean(x: np.ndarray) -> float:
    """Mean over finite entries; NaN when there are none (no warning)."""
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def _ev(rows: list[dict], key: str) -> Evidence:
    vals = column(rows, key)
    return Evidence(key, tuple(int(r.get("step", i)) for i, r in enumerate(rows)), tuple(round(float(v), 6) for v in vals))


def _check_exploration(metrics: list[dict], cfg: dict) -> list[Finding]:
    if len(metrics) < MIN_TREND_STEPS:
        return []
    w = min(DIAG_WINDOW, len(metrics) // 2)
    first, last = metrics[:w], metrics[-w:]
    e0, e1 = _nanmean(column(first, "policy/entropy")), _nanmean(column(last, "policy/entropy"))
    if not (np.isfinite(e0) and np.isfinite(e1)) or not (e1 < ENTROPY_REL_FLOOR * e0 or e1 < ENTROPY_ABS_FLOOR):
        return []
    s0, s1 = 1 - _nanmean(column(first, "groups/all_wrong_frac")), 1 - _nanmean(column(last, "groups/all_wrong_frac"))
    if e1 >= ENTROPY_ABS_FLOOR and np.isfinite(s0) and np.isfinite(s1) and s1 > s0 + SOLVED_RISE_MIN:
        return []  # sharpening onto answers it finds on ever more problems, not collapse (see SOLVED_RISE_MIN)
    ch = _nanmean(column(last, "policy/clipfrac_high"))
    clip_off = "eps_high" in cfg and cfg["eps_high"] <= cfg.get("eps_low", 0.2)
    idle = np.isfinite(ch) and ch < CLIPFRAC_HIGH_IDLE
    msg = f"policy entropy fell from {e0:.3g} to {e1:.3g} nats/token ({e1 / max(e0, 1e-12):.0%} of its first {w} steps)"
    if np.isfinite(s0) and np.isfinite(s1):
        msg += f" while the share of groups with a right answer went {s0:.2f} -> {s1:.2f}"
    if clip_off:
        msg += f"; Clip-Higher is off (eps_high {cfg['eps_high']} <= eps_low {cfg.get('eps_low')}): rare tokens cannot grow"
    if idle:
        msg += f"; the upper clip never binds (clipfrac_high {ch:.2g} < {CLIPFRAC_HIGH_IDLE}): updates only sharpen likely tokens"
    if not (clip_off or idle):
        msg += "; Clip-Higher is on and acting, yet entropy still collapsed: raise --eps_high or lower --lr"
    evidence = (_ev(first, "policy/entropy"), _ev(last, "policy/entropy"), _ev(last, "policy/clipfrac_high"))
    if np.isfinite(s0) and np.isfinite(s1):
        evidence += (_ev(first, "groups/all_wrong_frac"), _ev(last, "groups/all_wrong_frac"))
    return [Finding("exploration", "critical" if clip_off or idle else "warning", msg, SWITCHES["exploration"], evidence)]


def _check_contrast(metrics: list[dict], cfg: dict) -> list[Finding]:
    last = metrics[-DIAG_WINDOW:]
    uniform = _nanmean(column(last, "groups/all_correct_frac") + column(last, "groups/all_wrong_frac"))
    kept = _nanmean(column(last, "groups/kept_frac"))
    short = column(last, "groups/exhausted") > 0  # (steps,) the round budget ran out
    wanted, got = cfg.get("prompts_per_step"), column(last, "groups/kept")
    if wanted and np.isfinite(got).all():  # short by more than SHORT_BATCH_MIN; unknown sizes: every short step counts
        short &= got < SHORT_BATCH_MIN * wanted
    exhausted = int(short.sum())
    ds = cfg.get("dynamic_sampling")  # None: unknown (no config.json)
    rounds, max_rounds = column(last, "groups/gen_rounds"), cfg.get("max_gen_rounds")
    # With one round there is no resampling: every step "uses all its rounds", full batch or not (a short one is what
    # groups/exhausted says). Until --preset smollm2-arith (max_gen_rounds 1) was run in bench/symptoms.py this fired
    # on every step of any one-round run.
    at_budget = float(np.mean(rounds >= max_rounds)) if max_rounds and max_rounds > 1 and ds is not False else 0.0
    why, critical = [], False
    if ds is not True and uniform > UNIFORM_GROUPS_MAX:  # with dynamic sampling they are filtered out, never trained
        # "Zero advantage" only without the soft overlong punishment: with it, a group all right or all wrong still has
        # reward differences from length (on SmolLM2's contrast pair 22-24% of such responses had an advantage on
        # 2026-12-07, 17-23% on 2026-12-03).
        length_only = " (the soft overlong punishment still gives them an advantage, from length alone)" if cfg.get(
            "overlong_penalty") else " (zero advantage)"
        why.append(f"{uniform:.0%} of generated groups are all-correct or all-wrong"
                   + (f": they are trained on, with no gradient toward right answers{length_only}" if ds is False
                      else " (no contrast in correctness)"))
        critical |= ds is False  # they are trained on: the effective batch is that much smaller
    if ds is not False and kept < KEPT_FRAC_MIN:
        why.append(f"only {kept:.0%} of generated groups are kept: each trained group costs {1 / max(kept, 1e-9):.1f} generated")
    if exhausted:
        why.append((f"{at_budget:.0%} of the last {len(last)} steps used all {max_rounds} generation rounds; "
                    if at_budget >= BUDGET_STEPS_FRAC else "") + f"the round budget ran out in {exhausted} of the last "
                   f"{len(last)} steps: the batch was short" + (f" (under {SHORT_BATCH_MIN:.0%} of the {wanted} groups wanted)"
                                                                if wanted and np.isfinite(got).all() else ""))
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
    wrong, right = _nanmean(column(last, "length/wrong_mean")), _nanmean(column(last, "length/correct_mean"))
    growth = _nanmean(column(last, "length/mean")) / _nanmean(column(first, "length/mean"))
    trunc_wrong = _nanmean(column(last, "length/truncated_frac_wrong"))
    long_wrong = _nanmean(column(metrics, "length/long_wrong_frac"))  # NaN without rollouts.jsonl
    # Wrong answers that are long because the budget cut them are the reward boundary's business.
    if trunc_wrong > TRUNCATED_WRONG_FRAC_MAX:
        return []
    why, evidence = [], []
    if wrong / right > WRONG_CORRECT_LEN_RATIO and growth > LENGTH_GROWTH_MIN:
        why.append(f"wrong answers are {wrong / right:.1f}x as long as correct ones ({wrong:.0f} vs {right:.0f} tokens) and "
                   f"mean length grew {growth:.2f}x")
        evidence += [_ev(last, "length/wrong_mean"), _ev(last, "length/correct_mean"), _ev(first, "length/mean"),
                     _ev(last, "length/mean")]
    if long_wrong > LONG_WRONG_FRAC_MAX:
        why.append(f"{long_wrong:.0%} of wrong answers beside a right one are at least {LONG_WRONG_RATIO}x as long as their "
                   f"group's longest right answer (mean over {len(metrics)} steps)")
        evidence.append(_ev(metrics, "length/long_wrong_frac"))
    if not why:
        return []
    msg = "; ".join(why) + ", under " + ("the sample-level mean (seq-mean-token-mean): each token of a long wrong answer is "
                                          "under-penalised" if agg else "an unknown loss aggregation (no config.json)")
    return [Finding("credit", "critical" if agg else "warning", msg, SWITCHES["credit"], tuple(evidence))]


def long_wrong_fracs(rollouts: list[dict]) -> dict[int, float]:
    """Per step, the share of wrong answers at least LONG_WRONG_RATIO x as long as the longest right answer of their
    group, over the groups with a right answer (steps without such a wrong answer are left out).

    rollouts: rollouts.jsonl records with step, group_id, correct, response_tokens (report.load_run)."""
    groups: dict[tuple, list] = {}
    for r in rollouts:
        groups.setdefault((r["step"], r["group_id"]), []).append(r)
    counts: dict[int, list] = {}
    for (step, _), rs in groups.items():
        right = [r["response_tokens"] for r in rs if r["correct"]]
        if right:
            c = counts.setdefault(step, [0, 0])
            for r in rs:
                if not r["correct"]:
                    c[0] += r["response_tokens"] >= LONG_WRONG_RATIO * max(right)
                    c[1] += 1
    return {s: n / d for s, (n, d) in sorted(counts.items()) if d}


def with_rollout_metrics(metrics: list[dict], rollouts: list[dict] | None) -> list[dict]:
    """The history with length/long_wrong_frac added from rollouts.jsonl where a step does not log it (new dicts)."""
    if not rollouts or any(r.get("group_id") is None for r in rollouts[:1]):
        return metrics
    fr = long_wrong_fracs(rollouts)
    return [m if "length/long_wrong_frac" in m or m.get("step") not in fr else {**m, "length/long_wrong_frac": fr[m["step"]]}
            for m in metrics]


def _check_reward(metrics: list[dict], cfg: dict) -> list[Finding]:
    last = metrics[-DIAG_WINDOW:]
    out = []
    trunc, trunc_wrong = _nanmean(column(last, "length/truncated_frac")), _nanmean(column(last, "length/truncated_frac_wrong"))
    if cfg.get("overlong_filter"):  # truncated answers are masked, not scored as wrong: the boundary holds
        if trunc > TRUNCATED_FILTERED_MAX:
            out.append(Finding("reward", "warning", f"{trunc:.0%} of rollouts hit the {cfg.get('max_response_len', '?')}-token "
                               "budget and --overlong_filter takes them out of the loss: most of the batch teaches nothing, "
                               "the budget itself is too small: raise --max_response_len", SWITCHES["reward"],
                               (_ev(last, "length/truncated_frac"),)))
    elif trunc > TRUNCATED_FRAC_MAX or trunc_wrong > TRUNCATED_WRONG_FRAC_MAX:
        msg = (f"{trunc:.0%} of rollouts hit the {cfg.get('max_response_len', '?')}-token budget and {trunc_wrong:.0%} of wrong "
               "answers are truncated: the reward mostly says 'ran out of budget', not 'wrong'")
        if "overlong_penalty" not in cfg:
            severity, msg = "warning", msg + " (no config.json: whether overlong shaping was on is unknown)"
        elif cfg["overlong_penalty"]:  # graded below the limit, yet a truncated answer still scores as wrong (-1 - factor)
            severity, msg = "warning", msg + ("; the soft punishment is on but truncated answers are still scored as wrong: "
                                              "raise --max_response_len, or turn on --overlong_filter")
        else:
            severity, msg = "critical", msg + ("; truncated answers get the plain wrong-answer reward (a cliff): turn on "
                                               "--overlong_penalty (or --overlong_filter), or raise --max_response_len")
        out.append(Finding("reward", severity, msg, SWITCHES["reward"],
                           (_ev(last, "length/truncated_frac"), _ev(last, "length/truncated_frac_wrong"))))
    reasons = [k for k in {k for r in last for k in r} if k.startswith("verifier/") and k != "verifier/exceptions"]
    verdicts = sum(float(np.nansum(column(last, k))) for k in reasons)
    exc = float(np.nansum(column(last, "verifier/exceptions")))
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
        metrics: metrics.jsonl of a run, one dict per rollout step in step order (docs/metrics.md);
            missing keys (older runs, skipped steps) are ignored, not read as zeros. A step may also carry
            length/long_wrong_frac, which report.py derives from rollouts.jsonl (`with_rollout_metrics`).
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


