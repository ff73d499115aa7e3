"""Tests of DAPO's successors in dapo.py: cispo_loss (MiniMax-M1) and gspo_loss (GSPO-token).

Written from the docstrings and hand derivations, like tests/test_dapo.py. Notation: r_t =
pi_theta / pi_old per token, s_i = exp(masked mean of log r_t) per response, A the advantage,
"grad" = d loss / d logp after aggregation. Kinds:
  - hand-derived values (each expected number is worked out in a comment next to it): the
    on-policy equalities (CISPO == DAPO's token-mean gradient, GSPO == GRPO's sequence-mean one);
    CISPO keeping the gradient DAPO's clip sets to 0, its bounds for both signs of A; a GSPO
    response whose ratio leaves the band losing the gradient of every token; the geometric-mean
    behaviour weight of the decoupled objective;
  - hypothesis properties: the on-policy equalities on random batches, GSPO-token against the
    sequence form differentiated through the mean, masked positions never reaching the loss,
    micro-batched gradient accumulation against the full batch, no gradient into old_logp;
  - end to end: the generator process at lag 0 reproduces the inline loop with each surrogate.
Every hand case runs with a float and with a bool mask.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_surrogates.py
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import dapo
import train

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MASKS = [torch.float64, torch.bool]
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "group-token-mean"]
STAT_KEYS = {"clipfrac_low", "clipfrac_high", "clipfrac_dual", "ratio_mean", "ratio_max", "approx_kl"}


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def _close(a, b, atol=1e-6, rtol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a).double(), torch.as_tensor(b).double(), atol=atol, rtol=rtol)


def _grad(fn, logp, old, adv, mask, mode, **kw):
    """d aggregate_loss(fn(logp, old, adv, mask)) / d logp (B, T), with this batch as the whole step."""
    lp = logp.clone().requires_grad_(True)
    loss_tok, stats = fn(lp, old, adv, mask, **kw)
    dapo.aggregate_loss(loss_tok, mask, mode).backward()
    return lp.grad, stats


def _fixture_f(mask_dtype):
    """Review fixture F: response a has 1 token, b has 3; A = +1 for both; logp == old (on-policy)."""
    logp = _t([[-1.0, 0.0, 0.0], [-0.5, -2.0, -3.0]])
    mask = _t([[1, 0, 0], [1, 1, 1]]).to(mask_dtype)
    return logp, logp.clone(), _t([1.0, 1.0]), mask


# =============================================================================================
# on-policy equalities
# =============================================================================================

@pytest.mark.parametrize("mask_dtype", MASKS)
def test_on_policy_cispo_is_dapo_and_gspo_is_sequence_mean_grpo_hand_values(mask_dtype):
    # r = 1 everywhere. Token-mean over the step's 4 tokens: every token's gradient -A / 4 = -0.25,
    # for DAPO's clip and for CISPO (weight clamp(1, 0, 5) = 1). Seq-mean-token-mean over 2
    # responses: a's token -1 / (1 * 2) = -0.5, each of b's -1 / (3 * 2) = -1/6, for GRPO's clip
    # and for GSPO (s = 1). Padding: 0.
    logp, old, adv, mask = _fixture_f(mask_dtype)
    quarter = _t([[-0.25, 0, 0], [-0.25, -0.25, -0.25]])
    seq = _t([[-0.5, 0, 0], [-1 / 6, -1 / 6, -1 / 6]])
    g_dapo, _ = _grad(dapo.policy_loss, logp, old, adv, mask, "token-mean")
    g_cispo, s_cispo = _grad(dapo.cispo_loss, logp, old, adv, mask, "token-mean")
    g_grpo, _ = _grad(dapo.policy_loss, logp, old, adv, mask, "seq-mean-token-mean", eps_high=0.2)
    g_gspo, s_gspo = _grad(dapo.gspo_loss, logp, old, adv, mask, "seq-mean-token-mean")
    _close(g_dapo, quarter, atol=1e-7)
    _close(g_cispo, quarter, atol=1e-7)
    _close(g_grpo, seq, atol=1e-7)
    _close(g_gspo, seq, atol=1e-7)
    assert s_cispo["clipfrac_high"] == s_cispo["clipfrac_low"] == 0.0
    assert s_gspo["seq_clipfrac_high"] == s_gspo["seq_clipfrac_low"] == s_gspo["clipfrac_high"] == 0.0
    assert s_gspo["ratio_mean"] == pytest.approx(1.0) and s_gspo["approx_kl"] == pytest.approx(0.0, abs=1e-9)


@st.composite
def batches(draw, on_policy=False):
    """A small batch (python lists): logp, old, per-response advantages, a mask with a loss token."""
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    fl = st.floats(-4.0, 0.0, allow_subnormal=False, width=32)
    lp = [draw(st.lists(fl, min_size=T, max_size=T)) for _ in range(B)]
    if on_policy:
        old = [row[:] for row in lp]
    else:  # old within +-0.5 of logp: ratios in [0.6, 1.65], on both sides of every band
        d = st.floats(-0.5, 0.5, allow_subnormal=False, width=32)
        old = [[x + draw(d) for x in row] for row in lp]
    adv = draw(st.lists(st.one_of(st.just(0.0), st.floats(-3.0, 3.0, allow_subnormal=False, width=32)),
                        min_size=B, max_size=B))
    mask = [draw(st.lists(st.booleans(), min_size=T, max_size=T)) for _ in range(B)]
    mask[0][0] = True
    return lp, old, adv, mask


@PROPERTY
@given(batches(on_policy=True), st.sampled_from(MODES), st.sampled_from(MASKS))
def test_on_policy_cispo_gradient_is_dapo_gradient(case, mode, mask_dtype):
    # At r = 1 CISPO's per-token gradient -clamp(1) A = -A is policy_loss's -A r, whatever the
    # aggregation: the two updates are equal until the ratio moves.
    lp, old, adv, mask = case
    m = torch.tensor(mask).to(mask_dtype)
    G = len(lp)
    kw = dict(num_tokens=float(m.sum()), num_seqs=G, max_len=len(lp[0]), num_groups=1,
              group_num_tokens=torch.full((G,), float(m.sum())))
    grads = []
    for fn in (dapo.policy_loss, dapo.cispo_loss):
        x = _t(lp).requires_grad_(True)
        loss_tok, _ = fn(x, _t(old), _t(adv), m)
        dapo.aggregate_loss(loss_tok, m, mode, **kw).backward()
        grads.append(x.grad)
    _close(grads[1], grads[0], atol=1e-7, rtol=1e-6)


@PROPERTY
@given(batches(on_policy=True), st.sampled_from(MASKS), st.floats(1e-4, 0.3), st.floats(1e-4, 0.3))
def test_on_policy_gspo_gradient_is_sequence_mean_grpo_gradient(case, mask_dtype, eps_low, eps_high):
    # At s = 1 no band clips: GSPO under seq-mean-token-mean is GRPO's sample-level loss (policy_loss
    # with the same aggregation) for any band.
    lp, old, adv, mask = case
    m = torch.tensor(mask).to(mask_dtype)
    g_grpo, _ = _grad(dapo.policy_loss, _t(lp), _t(old), _t(adv), m, "seq-mean-token-mean", eps_high=0.2)
    g_gspo, _ = _grad(dapo.gspo_loss, _t(lp), _t(old), _t(adv), m, "seq-mean-token-mean", eps_low=eps_low,
                      eps_high=eps_high)
    _close(g_gspo, g_grpo, atol=1e-7, rtol=1e-6)


# =============================================================================================
# CISPO: hand cases
# =============================================================================================

def _one_token(ratio, adv, mask_dtype, old_grad=False):
    """One token with log pi_old = -1 and log pi_theta = -1 + log(ratio), and its advantage."""
    old = _t([[-1.0]]).requires_grad_(old_grad)
    logp = (old.detach() + math.log(ratio)).requires_grad_(True)
    return logp, old, _t([adv]), torch.ones(1, 1, dtype=mask_dtype)


@pytest.mark.parametrize("mask_dtype", MASKS)
def test_cispo_keeps_the_gradient_dapo_clips(mask_dtype):
    # r = 1.5, A = +1, one token (N = 1): DAPO's clip is active (1.5 > 1 + 0.28), loss -A * 1.28,
    # gradient 0. CISPO: weight clamp(1.5, 0, 5) = 1.5, gradient -1.5. With r = 6 the weight is
    # capped at 5: gradient -5. No gradient reaches old_logp.
    logp, old, adv, mask = _one_token(1.5, 1.0, mask_dtype, old_grad=True)
    dapo_tok, _ = dapo.policy_loss(logp, old.detach(), adv, mask)
    (g,) = torch.autograd.grad(dapo_tok.sum(), logp)
    assert g.item() == 0.0
    loss_tok, stats = dapo.cispo_loss(logp, old, adv, mask)
    g, g_old = torch.autograd.grad(loss_tok.sum(), (logp, old), allow_unused=True)
    assert g.item() == pytest.approx(-1.5, rel=1e-6)
    assert g_old is None or g_old.item() == 0.0
    assert loss_tok.item() == pytest.approx(-1.5 * logp.item(), rel=1e-6)  # the value is -w A log pi
    assert stats["clipfrac_high"] == 0.0 and stats["ratio_mean"] == pytest.approx(1.5, rel=1e-6)
    logp, old, adv, mask = _one_token(6.0, 1.0, mask_dtype)
    loss_tok, stats = dapo.cispo_loss(logp, old, adv, mask)
    (g,) = torch.autograd.grad(loss_tok.sum(), logp)
    assert g.item() == pytest.approx(-5.0, rel=1e-6) and stats["clipfrac_high"] == 1.0


@pytest.mark.parametrize("mask_dtype", MASKS)
def test_cispo_bounds_a_negative_advantage_without_dual_clip(mask_dtype):
    # A = -1, r = 10: DAPO without dual clip loses |A| r = 10, gradient +10; with dual clip c = 3 the
    # loss is capped at 3, gradient 0. CISPO: weight min(10, 5) = 5, gradient +5.
    logp, old, adv, mask = _one_token(10.0, -1.0, mask_dtype)
    cases = [(dapo.policy_loss, {}, 10.0), (dapo.policy_loss, dict(dual_clip=3.0), 0.0), (dapo.cispo_loss, {}, 5.0)]
    for fn, kw, expect in cases:
        loss_tok, _ = fn(logp, old, adv, mask, **kw)
        (g,) = torch.autograd.grad(loss_tok.sum(), logp)
        assert g.item() == pytest.approx(expect, rel=1e-6, abs=1e-12), (fn.__name__, kw)


@pytest.mark.parametrize("mask_dtype", MASKS)
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_cispo_weight_is_capped_at_both_bounds_for_both_signs(mask_dtype, adv):
    # gradient = -clamp(r, low, high) * A. Bounds [0.8, 2]: r = 0.5 -> weight 0.8, r = 3 -> 2,
    # r = 1.2 -> 1.2 (inside). Default [0, 5]: r = 0.5 -> 0.5 (attenuated). SkyRL's old floor
    # [1, 6] would give 1.0 there instead; this implementation's default must not.
    for ratio, kw, weight in ((0.5, dict(low=0.8, high=2.0), 0.8), (3.0, dict(low=0.8, high=2.0), 2.0),
                              (1.2, dict(low=0.8, high=2.0), 1.2), (0.5, {}, 0.5), (0.5, dict(low=1.0, high=6.0), 1.0)):
        logp, old, a, mask = _one_token(ratio, adv, mask_dtype)
        loss_tok, stats = dapo.cispo_loss(logp, old, a, mask, **kw)
        (g,) = torch.autograd.grad(loss_tok.sum(), logp)
        assert g.item() == pytest.approx(-weight * adv, rel=1e-6), (ratio, kw)
        assert stats["clipfrac_low"] == float(ratio < kw.get("low", 0.0))
        assert stats["clipfrac_high"] == float(ratio > kw.get("high", 5.0))
    logp, old, a, mask = _one_token(0.5, adv, mask_dtype)
    loss_tok, _ = dapo.cispo_loss(logp, old, a, mask)
    (g,) = torch.autograd.grad(loss_tok.sum(), logp)
    assert g.item() != pytest.approx(-1.0 * adv)  # the floor at 1 is not the default


@PROPERTY
@given(batches(), st.sampled_from(MASKS), st.floats(0.0, 1.0), st.floats(1.0, 8.0))
def test_cispo_gradient_is_minus_clamped_ratio_times_advantage(case, mask_dtype, low, high):
    # From the definition, per token, in float64: d loss_t / d logp_t = -clamp(r_t, low, high) A at
    # loss tokens, 0 elsewhere; the stats are shares of loss tokens beyond each bound.
    lp, old, adv, mask = case
    m = torch.tensor(mask)
    x = _t(lp).requires_grad_(True)
    loss_tok, stats = dapo.cispo_loss(x, _t(old), _t(adv), m.to(mask_dtype), low=low, high=high)
    loss_tok.sum().backward()
    r = torch.exp(_t(lp) - _t(old))
    expect = torch.where(m, -r.clamp(low, high) * _t(adv)[:, None], 0.0)
    _close(x.grad, expect, atol=1e-6, rtol=1e-5)
    assert (loss_tok[~m] == 0).all() and STAT_KEYS <= set(stats)
    rv = r[m]
    assume(((rv - low).abs() > 1e-6).all() and ((rv - high).abs() > 1e-6).all())  # float32 rounding at a bound
    assert stats["clipfrac_low"] == pytest.approx(float((rv < low).double().mean()))
    assert stats["clipfrac_high"] == pytest.approx(float((rv > high).double().mean()))


# =============================================================================================
# GSPO: hand cases
# =============================================================================================

@pytest.mark.parametrize("mask_dtype", MASKS)
def test_gspo_clips_whole_responses_where_dapo_clips_tokens(mask_dtype):
    # One response, 2 tokens, A = +1, B = 1, seq-mean-token-mean (GSPO) / token-mean (DAPO).
    # log r = (+0.3, -0.3): s = exp(0) = 1, in band: GSPO gradient -s / 2 = -0.5 on each token.
    # DAPO per token: r = 1.3499 > 1.28 clipped (0); r = 0.7408, A > 0 never clipped on the low side:
    # -0.7408 / 2 = -0.3704.
    old = _t([[-1.0, -2.0]])
    mask = torch.ones(1, 2, dtype=mask_dtype)
    logp = old + _t([[0.3, -0.3]])
    g, st_ = _grad(dapo.gspo_loss, logp, old, _t([1.0]), mask, "seq-mean-token-mean")
    _close(g, _t([[-0.5, -0.5]]), atol=1e-7)
    assert st_["seq_clipfrac_high"] == 0.0
    g, _ = _grad(dapo.policy_loss, logp, old, _t([1.0]), mask, "token-mean")
    _close(g, _t([[0.0, -math.exp(-0.3) / 2]]), atol=1e-7)  # (0, -0.3704)
    # log r = (0.001, 0.001): s = e^0.001 = 1.0010 > 1 + 4e-4, A > 0: no gradient on either token.
    # DAPO's token clip (1.28) is nowhere near: -1.001 / 2 on each.
    logp = old + 0.001
    g, st_ = _grad(dapo.gspo_loss, logp, old, _t([1.0]), mask, "seq-mean-token-mean")
    assert (g == 0).all() and st_["seq_clipfrac_high"] == 1.0 and st_["clipfrac_high"] == 1.0
    g, _ = _grad(dapo.policy_loss, logp, old, _t([1.0]), mask, "token-mean")
    _close(g, torch.full((1, 2), -math.exp(0.001) / 2, dtype=torch.float64), atol=1e-7)
    # A = -1 below the band (s = e^-0.001 < 1 - 3e-4): no gradient either (clipfrac_low); A = -1
    # above it (s = e^0.001): the unclipped side, gradient +s / 2 on each token.
    g, st_ = _grad(dapo.gspo_loss, old - 0.001, old, _t([-1.0]), mask, "seq-mean-token-mean")
    assert (g == 0).all() and st_["seq_clipfrac_low"] == 1.0
    g, st_ = _grad(dapo.gspo_loss, old + 0.001, old, _t([-1.0]), mask, "seq-mean-token-mean")
    _close(g, torch.full((1, 2), math.exp(0.001) / 2, dtype=torch.float64), atol=1e-7)
    assert st_["seq_clipfrac_low"] == st_["seq_clipfrac_high"] == 0.0


@pytest.mark.parametrize("mask_dtype", MASKS)
@pytest.mark.parametrize("garbage", [1e4, -1e4, math.inf, -math.inf, math.nan])
def test_gspo_masked_position_cannot_move_the_sequence_ratio(mask_dtype, garbage):
    # Response 0: loss tokens with log r = (0.0002, -0.0002) -> s = 1 (in band), then a padded
    # position whose log r would be huge. If it entered the mean, s would leave the band (or be
    # NaN) and the response would lose its gradient. Expected, A = +1, 2 responses: -1 / (2 * 2)
    # on each loss token of response 0. Response 1 (A = -1, 3 tokens, log r = 0): +1 / (3 * 2).
    old = _t([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    logp = old + _t([[0.0002, -0.0002, 0.0], [0.0, 0.0, 0.0]])
    mask = _t([[1, 1, 0], [1, 1, 1]]).to(mask_dtype)
    logp[0, 2], old[0, 2] = garbage, -garbage
    x = logp.clone().requires_grad_(True)
    loss_tok, stats = dapo.gspo_loss(x, old, _t([1.0, -1.0]), mask)
    assert torch.isfinite(loss_tok).all() and loss_tok[0, 2] == 0
    dapo.aggregate_loss(loss_tok, mask, "seq-mean-token-mean").backward()
    _close(x.grad, _t([[-0.25, -0.25, 0.0], [1 / 6, 1 / 6, 1 / 6]]), atol=1e-7)
    assert all(math.isfinite(v) for v in stats.values()) and stats["seq_clipfrac_high"] == 0.0


def _sequence_gspo(lp, old, adv, mask, eps_low, eps_high):
    """GSPO eq. 5 directly (TRL's form): s_i = exp(mean of log r), differentiated through the mean;
    (1 / B) sum over responses with loss tokens of max(-A s, -A clip(s)). Returns (loss, d/dlogp)."""
    x = _t(lp).requires_grad_(True)
    m = torch.tensor(mask).double()
    total = x.new_zeros(())
    for i in range(len(lp)):
        if m[i].sum() == 0:
            continue
        s = torch.exp(((x[i] - _t(old[i])) * m[i]).sum() / m[i].sum())
        a = adv[i]
        total = total + torch.maximum(-a * s, -a * s.clamp(1 - eps_low, 1 + eps_high))
    total = total / len(lp)
    total.backward()
    return total.item(), x.grad


@PROPERTY
@given(batches(), st.sampled_from(MASKS), st.sampled_from([(3e-4, 4e-4), (0.05, 0.1), (0.2, 0.2)]))
def test_gspo_token_form_equals_the_sequence_form(case, mask_dtype, eps):
    # With one advantage per response the GSPO-token loss, aggregated by seq-mean-token-mean, has
    # the value and the gradient of eq. 5 differentiated through the sequence mean.
    lp, old, adv, mask = case
    m = torch.tensor(mask)
    log_s = [float(((_t(lp[i]) - _t(old[i])) * m[i]).sum() / m[i].sum()) for i in range(len(lp)) if m[i].any()]
    assume(all(abs(math.exp(x) - (1 - eps[0])) > 1e-6 and abs(math.exp(x) - (1 + eps[1])) > 1e-6 for x in log_s))
    ref_loss, ref_grad = _sequence_gspo(lp, old, adv, mask, *eps)
    x = _t(lp).requires_grad_(True)
    loss_tok, _ = dapo.gspo_loss(x, _t(old), _t(adv), m.to(mask_dtype), eps_low=eps[0], eps_high=eps[1])
    loss = dapo.aggregate_loss(loss_tok, m.to(mask_dtype), "seq-mean-token-mean")
    loss.backward()
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    _close(x.grad, ref_grad, atol=1e-6, rtol=1e-5)


# =============================================================================================
# aggregation across micro-batches; no gradient into old_logp
# =============================================================================================

def _accumulated(fn, kw, logp, old, adv, mask, mode, glob, n_micro):
    """Sum of the gradients of n_micro micro-batches (rows split), each with the step's denominators."""
    x = logp.clone().requires_grad_(True)
    for rows in torch.arange(logp.shape[0]).chunk(n_micro):
        sl = slice(int(rows[0]), int(rows[-1]) + 1)
        loss_tok, _ = fn(x[sl], old[sl], adv[sl], mask[sl], **kw)
        dapo.aggregate_loss(loss_tok, mask[sl], mode, **dict(glob, group_num_tokens=glob["group_num_tokens"][sl])).backward()
    return x.grad


@pytest.mark.parametrize("fn, kw, mode", [(dapo.cispo_loss, dict(high=1.2), m) for m in MODES]
                         + [(dapo.gspo_loss, dict(eps_low=0.05, eps_high=0.05), "seq-mean-token-mean")],
                         ids=[f"cispo-{m}" for m in MODES] + ["gspo"])
@pytest.mark.parametrize("mask_dtype", MASKS)
@FEW
@given(seed=st.integers(0, 2**31 - 1))
def test_micro_batched_gradient_equals_full_batch(fn, kw, mode, mask_dtype, seed):
    # With the step's denominators given to every micro-batch the accumulated gradient is the full
    # batch's, for any split (the verl-project/verl#7913 class of bug, for every aggregation the surrogate
    # allows). Bounds tight enough that some tokens / responses are clipped.
    g = torch.Generator().manual_seed(seed)
    B, G, T = 8, 4, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(mask_dtype)  # (B, T)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    glob = dict(num_tokens=float(mask.sum()), num_seqs=B, max_len=T, num_groups=B // G,
                group_num_tokens=mask.double().reshape(B // G, G * T).sum(1).repeat_interleave(G))
    full = _accumulated(fn, kw, logp, old, adv, mask, mode, glob, 1)
    assert full.abs().sum() > 0
    for n_micro in (2, 4, 8):
        _close(_accumulated(fn, kw, logp, old, adv, mask, mode, glob, n_micro), full, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("fn", [dapo.cispo_loss, dapo.gspo_loss])
def test_no_gradient_reaches_old_logp(fn):
    torch.manual_seed(0)
    logp = (-torch.rand(3, 4, dtype=torch.float64) * 2).requires_grad_(True)
    old = (logp.detach() + 0.3 * torch.randn(3, 4, dtype=torch.float64)).requires_grad_(True)
    loss_tok, _ = fn(logp, old, torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64), torch.ones(3, 4))
    g, g_old = torch.autograd.grad(loss_tok.sum(), (logp, old), allow_unused=True)
    assert g_old is None and (g != 0).any()


# =============================================================================================
# with the off-policy objectives
# =============================================================================================

@pytest.mark.parametrize("surrogate, kw", [("cispo", dict(low=0.0, high=1.5)), ("gspo", dict(eps_low=0.01, eps_high=0.02))])
@pytest.mark.parametrize("mask_dtype", MASKS)
def test_offpolicy_objectives_compose_with_each_surrogate(surrogate, kw, mask_dtype):
    # naive: the surrogate around pi_prox; bypass: around mu; decoupled with mu == pi_prox: naive
    # exactly (w = 1). Nothing reaches pi_prox or mu.
    fn = {"cispo": dapo.cispo_loss, "gspo": dapo.gspo_loss}[surrogate]
    torch.manual_seed(1)
    prox = -torch.rand(3, 5, dtype=torch.float64) * 2
    behav = prox + 0.3 * torch.randn(3, 5, dtype=torch.float64)
    logp = prox + 0.2 * torch.randn(3, 5, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 2, 3])[:, None]).to(mask_dtype)
    for objective, old in (("naive", prox), ("bypass", behav)):
        out, _ = dapo.offpolicy_loss(logp, prox, behav, adv, mask, objective=objective, cap=2.0, surrogate=surrogate, **kw)
        assert torch.equal(out, fn(logp, old, adv, mask, **kw)[0]), objective
    same = torch.where(mask.bool(), prox, math.nan)
    out, stats = dapo.offpolicy_loss(logp, prox, same, adv, mask, objective="decoupled", cap=2.0, surrogate=surrogate, **kw)
    assert torch.equal(out, fn(logp, prox, adv, mask, **kw)[0]) and stats["weight_mean"] == 1.0
    p, b, x = prox.clone().requires_grad_(True), behav.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    out, _ = dapo.offpolicy_loss(x, p, b, adv, mask, objective="decoupled", cap=2.0, surrogate=surrogate, **kw)
    _, g_p, g_b = torch.autograd.grad(out.sum(), (x, p, b), allow_unused=True)
    assert g_p is None and g_b is None


@pytest.mark.parametrize("mask_dtype", MASKS)
def test_gspo_decoupled_weight_is_the_geometric_mean_per_response(mask_dtype):
    # log(pi_prox / mu) on 3 loss tokens: ln 2, ln 0.5, ln 4, then padding (garbage). The response's
    # weight is exp((ln 2 + ln 0.5 + ln 4) / 3) = 4^(1/3) = 1.5874 on every loss token, below C = 2;
    # exp of the sum (the product, 4) would be capped at 2. logp == pi_prox and A = +1, so the
    # GSPO loss per token is -1 and the decoupled loss -1.5874 (0 at padding).
    prox = _t([[-1.0, -2.0, -0.5, 0.0]])
    behav = prox - _t([[math.log(2.0), math.log(0.5), math.log(4.0), 0.0]])
    behav[0, 3] = math.nan
    mask = _t([[1, 1, 1, 0]]).to(mask_dtype)
    w, stats = dapo.behaviour_weight(prox, behav, mask, cap=2.0, level="sequence")
    geo = 4.0 ** (1 / 3)
    _close(w, _t([[geo, geo, geo, 0.0]]))
    assert stats["capped_frac"] == 0.0 and stats["ess"] == pytest.approx(1.0)
    # behav_kl stays the token-level k3: mean of r - 1 - ln r over r = 2, 0.5, 4.
    kl = sum(r - 1 - math.log(r) for r in (2.0, 0.5, 4.0)) / 3
    assert stats["behav_kl"] == pytest.approx(kl, rel=1e-6)
    out, _ = dapo.offpolicy_loss(prox, prox, behav, _t([1.0]), mask, objective="decoupled", cap=2.0, surrogate="gspo")
    _close(out, _t([[-geo, -geo, -geo, 0.0]]))
    # A response over the cap: token weights 4, 4 -> geometric mean 4 > C = 1.5: capped at 1.5, or
    # dropped (0) in mode "mask"; the token level caps each token the same way here.
    prox2, behav2, m2 = _t([[0.0, 0.0]]), _t([[-math.log(4.0)] * 2]), torch.ones(1, 2, dtype=mask_dtype)
    w, s = dapo.behaviour_weight(prox2, behav2, m2, cap=1.5, level="sequence")
    _close(w, _t([[1.5, 1.5]]))
    assert s["capped_frac"] == 1.0
    w, s = dapo.behaviour_weight(prox2, behav2, m2, cap=1.5, mode="mask", level="sequence")
    assert (w == 0).all() and s["masked_frac"] == 1.0


# =============================================================================================
# errors
# =============================================================================================

def test_errors():
    x, adv, mask = torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3)
    for kw in (dict(low=1.5), dict(low=-0.1), dict(high=0.2), dict(low=0.5, high=0.9), dict(low=math.nan)):
        with pytest.raises(ValueError, match="CISPO needs 0 <= low <= 1 <= high"):
            dapo.cispo_loss(x, x, adv, mask, **kw)
    for kw in (dict(eps_low=0.0), dict(eps_low=1.0), dict(eps_high=0.0), dict(eps_high=-1e-4)):
        with pytest.raises(ValueError, match="GSPO needs"):
            dapo.gspo_loss(x, x, adv, mask, **kw)
    for fn in (dapo.cispo_loss, dapo.gspo_loss):
        with pytest.raises(ValueError, match="must all be the same"):
            fn(x, torch.zeros(2, 4), adv, mask)
        with pytest.raises(ValueError, match="advantages"):
            fn(x, x, torch.zeros(3), mask)
    with pytest.raises(ValueError) as e:
        dapo.offpolicy_loss(x, x, None, adv, mask, objective="naive", cap=2.0, surrogate="sapo")
    assert all(name in str(e.value) for name in dapo.SURROGATES)
    with pytest.raises(ValueError, match="weight level"):
        dapo.behaviour_weight(x, x, mask, cap=2.0, level="group")
    with pytest.raises(TypeError):  # a parameter of another surrogate is not silently dropped
        dapo.offpolicy_loss(x, x, None, adv, mask, objective="naive", cap=2.0, surrogate="cispo", eps_high=0.28)


# =============================================================================================
# end to end: the generator process at lag 0 reproduces the inline loop with each surrogate
# =============================================================================================

def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _strip(rows: list[dict], drop=("time/", "perf/", "memory/", "async/", "gen_wall_s", "lag_s", "admission")) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]


@pytest.mark.parametrize("flags", [["--surrogate", "cispo", "--offpolicy_objective", "bypass"],
                                   ["--surrogate", "gspo", "--loss_agg", "seq-mean-token-mean",
                                    "--offpolicy_objective", "decoupled"]], ids=["cispo-bypass", "gspo-decoupled"])
def test_generator_process_at_lag_0_reproduces_inline_with_each_surrogate(tmp_path, flags):
    # 8 groups x 8 answers, mini-batch 16: 4 optimizer steps per rollout step, so the ratio leaves 1.
    small = ["--task_args", '{"train_size": 500}', "--steps", "2", "--eval_data", "", "--probe_every", "0", "--prompts_per_step", "8",
             "--gen_prompts_per_round", "12", "--mini_batch_size", "16", "--micro_batch_size", "16", "--run_id", "t", *flags]
    inline, proc = tmp_path / "inline", tmp_path / "proc"
    train.main(["--run_dir", str(inline), *small])
    train.main(["--run_dir", str(proc), "--generator_process", "true", *small])
    for name in ("metrics.jsonl", "rollouts.jsonl"):
        assert _strip(_jsonl(inline / name)) == _strip(_jsonl(proc / name)), name
    metrics = _jsonl(inline / "metrics.jsonl")
    assert all(m["policy/optimizer_steps"] == 4 for m in metrics)
    assert max(m["policy/approx_kl"] for m in metrics) > 0  # later mini-batches saw ratios != 1
    if "gspo" in flags:
        assert all("policy/seq_clipfrac_high" in m and "offpolicy/weight_mean" in m for m in metrics)
    a, b = load_file(inline / "final/model.safetensors"), load_file(proc / "final/model.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
