"""The ablation ladder of the paper's Table 1, on the tiny default task (or on real data with a GPU).

    OMP_NUM_THREADS=1 python bench/ladder.py                          # 6 rows x 3 seeds x 20 steps, tiny task
    OMP_NUM_THREADS=1 python bench/ladder.py --rows 1,6 --seeds 1 --steps 2 --eval_limit 16   # a smoke run
    OMP_NUM_THREADS=1 python bench/ladder.py --rows 6,7,8 --optimizer_steps 2,8 --out runs/ladder-successors
        # DAPO's successors (row 7 = DAPO + CISPO, row 8 = DAPO + GSPO) beside row 6, at 2 and 8
        # optimizer steps per rollout step
    python bench/ladder.py --preset-base paper --model DIR --data dapo-math-17k.parquet \\
        --eval_data aime-2024.parquet --steps 1000 --out runs/ladder32b -- --eval_k 32   # Table 1 on a GPU node

Each row is a preset of train.py ("ladder-1-grpo" ... "ladder-6-dapo", built from train.LADDER);
each row turns on exactly one more DAPO switch than the row above, in the paper's order (rows are
cumulative, not a factorial study). Rows 7 and 8 are not in Table 1: row 6 with the surrogate of one
of DAPO's successors each ("ladder-6-cispo", "ladder-6-gspo" from train.SUCCESSORS; GSPO's row also
takes the seq-mean-token-mean aggregation its objective requires), not cumulative. For every row
and seed the script runs

    python train.py --preset ROW --seed S --steps N --run_dir OUT/ROW/sS [common flags] [-- extra flags]

and with --optimizer_steps N1,N2 once per value, with --mini_batch_size (prompts_per_step x
group_size) / Ni and run directory OUT/ROW/osNi/sS: on-policy (the first mini-batch of a rollout
step) the successors equal DAPO (CISPO) or GRPO's sequence mean (GSPO) exactly, so they can only
differ where later mini-batches train with ratios away from 1.

in a subprocess (a fresh process per run: no state leaks between rows), from a copy of the code
frozen in OUT/.code/HASH when the ladder starts (others may edit the working tree meanwhile; a finished
run is reused only for the same config and HASH), then reads the run's summary.json and metrics.jsonl
and writes OUT/ladder.md and OUT/ladder.json:

  held-out avg@k   summary.json "heldout_after/avg@K": mean over seeds with a 95% Student-t interval
                   across seeds (mean +- t_{0.975, n-1} * s / sqrt(n), s the n-1 std); before-training
                   value beside it. The interval is over seeds only; each seed's own sampling noise
                   (eval_limit problems x k samples) is inside the seed-to-seed spread.
  samples gen.     sum over steps of envelope/samples_generated (what the rollouts cost), and of
                   envelope/active_samples (what was trained on), mean over seeds
  wall             seconds per run measured around the subprocess (load-dependent on a shared machine)
  trunc., entropy, length, clip fractions
                   length/truncated_frac, policy/entropy, length/mean, policy/clipfrac_low and _high
                   (GSPO: also policy/seq_clipfrac_low / _high, per response), mean over the last
                   --last steps; opt. steps: policy/optimizer_steps, mean over the run (measured)

Common flags on the tiny task (same for every row, so they are not part of any row's difference):

  --max_response_len 34 --overlong_buffer 6. The tiny task's correct answers are 16 to 38 tokens
      (EOS included; `tiny.make_problem`, 5000 training problems: 16.5% need 35-38 tokens, 3.2% need
      38). Budget 34 makes the paper's situation happen: an answer that would be right if it could
      finish is cut off and scored as wrong, which overlong filtering (row 2) stops punishing.
      Buffer 6 puts lengths 29-34 in the soft punishment zone (row 4): 42% of correct answers
      (lengths 30, 32, 33) and the rambling wrong ones. The ceiling this puts on held-out accuracy
      (about 0.83) is the same for every row. train.py's own default (48/8) truncates nothing.
      The cost of this choice: a zone over 42% of the right answers lets the soft punishment outweigh
      correctness (a short wrong answer beats a long wrong one, and a long right one earns as little as
      +0.17; WALKTHROUGH.md sections 5 and 7), which the paper's zone, above most right answers, does
      not. --max_response_len 36 --overlong_buffer 2 is the paper-like alternative (zone 35-36: 5% of
      right answers; 3.2% truncated).
  --gen_prompts_per_round 16 (= prompts_per_step). Rows 1-5 generate exactly what they train on
      (train.py before commit 2bb8a9c generated 24 and threw 8 away even without dynamic sampling);
      row 6 generates rounds of the same size until dynamic sampling has kept 16 groups (at most
      max_gen_rounds = 4), so "samples generated" is each row's real rollout cost.
  --eval_limit 128 (held-out problems, k = 4 samples each), --probe_every 0 (no probe set: saves
      time, changes no update).

With --preset-base paper (or any non-ladder preset) none of those tiny defaults are applied: every
preset value of the base that a ladder row does not set is passed as a flag, the row's switches on
top, then --model/--data/--eval_data, then the flags after `--` (last wins).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import train  # noqa: E402
from plumbing import policy  # noqa: E402

# AIME 2024 avg@32, Qwen2.5-32B base (paper Table 1), in the order of train.LADDER.
PAPER_AIME24 = {"ladder-1-grpo": 30, "ladder-2-overlong-filter": 36, "ladder-3-clip-higher": 38,
                "ladder-4-soft-overlong": 41, "ladder-5-token-level": 42, "ladder-6-dapo": 50}
PAPER_LABEL = {"ladder-1-grpo": "naive GRPO", "ladder-2-overlong-filter": "+ overlong filtering",
               "ladder-3-clip-higher": "+ clip-higher", "ladder-4-soft-overlong": "+ soft overlong punishment",
               "ladder-5-token-level": "+ token-level loss", "ladder-6-dapo": "+ dynamic sampling (= DAPO)",
               "ladder-6-cispo": "DAPO + CISPO", "ladder-6-gspo": "DAPO + GSPO"}

# What each row can and cannot show on the tiny task (1.23M-parameter policy, answers of 16-38 tokens).
ROW_NOTES = {
    "ladder-1-grpo": (
        "Plain GRPO: symmetric clip 0.2, sample-level loss (eq. 5), every group trained, no length "
        "handling, so a truncated answer is scored -1 like a wrong one. It is the baseline every other "
        "row is compared with. At this scale it can show whether the loop learns at all in the step "
        "budget; it cannot show the paper's 30 points, which belong to a 32B model on AIME."),
    "ladder-2-overlong-filter": (
        "Truncated answers leave the loss (their rewards still count in the group mean and std). With "
        "budget 34, the 3-digit problems whose correct answer needs 35-38 tokens are always truncated, "
        "so this row stops pushing down answers that were on the right track. It can show a change in "
        "truncation rate and accuracy on those long problems; it cannot show the paper's stability "
        "argument (noisy rewards on 20k-token answers), since our truncated answers are a fixed, "
        "problem-determined share rather than unfinished reasoning of varying quality."),
    "ladder-3-clip-higher": (
        "eps_high 0.28 instead of 0.2: tokens with positive advantage may grow further before the clip "
        "stops them. It only acts when the ratio leaves [0.8, 1.2] within a rollout step, i.e. on the "
        "second mini-batch (2 optimizer steps per rollout step here, 16 in the paper); watch "
        "policy/clipfrac_high and the entropy column. The paper's effect (entropy kept from collapsing "
        "over thousands of steps) needs far longer runs than this budget; over 20 steps the entropy of "
        "a 1.23M-parameter policy hardly moves, so a difference here is mostly noise."),
    "ladder-4-soft-overlong": (
        "Adds the graded penalty for lengths 29-34 (eq. 13): a correct 33-token answer earns "
        "1 - 5/6 = 0.17 instead of 1. On this task the length of a correct answer is fixed by the "
        "problem, so the penalty mostly re-weights groups of long problems and separates short wrong "
        "answers from long wrong ones; it can show a lower truncation rate, and it can cost accuracy "
        "on long problems (the penalty lowers the reward of their right answers). At budget 34/6 the zone holds "
        "42% of the right answers, so being short can pay more than being right: a short wrong answer scores -1, "
        "a long wrong one down to -2, a long right one as little as +0.17. Without dynamic sampling most groups "
        "are all wrong, and in them only length separates the answers: the policy can learn to answer short and "
        "wrong (WALKTHROUGH.md sections 5 and 7 show one step of it). It cannot show the paper's gain from "
        "discouraging needless verbosity, which this task's fixed format leaves no room for; the paper's zone "
        "(16k-20k tokens) sits above most right answers, ours inside them."),
    "ladder-5-token-level": (
        "token-mean over the whole mini-batch (eq. 8) instead of the mean of per-answer means: every "
        "token weighs the same, so long answers (the 3-digit problems, 30-38 tokens) get more of the "
        "gradient than short ones (16-23 tokens). Length varies by at most 2.4x here against 100x in "
        "the paper, so the re-weighting is mild and its effect small; the paper's motivation (long "
        "gibberish answers escaping punishment) cannot arise in 34 tokens. It inherits row 4's length signal, "
        "so it measures the token-level loss under that signal, not on its own."),
    "ladder-6-dapo": (
        "Dynamic sampling: groups whose answers are all right or all wrong are dropped and more are "
        "generated until 16 mixed groups are kept. It is the row most likely to show at this scale: "
        "the base policy is right only part of the time (27-40% held-out), so many groups are all-wrong and give "
        "zero advantage in rows 1-5 (or, with row 4's penalty, a pure length signal). Its cost is visible in "
        "'samples generated'. It cannot show the "
        "paper's wall-clock argument (fewer steps to a given accuracy on a cluster)."),
    "ladder-6-cispo": (
        "Row 6 with CISPO's loss (MiniMax-M1): -sg(clamp(r, 0, 5)) A log pi instead of the clip, so a token "
        "the clip would stop keeps a gradient, weighted by its ratio (at most 5). On-policy it is row 6 "
        "exactly; at 2 optimizer steps per rollout step only the second mini-batch sees r != 1, where row "
        "6's clip rarely acts, so the two rows can differ only by noise. At 8 optimizer steps mini-batches "
        "2-8 train with moved ratios and the clipped tokens' gradient is what differs. It can show whether "
        "keeping it changes learning in this budget; it cannot show MiniMax's argument (rare reflective "
        "tokens such as 'Wait' at the forks of long chains of thought), which 16-38-token sums do not have."),
    "ladder-6-gspo": (
        "Row 6 with GSPO (Qwen): one ratio per response (the geometric mean of its token ratios), clipped "
        "to (1 - 3e-4, 1 + 4e-4), and the mean over responses its objective is defined with. So it differs "
        "from row 6 even on-policy, where it is GRPO's sequence-mean loss: row 5's token-level loss is "
        "undone (a mild change here, lengths differ by at most 2.4x). Off-policy the band is so narrow that "
        "many responses lose their whole gradient in later mini-batches (seq clipfrac). It can show what "
        "that costs or buys at this scale; it cannot show the paper's reason, stable training of "
        "mixture-of-experts models whose token ratios jump when routing changes: the tiny policy is dense."),
}

# Ladder defaults on the tiny task (module docstring says why); None = train.py's own value.
TINY_DEFAULTS = dict(steps=20, max_response_len=34, overlong_buffer=6, gen_prompts_per_round=16,
                     eval_limit=128, probe_every=0)
LADDER_FLAGS = ("steps", "max_response_len", "overlong_buffer", "gen_prompts_per_round", "eval_limit", "eval_k",
                "probe_every", "model", "data", "eval_data")


def code_files() -> list[Path]:
    """What decides what a run computes: the repository's modules (the root and its code folders) and the tiny base policy."""
    assets = REPO / "assets" / "tiny-base"
    modules = sorted(REPO.glob("*.py")) + sorted(p for d in ("plumbing", "evaluation", "tasks") for p in (REPO / d).glob("*.py"))
    return modules + (sorted(f for f in assets.iterdir() if f.is_file()) if assets.is_dir() else [])


def snapshot_code(out: Path) -> tuple[Path, str]:
    """Copy the code into OUT/.code/HASH once and return (that directory, HASH).

    Every run of the ladder executes this frozen copy (train.py finds its modules and assets/tiny-base
    next to itself), so edits to the working tree while a ladder runs cannot mix code versions
    between rows; HASH (sha256 of names and bytes, 16 hex) goes into ladder.md and decides reuse.
    """
    blobs = [(f.relative_to(REPO).as_posix(), f.read_bytes()) for f in code_files()]
    h = hashlib.sha256()
    for name, data in blobs:
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    digest = h.hexdigest()[:16]
    dest = out / ".code" / digest
    if not (dest / "train.py").exists():
        tmp = out / ".code" / f"{digest}.tmp{os.getpid()}"
        for name, data in blobs:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    return dest, digest


# --- statistics -----------------------------------------------------------------------------------------


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with df degrees of freedom (p in (0.5, 1)), by bisection on its CDF.

    The CDF is 0.5 + the integral of the density from 0 to x (Simpson's rule, 2000 panels); exact to
    ~1e-9 for the df >= 1 and p <= 0.999 used here (tests check df 1, 2, 4 against tables).
    """
    if not (0.5 < p < 1) or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    dens = lambda x: math.exp(c - (df + 1) / 2 * math.log1p(x * x / df))  # noqa: E731

    def cdf(x: float, n: int = 2000) -> float:
        h = x / n
        s = dens(0.0) + dens(x) + sum((4 if i % 2 else 2) * dens(i * h) for i in range(1, n))
        return 0.5 + s * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float | None, float | None]:
    """(mean, lo, hi): Student-t interval for the mean of independent runs; lo = hi = None for n < 2."""
    n = len(values)
    if n == 0:
        raise ValueError("t_interval needs at least one value")
    mean = statistics.fmean(values)
    if n < 2:
        return mean, None, None
    half = t_quantile((1 + level) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


# --- presets ----------------------------------------------------------------------------------------------


def ladder_rows() -> list[str]:
    """Table 1's six rows, then the successors' (row numbers 7 and 8)."""
    return [name for name, _ in train.LADDER] + [name for name, _ in train.SUCCESSORS]


def is_successor(row: str) -> bool:
    return row in dict(train.SUCCESSORS)


def base_row(row: str) -> str:
    """What a row is compared with: the row above (Table 1), row 6 (a successor), tiny (row 1)."""
    rows = ladder_rows()
    if is_successor(row):
        return train.LADDER[-1][0]
    return rows[rows.index(row) - 1] if rows.index(row) else "tiny"


def preset_diff(row: str) -> dict:
    """{field: (value in base_row(row), value here)} of the resolved configs."""
    prev = train.Config(**train.PRESETS[base_row(row)])
    cur = train.Config(**train.PRESETS[row])
    a, b = dataclasses.asdict(prev), dataclasses.asdict(cur)
    return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


def select_rows(spec: str) -> list[str]:
    """'1,6' or 'ladder-1-grpo,6' or '' (Table 1's six) -> row names in ladder order (7, 8: the successors)."""
    rows = ladder_rows()
    if not spec:
        return rows[: len(train.LADDER)]
    out = set()
    for part in spec.split(","):
        part = part.strip()
        if part.isdigit() and 1 <= int(part) <= len(rows):
            out.add(rows[int(part) - 1])
        elif part in rows:
            out.add(part)
        else:
            raise ValueError(f"--rows: {part!r} is neither a row number 1..{len(rows)} nor one of {rows}")
    return [r for r in rows if r in out]


def _flag(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def run_argv(row: str, seed: int, run_dir: Path, args, extra: list[str], opt_steps: int | None = None) -> list[str]:
    """train.py argv for one run: --preset ROW, base-preset values the row leaves alone, ladder flags, the
    mini-batch size that gives `opt_steps` optimizer steps per rollout step (None: the preset's), extras."""
    argv = ["--preset", row, "--seed", str(seed), "--run_dir", str(run_dir)]
    if args.preset_base != "tiny":
        for k, v in train.PRESETS[args.preset_base].items():
            if k not in train.PRESETS[row] and k not in ("run_dir", "seed"):
                argv += [f"--{k}", _flag(v)]
    for k in LADDER_FLAGS:
        v = getattr(args, k)
        if v is not None:
            argv += [f"--{k}", _flag(v)]
    if opt_steps is not None:
        group = int(_flag_value(argv + extra, row, "group_size"))
        responses = int(_flag_value(argv + extra, row, "prompts_per_step")) * group
        if responses % opt_steps or (responses // opt_steps) % group:
            raise ValueError(f"--optimizer_steps {opt_steps}: {responses} responses per rollout step do not split into "
                             f"{opt_steps} mini-batches of whole groups of {group}")
        argv += ["--mini_batch_size", str(responses // opt_steps)]
    return argv + extra


def _flag_value(argv: list[str], row: str, name: str):
    """The value train.parse_config gives field `name`: its last flag in argv (--name V or --name=V), else the
    row's preset, else the Config default (read without parsing: the config is only valid with the mini-batch size)."""
    value = train.PRESETS[row].get(name, getattr(train.Config, name))
    for i, arg in enumerate(argv):
        if arg == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
    return value


# --- running ---------------------------------------------------------------------------------------------


def run_one(row: str, seed: int, args, extra: list[str], opt_steps: int | None = None) -> dict:
    """Run (or reuse) one training run; returns its ladder record."""
    run_dir = Path(args.out) / row / (f"os{opt_steps}" if opt_steps else "") / f"s{seed}"
    argv = run_argv(row, seed, run_dir, args, extra, opt_steps)
    want = dataclasses.asdict(train.parse_config(argv))  # also validates before a subprocess starts
    meta_path = run_dir / "ladder_run.json"
    if not args.force and meta_path.exists() and (run_dir / "summary.json").exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("config") == want and meta.get("code_hash") == args.code_hash:
            print(f"[ladder] reuse {row} seed {seed} ({run_dir})", flush=True)
            return collect(row, seed, run_dir, meta["wall_s"], args.last, opt_steps)
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"}
    print(f"[ladder] run   {row} seed {seed}: python train.py {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    with open(run_dir / "train.log", "w") as log:
        proc = subprocess.run([sys.executable, str(args.code_dir / "train.py"), *argv, "--overwrite", "true"], cwd=REPO,
                              env=env, stdout=log, stderr=subprocess.STDOUT)  # rerun: replaces an older run of the row
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (run_dir / "train.log").read_text()[-3000:]
        raise RuntimeError(f"{row} seed {seed} failed (exit {proc.returncode}); log {run_dir / 'train.log'}:\n{tail}")
    meta_path.write_text(json.dumps({"argv": argv, "config": want, "wall_s": round(wall, 1), "code_hash": args.code_hash},
                                    indent=1) + "\n")
    print(f"[ladder] done  {row} seed {seed} in {wall:.0f} s", flush=True)
    return collect(row, seed, run_dir, round(wall, 1), args.last, opt_steps)


def collect(row: str, seed: int, run_dir: Path, wall: float, last: int, opt_steps: int | None = None) -> dict:
    """One run's numbers from summary.json and metrics.jsonl."""
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    k = summary.get("heldout_after/k") or summary.get("heldout/k")
    tail = metrics[-last:]

    def tail_mean(key: str):
        vals = [m[key] for m in tail if m.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    return {
        "row": row, "opt_steps": opt_steps, "seed": seed, "k": k,
        "avg_after": summary.get(f"heldout_after/avg@{k}"), "avg_before": summary.get(f"heldout/avg@{k}"),
        "samples_generated": sum(m.get("envelope/samples_generated", 0) for m in metrics),
        "samples_trained": sum(m.get("envelope/active_samples", 0) for m in metrics),
        "wall_s": wall, "train_s": summary.get("seconds"), "steps": len(metrics),
        "truncated_frac_last": tail_mean("length/truncated_frac"), "entropy_last": tail_mean("policy/entropy"),
        "clipfrac_high_last": tail_mean("policy/clipfrac_high"), "kept_frac_mean": statistics.fmean(
            [m["groups/kept_frac"] for m in metrics]) if metrics else None,
        "clipfrac_low_last": tail_mean("policy/clipfrac_low"), "length_last": tail_mean("length/mean"),
        "seq_clipfrac_low_last": tail_mean("policy/seq_clipfrac_low"),
        "seq_clipfrac_high_last": tail_mean("policy/seq_clipfrac_high"), "approx_kl_last": tail_mean("policy/approx_kl"),
        "opt_steps_mean": statistics.fmean(m["policy/optimizer_steps"] for m in metrics) if metrics else None,
        "heldout_truncated_after": summary.get("heldout_after/truncated_frac"),
    }


AVERAGED = ("samples_generated", "samples_trained", "wall_s", "truncated_frac_last", "entropy_last", "clipfrac_high_last",
            "kept_frac_mean", "clipfrac_low_last", "length_last", "seq_clipfrac_low_last", "seq_clipfrac_high_last",
            "approx_kl_last", "opt_steps_mean")


def aggregate(records: list[dict], rows: list[str], opt_steps: list) -> list[dict]:
    """One table row per (ladder row, optimizer-steps setting): means over seeds, the interval of avg@k."""
    out = []
    for n in opt_steps:
        for row in rows:
            rs = sorted((r for r in records if r["row"] == row and r["opt_steps"] == n), key=lambda r: r["seed"])
            if not rs:
                continue
            mean, lo, hi = t_interval([r["avg_after"] for r in rs])
            agg = {"row": row, "opt_steps": n, "paper_label": PAPER_LABEL[row], "paper_aime24_avg32": PAPER_AIME24.get(row),
                   "diff": {k: list(v) for k, v in preset_diff(row).items()}, "n_seeds": len(rs), "k": rs[0]["k"],
                   "avg_after_mean": mean, "avg_after_ci95": [lo, hi], "avg_after_per_seed": [r["avg_after"] for r in rs],
                   "avg_before_mean": statistics.fmean(r["avg_before"] for r in rs)}
            for key in AVERAGED:
                vals = [r[key] for r in rs if r.get(key) is not None]
                agg[key] = statistics.fmean(vals) if vals else None
            out.append(agg)
    return out


# --- report ----------------------------------------------------------------------------------------------


def _f(x, nd: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def render(rows: list[dict], args, extra: list[str], command: str) -> str:
    k = rows[0]["k"] if rows else "k"
    L = ["# The ablation ladder (paper Table 1) on this repository", "",
         f"Command: `{command}`", "",
         f"Base: `{args.preset_base}`; {args.seeds} seed(s) per row (0..{args.seeds - 1}); steps "
         f"{args.steps if args.steps is not None else 'preset'}; common flags: "
         + ", ".join(f"--{k_} {getattr(args, k_)}" for k_ in LADDER_FLAGS if getattr(args, k_) is not None)
         + (f"; extra train flags: `{' '.join(extra)}`" if extra else "") + ".",
         f"Code: git commit {args.git_commit}, frozen as source hash {args.code_hash} (the top-level "
         "*.py files and assets/tiny-base, copied to OUT/.code/ before the first run; every run of this table "
         "executed that copy).",
         f"Machine: {platform.machine()}, {os.cpu_count()} CPU(s) visible, Python {platform.python_version()}; "
         "wall times depend on the load of the machine.", "",
         "**Scale and task differ from the paper**: the paper's column is AIME 2024 avg@32 of Qwen2.5-32B after "
         "thousands of steps with 512 prompts x 16 answers each; ours is held-out avg@" f"{k} of a 1.23M-parameter "
         "policy on column addition after a few steps. Compare the direction and size of the steps between rows "
         "with their intervals, never the numbers across the two columns.", "",
         f"| row | paper (AIME24 avg@32) | opt. steps | held-out avg@{k} after (95% CI) | before | samples generated | "
         "samples trained | wall s / run | trunc. (last) | entropy (last) | length (last) | clipfrac low / high (last) | "
         "seq clipfrac low / high (last) | kept frac |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r["avg_after_ci95"]
        ci = f"{r['avg_after_mean']:.3f} [{_f(lo)}, {_f(hi)}]"
        seq = "" if r["seq_clipfrac_low_last"] is None else (
            f"{_f(r['seq_clipfrac_low_last'], 4)} / {_f(r['seq_clipfrac_high_last'], 4)}")
        L.append(f"| {r['row']} ({r['paper_label']}) | {_f(r['paper_aime24_avg32'], 0)} | {_f(r['opt_steps_mean'], 1)} | {ci} | "
                 f"{r['avg_before_mean']:.3f} | {r['samples_generated']:.0f} | {r['samples_trained']:.0f} | {r['wall_s']:.0f} | "
                 f"{_f(r['truncated_frac_last'])} | {_f(r['entropy_last'])} | {_f(r['length_last'], 1)} | "
                 f"{_f(r['clipfrac_low_last'], 4)} / {_f(r['clipfrac_high_last'], 4)} | {seq} | {_f(r['kept_frac_mean'], 2)} |")
    L += ["", f"Interval: Student-t over seeds, mean +- t(0.975, n-1) s / sqrt(n) (n/a with one seed; not clipped to "
          "[0, 1], so a bound below 0 means the seeds disagree wildly). "
          f"Per-seed values are in ladder.json. Last-steps columns average the last {args.last} rollout steps "
          "(truncation: length/truncated_frac of the training rollouts; entropy: policy/entropy, true entropy "
          "per response token, nats; length: length/mean of the training rollouts, tokens; clip fractions: "
          "policy/clipfrac_low and _high, whose meaning depends on the surrogate (docs/metrics.md \"Surrogates\"); "
          "seq clipfrac: GSPO's, per response). Opt. steps: optimizer steps per rollout step, measured "
          "(policy/optimizer_steps, mean over the run). Samples: sums over the run of envelope/samples_generated and "
          "envelope/active_samples, mean over seeds.", "", "## What each row changes (resolved presets of train.py)", ""]
    for r in dict((r["row"], r) for r in rows).values():
        diff = ", ".join(f"`{k_}`: {a!r} -> {b!r}" for k_, (a, b) in r["diff"].items())
        against = ("the tiny default (DAPO recipe)" if base_row(r["row"]) == "tiny" else
                   "row 6 (DAPO)" if is_successor(r["row"]) else "the row above")
        L.append(f"- **{r['row']}** vs {against}: {diff}")
    L += ["", "## What each row can and cannot show at this scale", ""]
    for r in dict((r["row"], r) for r in rows).values():
        L += [f"**{r['row']}** ({r['paper_label']}). {ROW_NOTES[r['row']]}", ""]
    return "\n".join(L).rstrip() + "\n"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ladder_argv, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "runs" / "ladder"), help="output directory (runs, ladder.md, ladder.json)")
    ap.add_argument("--rows", default="", help="rows to run: numbers or names, comma-separated (default Table 1's six; "
                    "7 = DAPO + CISPO, 8 = DAPO + GSPO)")
    ap.add_argument("--optimizer_steps", default="", help="optimizer steps per rollout step, comma-separated: each row runs "
                    "once per value (--mini_batch_size = responses per rollout step / value); default: the preset's")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per row (0..N-1)")
    ap.add_argument("--preset-base", dest="preset_base", default="tiny",
                    choices=sorted(p for p in train.PRESETS if p not in ladder_rows()),
                    help="preset whose values every row starts from (paper: the published run)")
    ap.add_argument("--steps", type=int, default=None, help="rollout steps per run (tiny: 20)")
    ap.add_argument("--max_response_len", type=int, default=None, help="response budget in tokens (tiny: 34)")
    ap.add_argument("--overlong_buffer", type=int, default=None, help="soft punishment buffer in tokens (tiny: 6)")
    ap.add_argument("--gen_prompts_per_round", type=int, default=None, help="prompts per generation round (tiny: 16)")
    ap.add_argument("--eval_limit", type=int, default=None, help="held-out problems (tiny: 128)")
    ap.add_argument("--eval_k", type=int, default=None, help="samples per held-out problem (train.py default 4)")
    ap.add_argument("--probe_every", type=int, default=None, help="probe-set period (tiny: 0 = off)")
    ap.add_argument("--model", default=None, help="HF model directory (train --model)")
    ap.add_argument("--data", default=None, help="training data (train --data)")
    ap.add_argument("--eval_data", default=None, help="held-out data (train --eval_data)")
    ap.add_argument("--last", type=int, default=5, help="rollout steps averaged for the end-of-run columns")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each one CPU thread)")
    ap.add_argument("--force", action="store_true", help="rerun runs whose finished output with the same config exists")
    args = ap.parse_args(ladder_argv)
    args.out = str(Path(args.out).resolve())  # runs start in the repository root, whatever the caller's directory
    if args.preset_base == "tiny":
        for k, v in TINY_DEFAULTS.items():
            if getattr(args, k) is None:
                setattr(args, k, v)
    if args.seeds < 1 or args.jobs < 1 or args.last < 1:
        ap.error("--seeds, --jobs and --last must be >= 1")
    try:
        args.opt_steps = [int(x) for x in args.optimizer_steps.split(",")] if args.optimizer_steps else [None]
    except ValueError:
        ap.error(f"--optimizer_steps must be comma-separated integers, got {args.optimizer_steps!r}")
    if any(n is not None and n < 1 for n in args.opt_steps):
        ap.error("--optimizer_steps values must be >= 1")
    return args, extra


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parse(argv)
    rows = select_rows(args.rows)
    args.code_dir, args.code_hash = snapshot_code(Path(args.out))
    args.git_commit = policy.repo_commit()
    for row in rows:  # the ladder's premise, checked before any compute is spent
        diff = set(preset_diff(row))
        if is_successor(row):  # its surrogate and (GSPO) the aggregation that surrogate requires
            if "surrogate" not in diff or diff - {"surrogate", "loss_agg"}:
                raise ValueError(f"preset {row} changes {sorted(diff)} against row 6; a successor row changes the "
                                 "surrogate and at most the aggregation it requires (train.SUCCESSORS)")
        elif row != ladder_rows()[0] and len(diff) != 1:
            raise ValueError(f"preset {row} changes {sorted(diff)} against the row above; a ladder row must "
                             "change exactly one switch (train.LADDER)")
    # seed-major, then setting: a partial ladder is usable
    jobs = [(row, seed, n) for seed in range(args.seeds) for n in args.opt_steps for row in rows]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        records = list(pool.map(lambda job: run_one(job[0], job[1], args, extra, job[2]), jobs))
    table = aggregate(records, rows, args.opt_steps)
    out = Path(args.out)
    command = "python bench/ladder.py " + " ".join(argv)
    (out / "ladder.md").write_text(render(table, args, extra, command.strip()))
    (out / "ladder.json").write_text(json.dumps({"command": command.strip(), "args": {**vars(args), "code_dir": str(args.code_dir)}, "extra_train_flags": extra,
                                                 "ci": "Student-t over seeds, 95%", "rows": table, "runs": records},
                                                indent=1) + "\n")
    print((out / "ladder.md").read_text())
    return table


if __name__ == "__main__":
    main()
