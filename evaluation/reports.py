"""An evaluation report on disk (report.json, report.md), and the paper's protocol it is compared with.

`python eval.py --out DIR` writes both files; `eval.py compare` and `eval.py frontier` read them back.
"""

from __future__ import annotations

import json
from pathlib import Path

from evaluation import paraphrase

SHOWN_RESPONSES = 20  # problems whose first response report.md shows

# The published evaluation (paper section 4.1: AIME 2024, avg@32, temperature 1.0, top_p 0.7, 20480-token
# responses, scored by the official rule), for the report's "differs from the paper" list.
PAPER_PROTOCOL = {"n_problems": 30, "k": 32, "temperature": 1.0, "top_p": 0.7, "max_new_tokens": 20480,
                  "verifier": "dapo-official"}
# AIME 2024 as the paper evaluated it: task.file_hash (sha256[:16]) of the official DAPO file
# (eval/aime-2024.parquet of github.com/BytedTsinghua-SIA/DAPO) and of its 30-row JSONL copy, both in tests/fixtures.
PAPER_DATASET_HASHES = {"12154e38a716d12d": "aime2024_dapo_eval.parquet", "2cf5f0b3e4265b88": "aime2024.jsonl"}


def paper_deviations(settings: dict) -> list[str]:
    """Each setting that differs from the paper's AIME 2024 avg@32 protocol, as 'name: ours (paper x)'."""
    out = [f"{key}: {settings.get(key)!r} (paper {want!r})" for key, want in PAPER_PROTOCOL.items() if settings.get(key) != want]
    if settings.get("dataset_hash") not in PAPER_DATASET_HASHES:
        out.append(f"dataset: {settings.get('dataset')!r} (paper AIME 2024, one of {sorted(PAPER_DATASET_HASHES.values())})")
    return out


def fmt(x) -> str:
    """A report cell: 3 decimals for a float, - for None."""
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
    out += [f"| {k} | {fmt(v)} | {'[' + fmt(ci[k][0]) + ', ' + fmt(ci[k][1]) + ']' if k in ci else ''} |" for k, v in m.items()]
    out += ["", "## Length and correctness", "", "| response length (tokens) | samples | share | accuracy |", "|---|---:|---:|---:|"]
    out += [f"| {r['bin']} | {r['samples']} | {fmt(r['share'])} | {fmt(r['accuracy'])} |" for r in res["length_table"]]
    greedy = s["greedy"]
    out += ["", "## Per problem", "", "| id | accuracy | correct/k | maj | " + ("greedy | " if greedy else "")
            + "mean length | length correct | length wrong | truncated | verifier reasons |",
            "|---|---:|---:|---|" + ("---|" if greedy else "") + "---:|---:|---:|---:|---|"]
    for r in res["per_problem"]:
        reasons = " ".join(f"{k}:{v}" for k, v in sorted(r["reasons"].items()))
        out.append(f"| {r['id']} | {fmt(r['accuracy'])} | {r['n_correct']}/{len(r['correct'])} | {r['maj_correct']} | "
                   + (f"{r['greedy_correct']} | " if greedy else "")
                   + f"{fmt(r['mean_length'])} | {fmt(r['mean_length_correct'])} | {fmt(r['mean_length_wrong'])} | "
                   f"{fmt(r['truncated_frac'])} | {reasons} |")
    shown = [r for r in res["per_problem"] if r.get("samples")][:SHOWN_RESPONSES]
    if shown:  # what the numbers are made of: the first sample of the first problems (all are in report.json)
        out += ["", f"## Responses (the first sample of the first {len(shown)} problems; every sample is in report.json)", "",
                "| id | answer | verdict | exact form | response |", "|---|---|---|---|---|"]
        for r in shown:
            smp = r["samples"][0]
            text = smp["response"].replace("|", "\\|").replace("\n", " \u23ce ")
            out.append(f"| {r['id']} | {r['answer']} | {smp['reason']} | {r['exact_form'][0] if 'exact_form' in r else '-'} | "
                       f"{text} |")
    if "paraphrase" in res:
        out += paraphrase.markdown(res["paraphrase"])
    return "\n".join(out) + "\n"


def write_report(res: dict, out_dir: str | Path) -> None:
    """report.json (with the paper deviations) and report.md in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({**res, "paper_deviations": paper_deviations(res["settings"])}, indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(res))
