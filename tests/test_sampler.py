"""The transformers engine's sampler (rollout.sample_token, rollout.sequence_uniforms, HFEngine).

1. sample_token is an exact draw from softmax(scores): over a grid of uniforms, each token takes
   exactly its probability's share (float64, small vocabulary, with and without a top-p nucleus),
   and tokens outside the nucleus are never drawn.
2. The per-sequence streams are uniform and independent: one draw per row of many rows passes a
   chi-square test of the target distribution, and so do many draws along one row.
4. plumbing.decoding.top_p_filter keeps the nucleus transformers' TopPLogitsWarper keeps, on a
   49k-token vocabulary: peaked rows (nucleus among the first 64 candidates) and flat ones (the full
   sort), away from the float32 rounding of the warper's boundary.
3. Through HFEngine: the first token of many sequences follows softmax(logits / T) renormalised
   over the top-p nucleus (chi-square against the model's own logits; the full softmax is
   rejected, so the test can tell), and the samples do not change with max_batch.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_sampler.py
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import rollout
import train
from plumbing import policy
from rollout import SamplingParams
from tasks.tiny import TinyTask

torch.set_num_threads(1)
CPU = torch.device("cpu")


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """(statistic, critical value at significance 1e-3) of a chi-square goodness-of-fit test; cells
    expected below 5 draws are pooled. Critical value: Wilson-Hilferty, z = 3.09 (2% above the exact one at df = 2, closer above)."""
    n = float(counts.sum())
    expected = probs.double() * n
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum(0, keepdim=True)])
    exp = torch.cat([expected[~small], expected[small].sum(0, keepdim=True)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    crit = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


def _nucleus_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(V,) float64: softmax(logits / T) restricted to the smallest set of most likely tokens whose
    mass reaches top_p, renormalised (what transformers' TopPLogitsWarper keeps), by hand."""
    p = torch.softmax(logits.double() / temperature, -1)
    order = torch.argsort(p, descending=True)
    mass_before = torch.cumsum(p[order], 0) - p[order]  # mass of the tokens more likely than each
    keep = torch.zeros_like(p, dtype=torch.bool)
    keep[order[mass_before < top_p]] = True
    return torch.where(keep, p, 0.0) / p[keep].sum()


@pytest.mark.parametrize("masked", [False, True])
def test_sample_token_gives_each_token_exactly_its_probability(masked):
    scores = torch.tensor([[0.3, -1.2, 2.0, 0.0, -0.5, 1.1, -3.0]], dtype=torch.float64)  # (1, V = 7)
    if masked:
        scores[0, [1, 4, 6]] = float("-inf")  # outside a nucleus
    probs = torch.softmax(scores[0], -1)  # (V,)
    M = 1_000_000
    u = (torch.arange(M, dtype=torch.float64) + 0.5) / M  # (M,) a grid over [0, 1)
    tok = rollout.sample_token(scores.expand(M, -1), u)  # (M,)
    counts = torch.bincount(tok, minlength=7).double()  # (V,)
    # the draw is the quantile function: token v takes the grid points in an interval of length p_v
    assert torch.allclose(counts / M, probs, atol=2 / M, rtol=0)
    assert (counts[probs == 0] == 0).all()
    # the largest uniform, and u * total rounded up to the total (u = 1), land on the last token with mass
    last = int(torch.nonzero(probs > 0).max())
    assert rollout.sample_token(scores.expand(2, -1), torch.tensor([1 - 2**-53, 1.0], dtype=torch.float64)).tolist() == [
        last, last]


def test_sequence_streams_are_uniform_and_independent():
    probs = torch.tensor([0.05, 0.3, 0.15, 0.25, 0.2, 0.05], dtype=torch.float64)  # (V = 6,)
    scores = probs.log().unsqueeze(0)  # (1, V)
    across = rollout.sequence_uniforms(7, 0, 20_000, 2)  # (rows, 2): the first two draws of 20,000 sequences
    along = rollout.sequence_uniforms(7, 123, 1, 20_000)[0]  # (20,000,): one sequence's stream
    for u in (across[:, 0], across[:, 1], along):
        tok = rollout.sample_token(scores.expand(len(u), -1), u)
        stat, crit = _chi2(torch.bincount(tok, minlength=6), probs)
        assert stat < crit, (stat, crit)
    # consecutive draws of one row are not correlated, nor are two rows (sample correlation, 20,000 pairs)
    assert abs(float(torch.corrcoef(across.T)[0, 1])) < 0.03
    assert abs(float(torch.corrcoef(torch.stack([along[:-1], along[1:]]))[0, 1])) < 0.03
    # the stream is a function of (seed, index) only
    assert torch.equal(rollout.sequence_uniforms(7, 5, 3, 4), rollout.sequence_uniforms(7, 0, 8, 4)[5:8])


@pytest.fixture(scope="module")
def tiny_policy():
    model, tok = policy.load_policy("", CPU)
    prompts = TinyTask().load("tiny", tok, train.Config(), held_out=True).prompt_ids[:6]
    return model, tok, prompts


@pytest.mark.engine  # transformers: the model's KV cache; its TopPLogitsWarper
def test_hf_engine_first_tokens_follow_the_nucleus_distribution(tiny_policy):
    model, tok, prompts = tiny_policy
    T, top_p, n = 1.5, 0.9, 2000
    with torch.no_grad():  # (prompts, V) next-token logits; the prompt whose first token is least certain
        last = torch.stack([model(input_ids=torch.tensor([p])).logits[0, -1] for p in prompts])
    i = int(torch.softmax(last, -1).max(-1).values.argmin())
    target = _nucleus_probs(last[i], T, top_p)  # (V,)
    assert int((target > 0).sum()) >= 3  # a nucleus of several tokens, and tokens outside it
    samples = rollout.HFEngine(model, tok).generate([prompts[i]], SamplingParams(n=n, max_new_tokens=1, temperature=T,
                                                                                top_p=top_p, seed=5))[0]
    counts = torch.bincount(torch.tensor([s.token_ids[0] for s in samples]), minlength=last.shape[1])
    stat, crit = _chi2(counts, target)
    assert stat < crit, (stat, crit)
    logits = last[i]
    stat_full, _ = _chi2(counts, torch.softmax(logits.double() / T, -1))  # without the nucleus: rejected
    assert stat_full > crit


@pytest.mark.engine  # transformers: the model's KV cache; its TopPLogitsWarper
def test_hf_engine_samples_do_not_depend_on_max_batch(tiny_policy):
    model, tok, prompts = tiny_policy
    params = SamplingParams(n=4, max_new_tokens=24, temperature=1.0, top_p=0.7, seed=3)
    runs = [rollout.HFEngine(model, tok, max_batch=b).generate(prompts, params) for b in (256, 7, 1)]
    tokens = [[[s.token_ids for s in g] for g in r] for r in runs]
    assert tokens[0] == tokens[1] == tokens[2]
    for r in runs[1:]:  # the sampler's log-probs: the same up to padding-dependent float rounding
        assert max(abs(a - b) for ga, gb in zip(runs[0], r) for sa, sb in zip(ga, gb)
                   for a, b in zip(sa.logprobs, sb.logprobs)) < 1e-5
    other_seed = rollout.HFEngine(model, tok).generate(prompts, dataclasses.replace(params, seed=4))
    assert [[s.token_ids for s in g] for g in other_seed] != tokens[0]


@pytest.mark.engine  # transformers: the model's KV cache; its TopPLogitsWarper
@pytest.mark.parametrize("scale", [0.5, 2.0, 6.0, 12.0])
def test_top_p_filter_keeps_the_warpers_nucleus(scale):
    from transformers import TopPLogitsWarper

    from plumbing import decoding

    gen = torch.Generator().manual_seed(int(scale * 10))
    logits = torch.randn(24, 49152, generator=gen) * scale  # (rows, V): flat (scale 0.5) to peaked (12)
    for top_p in (0.3, 0.7, 0.95):
        ours = torch.isfinite(decoding.top_p_filter(logits, top_p))  # (rows, V)
        theirs = torch.isfinite(TopPLogitsWarper(top_p)(None, logits.clone()))
        probs = torch.softmax(logits.double(), -1)  # (rows, V)
        v, order = probs.sort(-1, descending=True)
        before = torch.empty_like(probs).scatter_(1, order, v.cumsum(-1) - v)  # (rows, V) mass more likely than each token
        near = (before - top_p).abs() < 1e-5  # tokens the warper's float32 sums over 49k tokens may put on either side
        assert not ((ours != theirs) & ~near).any()
        assert ours.sum() >= 24 and (ours != theirs).sum() <= 1e-3 * ours.sum()
        assert (ours.sum(-1) >= 1).all()
    assert torch.equal(decoding.top_p_filter(logits, 1.0), logits)
