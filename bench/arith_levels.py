"""A model's accuracy and format-error rate on the arithmetic task, per difficulty level and wording.

    OMP_NUM_THREADS=1 python bench/arith_levels.py --model smollm2-135m-instruct --limit 64 --k 4

Which levels of tasks/arith.py a model can learn on is measured, not guessed: RL needs groups with
some right and some wrong answers (dynamic sampling keeps only those), so a level where the base
model is never right, or always right, teaches nothing. For each level and style this samples k
answers to the first --limit held-out problems under the DAPO instruction (measure.evaluate, the
verifier's "dapo" rule) and prints avg@k with its 95% interval, the share of groups of k with mixed
correctness (what dynamic sampling would keep at G = k), the format-error rate (no single
well-formed final answer) and the share in exactly the instruction's "Answer: N" form.
One model load; every cell is sampled with the same seed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common import machine_line, title_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="HF model directory or a plumbing/models.py name")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--styles", nargs="+", default=["bare", "worded"])
    ap.add_argument("--limit", type=int, default=64, help="held-out problems per cell")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max_new_tokens", type=int, default=48)
    ap.add_argument("--top_p", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="also write the table as JSON here")
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers

    import eval as ev
    from plumbing import models, policy
    from rollout import HFEngine, SamplingParams
    from tasks.arith import LEVELS, Arithmetic

    torch.set_num_threads(1)
    print(title_line("arith_levels"))
    print(machine_line(f"; torch {torch.__version__}, transformers {transformers.__version__}"))
    print(f"# settings: model {args.model}, {args.limit} held-out problems x k={args.k} per cell, <= {args.max_new_tokens} "
          f"new tokens, T=1.0 top_p={args.top_p}, DAPO instruction, verifier dapo, seed {args.seed}", flush=True)
    model_dir = models.resolve(args.model)
    model, tok = policy.load_policy(model_dir, torch.device("cpu"))
    engine = HFEngine(model, tok, return_logprobs=False)
    cfg = ev.ModelSettings(model=model_dir, max_response_len=args.max_new_tokens)
    params = SamplingParams(n=args.k, max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=args.top_p, seed=args.seed)
    print(f"{'level':<6} {'style':<7} {'avg@k [95% CI]':<24} {'mixed groups':>12} {'format error':>13} {'exact form':>11} "
          f"{'tokens/problem':>15} {'s':>6}  problems")
    rows = []
    for level in args.levels:
        for style in args.styles:
            task = Arithmetic(levels=[level], style=style)
            data = task.load("arith", tok, cfg, held_out=True, limit=args.limit)
            t0 = time.perf_counter()
            res = ev.evaluate(engine, tok, data, params, cfg, task, n_boot=1000)
            m, ci = res["metrics"], res["ci"]
            c = np.array(res["correct"]).sum(1)  # (P,) right answers per problem
            mixed = float(((c > 0) & (c < args.k)).mean())
            row = {"level": level, "style": style, "n": len(data), "avg": m[f"avg@{args.k}"], "ci": ci[f"avg@{args.k}"],
                   "mixed": mixed, "format_error": m["format_error"], "exact_form": m["exact_form"],
                   "tokens": m["tokens_per_problem"], "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(f"{level:<6} {style:<7} {row['avg']:.3f} [{row['ci'][0]:.3f}, {row['ci'][1]:.3f}]{'':<6} {mixed:>12.3f} "
                  f"{row['format_error']:>13.3f} {row['exact_form']:>11.3f} {row['tokens']:>15.1f} {row['seconds']:>6.0f}  "
                  f"{LEVELS[level][0]}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
