"""The cost frontier (eval.py frontier): more samples of the base policy or training, at equal generated tokens?

    python eval.py frontier --models assets/tiny-base runs/default --k 1 2 4 8 16 32 --data tiny --limit 256 --out DIR

Training a policy and drawing more answers from a fixed one are different interventions: RL pays
once, during training, and then costs one sample per problem; a fixed policy pays per problem, k
samples each, and needs a way to pick one answer: the majority vote (maj@k) or a verifier (verified
best-of-k: the chance that one of the k is right, pass@k, which only an oracle that checks answers
achieves). This compares them under one cost ceiling, generated tokens per problem, with the
executor (engine, sampling settings, seed, verifier) held fixed, and never adds the two costs up:
the training's own cost (its generated samples and tokens) is reported beside the table.

Each model is sampled once at n = max(--k) answers per problem (eval.py, every model with the
same settings and seed); each smaller budget j is derived from those n answers by estimators that
are unbiased for the policy's value at j samples (means over all C(n, j) subsets, computed
exactly): pass@j (estimators.pass_at_k, Chen et al., 2021, eq. 1), maj@j
(estimators.maj_at_j_curve), diversity at j (estimators.diversity_curve: distinct final answers,
the answers' entropy, duplicate responses), and tokens at j = j x the problem's mean tokens per
sample. Every number has a percentile bootstrap interval over problems (estimators.bootstrap_ci).
The table also says at which budget the base policy's maj@j and pass@j first reach each trained
policy's avg@1 (point estimates; the intervals are in the table).

Writes frontier.json (everything), frontier.md (the table and the reading) and frontier.png
(success against tokens per problem; distinct answers and entropy against k) to --out.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from evaluation import audit
from evaluation.estimators import DIVERSITY, MAJ_SUBSET_TIE_RULE, bootstrap_ci, diversity_curve, maj_at_j_curve, paired_bootstrap, pass_at_k

# Settings that must agree between the models for their costs to be comparable (else a warning).
SAME_EXECUTOR = ("dataset_hash", "n_problems", "temperature", "top_p", "max_new_tokens", "seed", "verifier",
                 "verifier_version", "instruction", "engine")


def check_budgets(ks: list[int]) -> None:
    """Raises ValueError unless every --k budget is an integer >= 1."""
    bad = [k for k in ks if k < 1]
    if not ks or bad:
        raise ValueError(f"--k takes budgets >= 1 (samples per problem), e.g. --k 1 2 4 8 16 32; got {ks}")


def names(specs: list[str]) -> list[str]:
    """A short, unique name per --models entry: its directory's name (a run's, for RUN/final or a
    report.json inside a directory), with the entry's position added when two would be the same."""
    out = []
    for spec in specs:
        path = Path(spec or "tiny-base")
        path = path.parent if path.suffix == ".json" or path.name == "final" else path
        out.append(path.resolve().name or "model")
    return [f"{i}-{n}" for i, n in enumerate(out, 1)] if len(set(out)) < len(out) else out


def training_cost(model: str) -> dict | None:
    """What training the model cost, from its run directory (the model's directory or its parent:
    RUN/final): {"run_dir", "steps", "seconds", "samples_generated", "trained_tokens" (the
    envelope/* sums of metrics.jsonl), "generated_tokens" (the response tokens of every rollout
    record in rollouts.jsonl: trained, filtered or expired)}; None when the model is no run's."""
    for run in (Path(model), Path(model).parent):
        if (run / "metrics.jsonl").is_file():
            break
    else:
        return None
    steps = [row for _, row in audit.iter_jsonl(run / "metrics.jsonl")]
    try:
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{run / 'summary.json'} is not JSON ({e.msg} at line {e.lineno}): rerun or restore it") from e
    generated = (sum(row.get("response_tokens", 0) for _, row in audit.iter_jsonl(run / "rollouts.jsonl"))
                 if (run / "rollouts.jsonl").is_file() else None)
    return {"run_dir": str(run), "steps": summary.get("steps", len(steps)), "seconds": summary.get("seconds"),
            "samples_generated": int(sum(r.get("envelope/samples_generated", 0) for r in steps)),
            "trained_tokens": int(sum(r.get("envelope/trained_tokens", 0) for r in steps)), "generated_tokens": generated}


def curves(report: dict, ks: list[int]) -> dict[str, np.ndarray]:
    """Per-problem values at each budget of `ks` from a report's n samples per problem.

    Returns {"avg@1": (P,), "pass": (P, J), "maj": (P, J), "tokens": (P, J), DIVERSITY names: (P, J)}
    with J = len(ks), budgets in the order given; each column the subset mean (module docstring).

    Raises:
        ValueError: a budget above the report's samples per problem, or a report written before
            answer classes and token counts were recorded.
    """
    n, model = report["settings"]["k"], report["settings"].get("model")
    if max(ks) > n:
        raise ValueError(f"budget k={max(ks)} needs {max(ks)} samples per problem; the report of {model!r} has {n}: "
                         f"measure it again with --k {max(ks)}")
    if not all({"classes", "response_class", "lengths"} <= set(r) for r in report["per_problem"]):
        raise ValueError(f"the report of {model!r} has no answer classes or token counts (written by an older eval.py): "
                         "measure it again")
    cols = np.array(ks) - 1  # (J,) entry j - 1 of each curve
    out: dict[str, list] = {"avg@1": [], "pass": [], "maj": [], "tokens": [], **{d: [] for d in DIVERSITY}}
    for r in report["per_problem"]:
        labels, c = r["classes"], int(sum(r["correct"]))
        out["avg@1"].append(c / n)
        out["pass"].append([pass_at_k(n, c, j) for j in ks])
        out["maj"].append(maj_at_j_curve(labels, r["correct"])[cols])
        out["tokens"].append(np.array(ks) * np.mean(r["lengths"]))
        div = diversity_curve(labels, r["response_class"])
        for d in DIVERSITY:
            out[d].append(div[d][cols])
    return {key: np.array(v, dtype=float) for key, v in out.items()}


def _with_ci(values: np.ndarray, n_boot: int, level: float, seed: int) -> list:
    """[[mean, lo, hi] per column] of a (P,) or (P, J) array, bootstrap over problems."""
    v = values if values.ndim == 2 else values[:, None]  # (P, J)
    lo, hi = bootstrap_ci(v, n_boot=n_boot, level=level, seed=seed)  # (J,), (J,)
    return [[float(m), float(a), float(b)] for m, a, b in zip(v.mean(0), np.atleast_1d(lo), np.atleast_1d(hi))]


def build(reports: list[dict], model_names: list[str], ks: list[int], costs: list, *, n_boot: int, level: float,
          seed: int) -> dict:
    """The frontier of the models in `reports` (the base policy first) at the budgets `ks`.

    Args:
        reports: eval.py report dicts, the same problems, at least max(ks) samples per problem.
        model_names: one per report (`names`). costs: `training_cost` per report (None: none).
        n_boot, level, seed: the bootstrap over problems.

    Returns {"ks", "level", "n_problems", "maj_tie_rule", "models": {name: {"avg@1": [m, lo, hi], "n_samples",
    "tokens_per_sample", "rows": [{"k", "tokens": [m, lo, hi], "maj", "pass", DIVERSITY...}],
    "training", "settings"}}, "crossings": [{"base", "trained", "metric", "target_avg@1", "k" (the
    smallest budget 1..max(ks) whose base value reaches the target, or None), "value",
    "tokens_per_problem", "trained_tokens_per_problem", "paired_diff": base at k (or max(ks)) minus
    the trained avg@1, estimators.paired_bootstrap, "k_not_shown_worse": the smallest budget whose
    paired interval reaches 0, or None}], "warnings": [settings that differ]}.

    Raises:
        ValueError: the reports cover different problems, or a budget exceeds a report's samples.
    """
    ids = [sorted(r["id"] for r in rep["per_problem"]) for rep in reports]
    if any(i != ids[0] for i in ids):
        raise ValueError(f"the frontier compares models on the same problems; the reports hold {[len(i) for i in ids]} "
                         "problems with different ids: measure every model with the same --data and --limit")
    first = reports[0]["settings"]
    warnings = [f"{key} differs: {model_names[0]} {first.get(key)!r}, {name} {rep['settings'].get(key)!r}"
                for name, rep in zip(model_names[1:], reports[1:]) for key in SAME_EXECUTOR
                if rep["settings"].get(key) != first.get(key)]
    models, every = {}, {}  # every[name]: curves at every budget 1..max(ks), for the crossings
    cols = np.array(ks) - 1  # (J,)
    for name, rep, cost in zip(model_names, reports, costs):
        paired = sorted(rep["per_problem"], key=lambda r: r["id"])  # the same problem order (and resamples) for every model
        every[name] = curves({**rep, "per_problem": paired}, list(range(1, max(ks) + 1)))
        stats = {key: _with_ci(every[name][key][:, cols], n_boot, level, seed) for key in ("tokens", "maj", "pass", *DIVERSITY)}
        models[name] = {
            "avg@1": _with_ci(every[name]["avg@1"], n_boot, level, seed)[0], "n_samples": rep["settings"]["k"],
            "tokens_per_sample": float(np.mean([t for r in paired for t in r["lengths"]])),
            "rows": [{"k": k, **{key: stats[key][i] for key in stats}} for i, k in enumerate(ks)],
            "training": cost, "settings": {key: rep["settings"].get(key) for key in ("model", "k", *SAME_EXECUTOR)},
        }
    crossings = []
    base = every[model_names[0]]
    for name in model_names[1:]:
        target = models[name]["avg@1"][0]
        for metric in ("maj", "pass"):
            curve = base[metric].mean(0)  # (max k,) the base policy at every budget 1..max k
            hit = np.nonzero(curve >= target)[0]
            j = int(hit[0]) + 1 if len(hit) else None
            at = (j or max(ks)) - 1  # the paired difference at the crossing, or at the largest budget
            diff = paired_bootstrap(base[metric][:, at], every[name]["avg@1"], n_boot=n_boot, level=level, seed=seed)
            _, hi = bootstrap_ci(base[metric] - every[name]["avg@1"][:, None], n_boot=n_boot, level=level, seed=seed)  # (max k,)
            reach = np.nonzero(hi >= 0)[0]  # budgets whose paired interval reaches 0: not shown worse
            crossings.append({"base": model_names[0], "trained": name, "metric": f"{metric}@k", "target_avg@1": target,
                              "k": j, "value": None if j is None else float(curve[j - 1]),
                              "tokens_per_problem": None if j is None else float(base["tokens"].mean(0)[j - 1]),
                              "trained_tokens_per_problem": models[name]["tokens_per_sample"],
                              "paired_diff": {"k": at + 1, **diff},
                              "k_not_shown_worse": int(reach[0]) + 1 if len(reach) else None})
    return {"ks": ks, "level": level, "n_problems": len(ids[0]), "maj_tie_rule": MAJ_SUBSET_TIE_RULE, "models": models,
            "crossings": crossings, "warnings": warnings}


def _ci(x: list) -> str:
    return f"{x[0]:.3f} [{x[1]:.3f}, {x[2]:.3f}]"


def reading(res: dict) -> list[str]:
    """One sentence per (trained model, metric): the budget at which the base policy meets its avg@1."""
    out = []
    pct = round(100 * res["level"])
    for c in res["crossings"]:
        what = "majority vote (maj@k)" if c["metric"] == "maj@k" else "verified best-of-k (pass@k)"
        d = c["paired_diff"]
        paired = (f"paired difference at k = {d['k']}: {d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] ({pct}% over "
                  "problems); " + (f"the paired interval first reaches 0 at k = {c['k_not_shown_worse']}" if c["k_not_shown_worse"]
                                   else f"shown worse at every k <= {max(res['ks'])}"))
        if c["k"] is None:
            out.append(f"{c['base']} with {what} stays below {c['trained']}'s avg@1 {c['target_avg@1']:.3f} up to "
                       f"k = {max(res['ks'])}; {paired}.")
        else:
            out.append(f"{c['base']} with {what} reaches {c['trained']}'s avg@1 {c['target_avg@1']:.3f} at k = {c['k']} "
                       f"({c['value']:.3f}), {c['tokens_per_problem']:.0f} generated tokens per problem against "
                       f"{c['trained_tokens_per_problem']:.0f} for one sample of {c['trained']}; {paired}.")
    return out


def markdown(res: dict) -> str:
    """frontier.md: the table (mean [CI] per cell), each model's avg@1, the reading, the training costs."""
    pct = round(100 * res["level"])
    out = [f"# Cost frontier: {res['n_problems']} problems, budgets k = {res['ks']}, {pct}% bootstrap intervals over problems",
           "", "| model | k | tokens / problem | maj@k | pass@k (verified best-of-k) | distinct answers | answer entropy (bits) "
           "| duplicate responses |", "|---|---:|---|---|---|---|---|---|"]
    for name, m in res["models"].items():
        out += [f"| {name} | {r['k']} | {r['tokens'][0]:.1f} | {_ci(r['maj'])} | {_ci(r['pass'])} | {_ci(r['distinct_answers'])} | "
                f"{_ci(r['answer_entropy_bits'])} | {_ci(r['duplicate_response_frac'])} |" for r in m["rows"]]
    out += [""] + [f"- {name}: avg@1 {_ci(m['avg@1'])} at {m['tokens_per_sample']:.1f} tokens per sample"
                   for name, m in res["models"].items()]
    out += [""] + [f"- {line}" for line in reading(res)]
    for name, m in res["models"].items():
        t = m["training"]
        if t:
            out.append(f"- training {name} cost {t['samples_generated']:,} generated samples, "
                       + (f"{t['generated_tokens']:,} generated tokens" if t["generated_tokens"] is not None else "tokens unknown")
                       + f" ({t['steps']} steps, {t['seconds']} s); a one-off cost, not added to the tokens per problem above")
    out += [f"- warning: {w}" for w in res["warnings"]]
    return "\n".join(out) + "\n"


def plot(res: dict, path: Path) -> None:
    """frontier.png: success against tokens per problem (maj@k, pass@k per model, the trained
    policies' avg@1 as single points), distinct answers and answer entropy against k; 95% bars."""
    import matplotlib  # optional heavy dependency: only this function draws

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (ax, ax_d, ax_h) = plt.subplots(1, 3, figsize=(14, 4.8))
    err = lambda cells: np.abs(np.array([[c[1], c[2]] for c in cells]).T - [c[0] for c in cells])  # noqa: E731 (2, J)
    for i, (name, m) in enumerate(res["models"].items()):
        color, rows = f"C{i}", m["rows"]
        tokens = [r["tokens"][0] for r in rows]
        for metric, style in (("maj", "-o"), ("pass", "--s")):
            cells = [r[metric] for r in rows]
            ax.errorbar(tokens, [c[0] for c in cells], yerr=err(cells), fmt=style, color=color, ms=4, capsize=2,
                        label=f"{name} {'maj@k' if metric == 'maj' else 'pass@k (verified)'}")
        if i:  # a trained policy: one sample per problem
            a = m["avg@1"]
            ax.errorbar([m["tokens_per_sample"]], [a[0]], yerr=[[a[0] - a[1]], [a[2] - a[0]]], fmt="*", color=color, ms=12,
                        capsize=3, label=f"{name} avg@1")
            ax.axhline(a[0], color=color, lw=0.6, ls=":")
        ks = [r["k"] for r in rows]
        for axis, key in ((ax_d, "distinct_answers"), (ax_h, "answer_entropy_bits")):
            cells = [r[key] for r in rows]
            axis.errorbar(ks, [c[0] for c in cells], yerr=err(cells), fmt="-o", color=color, ms=4, capsize=2, label=name)
    ax.set(xscale="log", xlabel="generated tokens per problem", ylabel="verified success",
           title="success against generated tokens")
    for axis, label in ((ax_d, "distinct final answers"), (ax_h, "answer entropy (bits)")):
        axis.set(xscale="log", xlabel="k (samples per problem)", ylabel=label, title=f"{label} against k")
        axis.set_xticks(res["ks"], [str(k) for k in res["ks"]])
        axis.legend(fontsize=7)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below: the curves fill the panel
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write(res: dict, out: str | Path) -> list[Path]:
    """frontier.json, frontier.md and frontier.png under `out`; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "frontier.json", out / "frontier.md", out / "frontier.png"]
    paths[0].write_text(json.dumps(res, indent=2) + "\n")
    paths[1].write_text(markdown(res))
    plot(res, paths[2])
    return paths
