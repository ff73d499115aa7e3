"""Reading a finished run: which of DAPO's four boundaries it crossed, plots, and report.md.

    python report.py RUN_DIR                  # RUN_DIR/report: plots, report.md, diagnosis.json, audit.json
    python report.py RUN_A RUN_B --out DIR    # two runs overlaid (an ablation)

Input: what train.py wrote to a run directory (config.json, metrics.jsonl, rollouts.jsonl,
summary.json; plumbing/runlog.py). Output: PNG plots of the metrics and rollouts (a second run is
overlaid, labelled by its directory name; the length heatmap and the stacked phase times get one
panel per run), report.md (run identity, config differences, held-out before/after next to the
resource envelope, length x correctness, rollout age, the audit of rewarded answers of evaluation/audit.py),
diagnosis.json and audit.json.

The diagnosis is evaluation/diagnosis.py's `diagnose`: which of DAPO's four boundaries a run crossed
(exploration, contrast, credit, reward) and the switch that addresses it; its thresholds are the
constants of that module, each with its reason, and report.md prints them as a table. This file
reads the run, draws and writes. Measuring a model (avg@k, pass@k, comparisons) is eval.py's job.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

import train  # Config defaults only, for the "config differences" table
from plumbing import cli
from evaluation import audit
from evaluation import diagnosis  # the diagnosis of the four boundaries: its checks and thresholds
from evaluation.diagnosis import THRESHOLDS, Finding, column, diagnose
from evaluation.audit import age_bucket  # rollout ages, shared with the audit


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


# --- the run report (python report.py RUN_DIR [RUN_DIR2] [--out DIR]) ------------------------------------

# rollouts.jsonl fields the report reads (rollout.RolloutRecord) and their JSON types (missing in older runs: None);
# the rest (texts) is not kept in memory
ROLLOUT_FIELDS = {"step": int, "policy_version": int, "learner_version": int, "response_tokens": int, "truncated": bool,
                  "correct": bool, "reward": float, "verifier_reason": str, "gen_wall_s": float, "verifier_version": str,
                  "dataset_hash": str, "group_id": str}
ENVELOPE_SUMS = ("prompts_generated", "samples_generated", "active_samples", "trained_tokens")  # summed over steps
ENVELOPE_MAXES = ("max_response_len", "max_prompt_len")  # the largest over steps
PHASES = ("time/generate", "time/score", "time/old_logprobs", "time/update", "time/weight_sync")
RUN_FILE_FIX = "pass a run directory written by train.py --run_dir (a damaged file: rerun or restore it)"


def _read_jsonl(path: Path, types: dict | None = None) -> list[dict]:
    """Every record of a run's JSONL file (audit.iter_jsonl's errors), each a JSON object: with `types`
    only those fields, each of its type (float takes integers; bool is no number) or null; else
    every value a number or null (metrics.jsonl). Raises ValueError naming path:line."""
    rows = []
    for line_no, row in audit.iter_jsonl(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{line_no} is not a JSON object; {RUN_FILE_FIX}")
        row = {k: row.get(k) for k in types} if types else row
        for k, v in row.items():
            want = types[k] if types else float
            typed = isinstance(v, bool) == (want is bool) and isinstance(v, (int, float) if want is float else want)
            if v is not None and not typed:
                raise ValueError(f"{path}:{line_no}: {k} is {v!r}, not of type {want.__name__}; {RUN_FILE_FIX}")
        rows.append(row)
    return rows


def _read_json(path: Path) -> dict:
    """A run's config.json or summary.json ({} when absent). Raises ValueError: not a JSON object, naming the file."""
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e.msg} at line {e.lineno}); {RUN_FILE_FIX}") from e
    if not isinstance(obj, dict) or not isinstance(obj.get("config", {}), dict):
        raise ValueError(f"{path} is not a JSON object (with a 'config' object, if any); {RUN_FILE_FIX}")
    return obj


def load_run(run_dir: str | Path) -> dict:
    """What train.py wrote to a run directory: {"dir", "meta", "cfg", "metrics", "summary", "rollouts"}.

    Raises:
        FileNotFoundError: no metrics.jsonl (not a run directory).
        ValueError: a damaged file (`_read_json`, `_read_jsonl`), named.
    """
    d = Path(run_dir)
    if not (d / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{d} has no metrics.jsonl: pass a run directory written by train.py --run_dir")
    meta = _read_json(d / "config.json")
    return {"dir": d, "meta": meta, "cfg": meta.get("config"), "metrics": _read_jsonl(d / "metrics.jsonl"),
            "summary": _read_json(d / "summary.json"),
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
    import matplotlib.pyplot as plt  # optional heavy dependency: only the plots need it
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
        if ax.get_legend_handles_labels()[0]:  # a panel whose metrics this run lacks stays empty, without a legend
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
    import matplotlib.pyplot as plt  # optional heavy dependency: only the plots need it

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
    import matplotlib.pyplot as plt  # optional heavy dependency: only the plots need it
    from matplotlib.ticker import MaxNLocator

    if not any(len(_series(r, k)[0]) for r in runs for k in PHASES):
        return False
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 3.6), squeeze=False, sharey=True)
    for ax, run, name in zip(axes[0], runs, names):
        steps = np.array([m.get("step", i) for i, m in enumerate(run["metrics"])], dtype=float)  # (S,)
        ys = [np.nan_to_num(column(run["metrics"], k)) for k in PHASES]  # 5 x (S,), a missing phase is 0 s
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
    import matplotlib  # optional heavy dependency: only the plots need it

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
    env = {k: int(np.nansum(column(ms, f"envelope/{k}"))) for k in ENVELOPE_SUMS}
    env.update({k: int(np.nanmax(column(ms, f"envelope/{k}"))) if any(f"envelope/{k}" in m for m in ms) else None for k in ENVELOPE_MAXES})
    env["generated_tokens"] = sum(x["response_tokens"] for x in run["rollouts"]) if run["rollouts"] else None
    env["peak_memory_gb"] = float(np.nanmax(column(ms, "memory/peak_gb"))) if any("memory/peak_gb" in m for m in ms) else None
    env["wall_s"] = run["summary"].get("seconds", round(float(np.nansum(column(ms, "time/step"))), 1))
    env["rollout_steps"] = len(ms)
    return env


def length_correctness(rollouts: list[dict], budget: int) -> list[list]:
    """Rows [length bucket, rollouts, share, correct frac, truncated frac, verifier reasons, mean gen_wall_s]:
    four equal bins of the budget for finished answers (as evaluation/reports.py's length_table), the truncated ones, all."""
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
    out += ["Thresholds (evaluation/diagnosis.py constants; level checks use the last DIAG_WINDOW steps, trends compare the "
            "first and last):", ""]
    out += _md_table(["boundary", "constant", "value", "fires when"], [list(t) for t in THRESHOLDS])
    return "\n".join(out) + "\n"


def run_report(run_dirs: list[str | Path], out: str | Path | None = None) -> dict:
    """Plots, report.md, diagnosis.json and audit.json (evaluation/audit.py) for one run or two (overlaid).
    Returns {"out", "plots", "notes", "findings", "audits"}.

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
    findings = [diagnose(diagnosis.with_rollout_metrics(r["metrics"], r["rollouts"]), r["cfg"]) for r in runs]
    plots, notes = write_plots(runs, names, out)
    audits = [audit.audit_run(r) for r in runs]  # rewarded answers: flags and a stratified sample (evaluation/audit.py)
    (out / "report.md").write_text(render_run_report(runs, names, findings, plots, notes) + audit.markdown(audits, names))
    (out / "audit.json").write_text(json.dumps(dict(zip(names, audits)), indent=2) + "\n")
    (out / "diagnosis.json").write_text(json.dumps({n: [dataclasses.asdict(f) for f in fs] for n, fs in zip(names, findings)},
                                                   indent=2) + "\n")
    return {"out": out, "plots": plots, "notes": notes, "findings": dict(zip(names, findings)), "audits": dict(zip(names, audits))}


def main(argv: list[str] | None = None) -> dict:
    """`python report.py RUN_DIR [RUN_DIR2] [--out DIR]`: run_report, then print notes and the diagnosis."""
    ap = cli.ArgumentParser(prog="report.py", description="Plots, report.md and a diagnosis of one training run, "
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
    for name, a in res["audits"].items():
        print(f"[{name}] audit: " + ("no rollouts.jsonl" if a is None else f"{a['rewarded']} rewarded answers; flagged: "
              + (", ".join(f"{f} {v['count']}" for f, v in a["flags"].items() if v["count"]) or "none")))
    print(f"wrote {res['out']}/report.md, diagnosis.json, audit.json and {len(res['plots'])} plots")
    return res


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
