"""The transformers engine on a real model: its decoding loop (plumbing/decoding.py) against transformers
`generate` as rollout.HFEngine used it before, on SmolLM2-135M-Instruct.

    OMP_NUM_THREADS=1 python bench/bench_decoding.py [--model smollm2-135m-instruct] [--repeats 2]

Two parts, one process, one model load, 1 torch thread:

step    one decoding step of a batch of 32 rows (89 to 110 tokens of arithmetic prompts in the KV cache): the forward pass; transformers' TopPLogitsWarper (top_p 0.7, a full sort of the
        49k logits of every row); plumbing.decoding.top_p_filter (the same nucleus among the 64 most
        likely tokens); the draw (decoding.sample_token). Medians of 20 calls.
calls   whole requests, each engine in turn with the same prompts and seeds: a training round of the
        smollm2-arith preset (12 prompts x G = 8, <= 48 new tokens, T 1.0, top_p 0.7) and a held-out
        evaluation (32 prompts x k = 4, the same sampling). "before" = LegacyEngine below (the engine of
        commit cd68454: transformers generate, its TopPLogitsWarper, our per-sequence draw as its last
        logits processor, output_logits for the sampler's log-probs); "after" = rollout.HFEngine. Both
        draw from the same per-sequence uniforms, so they should give the same tokens: the script
        counts the sequences whose tokens differ (a last-bit difference of a logit across batch
        shapes can move a draw that lands within rounding of a boundary, rarely). tokens/s =
        generated tokens (EOS included) / wall time of engine.generate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import machine_line, title_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from transformers import GenerationConfig, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper  # noqa: E402

import rollout  # noqa: E402
from plumbing import decoding, forward  # noqa: E402
from plumbing.forward import inference  # noqa: E402
from rollout import Sample  # noqa: E402


class _Draw:
    """The old last logits processor: the per-sequence draw (decoding.sample_token), scores -inf but the drawn token."""

    def __init__(self, uniforms, prompt_len):
        self.uniforms, self.prompt_len = uniforms, prompt_len

    def __call__(self, input_ids, scores):
        tok = decoding.sample_token(scores, self.uniforms[:, input_ids.shape[1] - self.prompt_len])
        return torch.full_like(scores, float("-inf")).scatter_(1, tok.unsqueeze(1), 0.0)


class LegacyEngine(rollout.HFEngine):
    """rollout.HFEngine as of commit cd68454: one transformers `generate` call per batch of max_batch rows."""

    def generate(self, prompts, params):
        flat = [p for p in prompts for _ in range(params.n)]
        out = []
        with inference(self.model):
            for s in range(0, len(flat), self.max_batch):
                out.extend(self._batch(flat[s : s + self.max_batch], s, params))
        return [out[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _batch(self, prompts, first, params):
        P = max(map(len, prompts))
        ids = torch.full((len(prompts), P), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), P), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, P - len(p):], attn[i, P - len(p):] = torch.tensor(p), 1
        with_lp = self.logprobs_available(params)
        procs = LogitsProcessorList([TemperatureLogitsWarper(params.temperature)] if params.temperature != 1.0 else [])
        procs.extend([TopPLogitsWarper(params.top_p)] if params.top_p < 1.0 else [])
        procs.append(_Draw(decoding.sequence_uniforms(params.seed, first, len(prompts), params.max_new_tokens + 1), P))
        request = GenerationConfig(max_new_tokens=params.max_new_tokens, pad_token_id=self.pad_id, eos_token_id=self.stop_ids,
                                   return_dict_in_generate=True, output_logits=with_lp, do_sample=False)
        saved, self.model.generation_config = self.model.generation_config, GenerationConfig()
        try:
            gen = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=request, logits_processor=procs)
        finally:
            self.model.generation_config = saved
        new = gen.sequences[:, P:]
        lp = torch.stack([torch.log_softmax(lg.float() / params.temperature, -1).gather(1, new[:, j:j + 1]).squeeze(1)
                          for j, lg in enumerate(gen.logits)], 1) if with_lp else None
        stop, out = torch.tensor(self.stop_ids), []
        for i in range(new.shape[0]):
            hit = torch.isin(new[i], stop).nonzero()
            end, why = (int(hit[0]) + 1, "stop") if len(hit) else (new.shape[1], "length")
            out.append(Sample(new[i, :end].tolist(), why, lp[i, :end].tolist() if with_lp else None))
        return out


def median_s(fn, calls: int = 20) -> float:
    fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=2, help="calls per engine and workload, alternating")
    ap.add_argument("--max_new", type=int, default=48, help="new tokens at most")
    ap.add_argument("--prompts", type=int, default=0, help="prompts per request (0: 12 for the round, 32 for the evaluation)")
    args = ap.parse_args()
    import transformers

    import train
    from plumbing import models, policy
    from rollout import SamplingParams
    from tasks.arith import Arithmetic

    torch.set_num_threads(1)
    print(title_line("bench_decoding"))
    print(machine_line(f"; torch {torch.__version__}, transformers {transformers.__version__}"))
    model, tok = policy.load_policy(models.resolve(args.model), torch.device("cpu"))
    model.eval()
    data = Arithmetic().load("arith", tok, train.Config(), held_out=False)
    print(f"# model {args.model}; prompts: tasks/arith.py training problems under the DAPO instruction "
          f"({min(map(len, data.prompt_ids[:64]))}-{max(map(len, data.prompt_ids[:64]))} tokens)", flush=True)

    # --- one decoding step, batch 32
    B = 32
    with torch.no_grad():
        ids = torch.tensor([data.prompt_ids[i % 8][:90] for i in range(B)])  # (32, 90): equal lengths, no padding
        out = model(input_ids=ids[:, :-1], use_cache=True)
        kw = {forward.cache_kwarg(model): getattr(out, forward.cache_kwarg(model))}  # the prompt's KV cache
        logits = out.logits[:, -1].float()
        u = torch.rand(B, dtype=torch.float64)
        warper = TopPLogitsWarper(0.7)
        fwd = median_s(lambda: model(input_ids=ids[:, -1:], use_cache=True, logits_to_keep=1, **kw))  # the cache grows to 110
        warp = median_s(lambda: warper(None, logits))
        ours = median_s(lambda: decoding.top_p_filter(logits, 0.7))
        draw = median_s(lambda: decoding.sample_token(logits, u))
    print(f"\n## one decoding step, batch {B}, 89-110 tokens in the KV cache (median of 20)")
    print(f"  forward pass                               {fwd:.4f} s")
    print(f"  transformers TopPLogitsWarper(0.7)         {warp:.4f} s")
    print(f"  decoding.top_p_filter(0.7)                 {ours:.4f} s")
    print(f"  decoding.sample_token (the draw)           {draw:.4f} s", flush=True)

    # --- whole requests
    engines = {"before": LegacyEngine(model, tok, return_logprobs=False), "after": rollout.HFEngine(model, tok, return_logprobs=False)}
    a, b = args.prompts or 12, args.prompts or 32
    work = {f"training round ({a} x G=8)": (data.prompt_ids[100:100 + a], 8), f"evaluation ({b} x k=4)": (data.prompt_ids[200:200 + b], 4)}
    print(f"\n## whole requests, <= {args.max_new} new tokens, T 1.0, top_p 0.7; {args.repeats} calls per engine, alternating")
    print(f"{'workload':<28} {'engine':<7} {'s per call (median)':>20} {'tokens/s':>9} {'tokens':>7}  same tokens as before")
    for name, (prompts, n) in work.items():
        res = {e: [] for e in engines}
        toks = {}
        for r in range(args.repeats):
            for e, engine in engines.items():
                params = SamplingParams(n=n, max_new_tokens=args.max_new, temperature=1.0, top_p=0.7, seed=r)
                t = time.perf_counter()
                groups = engine.generate(prompts, params)
                wall = time.perf_counter() - t
                seqs = [s.token_ids for g in groups for s in g]
                res[e].append((wall, sum(map(len, seqs))))
                toks[(e, r)] = seqs
        for e in engines:
            walls = [w for w, _ in res[e]]
            n_tok = sum(t for _, t in res[e])
            same = sum(a == b for r in range(args.repeats) for a, b in zip(toks[("before", r)], toks[(e, r)]))
            total = sum(len(toks[(e, r)]) for r in range(args.repeats))
            print(f"{name:<28} {e:<7} {statistics.median(walls):>20.2f} {n_tok / sum(walls):>9.1f} {n_tok // args.repeats:>7}  "
                  f"{same}/{total}", flush=True)


if __name__ == "__main__":
    main()
