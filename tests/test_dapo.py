"""Tests of dapo.py, the pure math of DAPO (arXiv 2503.14476).

Written independently of dapo.py, from the docstrings' stated behaviour and hand derivations, so
that the two must agree. Three kinds of tests:
  - hand-derived values (each expected number is worked out in a comment next to it);
  - hypothesis properties (invariances, ranges, monotonicity);
  - slow reference versus fast implementation: a per-element Python loop against the vectorised
    policy loss, and micro-batched gradient accumulation against the full batch.
Each known failure of other implementations (docs/PITFALLS.md) that lives in this module has a
test that names it.

What the loss takes in (group advantages, overlong punishment and filter, dynamic sampling, token
log-probs) is tested in tests/test_dapo_inputs.py.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_dapo.py
"""

import math
import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dapo  # noqa: E402

# Small example counts and no deadline: the whole file has to run in well under a minute on a
# shared 2-core machine, and torch's first call on a new shape can be slow.
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=25, deadline=None,
               suppress_health_check=[HealthCheck.too_slow])

EPS_LOW, EPS_HIGH = 0.2, 0.28  # paper section 3.1 defaults, also dapo.py's defaults
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
         "seq-mean-token-sum-norm", "group-token-mean"]
STAT_KEYS = {"clipfrac_low", "clipfrac_high", "clipfrac_dual", "ratio_mean", "approx_kl"}
# dapo.py only promises "float" outputs of policy_loss: it may compute in float32 even from
# float64 inputs, so its values are compared at float32 precision.
FP32 = dict(atol=1e-6, rtol=1e-6)


def _f(x):
    """A stat (python float or 0-dim tensor) as a python float."""
    return float(x.item()) if torch.is_tensor(x) else float(x)


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def _close(a, b, atol=1e-6, rtol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a).double(), torch.as_tensor(b).double(),
                               atol=atol, rtol=rtol)


# =============================================================================================
# policy_loss
# =============================================================================================

def _ratio_batch(ratios, adv, mask=None, dtype=torch.float64):
    """logp = log(ratio), old_logp = 0: so the ratio is exactly (to rounding) the given one."""
    r = torch.tensor(ratios, dtype=dtype)
    logp = r.log().clone().requires_grad_(True)
    old = torch.zeros_like(logp)
    a = torch.tensor(adv, dtype=dtype)
    m = torch.ones_like(logp) if mask is None else torch.tensor(mask, dtype=dtype)
    return logp, old, a, m


def test_policy_loss_zero_advantage_gives_zero_loss_and_gradient():
    torch.manual_seed(0)
    logp = (-torch.rand(3, 5, dtype=torch.float64) * 3).requires_grad_(True)
    old = logp.detach() + 0.5 * torch.randn(3, 5, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    loss, stats = dapo.policy_loss(logp, old, torch.zeros(3, dtype=torch.float64), mask,
                                   dual_clip=3.0)
    assert (loss == 0).all()
    loss.sum().backward()
    assert (logp.grad == 0).all()
    assert _f(stats["clipfrac_low"]) == 0 and _f(stats["clipfrac_high"]) == 0
    assert _f(stats["clipfrac_dual"]) == 0


@pytest.mark.parametrize("adv_shape", ["seq", "token"])
def test_policy_loss_at_ratio_one_is_reinforce(adv_shape):
    # At r = 1 no clip is active, loss = -A * r per token, d/dlogp (-A * exp(logp - old)) = -A * r
    # = -A: the REINFORCE gradient, times the mask (0 at masked-out positions).
    torch.manual_seed(1)
    B, T = 4, 6
    logp = (-torch.rand(B, T, dtype=torch.float64) * 4).requires_grad_(True)
    old = logp.detach().clone()
    adv = torch.randn(B, dtype=torch.float64) if adv_shape == "seq" else \
        torch.randn(B, T, dtype=torch.float64)
    lengths = torch.tensor([6, 3, 1, 0])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()  # (B, T)
    loss, stats = dapo.policy_loss(logp, old, adv, mask, dual_clip=10.0)
    loss.sum().backward()
    a_tok = adv[:, None].expand(B, T) if adv_shape == "seq" else adv
    _close(loss, -a_tok * mask, **FP32)
    _close(logp.grad, -a_tok * mask, **FP32)
    assert _f(stats["ratio_mean"]) == pytest.approx(1.0, abs=1e-6)
    assert _f(stats["approx_kl"]) == pytest.approx(0.0, abs=1e-6)
    assert _f(stats["clipfrac_low"]) == 0 and _f(stats["clipfrac_high"]) == 0


def test_policy_loss_seq_and_token_advantages_agree():
    torch.manual_seed(2)
    B, T = 3, 4
    logp = -torch.rand(B, T, dtype=torch.float64) * 2
    old = logp + 0.4 * torch.randn(B, T, dtype=torch.float64)
    adv = torch.randn(B, dtype=torch.float64)
    mask = torch.rand(B, T) > 0.3
    l1, _ = dapo.policy_loss(logp, old, adv, mask)
    l2, _ = dapo.policy_loss(logp, old, adv[:, None].expand(B, T).contiguous(), mask)
    _close(l1, l2, atol=0, rtol=0)


def test_policy_loss_symmetric_clip_is_ppo():
    # eps_high == eps_low == e: the per-token loss is the PPO clip written by hand.
    torch.manual_seed(3)
    B, T, e = 5, 7, 0.2
    logp = -torch.rand(B, T, dtype=torch.float64) * 3
    old = logp + 0.6 * torch.randn(B, T, dtype=torch.float64)
    adv = torch.randn(B, dtype=torch.float64)
    mask = (torch.rand(B, T) > 0.2).double()
    loss, _ = dapo.policy_loss(logp, old, adv, mask, eps_low=e, eps_high=e)
    r = torch.exp(logp - old)
    A = adv[:, None]
    ppo = -torch.minimum(r * A, torch.clamp(r, 1 - e, 1 + e) * A) * mask
    _close(loss, ppo, **FP32)


def test_policy_loss_gradient_zero_outside_clip_range_nonzero_inside():
    # Columns: ratios; A > 0 on row 0, A < 0 on row 1. eps_low 0.2, eps_high 0.28.
    ratios = [[1.5, 1.1, 0.5, 1.0],   # A=+2: r>1.28 clipped (grad 0); 1.1 inside; 0.5 not clipped
              [0.5, 0.9, 1.5, 1.0]]   # A=-2: r<0.8 clipped (grad 0); 0.9 inside; 1.5 not clipped
    logp, old, adv, mask = _ratio_batch(ratios, [2.0, -2.0])
    loss, _ = dapo.policy_loss(logp, old, adv, mask)
    loss.sum().backward()
    g = logp.grad
    # Hand values: A>0: loss -A*min(r, 1.28) -> [-2.56, -2.2, -1.0, -2.0], grad -A*r unclipped.
    #              A<0: loss |A|*max(r, 0.8) -> [1.6, 1.8, 3.0, 2.0], grad |A|*r unclipped.
    _close(loss, _t([[-2.56, -2.2, -1.0, -2.0], [1.6, 1.8, 3.0, 2.0]]), **FP32)
    _close(g, _t([[0.0, -2.2, -1.0, -2.0], [0.0, 1.8, 3.0, 2.0]]), **FP32)
    assert g[0, 0] == 0 and g[1, 0] == 0
    assert (g[:, 1:] != 0).all()


def test_policy_loss_dual_clip_caps_negative_advantage_loss():
    # Scripts' dual clip c=3 for A < 0: loss = min(|A| * max(r, 0.8), 3 |A|).
    # A = -2: r = 5 -> min(10, 6) = 6, grad 0; r = 2 -> 4 (below cap), grad |A| r = 4;
    #         r = 0.5 -> 1.6 (low clip), grad 0.
    # A = +2: r = 5 -> the dual clip does not apply to A > 0: -2 * 1.28 = -2.56, grad 0.
    logp, old, adv, mask = _ratio_batch([[5.0, 2.0, 0.5], [5.0, 1.0, 1.0]], [-2.0, 2.0])
    loss, stats = dapo.policy_loss(logp, old, adv, mask, dual_clip=3.0)
    loss.sum().backward()
    _close(loss, _t([[6.0, 4.0, 1.6], [-2.56, -2.0, -2.0]]), **FP32)
    _close(logp.grad, _t([[0.0, 4.0, 0.0], [0.0, -2.0, -2.0]]), **FP32)
    assert logp.grad[0, 0] == 0
    # Without the dual clip the same token costs |A| r = 10 and has gradient 10.
    logp2, old2, adv2, mask2 = _ratio_batch([[5.0]], [-2.0])
    l2, s2 = dapo.policy_loss(logp2, old2, adv2, mask2)
    l2.sum().backward()
    assert l2.item() == pytest.approx(10.0, abs=1e-6)
    assert logp2.grad.item() == pytest.approx(10.0, abs=1e-6)
    assert _f(s2["clipfrac_dual"]) == 0.0
    # Masked tokens: 6; A<0 and r>3: one -> 1/6. A<0 and r<0.8: one -> 1/6. A>0 and r>1.28: 1/6.
    assert _f(stats["clipfrac_dual"]) == pytest.approx(1 / 6)
    assert _f(stats["clipfrac_low"]) == pytest.approx(1 / 6)
    assert _f(stats["clipfrac_high"]) == pytest.approx(1 / 6)


def test_policy_loss_clip_fractions_hand_case():
    # eps_low 0.2 (low bound 0.8), eps_high 0.28 (high bound 1.28), dual clip 3.
    ratios = [[1.0, 1.5, 0.5, 1.29, 2.0],    # A=+1
              [0.7, 1.0, 4.0, 0.79, 0.1],    # A=-1
              [2.0, 0.1, 1.0, 5.0, 1.0]]     # A=0: never counted as clipped
    mask = [[1, 1, 1, 1, 0],                 # the masked-out 2.0 would be "high"
            [1, 1, 1, 1, 0],                 # the masked-out 0.1 would be "low"
            [1, 1, 1, 1, 1]]
    logp, old, adv, m = _ratio_batch(ratios, [1.0, -1.0, 0.0], mask)
    _, stats = dapo.policy_loss(logp, old, adv, m, dual_clip=3.0)
    assert STAT_KEYS <= set(stats)
    n = 13  # masked tokens
    # high: row 0, r in {1.5, 1.29} -> 2; low: row 1, r in {0.7, 0.79} -> 2; dual: row 1, 4.0 -> 1
    assert _f(stats["clipfrac_high"]) == pytest.approx(2 / n, abs=1e-6)
    assert _f(stats["clipfrac_low"]) == pytest.approx(2 / n, abs=1e-6)
    assert _f(stats["clipfrac_dual"]) == pytest.approx(1 / n, abs=1e-6)
    kept = [r for row, mrow in zip(ratios, mask) for r, mm in zip(row, mrow) if mm]
    assert _f(stats["ratio_mean"]) == pytest.approx(sum(kept) / n, abs=1e-6)
    k3 = sum((r - 1) - math.log(r) for r in kept) / n
    assert _f(stats["approx_kl"]) == pytest.approx(k3, abs=1e-6)
    # Without dual clip the dual fraction is 0 and the others do not change.
    _, s2 = dapo.policy_loss(logp, old, adv, m)
    assert _f(s2["clipfrac_dual"]) == 0.0
    assert _f(s2["clipfrac_high"]) == pytest.approx(2 / n, abs=1e-6)


@pytest.mark.parametrize("garbage", [1e4, -1e4, 80.0, -80.0, math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_policy_loss_exactly_zero_at_masked_positions_with_garbage(garbage, mask_dtype):
    # Padding positions may hold anything: logp - old_logp = 1e4 overflows exp() to inf in
    # float32, and inf * 0 = nan; a -inf or nan log-prob at padding is common too. The loss there
    # must still be exactly 0, the stats finite and over the real tokens only, and no nan
    # gradient may reach the real logits (torch.where after the exp is not enough: its backward
    # multiplies the zero upstream gradient by exp(garbage)).
    torch.manual_seed(4)
    B, T = 3, 5
    logp = -torch.rand(B, T) * 2
    old = logp + 0.1 * torch.randn(B, T)
    lengths = torch.tensor([5, 2, 3])
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T) bool
    logp[~mask] = garbage
    old[~mask] = -garbage
    logp.requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 0.5])
    loss, stats = dapo.policy_loss(logp, old, adv, mask.to(mask_dtype), dual_clip=10.0)
    assert loss.shape == (B, T)
    assert (loss[~mask] == 0).all(), loss
    assert torch.isfinite(loss).all()
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all(), logp.grad
    assert (logp.grad[~mask] == 0).all()
    for k in STAT_KEYS:
        assert math.isfinite(_f(stats[k])), (k, stats[k])
    r = torch.exp(logp.detach() - old)[mask]
    assert _f(stats["ratio_mean"]) == pytest.approx(r.mean().item(), rel=1e-5)


def test_policy_loss_log_ratio_is_clamped_to_stay_finite():
    # Documented behaviour (dapo.LOG_RATIO_CLAMP): log r is clamped to [-20, 20] before
    # exp, so an extreme log-prob gap gives a finite, saturated loss with zero gradient instead of
    # overflowing. A < 0, no dual clip, log r = 25: loss |A| e^20, gradient 0.
    logp = torch.tensor([[25.0]], requires_grad=True)
    loss, _ = dapo.policy_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    loss.sum().backward()
    assert loss.item() == pytest.approx(math.exp(dapo.LOG_RATIO_CLAMP), rel=1e-5)
    assert logp.grad.item() == 0.0
    # Below the clamp the unclipped side is exact: log r = 3 gives loss e^3 and gradient e^3.
    logp = torch.tensor([[3.0]], requires_grad=True)
    loss, _ = dapo.policy_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    loss.sum().backward()
    assert loss.item() == pytest.approx(math.exp(3), rel=1e-5)
    assert logp.grad.item() == pytest.approx(math.exp(3), rel=1e-5)


def test_policy_loss_bool_and_float_mask_agree():
    torch.manual_seed(5)
    logp = -torch.rand(4, 6, dtype=torch.float64)
    old = logp + 0.5 * torch.randn(4, 6, dtype=torch.float64)
    adv = torch.randn(4, dtype=torch.float64)
    mask = torch.rand(4, 6) > 0.4
    mask[0, 0] = True
    lb, sb = dapo.policy_loss(logp, old, adv, mask, dual_clip=2.0)
    lf, sf = dapo.policy_loss(logp, old, adv, mask.double(), dual_clip=2.0)
    _close(lb, lf, atol=0, rtol=0)
    for k in STAT_KEYS:
        assert _f(sb[k]) == pytest.approx(_f(sf[k]), abs=1e-6)


def test_policy_loss_errors():
    logp = torch.zeros(2, 3)
    adv = torch.zeros(2)
    mask = torch.ones(2, 3)
    for kw in (dict(eps_low=0.0), dict(eps_low=-0.1), dict(eps_low=0.3, eps_high=0.2),
               dict(dual_clip=1.0), dict(dual_clip=0.5)):
        with pytest.raises(ValueError):
            dapo.policy_loss(logp, logp, adv, mask, **kw)
    with pytest.raises(ValueError):
        dapo.policy_loss(logp, torch.zeros(2, 4), adv, mask)
    with pytest.raises(ValueError):
        dapo.policy_loss(logp, logp, torch.zeros(3), mask)
    with pytest.raises(ValueError):
        dapo.policy_loss(logp, logp, torch.zeros(2, 4), mask)
    with pytest.raises(ValueError):
        dapo.policy_loss(logp, logp, adv, torch.ones(2, 4))


# --- slow reference: a per-element Python loop of scalar math --------------------------------

def _policy_loss_loop(lp, olp, adv, mask, eps_low, eps_high, dual_clip):
    """Per token: loss, d loss / d logp, and the stats, from the docstring's case analysis."""
    B, T = len(lp), len(lp[0])
    loss = [[0.0] * T for _ in range(B)]
    grad = [[0.0] * T for _ in range(B)]
    n = low = high = dual = 0
    rsum = klsum = 0.0
    for b in range(B):
        for t in range(T):
            if not mask[b][t]:
                continue
            a = adv[b][t] if isinstance(adv[b], list) else adv[b]
            log_r = lp[b][t] - olp[b][t]
            r = math.exp(log_r)
            if a >= 0:
                if r < 1 + eps_high:           # -A r, d/dlogp = -A r
                    loss[b][t], grad[b][t] = -a * r, -a * r
                else:                          # -A (1 + eps_high), constant
                    loss[b][t], grad[b][t] = -a * (1 + eps_high), 0.0
            else:
                if r > 1 - eps_low:            # |A| r, d/dlogp = |A| r
                    loss[b][t], grad[b][t] = -a * r, -a * r
                else:                          # |A| (1 - eps_low), constant
                    loss[b][t], grad[b][t] = -a * (1 - eps_low), 0.0
                if dual_clip is not None and loss[b][t] > dual_clip * -a:
                    loss[b][t], grad[b][t] = dual_clip * -a, 0.0
            n += 1
            low += a < 0 and r < 1 - eps_low
            high += a > 0 and r > 1 + eps_high
            dual += dual_clip is not None and a < 0 and r > dual_clip
            rsum += r
            klsum += (r - 1) - log_r
    stats = dict(clipfrac_low=low / n, clipfrac_high=high / n, clipfrac_dual=dual / n,
                 ratio_mean=rsum / n, approx_kl=klsum / n)
    return loss, grad, stats


@st.composite
def policy_cases(draw):
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 5))
    # float32-representable inputs: the implementation may compute in float32, and a float64
    # advantage of -1e-250 that becomes -0.0 would change its sign class.
    fl = st.floats(-4.0, 1.0, allow_subnormal=False, width=32)
    lp = [draw(st.lists(fl, min_size=T, max_size=T)) for _ in range(B)]
    olp = [draw(st.lists(fl, min_size=T, max_size=T)) for _ in range(B)]
    af = st.one_of(st.just(0.0), st.floats(-3.0, 3.0, allow_subnormal=False, width=32))
    if draw(st.booleans()):
        adv = draw(st.lists(af, min_size=B, max_size=B))
    else:
        adv = [draw(st.lists(af, min_size=T, max_size=T)) for _ in range(B)]
    mask = [draw(st.lists(st.booleans(), min_size=T, max_size=T)) for _ in range(B)]
    mask[0][0] = True  # at least one counted token, so the stats are defined
    eps_low = draw(st.floats(0.01, 0.5))
    eps_high = eps_low + draw(st.floats(0.0, 0.5))
    dual = draw(st.one_of(st.none(), st.floats(1.0, 20.0, exclude_min=True)))
    return lp, olp, adv, mask, eps_low, eps_high, dual


@PROPERTY
@given(policy_cases())
def test_policy_loss_matches_python_loop(case):
    lp, olp, adv, mask, eps_low, eps_high, dual = case
    loss_ref, grad_ref, stats_ref = _policy_loss_loop(lp, olp, adv, mask, eps_low, eps_high, dual)
    logp = _t(lp).requires_grad_(True)
    loss, stats = dapo.policy_loss(logp, _t(olp), _t(adv), torch.tensor(mask),
                                   eps_low=eps_low, eps_high=eps_high, dual_clip=dual)
    assert loss.shape == logp.shape
    _close(loss, _t(loss_ref), **FP32)
    loss.sum().backward()
    # The gradient is ambiguous exactly on a clip boundary; skip those measure-zero tokens.
    g, g_ref = logp.grad, _t(grad_ref)
    r = torch.exp(_t(lp) - _t(olp))
    bounds = [1 - eps_low, 1 + eps_high] + ([dual] if dual is not None else [])
    away = torch.ones_like(r, dtype=torch.bool)
    for x in bounds:
        away &= (r - x).abs() > 1e-9
    _close(g[away], g_ref[away], **FP32)
    assert STAT_KEYS <= set(stats)
    for k in STAT_KEYS:
        assert _f(stats[k]) == pytest.approx(stats_ref[k], rel=1e-6, abs=1e-6), k


# =============================================================================================
# aggregate_loss
# =============================================================================================

def _agg_example():
    loss = _t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = _t([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    return loss, mask


@pytest.mark.parametrize("mode, kwargs, expect", [
    # masked sums: row 0 = 1+2+3 = 6 (3 tokens), row 1 = 4 (1 token); total 10 over 4 tokens.
    ("token-mean", {}, 10 / 4),
    ("token-mean", {"num_tokens": 10}, 10 / 10),            # step-wide count passed in
    ("seq-mean-token-mean", {}, (6 / 3 + 4 / 1) / 2),          # (2 + 4) / 2 = 3
    ("seq-mean-token-mean", {"num_seqs": 4}, (2 + 4) / 4),
    ("seq-mean-token-sum", {}, (6 + 4) / 2),
    ("seq-mean-token-sum", {"num_seqs": 5}, (6 + 4) / 5),
    ("seq-mean-token-sum-norm", {"max_len": 5}, 10 / (2 * 5)),
    ("seq-mean-token-sum-norm", {"max_len": 5, "num_seqs": 4}, 10 / (4 * 5)),
])
@pytest.mark.parametrize("mask_dtype", [torch.float64, torch.bool])
def test_aggregate_hand_values(mode, kwargs, expect, mask_dtype):
    loss, mask = _agg_example()
    out = dapo.aggregate_loss(loss, mask.to(mask_dtype), mode, **kwargs)
    assert out.dim() == 0
    assert out.item() == pytest.approx(expect, abs=1e-12)


def test_aggregate_group_token_mean_hand_value():
    # Paper eq. 8. G = 2, two groups.
    # group 0 = rows 0, 1: masked sum 1+2+3 + 4 = 10 over 3 + 1 = 4 tokens -> 2.5
    # group 1 = rows 2, 3: masked sum 7+8 = 15 over 2 + 0 = 2 tokens      -> 7.5
    # mean over the 2 groups: 5.0. (token-mean of the batch: 25 / 6 = 4.1667; seq-mean-token-mean:
    # (2 + 4 + 7.5 + 0) / 4 = 3.375, the all-masked row 3 counting 0.)
    loss = _t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.0, 1.0, 1.0]])
    mask = _t([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    gnt = _t([4, 4, 2, 2])
    out = dapo.aggregate_loss(loss, mask, "group-token-mean", group_num_tokens=gnt, num_groups=2)
    assert out.item() == pytest.approx(5.0, abs=1e-12)
    # Counted as part of a 4-group step, the same tokens weigh half.
    out4 = dapo.aggregate_loss(loss, mask, "group-token-mean", group_num_tokens=gnt,
                               num_groups=4)
    assert out4.item() == pytest.approx(2.5, abs=1e-12)
    assert dapo.aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(25 / 6)
    assert dapo.aggregate_loss(loss, mask, "seq-mean-token-mean").item() == \
        pytest.approx(3.375, abs=1e-12)


def test_aggregate_group_token_mean_all_masked_group_is_zero_not_nan():
    # Known failure 2: a group whose answers were all overlong-filtered has 0 tokens; it must add
    # 0, not 0/0 = nan. Group 0: 10 / 4 = 2.5; group 1 (all masked): 0; mean over 2 groups 1.25.
    loss = _t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.0, 1.0, 1.0]])
    loss.requires_grad_(True)
    mask = _t([[1, 1, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]])
    out = dapo.aggregate_loss(loss, mask, "group-token-mean", group_num_tokens=_t([4, 4, 0, 0]),
                              num_groups=2)
    assert out.item() == pytest.approx(1.25, abs=1e-12)
    out.backward()
    assert torch.isfinite(loss.grad).all()
    _close(loss.grad, mask / 4 / 2, atol=1e-12, rtol=0)


def test_aggregate_token_mean_vs_seq_mean_token_mean():
    torch.manual_seed(6)
    loss = torch.randn(4, 5, dtype=torch.float64)
    # Equal lengths: (sum / (B L)) == mean over rows of (row sum / L).
    eq = (torch.arange(5)[None, :] < 3).double().expand(4, 5)
    assert dapo.aggregate_loss(loss, eq, "token-mean").item() == pytest.approx(
        dapo.aggregate_loss(loss, eq, "seq-mean-token-mean").item(), abs=1e-12)
    # Unequal lengths, concrete: rows [1, 1, 1] and [3]: token-mean (1+1+1+3)/4 = 1.5,
    # seq-mean-token-mean (1 + 3) / 2 = 2: the long answer weighs more per token in token-mean.
    l2 = _t([[1.0, 1.0, 1.0], [3.0, 9.0, 9.0]])
    m2 = _t([[1, 1, 1], [1, 0, 0]])
    assert dapo.aggregate_loss(l2, m2, "token-mean").item() == pytest.approx(1.5, abs=1e-12)
    assert dapo.aggregate_loss(l2, m2, "seq-mean-token-mean").item() == \
        pytest.approx(2.0, abs=1e-12)


@pytest.mark.parametrize("num_tokens", [None, 0])
def test_aggregate_token_mean_all_masked_is_zero_with_grad(num_tokens):
    # Known failure 2: every answer of the batch truncated and filtered -> 0 / 0. Must be 0, not
    # nan, and backward must still run (every rank has to join the gradient all-reduce).
    loss = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(3, 4, dtype=torch.float64)
    out = dapo.aggregate_loss(loss, mask, "token-mean", num_tokens=num_tokens)
    assert out.dim() == 0 and out.item() == 0.0
    assert out.requires_grad
    out.backward()
    assert loss.grad is not None and (loss.grad == 0).all()


def test_aggregate_seq_mean_token_mean_empty_sequence_counts_zero():
    # Row 1 fully masked: it contributes 0 and still counts in the local num_seqs (B = 2):
    # (6 / 3 + 0) / 2 = 1.
    loss = _t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).requires_grad_(True)
    mask = _t([[1, 1, 1], [0, 0, 0]])
    out = dapo.aggregate_loss(loss, mask, "seq-mean-token-mean")
    assert out.item() == pytest.approx(1.0, abs=1e-12)
    out.backward()
    assert torch.isfinite(loss.grad).all()
    _close(loss.grad, _t([[1 / 6, 1 / 6, 1 / 6], [0, 0, 0]]), atol=1e-12, rtol=0)


def test_aggregate_errors():
    loss, mask = _agg_example()
    with pytest.raises(ValueError) as e:
        dapo.aggregate_loss(loss, mask, "token_sum")
    msg = str(e.value)
    for m in MODES:
        assert m in msg, f"error for an unknown mode should list {m!r}: {msg}"
    with pytest.raises(ValueError):
        dapo.aggregate_loss(loss, mask, "seq-mean-token-sum-norm")  # max_len missing
    with pytest.raises(ValueError):
        dapo.aggregate_loss(loss, mask, "group-token-mean", num_groups=1)
    with pytest.raises(ValueError):
        dapo.aggregate_loss(loss, mask, "group-token-mean", group_num_tokens=_t([4, 4]))


# --- slow reference: every mode as a Python loop over sequences and tokens ---------------------

def _aggregate_loop(loss, mask, mode, G, num_tokens, num_seqs, max_len, num_groups):
    B, T = len(loss), len(loss[0])
    seq_sum = [sum(loss[b][t] for t in range(T) if mask[b][t]) for b in range(B)]
    seq_len = [sum(1 for t in range(T) if mask[b][t]) for b in range(B)]
    if mode == "token-mean":
        return sum(seq_sum) / num_tokens if num_tokens else 0.0
    if mode == "seq-mean-token-mean":
        return sum(s / n for s, n in zip(seq_sum, seq_len) if n) / num_seqs
    if mode == "seq-mean-token-sum":
        return sum(seq_sum) / num_seqs
    if mode == "seq-mean-token-sum-norm":
        return sum(seq_sum) / (num_seqs * max_len)
    total = 0.0  # group-token-mean: each group's token sum over its own token count
    for g0 in range(0, B, G):
        n = sum(seq_len[g0:g0 + G])
        if n:
            total += sum(seq_sum[g0:g0 + G]) / n
    return total / num_groups


@pytest.mark.parametrize("mode", MODES)
@FEW
@given(data=st.data())
def test_aggregate_matches_python_loop(mode, data):
    G = data.draw(st.integers(2, 4))
    n = data.draw(st.integers(1, 3))
    B, T = G * n, data.draw(st.integers(1, 6))
    vals = st.floats(-10, 10, allow_subnormal=False, width=32)
    loss = [data.draw(st.lists(vals, min_size=T, max_size=T)) for _ in range(B)]
    mask = [data.draw(st.lists(st.booleans(), min_size=T, max_size=T)) for _ in range(B)]
    local = sum(map(sum, mask))
    # Step-wide denominators at least as large as the local ones (more micro-batches exist).
    num_tokens = local + data.draw(st.integers(0, 20))
    num_seqs = B + data.draw(st.integers(0, 8))
    num_groups = n + data.draw(st.integers(0, 3))
    max_len = T + data.draw(st.integers(0, 10))
    expect = _aggregate_loop(loss, mask, mode, G, num_tokens, num_seqs, max_len, num_groups)
    m = torch.tensor(mask)
    gnt = m.double().reshape(n, G * T).sum(1).repeat_interleave(G)  # (B,)
    out = dapo.aggregate_loss(_t(loss), m, mode, num_tokens=num_tokens, num_seqs=num_seqs,
                              max_len=max_len, group_num_tokens=gnt, num_groups=num_groups)
    assert out.dim() == 0 and torch.isfinite(out)
    assert out.item() == pytest.approx(expect, rel=1e-9, abs=1e-9)


# --- slow reference: micro-batched gradient accumulation against the full batch --------------

def _step(seed, B=8, G=4, T=9, uneven=None):
    """One optimizer step's batch: uneven lengths, every group with at least one token."""
    g = torch.Generator().manual_seed(seed)
    if uneven is None:
        lengths = torch.randint(0, T + 1, (B,), generator=g)
        lengths[0::G] = torch.clamp(lengths[0::G], min=1)
    else:
        lengths = torch.tensor(uneven)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()  # (B, T)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    n_groups = B // G
    group_tokens = mask.reshape(n_groups, G * T).sum(1).repeat_interleave(G)  # (B,)
    glob = dict(num_tokens=int(mask.sum().item()), num_seqs=B, max_len=T,
                group_num_tokens=group_tokens, num_groups=n_groups)
    return logp, old, adv, mask, glob


def _grad(logp, old, adv, mask, mode, glob, n_micro, local_token_mean=False):
    """Sum of the gradients of n_micro micro-batches, each with the step-wide denominators."""
    B = logp.shape[0]
    logp.grad = None
    total = 0.0
    for rows in torch.arange(B).chunk(n_micro):
        sl = slice(int(rows[0]), int(rows[-1]) + 1)
        loss_tok, _ = dapo.policy_loss(logp[sl], old[sl], adv[sl], mask[sl], dual_clip=3.0)
        if local_token_mean:  # the known failure: per-micro-batch mean, averaged over micros
            loss = dapo.aggregate_loss(loss_tok, mask[sl], "token-mean") / n_micro
        else:
            kw = dict(glob, group_num_tokens=glob["group_num_tokens"][sl])
            loss = dapo.aggregate_loss(loss_tok, mask[sl], mode, **kw)
        loss.backward()
        total += loss.item()
    return logp.grad.clone(), total


@pytest.mark.parametrize("mode", MODES)
@FEW
@given(seed=st.integers(0, 2**31 - 1))
def test_gradient_accumulation_matches_full_batch(mode, seed):
    # Known failure 1: with the denominators of the whole optimizer step passed to every
    # micro-batch, the accumulated gradient is the full-batch gradient, for any split.
    logp, old, adv, mask, glob = _step(seed)
    g_full, l_full = _grad(logp, old, adv, mask, mode, glob, 1)
    assert torch.isfinite(g_full).all() and g_full.abs().sum() > 0
    for n_micro in (2, 4, 8):
        g, l = _grad(logp, old, adv, mask, mode, glob, n_micro)
        _close(g, g_full, atol=1e-6, rtol=1e-6)
        assert l == pytest.approx(l_full, abs=1e-6)


@pytest.mark.parametrize("n_micro", [2, 4, 8])
def test_gradient_accumulation_with_local_token_mean_differs(n_micro):
    # Negative control for the test above: the per-micro-batch token-mean (the bug of verl issues
    # 5625 / 2776) weighs a token of a short micro-batch more. Lengths 9 9 9 9 | 1 1 1 2: with 2
    # micro-batches the first has 36 tokens, the second 5, the step 41; a token of micro 2 gets
    # weight 1 / (2 * 5) = 0.1 instead of 1 / 41 = 0.024.
    logp, old, adv, mask, glob = _step(7, uneven=[9, 9, 9, 9, 1, 1, 1, 2])
    g_full, _ = _grad(logp, old, adv, mask, "token-mean", glob, 1)
    g_bad, _ = _grad(logp, old, adv, mask, "token-mean", glob, n_micro, local_token_mean=True)
    assert (g_bad - g_full).abs().max().item() > 1e-3
    # ...and with one micro-batch the local count is the step-wide count.
    g_one, _ = _grad(logp, old, adv, mask, "token-mean", glob, 1, local_token_mean=True)
    _close(g_one, g_full, atol=1e-12, rtol=1e-12)
