"""The transformers engine's decoding loop and its sampler (rollout.HFEngine generates through `decode`).

Plumbing a learner may skip on first reading: what is sampled is defined in rollout.HFEngine's
docstring; this file makes it cheap. transformers' `generate` did the same sampling with four
costs that a real model makes large (SmolLM2-135M, a 49k-token vocabulary; bench/bench_generation.py
measures both):

  * its top-p warper sorts every row's whole vocabulary at every decoding step; here the nucleus is
    found among the row's 64 most likely tokens, and only a row whose nucleus is wider is sorted
    whole (`top_p_filter`; the same rule, tests/test_sampler.py compares the two);
  * a batch ran until its longest row ended, finished rows still forwarded as padding; here a row
    leaves the batch (and its KV cache) when it ends;
  * each prompt was prefilled once per sample; here each distinct prompt is prefilled once and its
    KV cache copied to its n rows;
  * the sampler's log-probs needed `output_logits`, which keeps every step's (rows, V) float32
    logits until the batch ends (about 1 GB at 96 rows x 48 steps x 49k tokens); here the sampled
    token's log-prob is taken at each step and the logits dropped.

The draw itself is unchanged: row i of a request draws from its own stream of uniforms
(`sequence_uniforms`, seeded by the request seed and i), by inversion of the cumulative
distribution of softmax(processed scores) (`sample_token`), so the tokens do not depend on batching.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from plumbing.distributed import Dist, all_reduce_max
from plumbing.forward import prefill_shared

NUCLEUS_CANDIDATES = 64  # tokens looked at first for the top-p nucleus (a full sort only beyond them)


def sequence_uniforms(seed: int, first: int, count: int, steps: int) -> torch.Tensor:
    """(count, steps) float64 in [0, 1): the random streams of sequences first .. first + count - 1 of
    a request with sampler seed `seed`, one row each. Row i comes from numpy's generator seeded with
    the pair (seed, first + i) (a SeedSequence: independent streams for distinct pairs), so what a
    sequence draws depends on the request seed and its index in the request only."""
    return torch.from_numpy(np.stack([np.random.default_rng([seed, first + i]).random(steps) for i in range(count)]))


def sample_token(scores: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row from softmax(scores), by inversion of its cumulative distribution.

    scores: (N, V) the processed logits of one decoding step (after temperature and top-p; -inf
        outside the nucleus, which then has probability exactly 0).
    u: (N,) float64 uniforms in [0, 1), one per row (sequence_uniforms).
    Returns (N,) long: for each row the first token whose cumulative probability exceeds u times
    the total, so token v is drawn with probability p_v exactly (in float64; tests/test_sampler.py).
    """
    probs = torch.softmax(scores.double(), dim=-1)  # (N, V) float64: the float32 cumsum drifts over a large vocabulary
    cdf = probs.cumsum(-1)  # (N, V)
    tok = torch.searchsorted(cdf, (u.to(cdf.device) * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)  # (N,)
    # The first index whose cdf exceeds u * total always has mass (a token of probability 0 repeats its
    # predecessor's cdf), unless u * total rounds up to the total (about once in 2**53 draws): then the
    # search runs past the end (V) and the row takes its last token with mass. Checked, not computed,
    # on every decoding step: finding that token reads all (N, V) probabilities.
    over = tok >= probs.shape[1]  # (N,) bool
    if bool(over.any()):
        last = probs.shape[1] - 1 - (probs.flip(-1) > 0).to(torch.uint8).argmax(-1)  # (N,)
        tok = torch.where(over, last, tok)
    return tok


def top_p_filter(scores: torch.Tensor, top_p: float, candidates: int = NUCLEUS_CANDIDATES) -> torch.Tensor:
    """scores with -inf outside each row's top-p nucleus (Holtzman et al., 2020): the most likely
    tokens whose probability before them, in descending order, is below top_p (the smallest set whose
    mass reaches top_p; at least one token).

    The rule of transformers' TopPLogitsWarper (which removes the tokens whose ascending cumulative
    probability is <= 1 - top_p: the same set in exact arithmetic), without its full sort: the nucleus
    is looked for among the `candidates` most likely tokens (torch.topk), and only rows whose nucleus
    is wider are sorted whole. The masses are summed in float64 (the warper sums 49k float32
    probabilities, whose rounding moves the boundary by about 1e-5); a token at the boundary within
    that rounding can fall on the other side than the warper's (tests/test_sampler.py).

    scores: (N, V) float logits after temperature. Returns a new (N, V) tensor.
    """
    if top_p >= 1.0:
        return scores
    probs = torch.softmax(scores.double(), dim=-1)  # (N, V)
    k = min(candidates, probs.shape[1])
    vals, idx = probs.topk(k, dim=-1)  # (N, k) descending
    before = vals.cumsum(-1) - vals  # (N, k) mass of the tokens more likely than each
    wide = before[:, -1] + vals[:, -1] < top_p  # (N,) the nucleus reaches past the candidates
    keep = torch.zeros_like(probs, dtype=torch.bool)  # (N, V)
    keep.scatter_(1, idx, before < top_p)
    for r in wide.nonzero().flatten().tolist():  # rare on a trained model: one full sort per such row
        v, i = probs[r].sort(descending=True)
        keep[r, i[(v.cumsum(0) - v) < top_p]] = True
    return scores.masked_fill(~keep, float("-inf"))


@dataclass
class Decoded:
    """One decoded row: its tokens (up to and including the first stop token), why it ended, and the
    sampler's log-prob of each token (None when not asked for, or greedy)."""

    token_ids: list[int]
    finish_reason: str  # "stop" or "length"
    logprobs: list[float] | None


def decode(model, prompts: list[list[int]], *, first: int, max_new_tokens: int, temperature: float, top_p: float, seed: int,
           stop_ids: list[int], pad_id: int, processor=None, with_logprobs: bool = False, synced: bool = False) -> list[Decoded]:
    """Sample one response per row of `prompts` (rows of one prompt contiguous), KV-cached.

    Row i is sequence first + i of the request (its stream of uniforms). Each step: the raw logits,
    divided by the temperature; `processor(generated (A, t) long, scores (A, V)) -> scores` if given
    (a constraint: tokens it sets to -inf are never drawn); the top-p nucleus; the draw (greedy at
    temperature 0: the argmax). A row ends at its first token in stop_ids (kept), or after
    max_new_tokens. Log-probs (with_logprobs, temperature > 0) are of the drawn token under
    log_softmax(raw logits / temperature), the distribution the trainer scores.

    synced: under FSDP (world > 1) every rank must run the same number of forward passes: a rank
    whose rows have all ended keeps making a one-token pass until every rank's have.

    Raises RuntimeError: the model returned no KV cache.
    """
    N = len(prompts)
    heads = [i for i in range(N) if i == 0 or prompts[i] != prompts[i - 1]]  # (U,) the first row of each distinct prompt
    row_head = torch.tensor([sum(1 for h in heads if h <= i) - 1 for i in range(N)])  # (N,) index into heads
    P = max(len(prompts[h]) for h in heads)
    ids = torch.full((len(heads), P), pad_id, dtype=torch.long)  # (U, P) left-padded
    attn = torch.zeros((len(heads), P), dtype=torch.long)  # (U, P)
    for r, h in enumerate(heads):
        ids[r, P - len(prompts[h]):] = torch.tensor(prompts[h])
        attn[r, P - len(prompts[h]):] = 1
    pos = (attn.cumsum(-1) - 1).masked_fill(attn == 0, 0)  # (U, P) as transformers' generate numbers positions
    device = next(model.parameters()).device
    out, cache, cache_kw = prefill_shared(model, row_head.to(device), input_ids=ids.to(device),  # cache: (U,) -> (N,)
                                          attention_mask=attn.to(device), position_ids=pos.to(device), logits_to_keep=1)
    logits = out.logits[row_head.to(device), -1]  # (N, V)
    attn, last_pos = attn[row_head].to(device), pos[row_head, -1].to(device)  # (N, P), (N,)
    u = sequence_uniforms(seed, first, N, max_new_tokens + 1) if temperature > 0 else None  # (N, steps)
    stop = torch.tensor(stop_ids, device=device)
    tokens = torch.empty((N, 0), dtype=torch.long, device=device)  # (A, t) of the rows still going
    active = torch.arange(N)  # (A,) their request rows
    done: list[Decoded | None] = [None] * N
    lps = torch.empty((N, 0)) if with_logprobs and temperature > 0 else None  # (A, t)
    for t in range(max_new_tokens):
        raw = logits.to(dtype=torch.float32, copy=True)  # (A, V)
        scores = raw / temperature if temperature > 0 and temperature != 1.0 else raw
        if processor is not None:
            scores = processor(tokens, scores)
        if temperature > 0:
            tok = sample_token(top_p_filter(scores, top_p), u[active, t])  # (A,)
        else:
            tok = scores.argmax(-1)  # (A,)
        tokens = torch.cat([tokens, tok[:, None]], 1)  # (A, t + 1)
        if lps is not None:
            lp = torch.log_softmax(raw / temperature, dim=-1).gather(1, tok[:, None]).cpu()  # (A, 1)
            lps = torch.cat([lps, lp], 1)
        ended = torch.isin(tok, stop)  # (A,)
        if t == max_new_tokens - 1:
            ended = torch.ones_like(ended)
        for j in ended.nonzero().flatten().tolist():
            done[int(active[j])] = Decoded(tokens[j].tolist(), "stop" if bool(torch.isin(tok[j], stop)) else "length",
                                           lps[j].tolist() if lps is not None else None)
        going = (~ended).nonzero().flatten()  # (A',)
        if not len(going):
            while synced and _any_rank(0.0):  # another rank's rows go on: one pass per step of theirs (FSDP gathers)
                model(input_ids=torch.full((1, 1), pad_id, device=device), use_cache=False, logits_to_keep=1)
            break
        if synced:
            _any_rank(1.0)
        if len(going) < len(active):  # rows that ended leave the batch and the cache
            cache.reorder_cache(going)
            tokens, attn, last_pos, tok = tokens[going], attn[going], last_pos[going], tok[going]
            active = active[going.cpu()]
            lps = lps[going.cpu()] if lps is not None else None
        attn = torch.cat([attn, torch.ones((len(active), 1), dtype=attn.dtype, device=device)], 1)  # (A, P + t + 1)
        last_pos = last_pos + 1
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=last_pos[:, None], use_cache=True,
                    logits_to_keep=1, **{cache_kw: cache})
        logits = out.logits[:, -1]  # (A, V)
    return done


def _any_rank(x: float) -> bool:
    """Whether some rank passed x > 0 (a collective: every rank of the job calls it once per decoding step)."""
    return all_reduce_max(x, Dist(torch.distributed.get_rank(), torch.distributed.get_world_size())) > 0
