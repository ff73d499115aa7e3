"""What Dynamic Sampling costs: generated samples per trained sample and generation rounds per step.

    OMP_NUM_THREADS=1 python bench/bench_dynamic_sampling.py                 # 10 steps, reuse off and on
    OMP_NUM_THREADS=1 python bench/bench_dynamic_sampling.py --steps 20 --seeds 0 1

Runs `python train.py` with its defaults (full DAPO on the tiny task: G=8, 16 groups per step,
24 prompts per generation round, at most 4 rounds) for --steps rollout steps, once with surplus
reuse off (--max_rollout_age 0, the official behaviour: kept groups beyond the batch are thrown
away) and once on (--max_rollout_age 1: they are trained on in the next step), alternating, and
reads RUN_DIR/metrics.jsonl:

  samples generated per trained sample = sum(groups/generated) / sum(groups/kept)  (x G cancels)
  generation rounds per step            = groups/gen_rounds (median, max)
  kept fraction of a round              = groups/kept_frac
  seconds per step, generate seconds    = time/step, time/generate (load-dependent)

Held-out evaluation is switched off (--eval_data '') so only the training loop runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from common import SCRATCH_ROOT, machine_line, title_line

REPO = Path(__file__).resolve().parents[1]
SCRATCH = SCRATCH_ROOT / "dynamic_sampling"  # runs/bench/dynamic_sampling


def run(age: int, seed: int, steps: int) -> list[dict]:
    run_dir = SCRATCH / f"age{age}_seed{seed}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    cmd = [sys.executable, "train.py", "--steps", str(steps), "--seed", str(seed), "--eval_data", "", "--run_dir", str(run_dir),
           "--max_rollout_age", str(age)]
    log = SCRATCH / f"age{age}_seed{seed}.log"
    with open(log, "w") as f:
        p = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"), check=False)
    if p.returncode != 0:
        raise RuntimeError(f"train.py failed (rc {p.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]


def summary(ms: list[dict]) -> dict:
    gen, kept = sum(m["groups/generated"] for m in ms), sum(m["groups/kept"] for m in ms)
    rounds = [m["groups/gen_rounds"] for m in ms]
    return {"gen_per_kept": gen / max(kept, 1), "gen": gen, "kept": kept, "rounds_med": statistics.median(rounds),
            "rounds_mean": statistics.mean(rounds), "rounds_max": max(rounds),
            "exhausted": sum(1 for m in ms if m.get("groups/exhausted")),
            "kept_frac": statistics.median(m["groups/kept_frac"] for m in ms),
            "step_s": statistics.median(m["time/step"] for m in ms),
            "gen_s": statistics.median(m["time/generate"] for m in ms),
            "correct": statistics.mean(m["train/correct_frac"] for m in ms if "train/correct_frac" in m)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="rollout steps per run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = ap.parse_args()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    import torch

    print(title_line("bench_dynamic_sampling"))
    print(machine_line(f"; python {platform.python_version()}, torch {torch.__version__}"))
    sys.path.insert(0, str(REPO))
    import train

    c = train.Config()
    print(f"# settings: python train.py defaults (G={c.group_size}, {c.prompts_per_step} groups/step, {c.gen_prompts_per_round} "
          f"prompts/round, <= {c.max_gen_rounds} rounds, on_exhausted={c.on_exhausted}, lr {c.lr}), "
          f"--steps {args.steps} --eval_data '' ; seeds {args.seeds}; runs alternate reuse off/on", flush=True)
    ages = [0, 1]
    rows: dict = {a: [] for a in ages}
    for seed in args.seeds:
        for a in ages:
            s = summary(run(a, seed, args.steps))
            rows[a].append(s)
            print(f"  seed {seed} max_rollout_age={a}: {s['gen']} groups generated, {s['kept']} trained -> "
                  f"{s['gen_per_kept']:.2f} samples per trained sample; rounds/step median {s['rounds_med']} mean "
                  f"{s['rounds_mean']:.2f} max {s['rounds_max']}; exhausted steps {s['exhausted']}; "
                  f"train correct {s['correct']:.2f}; {s['step_s']:.1f} s/step ({s['gen_s']:.1f} s generating)", flush=True)
    print(f"{'surplus reuse':<28} {'generated/trained':>18} {'rounds/step (mean)':>19} {'s/step (median)':>16}")
    for a, ss in rows.items():
        name = {0: "off (max_rollout_age 0)", 1: "on (max_rollout_age 1)"}[a]
        gpk = [s["gen_per_kept"] for s in ss]
        rm = [s["rounds_mean"] for s in ss]
        st = [s["step_s"] for s in ss]
        rng = lambda v: f" ({min(v):.2f}-{max(v):.2f})" if len(v) > 1 else ""
        print(f"{name:<28} {statistics.median(gpk):>11.2f}{rng(gpk):<7} {statistics.median(rm):>12.2f}{rng(rm):<7} "
              f"{statistics.median(st):>9.1f}{rng(st)}")


if __name__ == "__main__":
    main()
