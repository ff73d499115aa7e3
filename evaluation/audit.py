"""Audit of rewarded answers: a stratified sample for a human to read, and flags on the ways a reward gets gamed.

RL optimises whatever the reward pays for, including its holes. A rise in training reward can be a
policy that learned the task, or one that learned to copy numbers from the prompt, to emit one
template that often happens to be right, or to reach the verifier through a side rule that another
rule would reject. None of these shows in a reward curve; all show in the rewarded text. So
`audit_rollouts` reads every rollout of a run (rollouts.jsonl, rollout.RolloutRecord) and, over
the rewarded ones (verdict correct), counts each pattern of FLAGS, keeps a few examples of each,
and draws a stratified sample (by training phase, rollout age and response length) for a human to
read. `python report.py RUN_DIR` calls it: report.md gets "Audit of rewarded answers" and the
report folder audit.json. preflight.py uses the same answer-route helpers before training.

A flag is a reason to look, not a verdict: the tiny task has legitimate problems whose answer is in
the prompt ("What is 0+57?"), and a short answer can be right on many problems. The contrast
table (correct fraction where the ground truth appears in the prompt, and where it does not) tells
a copying policy (much higher where it can copy) from a data set that leaks answers.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import verifier

FLAGS = {  # name: what it means; every flag is counted over rewarded answers only
    "answer_in_prompt": "the rewarded answer appears as a number in the prompt: copied from it, or the data leaks the answer",
    "same_response": "the same response text (whitespace collapsed) was rewarded on two or more different problems",
    "boxed_only": "no 'Answer:' marker: the verifier took the last \\boxed{} instead (verifier.py deviation 7)",
    "several_markers": "two or more 'Answer:' markers (the dapo rule needs them all to state the same value)",
    "decorated_value": "the final 'Answer:' line holds more than the bare answer (markdown, LaTeX, units, words, "
                       "leading zeros, a period): the verifier peeled it",
    "disagrees_dapo": "the 'dapo' rule scores this rewarded answer wrong",
    "disagrees_dapo-official": "the official rule ('dapo-official', the paper's) scores this rewarded answer wrong",
    "disagrees_math": "the 'math' mode scores this rewarded answer wrong",
}
RECORD_FIELDS = ("step", "policy_version", "learner_version", "prompt_id", "prompt", "response", "ground_truth", "correct",
                 "pred", "verifier_reason", "verifier", "response_tokens", "truncated")  # what the audit reads of a record
N_PHASES = 4  # training phases of the stratified sample: equal ranges of steps
_MARKER = re.compile(r"answer[ \t]*[:\uff1a]", re.IGNORECASE | re.ASCII)  # ASCII letters only, as verifier.py
_LEADING = re.compile(r"[ \t\r\n*]*")


# --- the answer route: how a response's final answer reached the verifier -------------------------------


def final_text(response: str) -> str:
    """The part of a response the verifier reads: after the last "</think>" (verifier.py deviation 12)."""
    cut = response.rfind("</think>")
    return response[cut + len("</think>"):] if cut >= 0 else response


def answer_markers(response: str) -> int:
    """How many "Answer:" markers (ASCII letters, any case, ':' or full-width colon) the final text holds."""
    return len(_MARKER.findall(final_text(response)))


def route(response: str, pred: str | None) -> list[str]:
    """The route flags of one response whose extracted answer is `pred`: any of "boxed_only",
    "several_markers", "decorated_value" (FLAGS); [] for the plain route, one "Answer: <pred>" line."""
    text = final_text(response)
    marks = list(_MARKER.finditer(text))
    if not marks:
        return ["boxed_only"] if "\\boxed{" in text else []
    out = ["several_markers"] if len(marks) > 1 else []
    start = _LEADING.match(text, marks[-1].end()).end()
    value = text[start:].split("\n", 1)[0].strip()
    if pred is not None and value != pred:
        out.append("decorated_value")
    return out


def number_in(pred: str | None, text: str) -> bool:
    """Whether `pred` occurs in `text` as a whole number (not inside a longer number or a decimal)."""
    if not pred or not pred.strip():
        return False
    return re.search(r"(?<![0-9.])" + re.escape(pred.strip()) + r"(?![0-9]|\.[0-9])", text) is not None


def other_verdicts(response: str, ground_truth: str, own_mode: str) -> dict[str, verifier.Score | None]:
    """The verdict of every verifier mode other than `own_mode`; None where that mode cannot judge
    this ground truth ("dapo" needs an integer)."""
    out = {}
    for mode in verifier.MODES:
        if mode == own_mode:
            continue
        try:
            out[mode] = verifier.score(response, ground_truth, mode=mode)
        except ValueError:  # the ground truth is not of this mode's kind
            out[mode] = None
    return out


def clip(text: str, limit: int) -> str:
    """text, its middle cut past `limit` characters (the end is kept: the answer is there)."""
    return text if len(text) <= limit else text[: limit // 3] + " ... " + text[-(limit - limit // 3 - 5):]


def inline(text: str, limit: int = 240) -> str:
    """One line of text for a markdown table cell or list item, in a code span: newlines shown as
    ' / ', '|' escaped (GFM tables), '`' replaced, clipped to `limit` characters."""
    one = clip(text.replace("\r", ""), limit).replace("\n", " / ").replace("`", "'").replace("|", "\\|")
    return f"`{one}`"


# --- the audit of a run ---------------------------------------------------------------------------------


def iter_jsonl(path: str | Path):
    """(line number from 1, parsed object) for each non-blank line of a run's JSONL file
    (rollouts.jsonl, metrics.jsonl), read as a stream so a long run's records need not fit in memory.

    Raises:
        ValueError: a line is not JSON (named as path:line); a run killed mid-write leaves a partial
            last line, which the message says to delete.
    """
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no} is not JSON ({e.msg}); a crash mid-write leaves a partial last line: "
                                 "delete it") from e


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


def length_bucket(tokens: int, truncated: bool, budget: int) -> tuple[int, str]:
    """(sort key, label): four equal bins of the budget, as report.length_correctness, or "truncated"."""
    if truncated:
        return 4, f"truncated ({budget})"
    edges = [round(budget * q / 4) for q in range(5)]
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        if tokens < hi or i == 3:
            return i, f"[{lo}, {hi}{']' if i == 3 else ')'}"
    raise AssertionError("unreachable")


def _key(seed: int, r: dict) -> str:
    """A rollout's place in every deterministic sample: a hash of the seed and its identity."""
    return hashlib.sha256(f"{seed}|{r.get('run_id')}|{r.get('group_id')}|{r.get('sample_index')}".encode()).hexdigest()


def _example(r: dict, flags: list[str], age: int) -> dict:
    return {"step": r["step"], "age": age, "prompt_id": r["prompt_id"], "group_id": r.get("group_id"),
            "sample_index": r.get("sample_index"), "prompt": clip(r["prompt"], 300), "response": clip(r["response"], 600),
            "ground_truth": r["ground_truth"], "pred": r["pred"], "verifier_reason": r["verifier_reason"],
            "response_tokens": r["response_tokens"], "truncated": bool(r["truncated"]), "flags": flags}


def audit_rollouts(path: str | Path, *, budget: int, n_steps: int, per_stratum: int = 2, examples: int = 3,
                   seed: int = 0) -> dict:
    """Flags and a stratified sample over the rewarded rollouts of one rollouts.jsonl, read as a stream.

    Args:
        path: a run's rollouts.jsonl (fields of rollout.RolloutRecord).
        budget: the run's max_response_len in tokens (length buckets).
        n_steps: rollout steps of the run (the sample's training phases: N_PHASES equal step ranges).
        per_stratum: rewarded rollouts drawn from each (phase, age bucket, length bucket) stratum,
            of different problems.
        examples: examples kept per flag, of different problems.
        seed: the samples are the rollouts with the smallest hash of (seed, run id, group id, sample
            index): deterministic, and spread over the run.

    Returns:
        {"rollouts", "rewarded", "flags": {flag: {"count", "share" (of rewarded), "doc", "per_phase" (counts
         per training phase; None for same_response), "examples"}}, "phases", "rewarded_per_phase",
         "same_response_groups": [{"response", "problems", "rollouts"}], "leak": rows of the ground-truth-
         in-prompt contrast, "strata": [{"phase", "age", "length", "rewarded"}], "sample": [...], "modes"}.

    Raises:
        FileNotFoundError: no such file. ValueError: a line that is not JSON or lacks a field of
        RECORD_FIELDS (file and line named), or a negative rollout age (age_bucket).
    """
    path = Path(path)
    counts, kept = Counter(), {f: [] for f in FLAGS}  # kept: per flag, the `examples` rollouts with the smallest keys
    strata, leak = {}, {True: [0, 0], False: [0, 0]}  # strata: (phase, age, length) -> [count, kept]; leak: in -> [n, correct]
    same: dict[bytes, list] = {}  # response digest -> [problem ids (up to 20), rollouts, text, first record's key]
    n = rewarded = 0
    modes: set[str] = set()
    phase_len = max(1, -(-n_steps // N_PHASES))
    per_phase = {f: [0] * N_PHASES for f in ["rewarded", *FLAGS]}  # rewarded answers and each flag, per training phase
    for line_no, r in iter_jsonl(path):
        missing = [k for k in RECORD_FIELDS if k not in r] if isinstance(r, dict) else list(RECORD_FIELDS)
        if missing:
            raise ValueError(f"{path}:{line_no} is not a rollout record (rollout.RolloutRecord): no {', '.join(missing)}")
        n += 1
        has_leak = number_in(r["ground_truth"], r["prompt"])
        leak[has_leak][0] += 1
        leak[has_leak][1] += bool(r["correct"])
        if not r["correct"]:
            continue
        rewarded += 1
        key = _key(seed, r)
        age = int(r["learner_version"]) - int(r["policy_version"])
        flags = route(r["response"], r["pred"])
        if number_in(r["pred"], r["prompt"]):
            flags.append("answer_in_prompt")
        modes.add(r["verifier"])
        for mode, s in other_verdicts(r["response"], r["ground_truth"], r["verifier"]).items():
            if s is not None and not s.correct:
                flags.append(f"disagrees_{mode}")
        digest = hashlib.sha256(" ".join(r["response"].split()).encode()).digest()[:12]
        entry = same.setdefault(digest, [[], 0, clip(r["response"], 600), key])
        entry[1] += 1
        if r["prompt_id"] not in entry[0] and len(entry[0]) < 20:
            entry[0].append(r["prompt_id"])
        ex = {**_example(r, flags, age), "_digest": digest}
        phase = min(int(r["step"]) // phase_len, N_PHASES - 1)
        per_phase["rewarded"][phase] += 1
        for fl in flags:
            counts[fl] += 1
            per_phase[fl][phase] += 1
            _keep(kept[fl], key, ex, examples)
        stratum = (phase, age_bucket(age), length_bucket(int(r["response_tokens"]), bool(r["truncated"]), budget))
        cell = strata.setdefault(stratum, [0, []])
        cell[0] += 1
        _keep(cell[1], key, ex, per_stratum)
    # same_response: a second pass over the digests (every rollout of a response rewarded on >= 2 problems)
    groups = [e for e in same.values() if len(e[0]) >= 2]
    counts["same_response"] = sum(e[1] for e in groups)
    for ex in [ex for best in [*kept.values(), *(c[1] for c in strata.values())] for _, ex in best]:
        if "_digest" in ex and len(same[ex.pop("_digest")][0]) >= 2:  # an example may sit in several lists: once
            ex["flags"].append("same_response")
    groups.sort(key=lambda e: (-len(e[0]), -e[1], e[3]))
    flags_out = {f: {"count": counts[f], "share": counts[f] / rewarded if rewarded else 0.0, "doc": doc,
                     "per_phase": None if f == "same_response" else per_phase[f], "examples": [ex for _, ex in kept[f]]}
                 for f, doc in FLAGS.items() if not f.startswith("disagrees_") or f.split("_", 1)[1] not in modes}
    sample, rows = [], []
    for (phase, (_, age_label), (_, len_label)), (count, best) in sorted(strata.items()):
        label = phase_label(phase, phase_len, n_steps)
        rows.append({"phase": label, "age": age_label, "length": len_label, "rewarded": count})
        sample += [{"phase": label, "age_bucket": age_label, "length_bucket": len_label, **ex} for _, ex in best]
    return {"path": str(path), "rollouts": n, "rewarded": rewarded, "modes": sorted(modes), "flags": flags_out,
            "same_response_groups": [{"response": e[2], "problems": e[0], "rollouts": e[1]} for e in groups[:examples]],
            "leak": [{"ground_truth_in_prompt": k, "rollouts": v[0], "correct_frac": v[1] / v[0] if v[0] else None}
                     for k, v in ((True, leak[True]), (False, leak[False]))],
            "phases": [phase_label(p, phase_len, n_steps) for p in range(N_PHASES)], "rewarded_per_phase": per_phase["rewarded"],
            "strata": rows, "sample": sample, "per_stratum": per_stratum, "seed": seed}


def _keep(best: list, key: str, item: dict, k: int) -> None:
    """Keep in `best` (sorted (key, item) pairs) the k problems with the smallest keys, each by its
    rollout with the smallest key: a group's G identical answers show once, as one example."""
    for i, (held, other) in enumerate(best):
        if other["prompt_id"] == item["prompt_id"]:
            if key < held:
                best[i] = (key, item)
                best.sort(key=lambda t: t[0])
            return
    if k and (len(best) < k or key < best[-1][0]):
        bisect.insort(best, (key, item), key=lambda t: t[0])
        del best[k:]


def phase_label(phase: int, phase_len: int, n_steps: int) -> str:
    """"2/4 (steps 8-15)": the training phase of the stratified sample (N_PHASES equal step ranges)."""
    lo, hi = phase * phase_len, min((phase + 1) * phase_len, n_steps) - 1
    return f"{phase + 1}/{N_PHASES} (steps {lo}-{max(lo, hi)})"


def _cell(x) -> str:
    return "-" if x is None else str(x).replace("|", "\\|").replace("\n", " ")


def markdown(audits: list[dict | None], names: list[str]) -> str:
    """report.md's "Audit of rewarded answers" section, one subsection per run when there are two."""
    out = ["", "## Audit of rewarded answers", "",
           "Rewarded = scored correct. A flag is a reason to read the answer, not a verdict (evaluation/audit.py). Counts are over "
           "the whole run (rollouts.jsonl); examples and the sample are deterministic (smallest hash per stratum).", ""]
    for a, name in zip(audits, names):
        out += [f"### {name}", ""] if len(audits) > 1 else []
        if a is None:
            out += [f"{name}: no rollouts.jsonl, nothing to audit", ""]
            continue
        out += [f"{a['rewarded']} rewarded of {a['rollouts']} rollouts (verifier mode {', '.join(a['modes']) or '-'}).", "",
                "| flag | rewarded answers | share of rewarded | what it means |", "|---|---:|---:|---|"]
        out += [f"| {f} | {v['count']} | {v['share']:.3f} | {v['doc']} |" for f, v in a["flags"].items()]
        seen = [i for i, k in enumerate(a["rewarded_per_phase"]) if k]
        out += ["", "Share of each phase's rewarded answers (a pattern the policy is learning grows from phase to phase):", "",
                "| flag | " + " | ".join(a["phases"][i] for i in seen) + " |", "|---|" + "---:|" * len(seen),
                "| rewarded answers | " + " | ".join(str(a["rewarded_per_phase"][i]) for i in seen) + " |"]
        out += [f"| {f} | " + " | ".join(f"{v['per_phase'][i] / a['rewarded_per_phase'][i]:.3f}" for i in seen) + " |"
                for f, v in a["flags"].items() if v["per_phase"] is not None]
        out += ["", "Ground truth in the prompt (all rollouts): a policy that copies is right far more often where it can.", "",
                "| ground truth appears in the prompt | rollouts | correct frac |", "|---|---:|---:|"]
        out += [f"| {'yes' if r['ground_truth_in_prompt'] else 'no'} | {r['rollouts']} | "
                f"{'-' if r['correct_frac'] is None else format(r['correct_frac'], '.3f')} |" for r in a["leak"]]
        for f, v in a["flags"].items():
            if f == "same_response" and a["same_response_groups"]:
                out += ["", f"Examples of `{f}`:", ""]
                out += [f"- rewarded {g['rollouts']} times on {len(g['problems'])}{'+' if len(g['problems']) >= 20 else ''} "
                        f"problems ({', '.join(g['problems'][:5])}): {inline(g['response'])}" for g in a["same_response_groups"]]
            elif v["examples"]:
                out += ["", f"Examples of `{f}`:", ""]
                out += [f"- step {e['step']}, problem {_cell(e['prompt_id'])} (truth {_cell(e['ground_truth'])}, pred "
                        f"{_cell(e['pred'])}, {e['response_tokens']} tokens): prompt {inline(e['prompt'], 120)} response "
                        f"{inline(e['response'])}" for e in v["examples"]]
        out += ["", f"Stratified sample: {a['per_stratum']} per (training phase, rollout age, response length) stratum.", "",
                "| phase | age | length (tokens) | rewarded in stratum | problem | truth | pred | flags | response |",
                "|---|---|---|---:|---|---|---|---|---|"]
        size = {(r["phase"], r["age"], r["length"]): r["rewarded"] for r in a["strata"]}
        for e in a["sample"]:
            cell = (e["phase"], e["age_bucket"], e["length_bucket"])
            out.append(f"| {' | '.join(cell)} | {size[cell]} | {_cell(e['prompt_id'])} | {_cell(e['ground_truth'])} | "
                       f"{_cell(e['pred'])} | {' '.join(e['flags']) or '-'} | {inline(e['response'])} |")
        out += [""]
    return "\n".join(out)


def audit_run(run: dict, **kw) -> dict | None:
    """`audit_rollouts` on a run loaded by report.load_run (None without rollouts.jsonl): the budget
    from its config (else the longest rollout), the steps from its metrics."""
    path = Path(run["dir"]) / "rollouts.jsonl"
    if not path.is_file():
        return None
    budget = int((run["cfg"] or {}).get("max_response_len") or max((x["response_tokens"] for x in run["rollouts"] or []),
                                                                    default=1))
    n_steps = max([int(m.get("step", i)) for i, m in enumerate(run["metrics"])], default=0) + 1
    return audit_rollouts(path, budget=budget, n_steps=n_steps, **kw)
