"""Tests of what dapo.py computes before the loss: group advantages (paper eq. 9), the soft
overlong punishment (paper eq. 13) and the overlong filter, dynamic sampling's group filter (paper
eq. 11), and token log-probs with entropy. The loss itself (the clipped objective, aggregation,
gradient accumulation) is tested in tests/test_dapo.py, written the same way: hand-derived values,
hypothesis properties, slow references.
Each known failure of other implementations (docs/PITFALLS.md) that lives here has a test that
names it.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_dapo_inputs.py
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

# The same budgets as tests/test_dapo.py: well under a minute on a shared 2-core machine.
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=25, deadline=None,
               suppress_health_check=[HealthCheck.too_slow])


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def _close(a, b, atol=1e-6, rtol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a).double(), torch.as_tensor(b).double(),
                               atol=atol, rtol=rtol)


# =============================================================================================
# group_advantages
# =============================================================================================

def test_advantages_hand_example_uses_unbiased_std():
    # rewards [1, -1, -1, -1]: mean -0.5, deviations [1.5, -0.5, -0.5, -0.5],
    # sum of squares 2.25 + 3 * 0.25 = 3; unbiased var 3 / (4 - 1) = 1 -> std 1.
    # (The biased std would be sqrt(0.75) = 0.866 and give 1.732 for the first answer.)
    r = _t([1.0, -1.0, -1.0, -1.0])
    a = dapo.group_advantages(r, 4)
    _close(a, _t([1.5, -0.5, -0.5, -0.5]) / (1.0 + 1e-6), atol=1e-9, rtol=1e-9)


def test_advantages_hand_example_two_groups():
    # group 0: [1, 0] -> mean 0.5, unbiased var (0.25 + 0.25) / 1 = 0.5, std 0.70711
    #          -> A = +-0.5 / 0.70711 = +-0.70711
    # group 1: [3, 3] -> constant -> 0 exactly.
    r = _t([1.0, 0.0, 3.0, 3.0])
    a = dapo.group_advantages(r, 2)
    s = math.sqrt(0.5) + 1e-6
    _close(a, _t([0.5 / s, -0.5 / s, 0.0, 0.0]), atol=1e-9, rtol=1e-9)
    assert a[2].item() == 0.0 and a[3].item() == 0.0


def test_advantages_eps_is_added_to_the_std():
    # [1, -1, -1, -1] has std 1; with eps 0.5: A_0 = 1.5 / (1 + 0.5) = 1.0, others -0.5/1.5.
    a = dapo.group_advantages(_t([1.0, -1.0, -1.0, -1.0]), 4, eps=0.5)
    _close(a, _t([1.0, -1.0 / 3, -1.0 / 3, -1.0 / 3]), atol=1e-9, rtol=1e-9)


def test_advantages_without_std_is_dr_grpo():
    # Dr. GRPO (scale_by_std=False): R - group mean. Group 0 mean -0.5, group 1 mean 2.
    r = _t([1.0, -1.0, -1.0, -1.0, 0.0, 2.0, 2.0, 4.0])
    a = dapo.group_advantages(r, 4, scale_by_std=False)
    _close(a, _t([1.5, -0.5, -0.5, -0.5, -2.0, 0.0, 0.0, 2.0]), atol=1e-12, rtol=0)


@pytest.mark.parametrize("group_size", [2, 3, 7, 8, 16])
@pytest.mark.parametrize("value", [0.1, 0.3, -0.9, 1.1, 2.3])
def test_advantages_constant_group_is_exactly_zero_in_float32(value, group_size):
    # Known failure 3 (exact float equality on std): in float32 the mean of sixteen 0.1s is not
    # 0.1, so R - mean is ~7e-9, the std ~8e-9, and a naive (R - mean) / (std + 1e-6) gives
    # ~7e-3 instead of 0. A constant group carries no signal: its advantage must be exactly 0.
    r = torch.full((2 * group_size,), value, dtype=torch.float32)
    r[group_size:] = 2 * value  # a second constant group, different constant
    a = dapo.group_advantages(r, group_size)
    assert a.shape == (2 * group_size,)
    assert torch.isfinite(a).all()
    assert (a == 0).all(), f"constant group gave {a.tolist()}"
    # Dr. GRPO divides by nothing, so nothing amplifies the rounding of the float32 mean: a few
    # ulps of the reward (7e-9 for 0.1) are harmless there; require no more than that.
    d = dapo.group_advantages(r, group_size, scale_by_std=False)
    assert torch.isfinite(d).all()
    assert d.abs().max().item() <= 1e-6 * abs(value), d.tolist()


def _rewards(draw, values=st.integers(-3, 3)):
    g = draw(st.integers(2, 8))
    n = draw(st.integers(1, 5))
    r = draw(st.lists(values, min_size=n * g, max_size=n * g))
    return torch.tensor(r, dtype=torch.float64), g


rewards_and_group = st.composite(_rewards)


@PROPERTY
@given(rewards_and_group())
def test_advantages_match_formula_and_sum_to_zero(rg):
    r, g = rg
    a = dapo.group_advantages(r, g)
    assert a.shape == r.shape and a.is_floating_point()
    # Independent reference with numpy: unbiased std (ddof=1), eps added to the std.
    rn = r.numpy().reshape(-1, g)
    expect = (rn - rn.mean(1, keepdims=True)) / (rn.std(1, ddof=1, keepdims=True) + 1e-6)
    _close(a, torch.from_numpy(expect.reshape(-1)), atol=1e-6, rtol=1e-6)
    per_group = a.double().reshape(-1, g)
    _close(per_group.sum(1), torch.zeros(per_group.shape[0]), atol=1e-6, rtol=0)
    # Each non-constant group comes out with unbiased std ~1 (std / (std + 1e-6)).
    for row, raw in zip(per_group, rn):
        if raw.std() > 0:
            assert abs(row.std(unbiased=True).item() - 1.0) < 1e-4
        else:
            assert (row == 0).all()


@PROPERTY
@given(rewards_and_group(), st.floats(-50, 50), st.floats(0.5, 100))
def test_advantages_invariant_to_shift_and_positive_scale(rg, shift, scale):
    r, g = rg
    a = dapo.group_advantages(r, g).double()
    _close(dapo.group_advantages(r + shift, g), a, atol=1e-5, rtol=0)
    # Integer rewards: a non-constant group of size <= 8 has std >= 0.35, so the eps=1e-6 moves
    # the scaled result by at most |A| * 1e-6 / 0.35 * |1 - 1/scale| < 1e-5.
    _close(dapo.group_advantages(r * scale, g), a, atol=1e-4, rtol=0)
    # Dr. GRPO: shift-invariant and linear in the scale.
    d = dapo.group_advantages(r, g, scale_by_std=False).double()
    _close(dapo.group_advantages(r + shift, g, scale_by_std=False), d, atol=1e-9, rtol=0)
    _close(dapo.group_advantages(r * scale, g, scale_by_std=False), d * scale,
           atol=1e-9, rtol=1e-9)


def test_advantages_errors():
    r = _t([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError):
        dapo.group_advantages(r, 4)  # 6 not divisible by 4
    with pytest.raises(ValueError):
        dapo.group_advantages(r, 1)  # G < 2
    with pytest.raises(ValueError):
        dapo.group_advantages(r, 0)
    for bad in (float("nan"), float("inf"), float("-inf")):
        rb = r.clone()
        rb[3] = bad
        with pytest.raises(ValueError):
            dapo.group_advantages(rb, 2)


# =============================================================================================
# overlong_penalty (paper eq. 13) and overlong_filter
# =============================================================================================

def test_overlong_penalty_hand_values():
    # max_len 20, buffer 4: free up to 16; inside (16, 20]: (16 - len) / 4; beyond 20: -1.
    lengths = torch.tensor([0, 10, 16, 17, 18, 19, 20, 21, 100])
    p = dapo.overlong_penalty(lengths, max_len=20, buffer_len=4)
    _close(p, _t([0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]), atol=1e-7, rtol=0)
    assert p.is_floating_point() and p.shape == (9,)
    p2 = dapo.overlong_penalty(lengths, max_len=20, buffer_len=4, penalty_factor=0.5)
    _close(p2, _t([0, 0, 0, -0.125, -0.25, -0.375, -0.5, -0.5, -0.5]), atol=1e-7, rtol=0)
    # The paper's run: L_max 20480, L_cache 4096. 18432 is the middle of the buffer -> -0.5.
    p3 = dapo.overlong_penalty(torch.tensor([16384, 18432, 20480, 20481]), max_len=20480,
                               buffer_len=4096)
    _close(p3, _t([0.0, -0.5, -1.0, -1.0]), atol=1e-7, rtol=0)


@PROPERTY
@given(max_len=st.integers(2, 30000), data=st.data(),
       factor=st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 5.0)))
def test_overlong_penalty_properties(max_len, data, factor):
    buf = data.draw(st.integers(1, max_len - 1))
    free = max_len - buf
    lengths = data.draw(st.lists(st.integers(0, 3 * max_len), min_size=1, max_size=20))
    # Always include the corners: end of the free zone, first buffer token, max_len, max_len + 1.
    lengths = sorted(set(lengths + [free, free + 1, max_len, max_len + 1]))
    p = dapo.overlong_penalty(torch.tensor(lengths), max_len=max_len, buffer_len=buf,
                              penalty_factor=factor).double()
    tol = 1e-6 * max(1.0, factor)
    for n, v in zip(lengths, p.tolist()):
        if n <= free:
            assert v == 0.0
        elif n <= max_len:
            assert v == pytest.approx((free - n) / buf * factor, abs=tol)
        else:
            assert v == pytest.approx(-factor, abs=tol)
        assert -factor - tol <= v <= 0.0
    assert (p[1:] - p[:-1] <= tol).all(), "penalty must not increase with length"
    # Slope inside the buffer: one more token costs factor / buffer_len.
    i = lengths.index(free + 1)
    j = lengths.index(max_len)
    if j > i:
        slope = (p[j] - p[i]).item() / (max_len - (free + 1))
        assert slope == pytest.approx(-factor / buf, abs=tol)
    assert p[lengths.index(max_len)].item() == pytest.approx(-factor, abs=tol)


def test_overlong_penalty_errors():
    n = torch.tensor([1, 2, 3])
    for kw in (dict(max_len=10, buffer_len=10), dict(max_len=10, buffer_len=11),
               dict(max_len=10, buffer_len=-1), dict(max_len=10, buffer_len=0),
               dict(max_len=10, buffer_len=4, penalty_factor=-0.5)):
        with pytest.raises(ValueError):
            dapo.overlong_penalty(n, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.long])
def test_overlong_filter_zeroes_exactly_truncated_rows(dtype):
    torch.manual_seed(8)
    mask = (torch.rand(5, 6) > 0.3).to(dtype)
    before = mask.clone()
    truncated = torch.tensor([False, True, False, True, False])
    out = dapo.overlong_filter(mask, truncated)
    assert out.dtype == mask.dtype and out.shape == mask.shape
    assert torch.equal(mask, before), "input mask was modified"
    assert (out[truncated] == 0).all()
    assert torch.equal(out[~truncated], mask[~truncated])
    out[0] = 0 if dtype != torch.bool else False  # the result is a new tensor, not a view
    assert torch.equal(mask, before)
    # Nothing truncated: same values, still a copy.
    out2 = dapo.overlong_filter(mask, torch.zeros(5, dtype=torch.bool))
    assert torch.equal(out2, mask)
    out2.zero_()
    assert torch.equal(mask, before)


# =============================================================================================
# dynamic_sampling_keep
# =============================================================================================

@PROPERTY
@given(g=st.integers(2, 8), n=st.integers(1, 12), data=st.data())
def test_dynamic_sampling_keeps_exactly_mixed_groups(g, n, data):
    bits = data.draw(st.lists(st.booleans(), min_size=g * n, max_size=g * n))
    keep = dapo.dynamic_sampling_keep(torch.tensor(bits, dtype=torch.bool), g)
    expect = []
    for i in range(n):
        c = sum(bits[i * g:(i + 1) * g])
        expect.append(0 < c < g)
    assert keep.shape == (n,) and keep.dtype == torch.bool
    assert keep.tolist() == expect


def test_dynamic_sampling_hand_case_and_errors():
    c = torch.tensor([1, 0, 1, 0, 0, 0, 1, 1, 1], dtype=torch.bool)  # mixed, all wrong, all right
    assert dapo.dynamic_sampling_keep(c, 3).tolist() == [True, False, False]
    with pytest.raises(ValueError):
        dapo.dynamic_sampling_keep(c, 4)
    with pytest.raises(ValueError):
        dapo.dynamic_sampling_keep(c, 1)


# =============================================================================================
# token_logprobs
# =============================================================================================

def _ref_logprobs(logits, tokens, temperature):
    """Naive fp32 reference: the full log_softmax at once."""
    lsm = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, T, V)
    logp = lsm.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)         # (B, T)
    entropy = -(lsm.exp() * lsm).sum(-1)                            # (B, T)
    return logp, entropy


def _check_logprobs(B, T, V, temperature, chunk_size, seed, scale=3.0, atol=1e-5):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(B, T, V, generator=g) * scale
    tokens = torch.randint(0, V, (B, T), generator=g)
    w = torch.randn(B, T, generator=g)
    logits = base.clone().requires_grad_(True)
    logp, ent = dapo.token_logprobs(logits, tokens, temperature=temperature,
                                    chunk_size=chunk_size)
    assert logp.shape == (B, T) and ent.shape == (B, T)
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32
    assert not ent.requires_grad
    (logp * w).sum().backward()
    ref_logits = base.clone().requires_grad_(True)
    rl, re = _ref_logprobs(ref_logits, tokens, temperature)
    (rl * w).sum().backward()
    _close(logp, rl, atol=atol, rtol=1e-5)
    _close(ent, re, atol=3 * atol, rtol=1e-5)  # an lse - E[x] entropy loses a few fp32 ulps
    _close(logits.grad, ref_logits.grad, atol=atol, rtol=1e-5)


def test_token_logprobs_matches_reference_in_chunks():
    # 3 * 5 = 15 rows in chunks of 4: three full chunks and a ragged one; temperature != 1.
    _check_logprobs(3, 5, 37, temperature=0.7, chunk_size=4, seed=0)
    _check_logprobs(3, 5, 37, temperature=1.3, chunk_size=1, seed=1)
    _check_logprobs(3, 5, 37, temperature=1.0, chunk_size=1024, seed=2)


def test_token_logprobs_non_contiguous_logits():
    # The usual call slices the model output, logits[:, :-1], which is not contiguous.
    g = torch.Generator().manual_seed(10)
    full = (torch.randn(2, 6, 11, generator=g) * 2).requires_grad_(True)
    tokens = torch.randint(0, 11, (2, 5), generator=g)
    logits = full[:, :-1]  # (2, 5, 11) view, not contiguous
    assert not logits.is_contiguous()
    logp, ent = dapo.token_logprobs(logits, tokens, temperature=0.9, chunk_size=3)
    logp.sum().backward()
    ref_full = full.detach().clone().requires_grad_(True)
    rl, re = _ref_logprobs(ref_full[:, :-1], tokens, 0.9)
    rl.sum().backward()
    _close(logp, rl, atol=1e-5, rtol=1e-5)
    _close(ent, re, atol=3e-5, rtol=1e-5)
    _close(full.grad, ref_full.grad, atol=1e-5, rtol=1e-5)
    assert (full.grad[:, -1] == 0).all()


def test_token_logprobs_large_logits_stable():
    # Logits ~1e3 / 0.6: no overflow, no nan. fp32 spacing at 5000 is 5e-4, hence the atol.
    _check_logprobs(2, 3, 50, temperature=0.6, chunk_size=5, seed=3, scale=1e3, atol=1e-2)


@FEW
@given(B=st.integers(1, 3), T=st.integers(1, 6), V=st.integers(2, 40),
       temperature=st.floats(0.5, 2.0), chunk_size=st.integers(1, 20),
       seed=st.integers(0, 2**31 - 1))
def test_token_logprobs_property(B, T, V, temperature, chunk_size, seed):
    _check_logprobs(B, T, V, temperature, chunk_size, seed)


def test_token_logprobs_bf16_logits():
    g = torch.Generator().manual_seed(9)
    base = (torch.randn(2, 7, 64, generator=g) * 3).to(torch.bfloat16)
    tokens = torch.randint(0, 64, (2, 7), generator=g)
    w = torch.randn(2, 7, generator=g)
    logits = base.clone().requires_grad_(True)
    logp, ent = dapo.token_logprobs(logits, tokens, temperature=0.7, chunk_size=5)
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32
    (logp * w).sum().backward()
    assert logits.grad is not None and logits.grad.shape == logits.shape
    up = base.float().requires_grad_(True)  # the same numbers, upcast exactly
    rl, re = _ref_logprobs(up, tokens, 0.7)
    (rl * w).sum().backward()
    # A bf16 division by the temperature costs ~2^-8 relative on logits of size ~10.
    _close(logp, rl, atol=5e-2, rtol=1e-2)
    _close(ent, re, atol=5e-2, rtol=1e-2)
    _close(logits.grad.float(), up.grad, atol=2e-2, rtol=2e-2)


def test_token_logprobs_entropy_is_not_sampled_nll_hand_case():
    # Known failure 9. p = [1/2, 1/4, 1/4]: entropy = 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2 = 1.0397;
    # the sampled token 0 has -log p = ln 2 = 0.6931, token 1 has ln 4 = 1.3863.
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]]]))  # (1, 2, 3)
    logp, ent = dapo.token_logprobs(logits, torch.tensor([[0, 1]]))
    _close(ent, torch.full((1, 2), 1.5 * math.log(2)), atol=1e-6, rtol=0)
    _close(logp, _t([[-math.log(2), -math.log(4)]]), atol=1e-6, rtol=0)
    assert (ent + logp).abs().min().item() > 0.3
    # Temperature 2 on logits [0, 2 ln 3]: tempered logits [0, ln 3] -> p = [1/4, 3/4];
    # entropy = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623; log p(token 1) = ln 3/4 = -0.2877.
    logits2 = torch.tensor([[[0.0, 2 * math.log(3)]]])
    lp2, e2 = dapo.token_logprobs(logits2, torch.tensor([[1]]), temperature=2.0)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert e2.item() == pytest.approx(h, abs=1e-6)
    assert lp2.item() == pytest.approx(math.log(0.75), abs=1e-6)


def test_token_logprobs_entropy_with_minus_inf_logits():
    # Masked vocabulary entries (-inf logits) have p = 0 and add 0 * log 0 = 0 to the entropy.
    # logits [0, 1, -inf]: p = [1/(1+e), e/(1+e), 0] = [0.26894, 0.73106, 0];
    # H = -(0.26894 ln 0.26894 + 0.73106 ln 0.73106) = 0.58220; log p(token 1) = -0.31326.
    logits = torch.tensor([[[0.0, 1.0, -math.inf]]], requires_grad=True)
    logp, ent = dapo.token_logprobs(logits, torch.tensor([[1]]))
    p1 = math.e / (1 + math.e)
    assert logp.item() == pytest.approx(math.log(p1), abs=1e-6)
    logp.sum().backward()
    assert torch.isfinite(logits.grad).all()
    h = -((1 - p1) * math.log(1 - p1) + p1 * math.log(p1))
    assert ent.item() == pytest.approx(h, abs=1e-6)


def test_token_logprobs_errors():
    logits = torch.randn(2, 3, 5)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    for t in (0.0, -1.0):
        with pytest.raises(ValueError):
            dapo.token_logprobs(logits, tokens, temperature=t)
    with pytest.raises(ValueError):
        dapo.token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError):
        dapo.token_logprobs(logits[0], tokens)
