"""Paired comparison of two evaluation reports on the same problems: does model A beat model B? (`eval.py compare`).

    python eval.py compare A/report.json B/report.json [--n_boot N] [--ci_level L] [--seed S]

Reads two report.json files written by `python eval.py ... --out DIR` and gives, for each metric
both carry, A minus B with a paired bootstrap interval over problems (estimators.paired_bootstrap:
each resample draws problems once and takes both models' values on them, so problem difficulty
cancels out): accuracy (avg@k, pass@k, maj@k, greedy pass@1), cost (generated tokens per problem)
and diversity (distinct answers, answer entropy, duplicate responses); with paraphrases in both,
the paraphrase side (paraphrase.compare). Settings that change what was measured are warnings.
"""

from __future__ import annotations

import json
from pathlib import Path

from plumbing import cli
from evaluation import paraphrase
from evaluation.estimators import DIVERSITY, paired_bootstrap, problem_scores

# Differences that change what was measured, or which samples were drawn (seed, engine groups; a
# report older than --vllm_tp had one group per process): each is a warning.
WARN_KEYS = ("dataset_hash", "temperature", "top_p", "max_new_tokens", "seed", "engine_groups", "verifier",
             "verifier_version", "instruction")
N_BOOT, CI_LEVEL = 2000, 0.95  # the defaults of eval.py's --n_boot and --ci_level


def bootstrap_rules(n_boot: int, ci_level: float, seed: int):
    """(fails, message) for the bootstrap's flags, shared by eval.py and eval.py compare (cli.check_config style)."""
    yield (n_boot < 1, f"--n_boot must be >= 1 bootstrap resample, got {n_boot}")
    yield (not 0 < ci_level < 1, f"--ci_level must be in (0, 1) (0.95 = a 95% interval), got {ci_level}")
    yield (seed < 0, f"--seed must be >= 0 (numpy's generators refuse negative seeds), got {seed}")


def compare(a: dict, b: dict, *, n_boot: int, level: float, seed: int) -> dict:
    """Paired comparison of two reports on the same problems: {"metrics": {name: paired_bootstrap}, "warnings"}.

    Compares avg@k, pass@k (k = n), maj@k, greedy_pass@1, tokens_per_problem and the diversity
    metrics (estimators.DIVERSITY), each when both reports have it; with paraphrases in both
    (--paraphrases), also avg@k on them and the gap (paraphrase.compare).

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
    names = [m for m in (f"avg@{k}", f"pass@{k}", f"maj@{k}", "greedy_pass@1", "tokens_per_problem", *DIVERSITY)
             if m in sa and m in sb]
    get = lambda s, key: s.get(key, s.get("world_size")) if key == "engine_groups" else s.get(key)  # noqa: E731
    warnings = [f"{key} differs: A {get(a['settings'], key)!r}, B {get(b['settings'], key)!r}"
                for key in WARN_KEYS if get(a["settings"], key) != get(b["settings"], key)]
    metrics = {m: paired_bootstrap(sa[m], sb[m], n_boot=n_boot, level=level, seed=seed) for m in names}
    if "paraphrase" in a and "paraphrase" in b:
        metrics.update(paraphrase.compare(a, b, n_boot=n_boot, level=level, seed=seed, warnings=warnings))
    return {"n_problems": len(ids_a), "k": k, "level": level, "warnings": warnings, "metrics": metrics}


def read_report(path: str, what: str = "compare") -> dict:
    """A report.json of eval.py, checked for what `compare` and the frontier read.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or not an eval.py report (no settings with k, no per_problem records
            with id, correct and maj_correct), naming the file and what is missing.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what}: {path!r} is not a file; pass a report.json written by `python eval.py ... --out DIR`")
    try:
        rep = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: {path} is not a report.json ({e.msg} at line {e.lineno})") from e
    fix = "pass the report.json that `python eval.py ... --out DIR` writes"
    if not isinstance(rep, dict) or not isinstance(rep.get("settings"), dict) or not isinstance(rep["settings"].get("k"), int):
        raise ValueError(f"{what}: {path} is not an eval.py report (no settings with k); {fix}")
    per = rep.get("per_problem")
    if not isinstance(per, list) or not per:
        raise ValueError(f"{what}: {path} is not an eval.py report (no per_problem records); {fix}")
    k = rep["settings"]["k"]
    for i, r in enumerate(per):
        if not (isinstance(r, dict) and "id" in r and "maj_correct" in r and isinstance(r.get("correct"), list)
                and len(r["correct"]) == k):
            raise ValueError(f"{what}: {path} per_problem[{i}] lacks id, maj_correct or k={k} verdicts in correct; {fix}")
    return rep


def main(argv: list[str]) -> dict:
    """`eval.py compare A B [--n_boot N] [--ci_level L] [--seed S]`: print and return `compare`'s result."""
    ap = cli.ArgumentParser(prog="eval.py compare", description="Paired bootstrap over problems: A minus B.")
    ap.add_argument("a", help="report.json of model A")
    ap.add_argument("b", help="report.json of model B")
    ap.add_argument("--n_boot", type=int, default=N_BOOT, help="bootstrap resamples of the problems")
    ap.add_argument("--ci_level", type=float, default=CI_LEVEL, help="coverage of the interval")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = ap.parse_args(argv)
    for fails, message in bootstrap_rules(args.n_boot, args.ci_level, args.seed):
        if fails:
            raise ValueError(message)
    res = compare(read_report(args.a), read_report(args.b), n_boot=args.n_boot, level=args.ci_level, seed=args.seed)
    print(f"A = {args.a}\nB = {args.b}\n{res['n_problems']} problems, k = {res['k']}, paired bootstrap over problems")
    for w in res["warnings"]:
        print(f"WARNING: {w}")
    for m, r in res["metrics"].items():
        verdict = ("A > B" if r["diff"] > 0 else "A < B") if r["excludes_zero"] else "no difference shown (interval contains 0)"
        print(f"{m:>23}: A {r['a']:.3f}  B {r['b']:.3f}  A-B {r['diff']:+.3f}  "
              f"{round(100 * args.ci_level)}% CI [{r['lo']:+.3f}, {r['hi']:+.3f}]  {verdict}")
    return res
