"""DAPO's four boundaries seen breaking and repaired: one pair of real train.py runs per intervention.

    OMP_NUM_THREADS=1 python bench/symptoms.py --boundary contrast --seeds 3 --out runs/symptoms
    OMP_NUM_THREADS=1 python bench/symptoms.py --boundary exploration contrast credit budget --seeds 3 --out runs/symptoms
    OMP_NUM_THREADS=1 python bench/symptoms.py --boundary contrast exploration --seeds 2 --model smollm2-135m-instruct --out runs/symptoms-smol

The documents this repository implements ask of every run "which boundary failed: exploration,
group contrast, token credit, or reward interpretation?", and read DAPO's techniques as mappings
from symptoms to mechanisms. For each boundary this script runs the same regime twice per seed,
once with the intervention off (arm `broken`) and once on (arm `repaired`), everything else equal
(the same rollout steps and mini-batch size, seed, data order and base policy; optimizer steps differ only where
dynamic sampling leaves a batch short):

  exploration  symmetric clip (--eps_high = --eps_low)    against Clip-Higher (paper 3.1)
  contrast     --dynamic_sampling false                   against true        (paper 3.2)
  credit       --loss_agg seq-mean-token-mean             against token-mean  (paper 3.3)
  budget       truncation scored as wrong (no overlong    against overlong filtering and the
               filter, no soft punishment)                soft punishment     (paper 3.4)

The regimes (PAIRS below, each with the reason it was chosen and what was measured to choose it)
are where the symptom was found to show on these machines, not the defaults: the shipped tiny base
is nearly deterministic and writes one fixed form per problem, so some pairs start from another
base built with the repository's own warm-up (tasks/tiny_base.py) at run time.

For every run it writes a train.py run directory DIR/<boundary>/<arm>-seed<N>/, runs report.py on
it (its diagnosis.json names the boundaries it saw), evaluates the final policy and the base with
eval.py on the same held-out problems and seed (DIR/<boundary>/base-eval/, RUN/eval/), and reads
the symptom metric of the pair from the run's files (bench/symptom_metrics.py). Then DIR/symptoms.json (one record per run:
boundary, arm, seed, the switches that differ, the symptom metric's name and value, report.py's
boundaries, held-out before/after with paired intervals, the resource envelope), DIR/symptoms.md
(the table), DIR/<boundary>/symptom.png (the symptom's metric per step, the arms overlaid) and
DIR/symptoms.png (every boundary run so far, one panel each).

Statistics: the symptom's difference broken - repaired per seed (the two arms of a seed share the
seed), its mean with a 95% Student-t interval over seeds (bench/ladder.py's t_interval: mean +-
t(0.975, n-1) s / sqrt(n)); held-out avg@k before/after and between the arms of a seed with
evaluation/compare.py's paired bootstrap over problems. Every seed run is in the table.

Runs execute a frozen copy of the code (bench/ladder.py's snapshot_code: DIR/.code/HASH), so edits
to the working tree while the script runs cannot mix versions. A finished run is reused only for the
same config and the same hash of the code that trains (every file snapshot_code copies but the
readers of a finished run, READERS); report.py runs again on it when a reader changed, so a change to
the diagnosis is checked on the same runs (--force reruns everything).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import ladder  # noqa: E402  (t_interval, snapshot_code)
import report  # noqa: E402  (load_run, envelope)
import train  # noqa: E402
from symptom_metrics import SYMPTOMS, mean_or_none  # noqa: E402  (the symptom of each pair, read from a finished run)
from evaluation import compare as cmp  # noqa: E402
from evaluation import diagnosis  # noqa: E402
from plumbing import policy  # noqa: E402

BOUNDARIES = ("exploration", "contrast", "credit", "budget")
ARMS = ("broken", "repaired")
DIAGNOSIS = {"exploration": "exploration", "contrast": "contrast", "credit": "credit", "budget": "reward"}  # report.py's names
TINY, SMOL = "tiny", "smollm2-135m-instruct"
READERS = ("report.py", "evaluation/diagnosis.py", "evaluation/audit.py")  # read a finished run; change no training


def code_hashes(root: Path = REPO) -> tuple[str, str]:
    """(hash of the code that trains, hash of the readers) of a checkout or a snapshot (DIR/.code/HASH).

    Over the files bench/ladder.py's snapshot copies (the root's and the code folders' *.py, the tiny
    base), a Python file by its syntax tree without docstrings (a comment or a docstring computes
    nothing), any other by its bytes; 16 hex each."""
    import ast
    import hashlib

    hs = {True: hashlib.sha256(), False: hashlib.sha256()}
    files = sorted(root.glob("*.py")) + sorted(p for d in ("plumbing", "evaluation", "tasks") for p in (root / d).glob("*.py"))
    files += sorted(f for f in (root / "assets" / "tiny-base").glob("*") if f.is_file())
    for f in files:
        name = f.relative_to(root).as_posix()
        data = f.read_bytes()
        if f.suffix == ".py":
            tree = ast.parse(data)
            for node in ast.walk(tree):
                body = getattr(node, "body", None)
                if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                        getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
            data = ast.dump(tree).encode()
        hs[name in READERS].update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return hs[False].hexdigest()[:16], hs[True].hexdigest()[:16]


_HASH_LOCK = threading.Lock()  # CPython 3.11 can raise SystemError from ast.parse run in two threads at once
# ("AST constructor recursion depth mismatch", python/cpython issue 106905): runs of a pair start side by side (--jobs)


def run_train_hash(meta: dict, out: Path) -> str | None:
    """The training-code hash of the snapshot a finished run executed (None: that snapshot is gone)."""
    code = out / ".code" / str(meta.get("code_hash"))
    with _HASH_LOCK:
        return code_hashes(code)[0] if (code / "train.py").exists() else None


@dataclass(frozen=True)
class Pair:
    """One boundary's broken/repaired pair in one regime: the flags both arms share and the switch between them."""

    boundary: str
    model: str  # TINY or SMOL
    common: dict  # train.py flags of both arms (after --preset), the regime
    broken: dict  # the intervention off
    repaired: dict  # the intervention on
    metric: str  # the symptom metric: a key of SYMPTOMS
    why: str  # the regime, and why it is this one (measured)
    preset: str = "tiny"
    base_sft_steps: int = 0  # tiny: warm-up steps of a base built at run time (tasks/tiny_base.py); 0 = the shipped base
    base_args: dict = field(default_factory=dict)  # more tasks.tiny_base flags for that base
    eval_k: int = 16  # held-out samples per problem (eval.py): avg@k, pass@k at large k, distinct answers
    eval_limit: int = 128
    long_budget: int = 0  # > 0: also evaluate the final policy at this budget, same seed (the budget pair)
    # An extras key the symptom also needs: it counts as shown only if the metric's interval excludes 0 in the expected
    # direction and some broken run's value of this key is above 0 (what the training metric alone cannot tell).
    requires: str = ""


# --- the regimes -----------------------------------------------------------------------------------------

# Each regime was found by pilot runs (docs/results.md "The four boundaries, seen" lists what was tried).
# Shared by every tiny pair: no probe set (it changes no update), the held-out pass of train.py kept small
# (eval.py measures the held-out effect on 128 problems x 16 samples instead).
TINY_COMMON = dict(probe_every=0, eval_limit=64, eval_k=4)

PAIRS: dict[tuple[str, str], Pair] = {
    ("contrast", TINY): Pair(
        "contrast", TINY, TINY_COMMON | dict(steps=20),
        broken=dict(dynamic_sampling=False), repaired=dict(dynamic_sampling=True), metric="zero_adv_share",
        base_sft_steps=240,
        why="A base stopped at 240 of the shipped base's 275 warm-up steps (`python -m tasks.tiny_base --steps 240`: "
            "the same warm-up, 35 steps earlier) is right on about 5% of training samples at top_p 1.0, so about 75% of "
            "its groups of 8 are all wrong: most groups are uniform, the regime of paper 3.2. The shipped base (40% "
            "right) has about 40% uniform groups, where the filter matters less. Without dynamic sampling those groups "
            "are trained on with advantage 0; with it, generation rounds are repeated (up to 4 of 24 prompts) until 16 "
            "mixed groups are kept. Train.py's defaults otherwise (2 optimizer steps per rollout step, lr 2e-4)."),
    ("exploration", TINY): Pair(
        "exploration", TINY, TINY_COMMON | dict(steps=30, mini_batch_size=8),
        broken=dict(eps_high=0.2), repaired=dict(eps_high=0.28), metric="entropy_last",
        base_sft_steps=275, base_args=dict(loop_share=0.2),
        why="The paper's 16 optimizer steps per rollout step (`--mini_batch_size 8` of 16 groups x 8 answers), so "
            "that the ratio leaves 1 within a rollout step and the upper clip can bind, from the credit pair's base "
            "(`--loop_share 0.2`): 0.17 nats/token at step 0 against the shipped base's 0.09, right on 30% of its "
            "training samples, and its entropy fell to 0.07 within 10 steps of the credit pair's own runs. lr 2e-4. "
            "Symmetric clip 0.2/0.2 against the paper's 0.2/0.28."),
    ("credit", TINY): Pair(
        "credit", TINY, TINY_COMMON | dict(steps=30, max_response_len=64, overlong_penalty=False),
        broken=dict(loss_agg="seq-mean-token-mean"), repaired=dict(loss_agg="token-mean"),
        metric="long_wrong_share", base_sft_steps=275, base_args=dict(loop_share=0.2),
        why="A base whose warm-up wrote 20% of its targets with one column line repeated 1-3 more times "
            "(`python -m tasks.tiny_base --loop_share 0.2`, the shipped recipe otherwise), so answers to the same "
            "problem differ in length by a loop: the shipped base never writes one. A 64-token budget truncates no "
            "loop, and the soft punishment is off in both arms, so length carries no reward of its own and only the "
            "aggregation differs. The metric is the share of wrong answers at least 1.2x as long as their group's "
            "longest right one (report.py's length/long_wrong_frac), mean over the run. Until 2026-12-07 it was the "
            "looping share of wrong answers over the last 5 steps (still in the extras as repetitive_wrong_last): "
            "0.046 [0.003, 0.090] over 3 seeds on 2026-12-03, but 0.018 [-0.000, 0.035] over 16 seeds on another "
            "CPU on 2026-12-07. The long share was then named in advance and tested on 8 fresh seeds (8-15): "
            "0.025 [0.008, 0.042]."),
    ("contrast", SMOL): Pair(
        "contrast", SMOL, dict(steps=10, max_seconds=0, eval_limit=16), preset="smollm2-arith",
        broken=dict(dynamic_sampling=False), repaired=dict(dynamic_sampling=True, max_gen_rounds=3), metric="zero_adv_share",
        eval_k=4, eval_limit=64,
        why="`--preset smollm2-arith` (rounds of 12 prompts x 8, one optimizer step per rollout step), the switch "
            "flipped, and the same budget for both arms: 10 rollout steps with no wall-clock cap (`--steps 10 "
            "--max_seconds 0`; the preset's 1380 s cap would stop the arms at different steps on a loaded machine), and "
            "the run's own held-out pass cut to 16 problems (`--eval_limit 16`: eval.py measures 64 x 4 after it). 10, "
            "not the preset's 15: a step of the broken arm (96 samples trained) was measured at 151 s and 114 s on one "
            "core (2026-12-03), so 4 runs of 15 steps, two at a time, would not fit an hour of both cores. Its base is "
            "right on 3.5% (2026-12-03) and 8.6% (2026-12-07, another CPU) of held-out samples (64 x 4 at 48 tokens), so "
            "nearly every group is all wrong. The repaired "
            "arm may draw up to 3 rounds a step to refill its batch (`--max_gen_rounds 3`; the broken arm keeps every "
            "group of its first round and never draws a second, so the flag changes nothing there): with the preset's "
            "one round it trained on 200 and 272 of 960 samples on 2026-12-03 (0-8 mixed groups a step), and report.py "
            "named its short batch. The broken arm trains on its all-wrong groups, whose only reward differences are the "
            "preset's soft overlong punishment (22-24% of their responses had an advantage, from length alone, on "
            "2026-12-07; 17-23% on 2026-12-03). The "
            "budget boundary was measured not to fit: of the base's answers truncated at 48 tokens 2.3% are right at "
            "128."),
    ("exploration", SMOL): Pair(
        "exploration", SMOL, dict(steps=8, max_seconds=0, eval_limit=16, mini_batch_size=8, micro_batch_size=8),
        preset="smollm2-arith", broken=dict(eps_high=0.2), repaired=dict(eps_high=0.28), metric="entropy_last",
        eval_k=4, eval_limit=64,
        why="`--preset smollm2-arith` with one optimizer step per 8 trained responses (`--mini_batch_size 8`: up to 12 "
            "per rollout step, the paper's 16 being more than a batch of 96 allows), so that the ratio leaves 1 and "
            "the clip can bind at all (with the preset's one step it is exactly 1). The real model is where Clip-Higher "
            "has room: of the response tokens of the preset's step-0 rollouts with a positive advantage, 57% have a "
            "probability below 1/1.2 (the only ones the upper bound can ever clip) and 34% below 0.5 (322 tokens, the "
            "contrast pair's 3-round step 0), against 4% and 2% for the shipped tiny base (5% and 2% at temperature 1.5; "
            "bench/symptom_metrics.py clip_room on 1-seed scout runs, 2026-12-07), and its "
            "entropy fell from 1.32 to 0.33 nats/token within 10 steps of the contrast pair's repaired run. A scout "
            "step measured clipfrac_high 1.1% and clipfrac_low 4.3% (against 0.1-0.3% and 1-2% in the tiny pairs). 8 "
            "rollout steps, the same for both arms (`--max_seconds 0`), so that 4 runs fit an hour of 2 cores."),
    ("budget", TINY): Pair(
        "budget", TINY, TINY_COMMON | dict(steps=30, max_response_len=40, overlong_buffer=2),
        broken=dict(overlong_filter=False, overlong_penalty=False), repaired=dict(overlong_filter=True, overlong_penalty=True),
        metric="on_track_truncated_last", base_sft_steps=275, base_args=dict(loop_share=0.2), long_budget=64,
        requires="truncated_right_at_long",
        why="The credit pair's base (20% of its warm-up targets loop: one column line repeated 1-3 more times, the "
            "answer still right) under a 40-token budget: every worked answer without a loop fits (16-38 tokens), "
            "and a loop on a two- or three-digit problem runs past 40, truncated while still right so far: answers "
            "that a larger budget completes right, in the same groups as right answers that fit. Buffer 2 (zone "
            "39-40, above every right answer without a loop), the paper-like placement. A base that sometimes "
            "answers without its working (`--direct_share 0.3`) was tried first: that warm-up reached 3% right "
            "(the shipped one 39%), since the 1.23M policy cannot add in one go, and its truncated answers were "
            "right at a larger budget 1.4% of the time: too weak a policy to learn from in 30 steps. The symptom also "
            "needs a right answer lost to the budget: some broken run's final policy has held-out samples cut at 40 "
            "tokens that are right at 64 (`truncated_right_at_long` > 0). The metric alone can separate the arms "
            "without one: on 2026-12-07 (8 seeds) it did, by the filter keeping looping rollouts alive in the "
            "repaired arm, while no held-out sample cut at 40 was right at 64 in any run."),
}


def pair_of(boundary: str, model: str) -> Pair:
    """The pair of a boundary on a model; ValueError naming the pairs there are."""
    if (boundary, model) not in PAIRS:
        have = ", ".join(f"{b} on {m}" for b, m in PAIRS)
        raise ValueError(f"--boundary {boundary} --model {model}: no pair is defined for it (defined: {have})")
    return PAIRS[(boundary, model)]


# --- running ---------------------------------------------------------------------------------------------


def _flag(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _flags(d: dict) -> list[str]:
    return [x for k, v in d.items() for x in (f"--{k}", _flag(v))]


def base_dir(pair: Pair, args) -> Path:
    """The base policy's directory: the shipped one, or one built with tasks/tiny_base.py (cached by its flags)."""
    if pair.model != TINY or not pair.base_sft_steps:
        return Path(pair.model) if pair.model != TINY else REPO / "assets" / "tiny-base"
    name = f"sft{pair.base_sft_steps}" + "".join(f"-{k}{v}" for k, v in sorted(pair.base_args.items()))
    out = Path(args.out) / ".bases" / name
    if not (out / "build.json").exists():
        cmd = [sys.executable, "-m", "tasks.tiny_base", "--out", str(out), "--steps", str(pair.base_sft_steps),
               *_flags(pair.base_args)]
        print(f"[symptoms] build the base: {' '.join(cmd[1:])}", flush=True)
        _run(cmd, Path(args.out) / ".bases" / f"{name}.log", cwd=args.code_dir)
    return out


def _run(cmd: list[str], log: Path, cwd: Path) -> float:
    """Run one command (nice'd, one torch thread), stdout+stderr to log; returns its wall seconds. RuntimeError on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(cwd)}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed (exit {proc.returncode}); log {log}:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - t0


def train_argv(pair: Pair, arm: str, seed: int, run_dir: Path, base: Path, args) -> list[str]:
    """train.py argv of one arm: --preset, the regime, the arm's switch, then --steps/extra flags of the command line."""
    model = [] if pair.model != TINY or not pair.base_sft_steps else ["--model", str(base)]
    common = dict(pair.common) | ({"steps": args.steps} if args.steps else {})
    return (["--preset", pair.preset, *model, *_flags(common), *_flags(getattr(pair, arm)), "--seed", str(seed),
             "--run_dir", str(run_dir)] + args.extra)


def eval_argv(model: str, cfg: dict, pair: Pair, out: Path, budget: int = 0) -> list[str]:
    """eval.py argv on the run's held-out problems and settings (its --eval_temperature, --eval_top_p), seed 0,
    k = pair.eval_k, no greedy pass."""
    return ["eval.py", "--model", model, "--data", cfg["eval_data"], "--task", cfg["task"], "--task_args", cfg["task_args"],
            "--max_new_tokens", str(budget or cfg["max_response_len"]), "--instruction", cfg["instruction"],
            "--temperature", str(cfg["eval_temperature"]), "--top_p", str(cfg["eval_top_p"]),
            "--verifier", cfg["verifier"], "--k", str(pair.eval_k), "--limit", str(pair.eval_limit), "--seed", "0",
            "--greedy", "false", "--out", str(out)]


def run_one(pair: Pair, arm: str, seed: int, base: Path, args) -> dict:
    """Train (or reuse) one arm of one seed, run report.py and eval.py on it, and read its symptom."""
    run_dir = Path(args.out) / pair.boundary / f"{arm}-seed{seed}"
    argv = train_argv(pair, arm, seed, run_dir, base, args)
    want = dataclasses.asdict(train.parse_config(argv))  # also validates before any compute is spent
    meta_path = run_dir / "symptoms_run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if (args.force or meta.get("config") != want or not (run_dir / "summary.json").exists()
            or run_train_hash(meta, Path(args.out)) != args.train_hash):
        print(f"[symptoms] run   {pair.boundary} {arm} seed {seed}: python train.py {' '.join(argv)}", flush=True)
        wall = _run([sys.executable, "train.py", *argv], run_dir.parent / f"{arm}-seed{seed}.train.log", args.code_dir)
        meta = {"argv": argv, "config": want, "wall_s": round(wall, 1), "code_hash": args.code_hash}
        for sub in ("report", "eval", "eval-long"):  # whatever an earlier run of this directory left
            for f in sorted((run_dir / sub).glob("*")) if (run_dir / sub).is_dir() else []:
                f.unlink()
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        print(f"[symptoms] done  {pair.boundary} {arm} seed {seed} in {wall:.0f} s", flush=True)
    stamp = run_dir / "report" / "readers_hash.txt"
    if not stamp.exists() or stamp.read_text() != args.readers_hash or not (run_dir / "report" / "diagnosis.json").exists():
        _run([sys.executable, "report.py", str(run_dir)], run_dir / "report.log", args.code_dir)
        stamp.write_text(args.readers_hash)
    cfg = json.loads((run_dir / "config.json").read_text())["config"]
    evals = {}
    for sub, budget in (("eval", 0), ("eval-long", pair.long_budget)):
        if sub == "eval-long" and not budget:
            continue
        if not (run_dir / sub / "report.json").exists():
            _run([sys.executable, *eval_argv(str(run_dir), cfg, pair, run_dir / sub, budget)], run_dir / f"{sub}.log", args.code_dir)
        evals[sub] = json.loads((run_dir / sub / "report.json").read_text())
    return collect(pair, arm, seed, run_dir, meta["wall_s"], evals)


def base_eval(pair: Pair, base: Path, cfg: dict, args) -> dict:
    """eval.py on the base policy with the runs' held-out settings (once per boundary)."""
    out = Path(args.out) / pair.boundary / "base-eval"
    model = pair.model if pair.model != TINY else str(base)
    if not (out / "report.json").exists():
        _run([sys.executable, *eval_argv(model, cfg, pair, out)], out.parent / "base-eval.log", args.code_dir)
    return json.loads((out / "report.json").read_text())


def collect(pair: Pair, arm: str, seed: int, run_dir: Path, wall: float, evals: dict) -> dict:
    """One run's record: the symptom, report.py's verdict, held-out, the envelope."""
    run = report.load_run(run_dir)
    run["rollouts"] = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines() if line.strip()]
    run["evals"] = evals
    fn, what, _ = SYMPTOMS[pair.metric]
    value, steps, series, extras = fn(run)
    diag = json.loads((run_dir / "report" / "diagnosis.json").read_text())
    findings = next(iter(diag.values()))
    env = report.envelope({**run, "rollouts": run["rollouts"]})
    k = pair.eval_k
    return {"boundary": pair.boundary, "model": pair.model, "arm": arm, "seed": seed, "run_dir": str(run_dir),
            "switches": getattr(pair, arm), "metric": pair.metric, "metric_means": what, "value": value, "extras": extras,
            "series": {"steps": steps, "values": series},
            "diagnosis": sorted({f["boundary"] for f in findings}),
            "diagnosis_findings": [{"boundary": f["boundary"], "severity": f["severity"], "message": f["message"]}
                                   for f in findings],
            "names_boundary": DIAGNOSIS[pair.boundary] in {f["boundary"] for f in findings},
            f"heldout_avg@{k}": evals["eval"]["metrics"][f"avg@{k}"], f"heldout_pass@{k}": evals["eval"]["metrics"][f"pass@{k}"],
            "heldout_distinct_answers": evals["eval"]["metrics"].get("distinct_answers"),
            "envelope": env | {"wall_s_command": wall,
                               "optimizer_steps": int(sum(m.get("policy/optimizer_steps", 0) for m in run["metrics"]))}}


# --- report.py's test fixtures ------------------------------------------------------------------------------

# What evaluation/diagnosis.py reads of a run: these metrics of every step (and verifier/* counts), these config fields.
FIXTURE_METRICS = ("step", "policy/entropy", "policy/clipfrac_high", "policy/clipfrac_low", "groups/all_correct_frac",
                   "groups/all_wrong_frac", "groups/kept_frac", "groups/kept", "groups/gen_rounds", "groups/exhausted", "length/mean",
                   "length/correct_mean", "length/wrong_mean", "length/truncated_frac", "length/truncated_frac_wrong",
                   "length/long_wrong_frac")  # the last one derived from rollouts.jsonl, as report.py does
FIXTURE_CONFIG = ("eps_low", "eps_high", "dynamic_sampling", "max_gen_rounds", "prompts_per_step", "loss_agg", "overlong_filter",
                  "overlong_penalty", "max_response_len", "overlong_buffer")


def export_fixture(record: dict, shown: bool, out: Path, tag: str = "") -> Path:
    """A real run's history trimmed to what the diagnosis reads, as tests/fixtures/symptoms/<boundary>-[smollm2-][TAG-]<arm>-seed<N>.json:
    {"boundary", "arm", "seed", "model", "regime", "diagnosis_boundary", "symptom_shown", "source", "config": {...},
    "metrics": [...]}. shown: whether its pair showed the symptom (summarize's "shown": the difference's interval
    excludes 0 in the expected direction, and the pair's `requires` holds). tag: names a regime run with extra train.py
    flags, or the same regime trained again elsewhere (--fixtures_tag), kept apart from the pair's own."""
    run_dir = Path(record["run_dir"])
    cfg = json.loads((run_dir / "config.json").read_text())["config"]
    run = report.load_run(run_dir)
    rows = diagnosis.with_rollout_metrics(run["metrics"], run["rollouts"])
    keep = lambda k: k in FIXTURE_METRICS or k.startswith("verifier/")  # noqa: E731
    rows = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in m.items() if keep(k)} for m in rows]
    doc = {"boundary": record["boundary"], "arm": record["arm"], "seed": record["seed"], "model": record["model"], "regime": tag,
           "diagnosis_boundary": DIAGNOSIS[record["boundary"]], "symptom_shown": shown,
           "source": " ".join(["python bench/symptoms.py --boundary", record["boundary"],
                               *([] if record["model"] == TINY else ["--model", record["model"]]),
                               *(["--", *record["extra_flags"]] if record.get("extra_flags") else []),
                               f"(run {run_dir.parent.name}/{run_dir.name})"]),
           "config": {k: cfg[k] for k in FIXTURE_CONFIG}, "metrics": rows}
    path = out / (f"{record['boundary']}-{'' if record['model'] == TINY else 'smollm2-'}{tag + '-' if tag else ''}"
                  f"{record['arm']}-seed{record['seed']}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return path


# --- statistics and the table ------------------------------------------------------------------------------


def summarize(pair: Pair, records: list[dict], base_report: dict) -> dict:
    """Per pair: each arm's values, the per-seed difference broken - repaired with its t-interval, report.py's
    verdicts, and held-out avg@k before/after and between the arms (paired bootstrap over problems)."""
    k = pair.eval_k
    by = {(r["arm"], r["seed"]): r for r in records}
    seeds = sorted({r["seed"] for r in records if ("broken", r["seed"]) in by and ("repaired", r["seed"]) in by})
    diffs = [by[("broken", s)]["value"] - by[("repaired", s)]["value"] for s in seeds
             if by[("broken", s)]["value"] is not None and by[("repaired", s)]["value"] is not None]
    mean, lo, hi = ladder.t_interval(diffs) if diffs else (None, None, None)
    direction = SYMPTOMS[pair.metric][2]
    out = {"boundary": pair.boundary, "model": pair.model, "metric": pair.metric, "metric_means": SYMPTOMS[pair.metric][1],
           "direction": "broken higher" if direction > 0 else "broken lower", "seeds": seeds,
           "broken": [by[("broken", s)]["value"] for s in seeds], "repaired": [by[("repaired", s)]["value"] for s in seeds],
           "diff_per_seed": diffs, "diff_mean": mean, "diff_ci95": [lo, hi],
           "excludes_zero": lo is not None and (lo > 0 or hi < 0),
           "in_expected_direction": mean is not None and mean * direction > 0,
           "requires": pair.requires, "requires_broken": [by[("broken", s)]["extras"].get(pair.requires) for s in seeds
                                                         ] if pair.requires else [],
           "broken_named": [by[("broken", s)]["names_boundary"] for s in seeds],
           "repaired_named": [by[("repaired", s)]["names_boundary"] for s in seeds], "heldout": {}}
    out["shown"] = out["excludes_zero"] and out["in_expected_direction"] and (
        not pair.requires or any(v is not None and v > 0 for v in out["requires_broken"]))
    for s in seeds:
        for arm in ARMS:
            rep = json.loads((Path(by[(arm, s)]["run_dir"]) / "eval" / "report.json").read_text())
            out["heldout"][f"{arm}-seed{s}"] = _paired(cmp.compare(rep, base_report, n_boot=2000, level=0.95, seed=0), k)
        for arm in ARMS:  # what the held-out gain cost: per optimizer step and per 1000 generated samples
            gain, env = out["heldout"][f"{arm}-seed{s}"][f"avg@{k}"]["diff"], by[(arm, s)]["envelope"]
            out["heldout"][f"{arm}-seed{s}"]["gain"] = {"per_optimizer_step": gain / max(env.get("optimizer_steps", 0), 1),
                                                        "per_1000_samples": 1000 * gain / max(env["samples_generated"], 1)}
        a = json.loads((Path(by[("broken", s)]["run_dir"]) / "eval" / "report.json").read_text())
        b = json.loads((Path(by[("repaired", s)]["run_dir"]) / "eval" / "report.json").read_text())
        out["heldout"][f"broken-minus-repaired-seed{s}"] = _paired(cmp.compare(a, b, n_boot=2000, level=0.95, seed=0), k)
    return out


def _paired(res: dict, k: int) -> dict:
    keep = (f"avg@{k}", f"pass@{k}", "distinct_answers", "tokens_per_problem")
    return {m: {x: round(v, 4) if isinstance(v, float) else v for x, v in res["metrics"][m].items()} for m in keep
            if m in res["metrics"]}


def _f(x, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _shown_cell(s: dict) -> str:
    """The table's "excludes 0" cell: yes / no, and where the pair's `requires` failed, why it is not shown anyway."""
    if not s["excludes_zero"]:
        return "no"
    if s.get("requires") and not s.get("shown", True):
        return f"yes, not shown: no broken run has {s['requires']} > 0"
    return "yes"


def render(summaries: list[dict], records: list[dict]) -> str:
    """symptoms.md: how each pair was made, one table row per run, then one per pair (difference, interval, verdicts)."""
    L = ["# DAPO's four boundaries, seen", "", f"Machine: {os.cpu_count()} CPU(s) visible (shared: wall times depend on "
         "the load, printed per pair).", "", "| boundary | command | date | git commit | source hash (training code, "
         "readers) | rollout steps | load average at the end |", "|---|---|---|---|---|---|---|"]
    L += [f"| {s['boundary']} | `{s.get('command', '-')}` | {s.get('date', '-')} | {s.get('git_commit', '-')} | "
          f"{s.get('code_hash', '-')} ({s.get('train_hash', '-')}, {s.get('readers_hash', '-')}) | {s.get('steps', '-')} | "
          f"{' '.join(map(str, s.get('load_avg_end', [])))} |" for s in summaries]
    L += ["", "## Every run", "",
         "| boundary | arm | seed | switch | symptom metric | value | report.py names | held-out avg@k before -> after "
         "(paired 95% CI) | gain per optimizer step / per 1000 samples | wall s | optimizer steps | samples generated | "
         "active samples | trained tokens | generated tokens | peak GiB |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (BOUNDARIES.index(r["boundary"]), r["seed"], r["arm"])):
        s = next(x for x in summaries if x["boundary"] == r["boundary"])
        h = s["heldout"].get(f"{r['arm']}-seed{r['seed']}", {})
        avg = next((v for m, v in h.items() if m.startswith("avg@")), None)
        held = "-" if not avg else f"{avg['b']:.3f} -> {avg['a']:.3f} ({avg['diff']:+.3f} [{avg['lo']:+.3f}, {avg['hi']:+.3f}])"
        g = h.get("gain", {})
        e = r["envelope"]
        L.append(f"| {r['boundary']} | {r['arm']} | {r['seed']} | {_switch(r['switches'])} | {r['metric']} | {_f(r['value'])} | "
                 f"{', '.join(r['diagnosis']) or 'healthy'} | {held} | {_f(g.get('per_optimizer_step'), 4)} / "
                 f"{_f(g.get('per_1000_samples'), 4)} | {_f(e['wall_s_command'], 0)} | {e.get('optimizer_steps', '-')} | "
                 f"{e['samples_generated']} | "
                 f"{e['active_samples']} | {e['trained_tokens']} | {e['generated_tokens']} | {_f(e['peak_memory_gb'], 2)} |")
    L += ["", "## Per pair", "", "| boundary | metric | broken (per seed) | repaired (per seed) | broken - repaired, mean "
          "[95% t-interval over seeds] | excludes 0 | report.py names it: broken / repaired | avg@k broken - repaired "
          "per seed (paired 95% CI) |", "|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        lo, hi = s["diff_ci95"]
        arms = "; ".join(_fmt_pair(v) for key, h in s["heldout"].items() if key.startswith("broken-minus")
                         for m, v in h.items() if m.startswith("avg@"))
        L.append(f"| {s['boundary']} | {s['metric']}: {s['metric_means']} ({s['direction']} expected) | "
                 f"{', '.join(_f(v) for v in s['broken'])} | {', '.join(_f(v) for v in s['repaired'])} | "
                 f"{_f(s['diff_mean'])} [{_f(lo)}, {_f(hi)}] | {_shown_cell(s)} | "
                 f"{sum(s['broken_named'])}/{len(s['seeds'])} / {sum(s['repaired_named'])}/{len(s['seeds'])} | {arms} |")
    L += ["", "Interval over seeds: Student-t, mean +- t(0.975, n-1) s / sqrt(n) of the per-seed differences (n/a with one "
          "seed). Held-out: eval.py on the same problems and sampling seed, evaluation/compare.py's paired bootstrap over "
          "problems (2000 resamples). Envelope: report.py's (sums over steps of envelope/*; generated tokens from "
          "rollouts.jsonl; peak resident memory); wall s: the train.py command, measured around it."]
    for s in summaries:
        pair = pair_of(s["boundary"], s["model"])
        L += ["", f"### {s['boundary']} ({s['model']})", "", pair.why, "",
              f"Both arms: `--preset {pair.preset} {' '.join(_flags(pair.common))}`" + (
                  f" (run here with `--steps {s['steps']}`)" if s.get("steps") not in (None, pair.common.get("steps")) else "")
              + (f", and after `--` for both arms `{' '.join(s['extra_flags'])}`" if s.get("extra_flags") else "")
              + (f", base built by `python -m tasks.tiny_base --steps {pair.base_sft_steps} {' '.join(_flags(pair.base_args))}`"
                 if pair.base_sft_steps else "") + f"; broken `{' '.join(_flags(pair.broken))}`, repaired "
              f"`{' '.join(_flags(pair.repaired))}`.", "", "![symptom](" + f"{s['boundary']}/symptom.png)"]
    return "\n".join(L) + "\n"


def _switch(d: dict) -> str:
    return " ".join(_flags(d))


def _fmt_pair(v: dict) -> str:
    return f"{v['diff']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}]"


def plot(boundaries: list[str], records: list[dict], path: Path, title: str = "") -> None:
    """The symptom metric per rollout step, every run a thin line, each arm's mean over seeds a thick one; one panel per boundary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(boundaries), figsize=(4.6 * len(boundaries), 3.4), squeeze=False)
    for ax, b in zip(axes[0], boundaries):
        rs = [r for r in records if r["boundary"] == b]
        for arm, colour in zip(ARMS, ("C3", "C0")):
            lines = [r["series"] for r in rs if r["arm"] == arm]
            for ln in lines:
                ax.plot(ln["steps"], [v if v is not None else float("nan") for v in ln["values"]], color=colour, alpha=0.3, lw=0.8)
            if lines:
                steps = sorted(set.intersection(*(set(ln["steps"]) for ln in lines)))
                mean = [mean_or_none([dict(zip(ln["steps"], ln["values"])).get(s) for ln in lines]) for s in steps]
                ax.plot(steps, [m if m is not None else float("nan") for m in mean], color=colour, lw=2,
                        label=f"{arm} ({_switch(rs[0]['switches'] if arm == rs[0]['arm'] else next(r['switches'] for r in rs if r['arm'] == arm))})")
        ax.set_title(f"{b}: {rs[0]['metric']}" if rs else b, fontsize=9)
        ax.set_xlabel("rollout step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --- command line ----------------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boundary", nargs="+", required=True, choices=BOUNDARIES, help="the pair(s) to run")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per arm (0..N-1)")
    ap.add_argument("--out", default=str(REPO / "runs" / "symptoms"), help="output directory")
    ap.add_argument("--model", default=TINY, choices=(TINY, SMOL), help="the policy: the tiny task's, or SmolLM2 (its preset)")
    ap.add_argument("--steps", type=int, default=0, help="rollout steps per run (0: the pair's)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (the two arms of a seed side by side)")
    ap.add_argument("--force", action="store_true", help="rerun finished runs")
    ap.add_argument("--fixtures", default="", help="also write each run's trimmed history here (report.py's tests: "
                    "tests/fixtures/symptoms)")
    ap.add_argument("--fixtures_tag", default="", help="a name for a regime run with extra train.py flags after `--`, "
                    "or for the same regime trained again on another machine (its fixtures are kept apart from the "
                    "pair's own: <boundary>-[smollm2-]TAG-<arm>-seed<N>.json)")
    args = ap.parse_args(own)
    if args.seeds < 1 or args.jobs < 1 or args.steps < 0:
        ap.error("--seeds and --jobs must be >= 1, --steps >= 0")
    if args.fixtures and extra and not re.fullmatch(r"[a-z0-9.]+", args.fixtures_tag):
        ap.error("--fixtures with train.py flags after `--`: give the regime a --fixtures_tag (letters, digits, dots), so "
                 "its fixtures do not replace the pair's own")
    args.extra, args.out = extra, str(Path(args.out).resolve())
    return args


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    pairs = [pair_of(b, args.model) for b in args.boundary]
    out = Path(args.out)
    have = json.loads((out / "symptoms.json").read_text())["pairs"] if (out / "symptoms.json").exists() else {}
    for pair in pairs:  # DIR/<boundary>/<arm>-seed<N>/ of another model would be overwritten
        if have.get(pair.boundary, {}).get("model", pair.model) != pair.model:
            print(f"error: --out {args.out} holds the {pair.boundary} pair on {have[pair.boundary]['model']}; give --model "
                  f"{pair.model} another --out (e.g. runs/symptoms-smol)", file=sys.stderr)
            raise SystemExit(2)
    args.code_dir, args.code_hash = ladder.snapshot_code(out)
    args.train_hash, args.readers_hash = code_hashes()
    args.git_commit = policy.repo_commit()
    command = "python bench/symptoms.py " + " ".join(argv)
    done_pairs = {}
    for pair in pairs:
        base = base_dir(pair, args)
        jobs = [(arm, s) for s in range(args.seeds) for arm in ARMS]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            records = list(pool.map(lambda j: run_one(pair, j[0], j[1], base, args), jobs))
        cfg = json.loads((Path(records[0]["run_dir"]) / "config.json").read_text())["config"]
        summary = summarize(pair, records, base_eval(pair, base, cfg, args))
        summary |= {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "git_commit": args.git_commit, "code_hash": args.code_hash, "train_hash": args.train_hash,
                    "readers_hash": args.readers_hash, "load_avg_end": [round(x, 2) for x in os.getloadavg()],
                    "steps": records[0]["envelope"]["rollout_steps"], "extra_flags": args.extra}
        if args.fixtures:
            for r in records:
                export_fixture(r | {"extra_flags": args.extra}, summary["shown"],
                               Path(args.fixtures), args.fixtures_tag)
        plot([pair.boundary], records, out / pair.boundary / "symptom.png")
        done_pairs[pair.boundary] = (summary, records)
    return write_outputs(out, done_pairs)


def write_outputs(out: Path, done_pairs: dict) -> dict:
    """Merge this invocation's pairs into DIR/symptoms.json (another invocation may be writing other boundaries:
    the file is read and written under a lock), then rewrite symptoms.md and symptoms.png from all of it. A
    boundary run again replaces its runs and its summary whole."""
    import fcntl

    with open(out / ".symptoms.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = out / "symptoms.json"
        state = json.loads(path.read_text()) if path.exists() else {"runs": {}, "pairs": {}}
        for b, (summary, records) in done_pairs.items():
            state["runs"] = {k: v for k, v in state["runs"].items() if v["boundary"] != b}
            state["runs"] |= {f"{b}/{r['arm']}-seed{r['seed']}": r for r in records}
            state["pairs"][b] = summary
        path.write_text(json.dumps(state, indent=1) + "\n")
        runs = list(state["runs"].values())
        done = [b for b in BOUNDARIES if b in state["pairs"]]
        plot(done, runs, out / "symptoms.png")
        (out / "symptoms.md").write_text(render([state["pairs"][b] for b in done], runs))
    print((out / "symptoms.md").read_text())
    return state


if __name__ == "__main__":
    main()
