"""Peak memory of the log-prob/entropy pass: from hidden states (ours) against today's logits routine.

    OMP_NUM_THREADS=1 python bench/bench_logprob_memory.py routine   # B=2, T=2048, D=896, V=49152 and 151936
    OMP_NUM_THREADS=1 python bench/bench_logprob_memory.py step      # one train.py step, micro-batch 64 vs 8
    OMP_NUM_THREADS=1 python bench/bench_logprob_memory.py step --repo OTHER_CHECKOUT   # the same on other code

routine: each case (vocabulary x method x repeat) runs in a fresh subprocess, so no allocator
cache or earlier peak leaks between cases. Inside it:
  1. the inputs are allocated: hidden states (B*T, D) and an output-head weight (V, D), fp32,
     seeded randn (the weight scaled so that the logits have a standard deviation of about 3),
     tokens (B*T,), upstream weights w (B*T,);
  2. the resident set is read (psutil: torch + the inputs);
  3. the method runs: log-probs of the tokens, the true entropy, and the backward of sum(w * logp),
     which fills the gradients of the hidden states and of the weight;
  4. ru_maxrss is read (the process's peak resident set): peak = (4) - (2), the memory the method needed on top of its inputs
     at its worst moment, the two gradients included. "working" = peak - the two gradients
     (B*T*D + V*D floats), which every method must return.
Both peaks are printed as x the fp32 logits (B*T*V*4 bytes). Methods:
  ours   forward.token_logprobs(hidden, weight, tokens, chunk_size=C): chunks of C positions,
         recomputed in backward; the logits never exist.
  today  the routine this replaced: logits = hidden @ weight^T through autograd (what the model's
         output head returned), then the chunked log_softmax over them (_LogitsTokenLogprob below,
         as it was in dapo.py).
Equality: both save logp, entropy and the gradient rows of 64 fixed positions plus 64 fixed rows
of the weight gradient; the parent prints their differences, and each against float64.

step: one rollout step of `python train.py` on a random Qwen2-style model with a 65,536-token
vocabulary (hidden 128, 2 layers, 4 heads, tied embeddings; the tiny tokenizer, which decodes ids
past its 82 as nothing) with --dynamic_sampling false --sampler_logprobs false --mini_batch_size 64
--logprob_chunk 256 --eval_data '' --probe_every 0, once with --micro_batch_size 64 and once with 8,
each in a fresh process whose peak resident set (ru_maxrss, what GNU time reports) is printed.
The 56 extra responses of the larger micro-batch would hold 56 x 49 x 65,536 fp32 logits
(0.67 GiB) in a logits routine (49 = the 48 response positions + 1 as the model's head returned
them); target: they raise the peak by at most 0.25x that. --repo runs train.py of another checkout
(for example one of an older commit) for the anchor.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from common import SCRATCH_ROOT, machine_line, title_line

REPO = Path(__file__).resolve().parents[1]
CHECK_ROWS = 64
STEP_VOCAB, STEP_MICRO = 65536, (64, 8)
STEP_ARGS = ["--steps", "1", "--dynamic_sampling", "false", "--sampler_logprobs", "false", "--mini_batch_size", "64",
             "--logprob_chunk", "256", "--eval_data", "", "--probe_every", "0"]


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


# --- routine: one case in a fresh process -------------------------------------------------------------


def _logits_routine():
    """Today's (replaced) routine: log_softmax(logits / T)[token] and the entropy, chunked over rows of the logits."""
    import torch

    class _LogitsTokenLogprob(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, tokens, chunk_size):  # logits (N, V), tokens (N,); temperature 1
            N = logits.shape[0]
            logp = torch.empty(N, dtype=torch.float32)  # (N,)
            entropy = torch.empty(N, dtype=torch.float32)  # (N,)
            for s in range(0, N, chunk_size):
                z = logits[s : s + chunk_size].to(torch.float32, copy=True)  # (n, V) the buffer
                z.sub_(z.amax(dim=1, keepdim=True))
                picked = z.gather(1, tokens[s : s + chunk_size, None]).squeeze(1)  # (n,)
                z.exp_()
                sum_e = z.sum(dim=1)  # (n,)
                lse = sum_e.log()  # (n,)
                logp[s : s + chunk_size] = picked - lse
                entropy[s : s + chunk_size] = lse - torch.special.xlogy(z, z, out=z).sum(dim=1) / sum_e
            ctx.save_for_backward(logits, tokens)
            ctx.chunk_size = chunk_size
            ctx.mark_non_differentiable(entropy)
            return logp, entropy

        @staticmethod
        def backward(ctx, grad_logp, _grad_entropy):
            logits, tokens = ctx.saved_tensors
            grad = torch.empty_like(logits)  # (N, V)
            for s in range(0, logits.shape[0], ctx.chunk_size):
                g = logits[s : s + ctx.chunk_size].to(torch.float32, copy=True)  # (n, V)
                g.sub_(g.amax(dim=1, keepdim=True)).exp_()
                g.div_(g.sum(dim=1, keepdim=True)).neg_()
                g.scatter_add_(1, tokens[s : s + ctx.chunk_size, None], torch.ones_like(g[:, :1]))
                g.mul_(grad_logp[s : s + ctx.chunk_size, None])
                grad[s : s + ctx.chunk_size] = g
            return grad, None, None

    return _LogitsTokenLogprob


def routine_worker(method: str, N: int, D: int, V: int, chunk: int, out: Path) -> dict:
    import numpy as np
    import psutil
    import torch

    sys.path.insert(0, str(REPO))
    from plumbing import forward

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, D, generator=g).requires_grad_(True)  # (N, D)
    weight = (torch.randn(V, D, generator=g) * (3.0 / D**0.5)).requires_grad_(True)  # (V, D): logits ~ 3 randn
    tokens = torch.randint(0, V, (N,), generator=g)  # (N,)
    w = torch.rand(N, generator=g)  # (N,) upstream gradient weights
    rows, wrows = torch.randperm(N, generator=g)[:CHECK_ROWS], torch.randperm(V, generator=g)[:CHECK_ROWS]
    logits_bytes, grads_bytes = N * V * 4, (N * D + V * D) * 4

    base = psutil.Process().memory_info().rss  # not ru_maxrss: importing torch may have peaked higher
    if method == "ours":
        logp, ent = forward.token_logprobs(hidden, weight, tokens, chunk_size=chunk)  # (N,), (N,)
    else:
        logits = hidden @ weight.t()  # (N, V)
        logp, ent = _logits_routine().apply(logits, tokens, chunk)  # (N,), (N,)
    (logp * w).sum().backward()
    peak = _maxrss_bytes() - base
    res = {"method": method, "V": V, "chunk": chunk, "peak_x": peak / logits_bytes,
           "working_x": (peak - grads_bytes) / logits_bytes, "logits_bytes": logits_bytes}
    # float64 on the check rows: whose fp32 rounding is where
    h64, w64 = hidden.detach()[rows].double().requires_grad_(True), weight.detach().double().requires_grad_(True)
    lp64 = torch.log_softmax(h64 @ w64.t(), -1)  # (64, V)
    v64 = lp64.gather(1, tokens[rows, None]).squeeze(1)  # (64,)
    (v64 * w[rows].double()).sum().backward()
    res.update(fp64_err_logp=float((logp.detach()[rows].double() - v64.detach()).abs().max()),
               fp64_err_entropy=float((ent[rows].double() + (lp64.exp() * lp64).sum(-1).detach()).abs().max()),
               fp64_err_dh=float((hidden.grad[rows].double() - h64.grad).abs().max()))
    np.savez(out, logp=logp.detach().numpy(), ent=ent.numpy(), dh=hidden.grad[rows].numpy(),
             dw=weight.grad[wrows].numpy())
    return res


def run_routine(args) -> None:
    import numpy as np

    N = args.B * args.T
    print(f"# settings: B={args.B} T={args.T} (N={N} positions) D={args.D}, fp32, chunk sizes (ours) {args.chunk}, "
          f"today's routine with chunk {args.chunk[0]}, repeats={args.repeats}, one fresh subprocess per case")
    print("# peak = ru_maxrss after the method - the resident set after allocating its inputs (gradients included); "
          "working = peak - the two gradients (N*D + V*D floats); x = / the fp32 logits (N*V*4 bytes)")
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"{'V':>7} {'method':<12} {'logits GiB':>10} {'peak x (med, range)':>21} {'working x':>9}  equality")
    met = True
    for V in args.vocab:
        cases = [("ours", c) for c in args.chunk] + [("today", args.chunk[0])]
        results = {c: [] for c in cases}
        for rep in range(args.repeats):  # alternate methods within each repeat
            for method, chunk in cases:
                cmd = [sys.executable, __file__, "routine", "--worker", method, "--B", str(args.B), "--T", str(args.T),
                       "--D", str(args.D), "--vocab", str(V), "--chunk", str(chunk),
                       "--out", str(scratch / f"{method}{chunk}_{V}_{rep}.npz")]
                p = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if p.returncode != 0:
                    raise RuntimeError(f"worker {method} V={V} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
                results[(method, chunk)].append(json.loads(p.stdout.strip().splitlines()[-1]))
        ref = np.load(scratch / f"today{args.chunk[0]}_{V}_0.npz")
        for (method, chunk), rs in results.items():
            xs, r0 = [r["peak_x"] for r in rs], rs[0]
            eq = ""
            if method == "ours":
                mine = np.load(scratch / f"ours{chunk}_{V}_0.npz")
                eq = "vs today: " + " ".join(f"{k} {float(np.abs(mine[k] - ref[k]).max()):.1e}"
                                             for k in ("logp", "ent", "dh", "dw")) + "; "
                if chunk <= 256 and V == max(args.vocab):
                    met &= max(r["working_x"] for r in rs) <= 0.25
            eq += (f"vs float64 ({CHECK_ROWS} rows): logp {r0['fp64_err_logp']:.1e} entropy {r0['fp64_err_entropy']:.1e} "
                   f"dh {r0['fp64_err_dh']:.1e}")
            name = f"{method} c={chunk}"
            print(f"{V:>7} {name:<12} {r0['logits_bytes'] / 2**30:>10.2f} {statistics.median(xs):>8.2f} "
                  f"({min(xs):.2f}-{max(xs):.2f}){'':>4} {statistics.median([r['working_x'] for r in rs]):>9.2f}  {eq}",
                  flush=True)
    print(f"target (ours, chunk <= 256, V={max(args.vocab)}: working memory <= 0.25x the logits): "
          f"{'MET' if met else 'NOT MET'}")


# --- step: one train.py step in a fresh process ----------------------------------------------------------


def make_step_model(out: Path) -> None:
    """The random Qwen2-style model of `step` (seed 0) with the tiny tokenizer, saved in HF format."""
    import shutil

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    conf = Qwen2Config(vocab_size=STEP_VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
                       eos_token_id=1, pad_token_id=0, bos_token_id=None)
    Qwen2ForCausalLM(conf).save_pretrained(out, safe_serialization=True)
    tiny_dir = REPO / "assets" / "tiny-base"
    for f in tiny_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)


def run_step(args) -> None:
    scratch = Path(args.scratch).resolve() / "step"
    model_dir = scratch / "model"
    if not (model_dir / "config.json").exists():
        make_step_model(model_dir)
    repo = Path(args.repo).resolve()
    print(f"# settings: train.py of {'this checkout' if repo == REPO else args.repo}; model {STEP_VOCAB}-token vocabulary, "
          f"hidden 128, 2 layers, tied; flags {' '.join(a or repr(a) for a in STEP_ARGS)}; repeats={args.repeats}")
    rss = {m: [] for m in STEP_MICRO}
    for rep in range(args.repeats):
        for micro in STEP_MICRO:
            run_dir = scratch / f"run{micro}_{rep}"
            shutil.rmtree(run_dir, ignore_errors=True)  # an earlier invocation's run: train.py refuses to write over it
            cmd = [sys.executable, "train.py", "--model", str(model_dir), "--run_dir", str(run_dir), *STEP_ARGS,
                   "--micro_batch_size", str(micro)]
            env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
            p = subprocess.run(["/usr/bin/time", "-f", "MAXRSS_KB %M", *cmd], cwd=repo, env=env, capture_output=True,
                               text=True, check=False)
            line = [x for x in p.stderr.splitlines() if x.startswith("MAXRSS_KB ")]
            if p.returncode != 0 or not line:
                raise RuntimeError(f"train.py --micro_batch_size {micro} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
            rss[micro].append(int(line[-1].split()[1]) * 1024)
            print(f"  repeat {rep}: --micro_batch_size {micro:>2}: max RSS {rss[micro][-1] / 2**30:.3f} GiB", flush=True)
    extra = statistics.median(rss[64]) - statistics.median(rss[8])
    logits = (64 - 8) * 49 * STEP_VOCAB * 4
    print(f"max RSS (median): micro 64 {statistics.median(rss[64]) / 2**30:.3f} GiB, micro 8 "
          f"{statistics.median(rss[8]) / 2**30:.3f} GiB; extra {extra / 2**30:.3f} GiB = {extra / logits:.2f}x the 56 "
          f"responses' fp32 logits ({logits / 2**30:.2f} GiB)")
    print(f"target (extra <= 0.25x): {'MET' if extra <= 0.25 * logits else 'NOT MET'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["routine", "step"])
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--D", type=int, default=896, help="hidden size (896: Qwen2.5-0.5B, whose vocabulary is 151936)")
    ap.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    ap.add_argument("--chunk", type=int, nargs="+", default=[1024, 256], help="chunk sizes of ours to measure")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--repo", default=str(REPO), help="step: the checkout whose train.py runs")
    ap.add_argument("--scratch", default=str(SCRATCH_ROOT / "logprob_memory"), help="folder for the workers' outputs")
    ap.add_argument("--worker", choices=["ours", "today"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(routine_worker(args.worker, args.B * args.T, args.D, args.vocab[0], args.chunk[0], Path(args.out))))
        return
    import torch

    print("\n".join([title_line(f"bench_logprob_memory {args.what}"), machine_line(f", torch threads {torch.get_num_threads()}"),
                     f"# versions: python {platform.python_version()}, torch {torch.__version__}"]))
    (run_routine if args.what == "routine" else run_step)(args)


if __name__ == "__main__":
    main()
