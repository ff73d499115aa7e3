"""Tests of what dapo.py computes before the loss: group advantages (paper eq. 9), the soft
overlong punishment (paper eq. 13) and the overlong filter, dynamic sampling's group filter (paper
eq. 11). Token log-probs with entropy are tested in tests/test_forward.py. The loss itself (the clipped objective, aggregation,
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
