"""Generation beside the learner (--max_policy_lag): speed, learning per wall-clock, and the lag x objective ablation.

    OMP_NUM_THREADS=1 python bench/bench_async.py speed --repeats 2       # samples/s, inline vs lag 1
    OMP_NUM_THREADS=1 python bench/bench_async.py learn                   # lag 1 against inline, same held-out problems
    OMP_NUM_THREADS=1 python bench/bench_async.py ablation --seeds 3      # lag {0,1,2,4} x {naive, decoupled}

Every run is `python train.py` in a fresh process with its defaults (the tiny task, full DAPO), one
torch thread per process: inline is one process, a lag > 0 is a learner and a generator process,
so on a 2-core machine each has a core.

speed: --steps rollout steps per run, held-out evaluation and the probe off; samples/s = samples
generated / the loop's wall time (metrics.jsonl time/elapsed), runs alternating inline and lag 1; also
after step 0, i.e. without the pipeline's fill (the generator process starts, imports torch and
transformers, and makes the first batch while the learner waits: about 6 s more than inline on 2 cores).
learn: an inline run of --steps steps (its final held-out avg@4, wall time T), then a lag-1 run
with --max_seconds 0.75 T; both final models are evaluated by eval.py on the same 256 held-out
problems with the same seed, and `eval.py compare` gives the paired difference (lag 1 - inline).
ablation: for each lag in --lags and objective in --objectives, --seeds seeds, each run stopping
after --samples generated samples (--max_samples; equal generated samples, not equal steps);
held-out avg@4 at the end (95% Student-t interval over seeds), wall time, samples/s, the
decoupled weight's diagnostics (offpolicy/*, mean over steps), and reward and pass rate of the
trained groups sliced by age (= lag in versions) beside the base policy's pass rate on the very
prompts of each age slice (avg@4 of assets/tiny-base), so that "old rollouts look better" can be
told apart from "old rollouts came from easier prompts".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from common import SCRATCH_ROOT, machine_line, title_line
from ladder import t_interval

REPO = Path(__file__).resolve().parents[1]
SCRATCH = SCRATCH_ROOT / "async"


def run_train(name: str, flags: list[str]) -> Path:
    """`python train.py` with flags into SCRATCH/name; returns the run directory."""
    run = SCRATCH / name
    subprocess.run(["rm", "-rf", str(run)], check=True)
    run.mkdir(parents=True)
    with open(run.with_suffix(".log"), "w") as log:
        p = subprocess.run([sys.executable, "train.py", "--run_dir", str(run), "--run_id", name, *flags], cwd=REPO,
                           stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise RuntimeError(f"train.py failed (rc {p.returncode}); see {run.with_suffix('.log')}")
    return run


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def throughput(run: Path) -> tuple[float, int, float, float]:
    """(samples generated per second of the loop, samples, seconds, samples per second after step 0).

    The last figure leaves out the pipeline's fill (with a generator process, its start-up and the
    first batch, which the learner waits for whole)."""
    m = jsonl(run / "metrics.jsonl")
    samples, seconds = sum(r["envelope/samples_generated"] for r in m), m[-1]["time/elapsed"]
    steady = (samples - m[0]["envelope/samples_generated"]) / (seconds - m[0]["time/elapsed"])
    return samples / seconds, samples, seconds, steady


def speed(args) -> None:
    flags = ["--steps", str(args.steps), "--eval_data", "", "--probe_every", "0"]
    res, steady = defaultdict(list), defaultdict(list)
    for rep in range(args.repeats):
        for lag in (0, 1):
            run = run_train(f"speed-lag{lag}-{rep}", flags + ["--max_policy_lag", str(lag)])
            sps, n, sec, after_step_0 = throughput(run)
            res[lag].append(sps)
            steady[lag].append(after_step_0)
            print(f"  run {rep} lag {lag}: {n} samples in {sec:.1f} s = {sps:.1f} samples/s (after step 0: "
                  f"{steady[lag][-1]:.1f}), load {os.getloadavg()[0]:.2f}", flush=True)
    for name, r in (("whole loop", res), ("after step 0", steady)):
        a, b = statistics.median(r[0]), statistics.median(r[1])
        print(f"{name}: inline {a:.1f} samples/s (runs {', '.join(f'{x:.1f}' for x in r[0])}); lag 1 {b:.1f} samples/s "
              f"(runs {', '.join(f'{x:.1f}' for x in r[1])}); lag 1 / inline = {b / a:.2f}x")


def evaluate(run: Path, out: Path) -> dict:
    cmd = [sys.executable, "eval.py", "--model", str(run), "--data", "tiny", "--k", "4", "--limit", "256", "--seed", "7",
           "--greedy", "false", "--out", str(out)]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads((out / "report.json").read_text())


def learn(args) -> None:
    sync = run_train("learn-inline", ["--steps", str(args.steps), "--probe_every", "0"])
    t_sync = jsonl(sync / "metrics.jsonl")[-1]["time/elapsed"]
    budget = 0.75 * t_sync
    lag1 = run_train("learn-lag1", ["--steps", "100000", "--max_seconds", f"{budget:.1f}", "--probe_every", "0",
                                    "--max_policy_lag", "1"])
    m1 = jsonl(lag1 / "metrics.jsonl")
    for run, m in ((sync, jsonl(sync / "metrics.jsonl")), (lag1, m1)):
        s = json.loads((run / "summary.json").read_text())
        print(f"  {run.name}: {len(m)} steps, {sum(r['envelope/samples_generated'] for r in m)} samples, loop "
              f"{m[-1]['time/elapsed']:.1f} s; train.py's held-out avg@4 {s['heldout/avg@4']:.3f} -> {s['heldout_after/avg@4']:.3f}")
    a, b = evaluate(lag1, SCRATCH / "eval-lag1"), evaluate(sync, SCRATCH / "eval-inline")
    reports = [str((SCRATCH / name / "report.json").relative_to(REPO)) for name in ("eval-lag1", "eval-inline")]
    out = subprocess.run([sys.executable, "eval.py", "compare", *reports], cwd=REPO, capture_output=True, text=True, check=True)
    print(f"inline: {args.steps} steps in {t_sync:.1f} s; lag 1 given {budget:.1f} s (0.75x): eval.py avg@4 "
          f"lag 1 {a['metrics']['avg@4']:.3f}, inline {b['metrics']['avg@4']:.3f}")
    print(out.stdout.strip())


def age_slices(run: Path) -> dict[int, dict]:
    """Trained groups by age: reward, correct fraction, and their prompt ids."""
    out: dict[int, dict] = defaultdict(lambda: {"reward": [], "correct": [], "prompts": set()})
    for r in jsonl(run / "rollouts.jsonl"):
        if r["kept"] and r["advantage"] is not None:
            s = out[r["lag_versions"]]
            s["reward"].append(r["reward"])
            s["correct"].append(float(r["correct"]))
            s["prompts"].add(r["prompt_id"])
    return out


def base_pass_rates(prompt_ids: set[str], seed: int = 11) -> dict[str, float]:
    """avg@4 of the base policy (assets/tiny-base) on each of these training prompts."""
    sys.path.insert(0, str(REPO))
    import torch

    import eval as evaluation
    import plumbing
    import train
    from rollout import HFEngine, SamplingParams
    from task import Dataset, Task

    torch.set_num_threads(1)
    cfg = train.Config()
    model, tok = plumbing.load_policy("", torch.device("cpu"))
    data = Task().load("tiny", tok, cfg, held_out=False)
    idx = [i for i, p in enumerate(data.problems) if p.id in prompt_ids]
    sub = Dataset([data.problems[i] for i in idx], [data.prompt_ids[i] for i in idx], data.name, data.hash)
    params = SamplingParams(n=4, max_new_tokens=cfg.max_response_len, temperature=1.0, top_p=1.0, seed=seed)
    res = evaluation.evaluate(HFEngine(model, tok, return_logprobs=False), tok, sub, params, cfg, Task(), n_boot=1)
    return {r["id"]: r["accuracy"] for r in res["per_problem"]}


def ablation(args) -> None:
    rows, slices = [], {}
    for seed in range(args.seeds):
        for lag in args.lags:
            for obj in args.objectives:
                name = f"abl-lag{lag}-{obj}-s{seed}"
                run = run_train(name, ["--steps", "100000", "--max_samples", str(args.samples), "--seed", str(seed),
                                       "--probe_every", "0", "--max_policy_lag", str(lag), "--offpolicy_objective", obj])
                m, s = jsonl(run / "metrics.jsonl"), json.loads((run / "summary.json").read_text())
                sps, n, sec, _ = throughput(run)
                diag = {k: statistics.mean(r[k] for r in m if k in r) for k in
                        ("offpolicy/weight_mean", "offpolicy/weight_min", "offpolicy/weight_max", "offpolicy/over_cap_frac",
                         "offpolicy/ess", "offpolicy/kl_k3") if any(k in r for r in m)}
                rows.append({"lag": lag, "objective": obj, "seed": seed, "acc": s["heldout_after/avg@4"],
                             "base": s["heldout/avg@4"], "samples": n, "seconds": sec, "sps": sps, "steps": len(m), **diag})
                slices[name] = age_slices(run)
                print(f"  {name}: {len(m)} steps, {n} samples, {sec:.0f} s, held-out avg@4 {s['heldout_after/avg@4']:.3f}",
                      flush=True)
    prompts = set().union(*(s["prompts"] for sl in slices.values() for s in sl.values()))
    base = base_pass_rates(prompts)
    out = [f"| lag | objective | held-out avg@4 (95% CI over {args.seeds} seeds) | samples | wall s | samples/s | "
           "weight mean / min / max | over cap | ESS | KL k3 | by age: reward, pass rate, base pass rate of those prompts |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for lag in args.lags:
        for obj in args.objectives:
            rs = [r for r in rows if r["lag"] == lag and r["objective"] == obj]
            mean, lo, hi = t_interval([r["acc"] for r in rs])
            ci = f"{mean:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None else f"{mean:.3f}"
            f = lambda k, nd=3: f"{statistics.mean(r[k] for r in rs):.{nd}f}" if all(k in r for r in rs) else "-"  # noqa: E731
            ages = defaultdict(lambda: {"reward": [], "correct": [], "prompts": []})
            for r in rs:
                for age, s in slices[f"abl-lag{lag}-{obj}-s{r['seed']}"].items():
                    ages[age]["reward"] += s["reward"]
                    ages[age]["correct"] += s["correct"]
                    ages[age]["prompts"] += [base[p] for p in s["prompts"]]
            by_age = "; ".join(f"age {a}: {statistics.mean(v['reward']):.2f}, {statistics.mean(v['correct']):.2f}, "
                               f"{statistics.mean(v['prompts']):.2f} ({len(v['reward']) // 8} groups)"
                               for a, v in sorted(ages.items()))
            out.append(f"| {lag} | {obj} | {ci} | {f('samples', 0)} | {f('seconds', 0)} | {f('sps', 1)} | "
                       f"{f('offpolicy/weight_mean')} / {f('offpolicy/weight_min')} / {f('offpolicy/weight_max')} | "
                       f"{f('offpolicy/over_cap_frac')} | {f('offpolicy/ess')} | {f('offpolicy/kl_k3', 4)} | {by_age} |")
    table = "\n".join(out)
    print(table)
    (SCRATCH / "ablation.md").write_text(table + "\n")
    (SCRATCH / "ablation.json").write_text(json.dumps(rows, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--steps", type=int, default=100, help="rollout steps per run (train.py's default)")
    s.add_argument("--repeats", type=int, default=2)
    le = sub.add_parser("learn")
    le.add_argument("--steps", type=int, default=100, help="rollout steps of the inline run (train.py's default)")
    ab = sub.add_parser("ablation")
    ab.add_argument("--lags", type=int, nargs="+", default=[0, 1, 2, 4])
    ab.add_argument("--objectives", nargs="+", default=["naive", "decoupled"])
    ab.add_argument("--seeds", type=int, default=3)
    ab.add_argument("--samples", type=int, default=8000, help="generated samples per run (--max_samples)")
    args = ap.parse_args()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    import torch
    print(title_line(f"bench_async {args.cmd}"))
    print(machine_line(f"; python {sys.version.split()[0]}, torch {torch.__version__}; settings: {vars(args)}"), flush=True)
    t0 = time.time()
    {"speed": speed, "learn": learn, "ablation": ablation}[args.cmd](args)
    print(f"# {time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
