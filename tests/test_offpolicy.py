"""Tests of the off-policy correction in dapo.py: behaviour_weight and offpolicy_loss.

Written from the docstrings and hand derivations, like tests/test_dapo.py. Notation: mu is the
sampler's policy (behav_logp), pi_prox the learner's recomputed one (prox_logp), pi_theta the one
being optimised (logp); w = pi_prox / mu, C the cap.
  - exact reductions (float64 inputs, bit-for-bit): "decoupled" with mu == pi_prox is
    policy_loss(logp, pi_prox); "naive" is policy_loss(logp, pi_prox); "bypass" is
    policy_loss(logp, mu);
  - gradients: the weight is a constant (no gradient reaches pi_prox or mu), and
    d loss / d logp = w * d policy_loss / d logp;
  - cap and mask: a capped token weighs exactly C; a masked one adds 0 loss and 0 gradient but
    still counts in aggregate_loss's denominator;
  - diagnostics: hand values of the effective sample size and the k3 KL, padding ignored;
  - slow reference: a per-token Python loop of scalar math against the vectorised loss, its
    gradient and its stats.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_offpolicy.py
"""

import math
import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dapo  # noqa: E402

# Small example counts and no deadline: the file has to run in seconds on a shared 2-core machine.
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

W_KEYS = {"weight_mean", "weight_min", "weight_max", "capped_frac", "masked_frac", "ess", "behav_kl"}
P_KEYS = {"clipfrac_low", "clipfrac_high", "clipfrac_dual", "ratio_mean", "ratio_max", "approx_kl"}
# The implementation computes in float32 (as policy_loss does); compared at float32 precision.
FP32 = dict(atol=1e-5, rtol=1e-5)


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def _close(a, b, atol=1e-6, rtol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a).double(), torch.as_tensor(b).double(),
                               atol=atol, rtol=rtol)


def _weight(log_ratios, cap, mode="cap", mask=None):
    """behaviour_weight of one row whose log(pi_prox / mu) are the given numbers (mu = 1)."""
    prox = _t([log_ratios])
    m = torch.ones_like(prox) if mask is None else _t([mask])
    return dapo.behaviour_weight(prox, torch.zeros_like(prox), m, cap=cap, mode=mode)


@st.composite
def cases(draw):
    """A small batch as python lists: logp, prox, behav, adv, mask and the clip settings."""
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 5))
    # float32-representable inputs: the implementation computes in float32, so the loop's float64
    # arithmetic then starts from the same numbers.
    fl = st.floats(-4.0, 1.0, allow_subnormal=False, width=32)
    rows = lambda: [draw(st.lists(fl, min_size=T, max_size=T)) for _ in range(B)]  # noqa: E731
    lp, prox, behav = rows(), rows(), rows()
    af = st.one_of(st.just(0.0), st.floats(-3.0, 3.0, allow_subnormal=False, width=32))
    if draw(st.booleans()):
        adv = draw(st.lists(af, min_size=B, max_size=B))
    else:
        adv = [draw(st.lists(af, min_size=T, max_size=T)) for _ in range(B)]
    mask = [draw(st.lists(st.booleans(), min_size=T, max_size=T)) for _ in range(B)]
    mask[0][0] = True  # at least one counted token
    eps_low = draw(st.floats(0.01, 0.5))
    eps_high = eps_low + draw(st.floats(0.0, 0.5))
    dual = draw(st.one_of(st.none(), st.floats(1.0, 20.0, exclude_min=True)))
    return dict(lp=lp, prox=prox, behav=behav, adv=adv, mask=mask,
                clip=dict(eps_low=eps_low, eps_high=eps_high, dual_clip=dual))


caps = st.one_of(st.floats(1.0, 8.0), st.just(math.inf))


# =============================================================================================
# exact reductions
# =============================================================================================

@PROPERTY
@given(cases(), caps, st.sampled_from(dapo.OFFPOLICY_WEIGHT_MODES), st.booleans())
def test_decoupled_with_mu_equal_to_prox_is_policy_loss_exactly(case, cap, mode, bool_mask):
    # w = exp(0) = 1 exactly on every counted token (C >= 1), so loss * w is the loss bit for bit,
    # and so is its gradient. mu may hold anything at padding (here NaN): it is never read there.
    mask = torch.tensor(case["mask"])
    mask = mask if bool_mask else mask.double()
    prox = _t(case["prox"])
    behav = torch.where(mask.bool(), prox, math.nan)
    logp_ref = _t(case["lp"]).requires_grad_(True)
    logp = _t(case["lp"]).requires_grad_(True)
    ref, ref_stats = dapo.policy_loss(logp_ref, prox, _t(case["adv"]), mask, **case["clip"])
    out, stats = dapo.offpolicy_loss(logp, prox, behav, _t(case["adv"]), mask, objective="decoupled",
                                     cap=cap, weight_mode=mode, **case["clip"])
    assert out.dtype == ref.dtype and torch.equal(out, ref)
    ref.sum().backward()
    out.sum().backward()
    assert torch.equal(logp.grad, logp_ref.grad)
    assert {k: stats[k] for k in P_KEYS} == ref_stats
    assert W_KEYS <= set(stats)
    assert stats["weight_mean"] == stats["weight_min"] == stats["weight_max"] == 1.0
    assert stats["ess"] == 1.0 and stats["behav_kl"] == 0.0
    assert stats["capped_frac"] == 0.0 and stats["masked_frac"] == 0.0


@PROPERTY
@given(cases(), caps, st.sampled_from(dapo.OFFPOLICY_WEIGHT_MODES))
def test_naive_is_policy_loss_against_prox_and_bypass_against_mu(case, cap, mode):
    adv, mask = _t(case["adv"]), torch.tensor(case["mask"])
    prox, behav = _t(case["prox"]), _t(case["behav"])
    for objective, old in (("naive", prox), ("bypass", behav)):
        logp_ref = _t(case["lp"]).requires_grad_(True)
        logp = _t(case["lp"]).requires_grad_(True)
        ref, ref_stats = dapo.policy_loss(logp_ref, old, adv, mask, **case["clip"])
        out, stats = dapo.offpolicy_loss(logp, prox, behav, adv, mask, objective=objective, cap=cap,
                                         weight_mode=mode, **case["clip"])
        assert torch.equal(out, ref), objective
        ref.sum().backward()
        out.sum().backward()
        assert torch.equal(logp.grad, logp_ref.grad), objective
        assert {k: stats[k] for k in P_KEYS} == ref_stats
        # Both log-probs given: the staleness diagnostics come along, the weight is not applied.
        assert W_KEYS <= set(stats)
    # "naive" never reads mu, "bypass" never reads pi_prox: either may be None.
    naive_none, s_naive = dapo.offpolicy_loss(_t(case["lp"]), prox, None, adv, mask, objective="naive",
                                              cap=cap, **case["clip"])
    assert torch.equal(naive_none, dapo.policy_loss(_t(case["lp"]), prox, adv, mask, **case["clip"])[0])
    bypass_none, s_bypass = dapo.offpolicy_loss(_t(case["lp"]), None, behav, adv, mask, objective="bypass",
                                                cap=cap, **case["clip"])
    assert torch.equal(bypass_none, dapo.policy_loss(_t(case["lp"]), behav, adv, mask, **case["clip"])[0])
    assert set(s_naive) == P_KEYS and set(s_bypass) == P_KEYS  # no weight, no weight stats


# =============================================================================================
# gradients: the weight is a constant
# =============================================================================================

@pytest.mark.parametrize("mode", dapo.OFFPOLICY_WEIGHT_MODES)
def test_weight_carries_no_gradient(mode):
    torch.manual_seed(0)
    B, T = 4, 6
    prox = (-torch.rand(B, T, dtype=torch.float64) * 3).requires_grad_(True)
    behav = (prox.detach() + torch.randn(B, T, dtype=torch.float64)).requires_grad_(True)
    logp = (prox.detach() + 0.3 * torch.randn(B, T, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(B, dtype=torch.float64)
    mask = torch.arange(T)[None, :] < torch.tensor([6, 4, 1, 0])[:, None]  # (B, T)
    w, _ = dapo.behaviour_weight(prox, behav, mask, cap=2.0, mode=mode)
    assert not w.requires_grad and w.grad_fn is None
    for objective in dapo.OFFPOLICY_OBJECTIVES:
        loss, _ = dapo.offpolicy_loss(logp, prox, behav, adv, mask, objective=objective, cap=2.0,
                                      weight_mode=mode)
        _, g_prox, g_behav = torch.autograd.grad(loss.sum(), (logp, prox, behav), allow_unused=True)
        assert g_prox is None and g_behav is None, objective  # not in the graph at all
    # d (w * loss_tok) / d logp = w * d loss_tok / d logp, token by token (w is a constant).
    loss, _ = dapo.offpolicy_loss(logp, prox, behav, adv, mask, objective="decoupled", cap=2.0,
                                  weight_mode=mode)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    ref, _ = dapo.policy_loss(logp, prox.detach(), adv, mask)
    (g_ref,) = torch.autograd.grad(ref.sum(), logp)
    _close(g, w * g_ref, atol=1e-7, rtol=1e-6)
    assert (w != 1).any()  # the test is not vacuous


# =============================================================================================
# cap and mask: hand cases
# =============================================================================================

def test_cap_mode_hand_case():
    # log(pi_prox / mu) = [0, -1, ln 1.5, ln 3, 30] and a padded 6th position, C = 2:
    #   r = [1, e^-1, 1.5, 3, e^20 (30 is clamped to LOG_RATIO_CLAMP = 20 first)]
    #   w = [1, e^-1, 1.5, 2, 2]: the two beyond C weigh exactly C; the padding weighs 0.
    w, s = _weight([0.0, -1.0, math.log(1.5), math.log(3.0), 30.0, 99.0], 2.0, "cap",
                   mask=[1, 1, 1, 1, 1, 0])
    assert w.dtype == torch.float32
    _close(w, _t([[1.0, math.exp(-1.0), 1.5, 2.0, 2.0, 0.0]]))
    assert w[0, 0].item() == 1.0 and w[0, 3].item() == 2.0 and w[0, 4].item() == 2.0 and w[0, 5].item() == 0.0
    ws = [1.0, math.exp(-1.0), 1.5, 2.0, 2.0]
    assert s["weight_mean"] == pytest.approx(sum(ws) / 5, rel=1e-6)
    assert s["weight_min"] == pytest.approx(math.exp(-1.0), rel=1e-6)
    assert s["weight_max"] == 2.0
    assert s["capped_frac"] == pytest.approx(2 / 5) and s["masked_frac"] == 0.0
    # ess = (sum w)^2 / (N sum w^2) = 6.8679^2 / (5 * 11.3853) = 0.82858
    assert s["ess"] == pytest.approx(sum(ws) ** 2 / (5 * sum(x * x for x in ws)), rel=1e-6)
    # behav_kl: mean of r - 1 - ln r over the raw (clamped, uncapped) ratios:
    #   0, e^-1 - 1 + 1 = e^-1, 0.5 - ln 1.5, 2 - ln 3, e^20 - 1 - 20
    kl = [0.0, math.exp(-1.0), 0.5 - math.log(1.5), 2.0 - math.log(3.0), math.exp(20.0) - 21.0]
    assert s["behav_kl"] == pytest.approx(sum(kl) / 5, rel=1e-6)


def test_mask_mode_hand_case():
    # Same ratios, mode "mask": the two beyond C drop out (w = 0), the rest keep w = r.
    w, s = _weight([0.0, -1.0, math.log(1.5), math.log(3.0), 30.0, 99.0], 2.0, "mask",
                   mask=[1, 1, 1, 1, 1, 0])
    _close(w, _t([[1.0, math.exp(-1.0), 1.5, 0.0, 0.0, 0.0]]))
    assert (w[0, 3:] == 0).all()
    ws = [1.0, math.exp(-1.0), 1.5, 0.0, 0.0]
    assert s["masked_frac"] == pytest.approx(2 / 5) and s["capped_frac"] == 0.0
    assert s["weight_min"] == 0.0 and s["weight_max"] == pytest.approx(1.5, rel=1e-6)
    assert s["weight_mean"] == pytest.approx(sum(ws) / 5, rel=1e-6)
    assert s["ess"] == pytest.approx(sum(ws) ** 2 / (5 * sum(x * x for x in ws)), rel=1e-6)
    # A ratio of exactly C is not beyond it: C = 1 and r = exp(0) = 1 keeps the token.
    w1, s1 = _weight([0.0], 1.0, "mask")
    assert w1.item() == 1.0 and s1["masked_frac"] == 0.0


def test_masked_tokens_add_nothing_but_stay_in_the_denominator():
    # One response, A = +1, logp == pi_prox (u = 1 inside the clip): policy loss -A u = -1 per token.
    # log(pi_prox / mu) = [0, ln 0.5, ln 4, ln 8] and a padded 5th position; C = 2, mode "mask":
    #   w = [1, 0.5, 0, 0] -> loss_tok = [-1, -0.5, 0, 0, 0]
    #   token-mean over ALL 4 counted tokens: (-1 - 0.5) / 4 = -0.375   (not -1.5 / 2 = -0.75)
    #   d/dlogp: w * (-A u) / 4 = [-0.25, -0.125, 0, 0, 0]
    prox = _t([[-1.0, -2.0, -0.5, -3.0, 0.0]])
    behav = prox - _t([[0.0, math.log(0.5), math.log(4.0), math.log(8.0), 0.0]])
    logp = prox.clone().requires_grad_(True)
    mask = _t([[1, 1, 1, 1, 0]])
    loss_tok, stats = dapo.offpolicy_loss(logp, prox, behav, _t([1.0]), mask, objective="decoupled",
                                          cap=2.0, weight_mode="mask")
    _close(loss_tok, _t([[-1.0, -0.5, 0.0, 0.0, 0.0]]))
    assert (loss_tok[0, 2:] == 0).all()
    loss = dapo.aggregate_loss(loss_tok, mask, "token-mean")
    assert loss.item() == pytest.approx(-0.375, rel=1e-6)
    loss.backward()
    _close(logp.grad, _t([[-0.25, -0.125, 0.0, 0.0, 0.0]]))
    assert (logp.grad[0, 2:] == 0).all()
    assert stats["masked_frac"] == pytest.approx(0.5)
    # The same with mode "cap": w = [1, 0.5, 2, 2], (-1 - 0.5 - 2 - 2) / 4 = -1.375.
    loss_tok, _ = dapo.offpolicy_loss(prox, prox, behav, _t([1.0]), mask, objective="decoupled",
                                      cap=2.0, weight_mode="cap")
    assert dapo.aggregate_loss(loss_tok, mask, "token-mean").item() == pytest.approx(-1.375, rel=1e-6)


@PROPERTY
@given(cases(), st.floats(1.0, 3.0))
def test_mask_mode_token_mean_is_kept_sum_over_all_tokens(case, cap):
    # With the whole step's token count: sum over the kept tokens of w * policy loss, over ALL
    # counted tokens (dropped ones included); the dropped tokens get exactly 0 gradient.
    prox, behav, adv = _t(case["prox"]), _t(case["behav"]), _t(case["adv"])
    mask = torch.tensor(case["mask"])
    logp = _t(case["lp"]).requires_grad_(True)
    loss_tok, _ = dapo.offpolicy_loss(logp, prox, behav, adv, mask, objective="decoupled", cap=cap,
                                      weight_mode="mask", **case["clip"])
    w, _ = dapo.behaviour_weight(prox, behav, mask, cap=cap, mode="mask")
    dropped = mask & (w == 0)  # (B, T)
    ref_tok, _ = dapo.policy_loss(logp.detach(), prox, adv, mask, **case["clip"])
    loss = dapo.aggregate_loss(loss_tok, mask, "token-mean", num_tokens=int(mask.sum()))
    expect = (ref_tok * w)[mask & ~dropped].double().sum() / mask.sum()
    _close(loss, expect, **FP32)
    loss.backward()
    assert (loss_tok[dropped] == 0).all() and (logp.grad[dropped] == 0).all()


def test_cap_below_one_caps_or_drops_on_policy_tokens():
    # Documented: C < 1 is accepted, and then even w = 1 (mu == pi_prox) exceeds it.
    w, s = _weight([0.0, 0.0, -1.0], 0.5, "cap")
    _close(w, _t([[0.5, 0.5, math.exp(-1.0)]]))
    assert s["capped_frac"] == pytest.approx(2 / 3)
    w, s = _weight([0.0, 0.0, -1.0], 0.5, "mask")
    _close(w, _t([[0.0, 0.0, math.exp(-1.0)]]))
    assert s["masked_frac"] == pytest.approx(2 / 3)


def test_extreme_log_ratios_stay_finite():
    # +-50 is clamped to +-20 (LOG_RATIO_CLAMP) before exp: w = e^20 uncapped (C = inf), e^-20 below.
    w, s = _weight([50.0, -50.0], math.inf)
    _close(w, _t([[math.exp(20.0), math.exp(-20.0)]]), rtol=1e-6, atol=0)
    assert all(math.isfinite(v) for v in s.values())
    assert s["ess"] == pytest.approx(0.5, rel=1e-6)  # one weight dominates: about 1/N


@PROPERTY
@given(cases(), st.floats(1.0, 8.0))
def test_cap_mode_is_truncated_importance_sampling(case, cap):
    # On counted tokens "cap" is min(pi_prox / mu, C), truncated importance sampling (Yao et al.,
    # 2025), computed here in float64 from the definition; masked-out positions weigh 0.
    prox, behav, mask = _t(case["prox"]), _t(case["behav"]), torch.tensor(case["mask"])
    w, _ = dapo.behaviour_weight(prox, behav, mask, cap=cap)
    expected = torch.exp((prox.double() - behav.double()).clamp(-dapo.LOG_RATIO_CLAMP, dapo.LOG_RATIO_CLAMP)).clamp(max=cap)
    _close(w[mask].double(), expected[mask], atol=0, rtol=1e-6)
    assert (w[~mask] == 0).all()


# =============================================================================================
# diagnostics
# =============================================================================================

def test_ess_hand_values():
    # Equal weights: (N w)^2 / (N * N w^2) = 1, whatever w.
    assert _weight([0.3] * 5, 2.0)[1]["ess"] == pytest.approx(1.0, abs=1e-12)
    assert _weight([0.0] * 4, 2.0)[1]["ess"] == 1.0
    # One nonzero weight of N = 4 (the other three beyond C = 2, dropped): w^2 / (4 w^2) = 1/4.
    assert _weight([-0.5, 1.0, 2.0, 3.0], 2.0, "mask")[1]["ess"] == pytest.approx(1 / 4, abs=1e-12)
    # Weights 1 and 3 (C = inf): (1 + 3)^2 / (2 * (1 + 9)) = 16 / 20 = 0.8.
    assert _weight([0.0, math.log(3.0)], math.inf)[1]["ess"] == pytest.approx(0.8, rel=1e-6)
    # Every token dropped: no effective sample, 0. Nothing counted (N = 0): the documented 1.
    assert _weight([1.0, 2.0], 2.0, "mask")[1]["ess"] == 0.0
    _, s = _weight([1.0, 2.0], 2.0, "mask", mask=[0, 0])
    assert s == dict(weight_mean=1.0, weight_min=1.0, weight_max=1.0, capped_frac=0.0,
                     masked_frac=0.0, ess=1.0, behav_kl=0.0)


def test_behav_kl_hand_two_tokens():
    # r = pi_prox / mu = 2 and 1/2. k3 = (r - 1) - ln r:
    #   r = 2:   1 - ln 2    = 0.306853
    #   r = 1/2: -1/2 + ln 2 = 0.193147
    # mean (1 - 1/2) / 2 = 0.25 exactly: the ln 2 terms cancel. A padded third position with
    # r = e^20 would add (e^20 - 21) / 3 if it were counted.
    _, s = _weight([math.log(2.0), -math.log(2.0), 20.0], math.inf, mask=[1, 1, 0])
    assert s["behav_kl"] == pytest.approx(0.25, rel=1e-6)
    # KL(mu || pi_prox) >= 0 and 0 exactly for r = 1; the cap and mode do not change it.
    assert _weight([0.0, 0.0], 2.0)[1]["behav_kl"] == 0.0
    assert _weight([math.log(2.0), -math.log(2.0)], 1.5, "mask")[1]["behav_kl"] == pytest.approx(0.25, rel=1e-6)


@pytest.mark.parametrize("garbage", [1e4, -1e4, 80.0, math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("mode", dapo.OFFPOLICY_WEIGHT_MODES)
def test_stats_and_loss_ignore_padding(garbage, mode):
    # Padding may hold anything in any of the three log-prob tensors; the weight there is 0, the
    # loss 0 and finite, the gradient finite, and the stats are those of the real tokens alone
    # (the same numbers, in the same order, as a batch of just those tokens).
    torch.manual_seed(1)
    B, T = 3, 5
    prox = -torch.rand(B, T) * 2
    behav = prox + 0.7 * torch.randn(B, T)
    logp = prox + 0.2 * torch.randn(B, T)
    adv = torch.tensor([1.0, -1.0, 0.5])
    mask = torch.arange(T)[None, :] < torch.tensor([5, 2, 3])[:, None]  # (B, T)
    ref_w, ref_s = dapo.behaviour_weight(prox[mask][None], behav[mask][None], torch.ones(1, 10),
                                         cap=1.5, mode=mode)
    for x in (prox, behav, logp):
        x[~mask] = garbage
    logp.requires_grad_(True)
    w, s = dapo.behaviour_weight(prox, behav, mask, cap=1.5, mode=mode)
    assert (w[~mask] == 0).all() and torch.equal(w[mask], ref_w[0])
    assert s == ref_s
    loss, stats = dapo.offpolicy_loss(logp, prox, behav, adv, mask, objective="decoupled", cap=1.5,
                                      weight_mode=mode, dual_clip=10.0)
    assert torch.isfinite(loss).all() and (loss[~mask] == 0).all()
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all() and (logp.grad[~mask] == 0).all()
    assert all(math.isfinite(v) for v in stats.values())


# =============================================================================================
# slow reference: a per-token Python loop of scalar math
# =============================================================================================

def _offpolicy_loop(lp, prox, behav, adv, mask, objective, cap, mode, eps_low, eps_high, dual_clip):
    """Per token: loss and d loss / d logp; and the weight stats; from the docstrings."""
    B, T = len(lp), len(lp[0])
    loss = [[0.0] * T for _ in range(B)]
    grad = [[0.0] * T for _ in range(B)]
    ws, kls, over = [], [], 0
    for b in range(B):
        for t in range(T):
            if not mask[b][t]:
                continue
            a = adv[b][t] if isinstance(adv[b], list) else adv[b]
            old = behav[b][t] if objective == "bypass" else prox[b][t]
            u = math.exp(lp[b][t] - old)          # pi_theta / old
            if a >= 0:                            # -A min(u, 1 + eps_high)
                loss_t, g = (-a * u, -a * u) if u < 1 + eps_high else (-a * (1 + eps_high), 0.0)
            else:                                 # |A| max(u, 1 - eps_low), then the dual cap
                loss_t, g = (-a * u, -a * u) if u > 1 - eps_low else (-a * (1 - eps_low), 0.0)
                if dual_clip is not None and loss_t > -a * dual_clip:
                    loss_t, g = -a * dual_clip, 0.0
            d = prox[b][t] - behav[b][t]          # log(pi_prox / mu)
            r = math.exp(d)
            w = min(r, cap) if mode == "cap" else (0.0 if r > cap else r)
            if objective == "decoupled":
                loss_t, g = w * loss_t, w * g
            loss[b][t], grad[b][t] = loss_t, g
            ws.append(w)
            kls.append((r - 1) - d)
            over += r > cap
    n, sq = len(ws), sum(x * x for x in ws)
    stats = dict(weight_mean=sum(ws) / n, weight_min=min(ws), weight_max=max(ws),
                 capped_frac=over / n if mode == "cap" else 0.0,
                 masked_frac=over / n if mode == "mask" else 0.0,
                 ess=sum(ws) ** 2 / (n * sq) if sq > 0 else 0.0, behav_kl=sum(kls) / n)
    return loss, grad, stats


@PROPERTY
@given(cases(), st.sampled_from(dapo.OFFPOLICY_OBJECTIVES), st.sampled_from(dapo.OFFPOLICY_WEIGHT_MODES),
       st.one_of(st.floats(0.25, 8.0), st.just(math.inf)))
def test_offpolicy_loss_matches_python_loop(case, objective, mode, cap):
    lp, prox, behav, mask = case["lp"], case["prox"], case["behav"], case["mask"]
    rr = _t(prox).sub(_t(behav)).exp()[torch.tensor(mask)]
    # Whether r > C is a discontinuity: skip ratios within float32 rounding of C (r == 1 is exact).
    assume(all(x == 1.0 or abs(x / cap - 1) > 1e-5 for x in rr.tolist()))
    loss_ref, grad_ref, stats_ref = _offpolicy_loop(lp, prox, behav, case["adv"], mask, objective, cap,
                                                    mode, **case["clip"])
    logp = _t(lp).requires_grad_(True)
    loss, stats = dapo.offpolicy_loss(logp, _t(prox), _t(behav), _t(case["adv"]), torch.tensor(mask),
                                      objective=objective, cap=cap, weight_mode=mode, **case["clip"])
    assert loss.shape == logp.shape and loss.dtype == torch.float32
    _close(loss, _t(loss_ref), **FP32)
    loss.sum().backward()
    # The gradient is ambiguous exactly on a clip boundary; skip those measure-zero tokens.
    old = _t(behav) if objective == "bypass" else _t(prox)
    u = torch.exp(_t(lp) - old)
    away = torch.ones_like(u, dtype=torch.bool)
    for x in [1 - case["clip"]["eps_low"], 1 + case["clip"]["eps_high"], case["clip"]["dual_clip"]]:
        if x is not None:
            away &= (u - x).abs() > 1e-6
    _close(logp.grad[away], _t(grad_ref)[away], **FP32)
    assert W_KEYS | P_KEYS <= set(stats)
    for k in W_KEYS:
        assert stats[k] == pytest.approx(stats_ref[k], rel=1e-5, abs=1e-6), k
    assert stats["behav_kl"] >= 0.0 and 0.0 <= stats["ess"] <= 1.0 + 1e-12
    # Capped tokens weigh exactly C (as a float32), not approximately.
    w, _ = dapo.behaviour_weight(_t(prox), _t(behav), torch.tensor(mask), cap=cap, mode=mode)
    beyond = torch.tensor(mask) & (_t(prox) - _t(behav) > math.log(cap))
    expect = torch.tensor(cap, dtype=torch.float32) if mode == "cap" else torch.tensor(0.0)
    assert (w[beyond] == expect).all()


# =============================================================================================
# errors
# =============================================================================================

def test_errors():
    x = torch.zeros(2, 3)
    adv, mask = torch.zeros(2), torch.ones(2, 3)
    for bad_cap in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="cap"):
            dapo.behaviour_weight(x, x, mask, cap=bad_cap)
        with pytest.raises(ValueError, match="cap"):
            dapo.offpolicy_loss(x, x, x, adv, mask, objective="decoupled", cap=bad_cap)
    with pytest.raises(ValueError, match="weight mode"):
        dapo.behaviour_weight(x, x, mask, cap=2.0, mode="drop")
    with pytest.raises(ValueError) as e:
        dapo.offpolicy_loss(x, x, x, adv, mask, objective="ppo", cap=2.0)
    assert all(name in str(e.value) for name in dapo.OFFPOLICY_OBJECTIVES)
    # Shapes: behaviour_weight's own inputs, and policy_loss's through offpolicy_loss.
    for p, b, m in ((x, torch.zeros(2, 4), mask), (x, x, torch.ones(2, 4)), (x[0], x[0], mask[0])):
        with pytest.raises(ValueError):
            dapo.behaviour_weight(p, b, m, cap=2.0)
    with pytest.raises(ValueError):
        dapo.offpolicy_loss(x, x, torch.zeros(2, 4), adv, mask, objective="decoupled", cap=2.0)
    with pytest.raises(ValueError):
        dapo.offpolicy_loss(torch.zeros(2, 4), x, x, adv, mask, objective="naive", cap=2.0)
    # A log-prob the objective needs is missing.
    for objective, p, b in (("naive", None, x), ("decoupled", None, x), ("decoupled", x, None),
                            ("bypass", x, None)):
        with pytest.raises(ValueError, match="needs"):
            dapo.offpolicy_loss(x, p, b, adv, mask, objective=objective, cap=2.0)
