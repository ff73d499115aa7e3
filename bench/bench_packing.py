"""Packed against padded micro-batches: tokens processed and time per update, side by side in one run.

    OMP_NUM_THREADS=1 python bench/bench_packing.py                         # both length mixes, 3 repeats
    OMP_NUM_THREADS=1 python bench/bench_packing.py --mix default --repeats 5

Length mixes (prompt and response lengths in tokens of the tiny tokenizer, one per character):
  default  the batch of one rollout step of `python train.py`: 16 groups of G = 8 responses that
           the shipped base policy samples for the first 16 training prompts (temperature 1, at
           most 48 tokens); micro-batches of 64 responses (the default --mini_batch_size and
           --micro_batch_size)
  long     DAPO-like long answers: 4 groups of 8, prompts of 64-256 tokens, response lengths
           long-tailed (log-normal, median 256, sigma 0.9, clipped to 48-2,048; the 2,048 ones are
           the truncated responses), one mini-batch, micro-batches by a token budget
           (--micro_batch_tokens 8192: real tokens packed, padded tokens padded)
Layouts (plumbing/forward.py): padded (one padded row per response), shared (padded, one pass per distinct
prompt: --share_prompt_forward), packed (one row per micro-batch, --pack_micro_batches).

Per layout: real tokens (prompt + response) against the tokens the layout feeds the model, the
attention score pairs it computes (sdpa with a mask, as on CPU, scores every query against every
key of its row: (P + T)^2 per padded row, L^2 for a packed row of L tokens, whose block-diagonal
mask is applied to that dense score matrix), and
seconds per update: one train.update_policy call (old log-probs of the later mini-batches, then
one optimizer step per mini-batch), the layouts alternating within each repeat, median and
range. The anchor is `padded`. Timing needs a quiet machine (the script prints the load).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import random
import statistics
import sys
import time
from pathlib import Path

from common import machine_line, title_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LAYOUTS = {"padded": dict(pack_micro_batches=False, share_prompt_forward=False),
           "shared": dict(pack_micro_batches=False, share_prompt_forward=True),
           "packed": dict(pack_micro_batches=True, share_prompt_forward=False)}


def default_mix(model, tok, rng: random.Random):
    """(prompts, responses, config changes) of one default rollout step's batch (see the docstring)."""
    import train
    from rollout import HFEngine, SamplingParams
    from task import Task

    cfg, task = train.Config(), Task()
    problems, _, _ = task.read("tiny", cfg, held_out=False)
    prompts = [task.build_prompt(p, tok, cfg) for p in problems[: cfg.prompts_per_step]]
    params = SamplingParams(n=cfg.group_size, max_new_tokens=cfg.max_response_len, temperature=1.0, top_p=1.0, seed=0)
    samples = HFEngine(model, tok, return_logprobs=False).generate(prompts, params)
    return [p for p in prompts for _ in range(cfg.group_size)], [s.token_ids for g in samples for s in g], {}


def long_mix(model, tok, rng: random.Random):
    """(prompts, responses, config changes) of the long-tailed mix (see the docstring)."""
    prompts, responses = [], []
    for _ in range(4):
        p = [rng.randrange(4, 80) for _ in range(rng.randint(64, 256))]
        for _ in range(8):
            n = int(min(2048, max(48, math.exp(rng.gauss(math.log(256), 0.9)))))
            prompts.append(p)
            responses.append([rng.randrange(4, 80) for _ in range(n)])
    return prompts, responses, dict(prompts_per_step=4, mini_batch_size=32, micro_batch_tokens=8192, max_response_len=2048)


def counts(batch, cfg) -> dict:
    """Real tokens, tokens fed to the model and attention pairs computed, summed over the step's passes."""
    from plumbing import update
    from plumbing.distributed import Dist

    real = fed = pairs = 0
    for mb in update.split_minibatches(batch, cfg.mini_batch_size, Dist()):
        for micro in update.micro_batches(mb, batch, cfg):
            P = max(len(batch.prompt_ids[i]) for i in micro)
            T = max(len(batch.response_ids[i]) for i in micro)
            n = sum(update.tokens_of(batch, i) for i in micro)
            u = len({tuple(batch.prompt_ids[i]) for i in micro})
            real += n
            if cfg.pack_micro_batches:
                fed, pairs = fed + n, pairs + n * n
            elif cfg.share_prompt_forward and u < len(micro):
                fed += u * P + len(micro) * (T - 1)
                pairs += u * P * P + len(micro) * (T - 1) * (P + T - 1)
            else:
                fed, pairs = fed + len(micro) * (P + T), pairs + len(micro) * (P + T) ** 2
    return {"real": real, "fed": fed, "pairs": pairs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mix", nargs="+", choices=["default", "long"], default=["default", "long"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch

    import dapo
    from plumbing import distributed
    from plumbing import policy
    import train

    torch.set_num_threads(1)
    print(title_line("bench_packing"))
    print(machine_line(f", torch threads {torch.get_num_threads()}"))
    print(f"# versions: torch {torch.__version__}; model: the tiny base policy (assets/tiny-base), float32, CPU, sdpa")
    base, tok = policy.load_policy("", torch.device("cpu"))
    for mix in args.mix:
        rng = random.Random(0)
        prompts, responses, change = (default_mix if mix == "default" else long_mix)(base, tok, rng)
        n = len(responses)
        G = 8
        rewards = torch.tensor([1.0 if rng.random() < 0.5 else -1.0 for _ in range(n)])  # (n,)
        batch = train.Batch(prompts, responses, dapo.group_advantages(rewards, G), torch.ones(n),
                            torch.arange(n // G).repeat_interleave(G), [None] * n)
        cfgs = {name: dataclasses.replace(train.Config(), **change, **over) for name, over in LAYOUTS.items()}
        lengths = sorted(len(r) for r in responses)
        print(f"\n## mix {mix}: {n} responses, {n // G} groups of {G}; response tokens min {lengths[0]}, median "
              f"{lengths[n // 2]}, max {lengths[-1]}; prompt tokens {min(map(len, prompts))}-{max(map(len, prompts))}; "
              f"mini-batch {cfgs['padded'].mini_batch_size}, micro-batch "
              + (f"{cfgs['padded'].micro_batch_tokens} tokens" if cfgs["padded"].micro_batch_tokens else
                 f"{cfgs['padded'].micro_batch_size} responses"))
        secs = {name: [] for name in LAYOUTS}
        for rep in range(args.repeats + 1):  # repeat 0 warms up (allocator, kernels), not counted
            for name, cfg in cfgs.items():
                model = copy.deepcopy(base)
                opt = torch.optim.SGD(model.parameters(), lr=1e-6)
                t0 = time.perf_counter()
                train.update_policy(model, opt, batch, cfg, distributed.Dist(), torch.device("cpu"), tok.pad_token_id)
                if rep:
                    secs[name].append(time.perf_counter() - t0)
        anchor = statistics.median(secs["padded"])
        print(f"{'layout':<8} {'real tokens':>11} {'fed to model':>12} {'fed/real':>8} {'attn pairs':>12} "
              f"{'s/update (median, range)':>26} {'vs padded':>9}")
        for name, cfg in cfgs.items():
            c, s = counts(batch, cfg), secs[name]
            print(f"{name:<8} {c['real']:>11,} {c['fed']:>12,} {c['fed'] / c['real']:>8.2f} {c['pairs']:>12,} "
                  f"{statistics.median(s):>10.3f} ({min(s):.3f}-{max(s):.3f}){'':>3} {statistics.median(s) / anchor:>8.2f}x")


if __name__ == "__main__":
    main()
