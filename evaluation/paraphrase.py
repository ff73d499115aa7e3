"""Paraphrase evaluation: the same problems in other words, scored beside the originals (eval.py --paraphrases).

A rise in reward on the training prompts is not a rise in correctness: a policy can learn the
prompt's surface (its wording, its format) rather than the task. Scoring the same problems worded
differently, with the same answers and the same sampling settings, separates the two: the gap
(paraphrase minus original) of each accuracy metric, with a paired bootstrap interval over
problems (estimators.paired_bootstrap), says whether what the model can do survives a rewording.

    python eval.py --data tiny --limit 100 --k 4 --paraphrases tiny --out OUT      # tasks/tiny.py's rewordings
    python eval.py --model DIR --data DATA --paraphrases para.jsonl --out OUT    # any data

Sources of paraphrases (`load`):
  * "tiny": tiny.paraphrases, every style ("tiny:K": the first K styles); the default task only.
  * a .jsonl, one paraphrase per line: {"id": the problem's id in --data, "problem": text} or
    {"id", "prompt": text}; optional "style" (a label for the per-style table) and "answer" (must
    equal the original's: a paraphrase keeps its problem's answer). "problem" replaces the text of
    the original's last message and is treated as the original is (the instruction is added exactly
    when it is added to the original); "prompt" is a full prompt, used as it is (task.py's rule for
    .jsonl data). Several lines may share an id. Lines for problems that are not evaluated (outside
    --limit) are counted and ignored.

Per problem, the paraphrase value of a metric is the mean over that problem's paraphrases; the
comparison covers the problems that have at least one paraphrase.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tasks import tiny
from task import Dataset, Problem, Task
from evaluation.estimators import paired_bootstrap, problem_scores


def load(spec: str, data: Dataset, tokenizer, cfg, task: Task) -> dict:
    """The paraphrases of the evaluated problems, tokenised: {"data": Dataset, "of": [original index],
    "styles": [style], "spec", "ignored": lines for problems not evaluated, "skipped": prompts too long}.

    Args:
        spec: "tiny", "tiny:K" or the path of a .jsonl (module docstring).
        data: the evaluated problems (the originals), as eval.py loaded them.
        tokenizer, cfg, task: as for Task.build_prompt (cfg.max_prompt_len, cfg.prompt_truncation).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown spec, a bad line (file and line named), an answer that differs from
            the original's, no paraphrase of any evaluated problem, a prompt over max_prompt_len
            under --prompt_truncation error.
    """
    index = {p.id: i for i, p in enumerate(data.problems)}
    rows, ignored = [], 0  # rows: (original index, style, Problem)
    if spec == "tiny" or spec.startswith("tiny:"):
        if not data.name.startswith("tiny:"):
            raise ValueError(f"--paraphrases {spec!r} rewords the tiny task's problems (--data tiny), not {data.name}: for "
                             "other data pass a .jsonl of paraphrases keyed by problem id")
        k = len(tiny.PARAPHRASE_STYLES)
        if spec != "tiny":
            given = spec.split(":", 1)[1]
            if not given.isdigit() or not 1 <= int(given) <= k:
                raise ValueError(f"--paraphrases {spec!r}: expected 'tiny' or 'tiny:K' with K in 1..{k} (the styles "
                                 f"{list(tiny.PARAPHRASE_STYLES)})")
            k = int(given)
        for i, p in enumerate(data.problems):
            for style, text in tiny.paraphrases(p.messages[-1]["content"], k):
                rows.append((i, style, _reworded(p, text, full_prompt=False, tag=style)))
    else:
        path = Path(spec)
        if path.suffix != ".jsonl":
            raise ValueError(f"--paraphrases {spec!r}: expected 'tiny', 'tiny:K' or a .jsonl file")
        if not path.is_file():
            raise FileNotFoundError(f"--paraphrases {spec!r}: no such file")
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from e
                _check_row(row, f"{path}:{n}")
                full = "prompt" in row
                text = row["prompt"] if full else row["problem"]
                i = index.get(str(row["id"]))
                if i is None:
                    ignored += 1
                    continue
                p = data.problems[i]
                if "answer" in row and str(row["answer"]).strip() != p.answer:
                    raise ValueError(f"{path}:{n}: answer {row['answer']!r} differs from problem {p.id}'s {p.answer!r}; a "
                                     "paraphrase must keep its problem's answer")
                style = row.get("style", "jsonl")
                rows.append((i, style, _reworded(p, text, full_prompt=full, tag=f"line{n}")))
    if not rows:
        raise ValueError(f"--paraphrases {spec!r} holds no paraphrase of the {len(data)} evaluated problems (ids such as "
                         f"{data.problems[0].id!r}); {ignored} line(s) name other ids")
    kept, ids, too_long = [], [], 0
    for i, style, p in rows:
        x = task.build_prompt(p, tokenizer, cfg)
        if len(x) > cfg.max_prompt_len:
            if cfg.prompt_truncation == "error":
                raise ValueError(f"paraphrase {p.id} has {len(x)} prompt tokens, over --max_prompt_len {cfg.max_prompt_len}")
            too_long += 1
            continue
        kept.append((i, style, p))
        ids.append(x)
    para = Dataset([p for _, _, p in kept], ids, f"paraphrases:{spec}", data.hash, {})
    return {"data": para, "of": [i for i, _, _ in kept], "styles": [s for _, s, _ in kept], "spec": spec, "ignored": ignored,
            "skipped": too_long}


def _check_row(row, where: str) -> None:
    """Raise ValueError (naming `where`, the file and line) unless a .jsonl line is one paraphrase:
    an object with an "id" (string or integer), exactly one of "problem" / "prompt" (a non-empty
    string) and, if present, a string "style" and a string or integer "answer"."""
    fix = "expected a JSON object with 'id' and a non-empty 'problem' or 'prompt'"
    if not isinstance(row, dict) or "id" not in row:
        raise ValueError(f"{where}: {fix}")
    if isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)):
        raise ValueError(f"{where}: 'id' must be a string or an integer (a problem id of --data), got {row['id']!r}")
    texts = [key for key in ("problem", "prompt") if key in row]
    if len(texts) != 1 or not isinstance(row[texts[0]], str) or not row[texts[0]].strip():
        raise ValueError(f"{where}: {fix}, not both" if len(texts) == 2 else f"{where}: {fix}")
    if "style" in row and not isinstance(row["style"], str):
        raise ValueError(f"{where}: 'style' must be a string (a label for the per-style table), got {row['style']!r}")
    if "answer" in row and (isinstance(row["answer"], bool) or not isinstance(row["answer"], (str, int))):
        raise ValueError(f"{where}: 'answer' must be a string or an integer (the problem's own answer), got {row['answer']!r}")


def _reworded(p: Problem, text: str, *, full_prompt: bool, tag: str) -> Problem:
    """Problem p (id "p.id~tag") with its last message's text replaced (a bare problem stays bare), or a full prompt."""
    if full_prompt:
        return Problem(f"{p.id}~{tag}", [{"role": "user", "content": text}], p.answer, bare=False)
    msgs = [dict(m) for m in p.messages]
    msgs[-1]["content"] = text
    return Problem(f"{p.id}~{tag}", msgs, p.answer, bare=p.bare)


def gaps(para: dict, original: dict, measured: dict, params, *, greedy: bool = False, n_boot: int = 2000,
         ci_level: float = 0.95) -> dict:
    """The gap between the paraphrases and the originals per metric, with paired intervals over problems.

    Args:
        para: `load`'s result.
        original: measure.evaluate's result on the originals (its per_problem records in data order).
        measured: measure.evaluate's result on para["data"], with the originals' sampling settings
            (the same k, budget, temperature, top_p and seed: `params`).
        greedy, n_boot, ci_level: as given to measure.evaluate.

    Returns:
        {"spec", "n_problems" (originals with a paraphrase), "n_paraphrases", "ignored", "skipped",
         "metrics": {metric: paired_bootstrap(paraphrase, original)} (diff = paraphrase - original),
         "by_style": {style: {"n": paraphrases, metric: paired_bootstrap}}, "per_paraphrase": [...]}
        over the accuracy metrics avg@k, pass@k, maj@k and greedy_pass@1 (when greedy).
    """
    res = measured
    k = params.n
    names = [m for m in (f"avg@{k}", f"pass@{k}", f"maj@{k}", "greedy_pass@1") if m != "greedy_pass@1" or greedy]
    orig = problem_scores(original["per_problem"])  # {metric: (P,)}
    mine = problem_scores(res["per_problem"])  # {metric: (Q,)}, paraphrases in para["data"] order
    of, styles = np.array(para["of"]), np.array(para["styles"])  # (Q,), (Q,)

    def gaps(sel: np.ndarray) -> dict:
        covered = np.unique(of[sel])  # (P',) originals with a paraphrase among `sel`
        out = {}
        for m in names:
            per = np.array([mine[m][sel & (of == i)].mean() for i in covered])  # (P',) mean over each one's paraphrases
            out[m] = paired_bootstrap(per, orig[m][covered], n_boot=n_boot, level=ci_level, seed=params.seed)
        return out

    everything = np.ones(len(of), dtype=bool)
    by_style = {s: {"n": int((styles == s).sum()), **gaps(styles == s)} for s in dict.fromkeys(para["styles"])}
    per = [{"id": p.id, "of": original["per_problem"][i]["id"], "style": s, "problem": p.messages[-1]["content"],
            "accuracy": r["accuracy"], "n_correct": r["n_correct"], "preds": r["preds"], "reasons": r["reasons"]}
           for p, i, s, r in zip(para["data"].problems, para["of"], para["styles"], res["per_problem"])]
    return {"spec": para["spec"], "n_problems": len(np.unique(of)), "n_paraphrases": len(of), "ignored": para["ignored"],
            "skipped": para["skipped"], "level": ci_level, "metrics": gaps(everything), "by_style": by_style,
            "per_paraphrase": per}


def compare(a: dict, b: dict, *, n_boot: int, level: float, seed: int, warnings: list) -> dict:
    """Paraphrase side of `eval.py compare A B`: {"paraphrase avg@k": A minus B on the paraphrases,
    "gap avg@k": A's gap minus B's gap}, each estimators.paired_bootstrap over the problems with paraphrases.

    a, b: two report.json dicts with "paraphrase" (same problems and k, checked by compare.compare). A
    rise on the originals with no rise on the paraphrases shows as a widening (more negative) gap.
    Returns {} and appends to `warnings` when the two reports paraphrased different problems or styles.
    """
    def per_problem(rep: dict) -> tuple[dict, dict]:  # {problem id: paraphrase avg@k}, {problem id: original avg@k}
        acc: dict[str, list] = {}
        for r in rep["paraphrase"]["per_paraphrase"]:
            acc.setdefault(r["of"], []).append(r["accuracy"])
        return {pid: float(np.mean(v)) for pid, v in acc.items()}, {r["id"]: r["accuracy"] for r in rep["per_problem"]}

    (para_a, orig_a), (para_b, orig_b) = per_problem(a), per_problem(b)
    ids_of = lambda rep: sorted(r["id"] for r in rep["paraphrase"]["per_paraphrase"])  # noqa: E731
    if ids_of(a) != ids_of(b):
        warnings.append(f"paraphrases differ (A {a['paraphrase']['spec']}, {a['paraphrase']['n_paraphrases']}; B "
                        f"{b['paraphrase']['spec']}, {b['paraphrase']['n_paraphrases']}): their comparison is left out")
        return {}
    ids = sorted(para_a)
    pa, pb = np.array([para_a[i] for i in ids]), np.array([para_b[i] for i in ids])  # (P,), (P,)
    ga, gb = pa - np.array([orig_a[i] for i in ids]), pb - np.array([orig_b[i] for i in ids])  # (P,) gaps
    k = a["settings"]["k"]
    return {f"paraphrase avg@{k}": paired_bootstrap(pa, pb, n_boot=n_boot, level=level, seed=seed),
            f"gap avg@{k}": paired_bootstrap(ga, gb, n_boot=n_boot, level=level, seed=seed)}


def _verdict(r: dict) -> str:
    if not r["excludes_zero"]:
        return "no gap shown (interval contains 0)"
    return "paraphrases worse" if r["diff"] < 0 else "paraphrases better"


def summary_lines(res: dict) -> list[str]:
    """The printout: one line per metric, paraphrase minus original with its interval."""
    pct = round(100 * res["level"])
    out = [f"paraphrases ({res['spec']}): {res['n_paraphrases']} paraphrases of {res['n_problems']} problems, the same sampling settings"]
    out += [f"{m:>14}: original {r['b']:.3f}  paraphrase {r['a']:.3f}  gap {r['diff']:+.3f}  {pct}% CI "
            f"[{r['lo']:+.3f}, {r['hi']:+.3f}]  {_verdict(r)}" for m, r in res["metrics"].items()]
    return out


def markdown(res: dict) -> list[str]:
    """report.md's section: the gap per metric, per style, and a few paraphrases with their accuracy."""
    pct = round(100 * res["level"])
    out = ["", "## Paraphrases: the same problems in other words", "",
           f"Source `{res['spec']}`: {res['n_paraphrases']} paraphrases of {res['n_problems']} problems, sampled with the "
           f"originals' settings; gap = paraphrase - original, {pct}% paired bootstrap interval over problems "
           f"(lines for problems not evaluated: {res['ignored']}; prompts too long, skipped: {res['skipped']}).", "",
           "| metric | original | paraphrase | gap | CI | verdict |", "|---|---:|---:|---:|---|---|"]
    out += [f"| {m} | {r['b']:.3f} | {r['a']:.3f} | {r['diff']:+.3f} | [{r['lo']:+.3f}, {r['hi']:+.3f}] | {_verdict(r)} |"
            for m, r in res["metrics"].items()]
    first = next(iter(res["metrics"]))
    out += ["", f"By style ({first}):", "", "| style | paraphrases | original | paraphrase | gap | CI |", "|---|---:|---:|---:|---:|---|"]
    out += [f"| {s} | {v['n']} | {v[first]['b']:.3f} | {v[first]['a']:.3f} | {v[first]['diff']:+.3f} | "
            f"[{v[first]['lo']:+.3f}, {v[first]['hi']:+.3f}] |" for s, v in res["by_style"].items()]
    out += ["", "Examples:", "", "| problem | style | paraphrase | accuracy |", "|---|---|---|---:|"]
    seen = []
    for r in res["per_paraphrase"]:
        if r["style"] not in seen:  # one per style
            seen.append(r["style"])
            out.append(f"| {r['of']} | {r['style']} | {r['problem'][:120].replace('|', '/').replace(chr(10), ' ')} | {r['accuracy']:.3f} |")
    return out
