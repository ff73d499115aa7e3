"""The DAPO algorithm's math: pure functions of tensors, one per intervention.

DAPO = Decoupled Clip and Dynamic sAmpling Policy Optimization (Yu et al., 2025,
arXiv 2503.14476). Read this file top to bottom: it is the whole algorithm. Everything else in
the repository (generation, verification, the loop, FSDP, logging) is plumbing around it. The
sections after dynamic_sampling_keep (the successors CISPO and GSPO, the off-policy correction)
go beyond the paper and can wait for a second reading. "The official code" is the authors' own
release: verl's recipe/dapo and its scripts.

Shape letters used in every docstring and shape comment:
    B  sequences (responses) in a batch, B = n_groups * G, groups contiguous
    G  group size: responses sampled per prompt
    T  response tokens (padded); prompts are never part of these tensors
    V  vocabulary size
    M  responses of one optimizer step on this rank (several micro-batches)

Notation: r = pi_theta / pi_old, the token's importance ratio; pi_old (called pi_prox in the
off-policy section) is the learner before this rollout step's updates; mu is the sampler that
generated the response when it is not pi_old (asynchronous generation); o_i is response i and
|o_i| its length in tokens; sg(x) is stop-gradient (x.detach()); "loss tokens" are the response
tokens with mask == 1.

Each DAPO intervention is one function with one config switch (train.py `Config`):

    | intervention (paper section)            | function here            | switch off = GRPO        |
    |-----------------------------------------|--------------------------|--------------------------|
    | Clip-Higher (3.1, eq. 10)               | policy_loss              | eps_high = eps_low       |
    | Dynamic Sampling (3.2, eq. 11)          | dynamic_sampling_keep    | keep every group         |
    | Token-Level Policy Gradient Loss (3.3)  | aggregate_loss           | "seq-mean-token-mean"    |
    | Overlong Filtering (3.4)                | overlong_filter          | mask unchanged           |
    | Soft Overlong Punishment (3.4, eq. 13)  | overlong_penalty         | penalty not added        |
    | not DAPO: off-policy correction         | offpolicy_loss,          | objective "naive"        |
    |   (asynchronous training)               |   behaviour_weight       |                          |
    | after DAPO: CISPO (MiniMax-M1, 2025)    | cispo_loss               | surrogate "clip"         |
    | after DAPO: GSPO (Qwen, 2025)           | gspo_loss                | surrogate "clip"         |

Group advantages (group_advantages) are shared by GRPO and DAPO, and so are the log-probs and
the true entropy that the ratio and the entropy metric come from: token_logprobs in
plumbing/forward.py, which computes them from the model's hidden states a chunk of positions at a time.

Nothing here does I/O, touches distributed state or loads a model. Denominators that depend on
the whole optimizer step (all micro-batches, all ranks) are explicit arguments: the caller counts
them before the first backward (docs/PITFALLS.md, failure 1: volcengine/verl issues 5625 and 2776).
"""

from __future__ import annotations


import torch

__all__ = [
    "LOSS_AGG_MODES",
    "group_advantages",
    "policy_loss",
    "loss_denominators",
    "aggregate_loss",
    "overlong_penalty",
    "overlong_filter",
    "dynamic_sampling_keep",
    "cispo_loss",
    "gspo_loss",
    "SURROGATES",
    "OFFPOLICY_OBJECTIVES",
    "OFFPOLICY_WEIGHT_MODES",
    "behaviour_weight",
    "offpolicy_loss",
]

# log r is clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp (verl's
# verl/trainer/ppo/core_algos.py clamps the log-ratio at +-20 the same way): a token whose
# probability moved by a factor e^20 within one rollout step is a numerical fault, not a signal;
# the clamp keeps its loss finite (saturated, zero gradient) instead of overflowing to inf.
LOG_RATIO_CLAMP = 20.0

LOSS_AGG_MODES = (
    "token-mean",
    "group-token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def _check_group_size(batch: int, group_size: int, name: str) -> int:
    """Return n_groups; raise if `batch` sequences do not split into groups of `group_size`."""
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2 (got {group_size}): a group of one answer has no relative "
            "advantage. Set Config.group_size (G) to 2 or more."
        )
    if batch % group_size != 0:
        raise ValueError(
            f"{name} has {batch} entries, not a multiple of group_size={group_size}: "
            "groups must be contiguous and complete."
        )
    return batch // group_size


# --- DAPO: group-relative advantage (GRPO, shared) -----------------------------------------------


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative outcome advantage of each response, the same for all of its tokens.

    Paper section 2.2 (GRPO) and the advantage in eq. 9: A_i = (R_i - mean(R)) / (std(R) + eps),
    over the G responses to one prompt. std is the unbiased one (divide by G - 1), as in the
    official code. scale_by_std=False gives Dr. GRPO's A_i = R_i - mean(R) (Liu et al., 2025).

    Args:
        rewards: (B,) float, total reward of each response (correctness plus overlong term),
            B = n_groups * G with each group's G responses contiguous.
        group_size: G.
        scale_by_std: divide by the group std (GRPO/DAPO) or not (Dr. GRPO).
        eps: added to the std; a constant group gets advantage exactly 0 (its centred rewards are
            0 whatever the std), so no float equality test on std is needed.

    Returns:
        (B,) float, same dtype as rewards. Sums to 0 within each group.

    Raises:
        ValueError: B not divisible by G, G < 2, rewards not 1-D or not finite.
    """
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards.shape)}")
    n_groups = _check_group_size(rewards.numel(), group_size, "rewards")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf: check the task's score, the verifier and the overlong penalty")
    r = rewards.view(n_groups, group_size)  # (n_groups, G)
    centred = r - r.mean(dim=1, keepdim=True)  # (n_groups, G)
    if scale_by_std:
        # Exactly-constant groups: mean() of G equal floats can differ from them by one ulp, so
        # zero the centred values explicitly instead of trusting the subtraction.
        constant = (r == r[:, :1]).all(dim=1, keepdim=True)  # (n_groups, 1)
        centred = centred.masked_fill(constant, 0.0)
        centred = centred / (r.std(dim=1, unbiased=True, keepdim=True) + eps)  # (n_groups, G)
    return centred.reshape(-1)  # (B,)


# --- DAPO: Clip-Higher (section 3.1, eq. 10) ------------------------------------------------------


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token clipped policy-gradient loss with decoupled clip range (Clip-Higher).

    Paper section 3.1, eq. 10: objective min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), with
    r = pi_theta / pi_old per token. As a loss (negated objective):
        A >= 0:  -A * min(r, 1 + eps_high)     (gradient 0 once r > 1 + eps_high)
        A <  0:  |A| * max(r, 1 - eps_low)     (gradient 0 once r < 1 - eps_low)
    Raising eps_high above eps_low leaves room for low-probability tokens with positive advantage
    to grow, which keeps entropy from collapsing (paper Fig. 2). eps_high == eps_low is PPO's clip.
    dual_clip = c (the official scripts use c = 10; Ye et al., 2020) additionally caps the loss of
    A < 0 tokens at c * |A|, so one token whose ratio exploded cannot dominate the batch.

    Args:
        logp: (B, T) float, log pi_theta of each sampled response token; carries the gradient.
            Values at mask == 0 are ignored (may be anything finite or not).
        old_logp: (B, T) float, log pi_old of the same tokens, recomputed by the trainer before
            the update (no gradient). Ignored at mask == 0.
        advantages: (B,) float (one per response, broadcast over tokens) or (B, T).
        mask: (B, T) bool or {0, 1} float, 1 on response tokens that count in the loss.
        eps_low, eps_high: clip range (1 - eps_low, 1 + eps_high); DAPO 0.2 and 0.28.
        dual_clip: None, or c > 1.

    log r is clamped to +-LOG_RATIO_CLAMP (20) before exp: beyond it the loss is constant and
    the gradient 0, so an extreme log-prob gap stays finite (LOG_RATIO_CLAMP).

    Returns:
        loss_tok: (B, T) float32, per-token loss, exactly 0 where mask == 0.
        stats: python floats over loss tokens: clipfrac_low (A < 0 and r < 1 - eps_low),
            clipfrac_high (A > 0 and r > 1 + eps_high), clipfrac_dual (A < 0 and r > c),
            ratio_mean, ratio_max, approx_kl (k3 = (r - 1) - log r, Schulman's low-variance KL estimate, mean).

    Raises:
        ValueError: bad clip range or dual_clip, mismatched shapes.
    """
    if not (0.0 < eps_low <= eps_high):
        raise ValueError(
            f"need 0 < eps_low <= eps_high, got eps_low={eps_low}, eps_high={eps_high} "
            "(DAPO: 0.2 and 0.28; PPO/GRPO: equal)"
        )
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be None or > 1 (official scripts: 10), got {dual_clip}")
    valid, adv, log_ratio = _loss_inputs(logp, old_logp, advantages, mask)  # valid, adv, log_ratio as documented there
    ratio = torch.exp(log_ratio)  # (B, T)

    unclipped = -adv * ratio  # (B, T)
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # (B, T)
    loss_tok = torch.maximum(unclipped, clipped)  # (B, T), negated min of the two objectives
    if dual_clip is not None:
        capped = torch.minimum(loss_tok, -adv * dual_clip)  # -adv * c = c * |A| for A < 0
        loss_tok = torch.where(adv < 0, capped, loss_tok)  # (B, T)
    loss_tok = torch.where(valid, loss_tok, 0.0)  # (B, T)

    with torch.no_grad():
        r, a = ratio.detach(), adv.expand_as(ratio)
        frac = _token_share(valid)
        stats = {
            "clipfrac_low": frac((a < 0) & (r < 1.0 - eps_low)),
            "clipfrac_high": frac((a > 0) & (r > 1.0 + eps_high)),
            "clipfrac_dual": frac((a < 0) & (r > dual_clip)) if dual_clip is not None else 0.0,
            **_ratio_stats(r, log_ratio.detach(), valid),
        }
    return loss_tok, stats


def _loss_inputs(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shape checks and the first lines of every surrogate. Returns valid (B, T) bool; adv (B, 1) or
    (B, T) float32; log_ratio (B, T) float32, 0 where mask == 0 (garbage there never makes
    inf * 0 = NaN) and clamped to +-LOG_RATIO_CLAMP (exp() stays finite; beyond it the gradient
    is 0). Raises ValueError on mismatched shapes."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.ndim != 2:
        raise ValueError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask "
            f"{tuple(mask.shape)} must all be the same (B, T)"
        )
    if advantages.ndim == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages (B,) has B={advantages.shape[0]}, logp has B={logp.shape[0]}")
        advantages = advantages[:, None]  # (B, 1)
    elif advantages.shape != logp.shape:
        raise ValueError(f"advantages must be (B,) or (B, T), got {tuple(advantages.shape)}")
    valid = mask.bool()  # (B, T)
    log_ratio = torch.where(valid, logp.float() - old_logp.float(), 0.0)  # (B, T)
    return valid, advantages.float(), log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)


def _response_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B,) the mean of x (B, T) over each response's loss tokens (valid (B, T) bool; x must be 0
    elsewhere); 0 for a response without one (its count is taken as 1)."""
    return x.sum(dim=1) / valid.sum(dim=1).clamp(min=1)


def _token_share(valid: torch.Tensor):
    """frac(cond): the share of loss tokens (valid) where cond holds, a python float (0 if none)."""
    n = valid.sum().clamp(min=1).float()
    return lambda cond: float((cond & valid).sum() / n)


def _ratio_stats(r: torch.Tensor, log_r: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """ratio_mean, ratio_max and approx_kl (k3: mean of (r - 1) - log r) of token ratios over loss tokens."""
    n = valid.sum().clamp(min=1).float()
    return {"ratio_mean": float((r * valid).sum() / n),
            "ratio_max": float(torch.where(valid, r, 0.0).max()) if valid.any() else 1.0,
            "approx_kl": float((((r - 1.0) - log_r) * valid).sum() / n)}


# --- DAPO: Token-Level Policy Gradient Loss (section 3.3, eq. 8 vs GRPO eq. 5) -------------------


def loss_denominators(response_tokens: torch.Tensor, group_index: torch.Tensor) -> tuple[dict, dict]:
    """The denominators every aggregation mode needs, counted over one optimizer step's responses.

    Paper section 3.3: the token-level loss divides by the token count of the whole step, not of
    a micro-batch (docs/PITFALLS.md, failure 1), so these are counted before the first backward.
    A new mode of `aggregate_loss` that needs another count adds it here, and nowhere else.

    Args:
        response_tokens: (M,) float, tokens of each response that count in the loss (its length,
            or 0 for an overlong-filtered response), for the M responses of the step on this rank.
        group_index: (M,) long, the group of each response. A group never spans two ranks.

    Returns:
        (sums, per_response):
        sums: {"num_tokens", "num_seqs", "num_groups"} python floats over this rank's M responses;
            under torchrun the caller sums each over all ranks (all_reduce SUM) to get the step's.
        per_response: {"group_num_tokens": (M,) float32}, the loss-token count of each
            response's whole group (complete on each rank, since groups do not span ranks).

    Raises:
        ValueError: mismatched shapes.
    """
    if response_tokens.ndim != 1 or response_tokens.shape != group_index.shape:
        raise ValueError(f"response_tokens {tuple(response_tokens.shape)} and group_index {tuple(group_index.shape)} "
                         "must be the same (M,)")
    tokens = response_tokens.to(torch.float64)  # (M,): exact integer sums
    groups, inverse = torch.unique(group_index, return_inverse=True)  # (n_groups,), (M,)
    per_group = torch.zeros(len(groups), dtype=torch.float64).index_add_(0, inverse, tokens)  # (n_groups,)
    sums = {"num_tokens": float(tokens.sum()), "num_seqs": float(len(tokens)), "num_groups": float(len(groups))}
    return sums, {"group_num_tokens": per_group[inverse].to(torch.float32)}  # (M,)


def aggregate_loss(
    loss_tok: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: int | float | None = None,
    num_seqs: int | None = None,
    max_len: int | None = None,
    group_num_tokens: torch.Tensor | None = None,
    num_groups: int | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to the scalar that is back-propagated.

    Paper section 3.3. GRPO (eq. 5) averages tokens within each answer, then answers: every answer
    weighs the same, so a token of a long answer weighs less than a token of a short one. DAPO
    (eq. 8) divides the sum over all tokens by the total token count, so every token weighs the
    same. Modes:

        "token-mean"           sum(loss) / num_tokens, num_tokens = loss tokens of the whole
                               optimizer step. What the official code does: one count over the
                               whole mini-batch.
        "group-token-mean"     paper-literal eq. 8: each group's token sum over that group's token
                               count, then the mean over groups. Differs from "token-mean" when
                               groups have different total lengths.
        "seq-mean-token-mean"  GRPO eq. 5: mean over answers of each answer's token mean.
        "seq-mean-token-sum"   mean over answers of each answer's token sum.
        "seq-mean-token-sum-norm"  Dr. GRPO: sum(loss) / (num_seqs * max_len), a constant.

    Gradient accumulation: when a step is split into micro-batches (and ranks), pass the WHOLE
    step's num_tokens / num_seqs / num_groups / group_num_tokens (loss_denominators) to every
    micro-batch; the sum of micro-batch gradients then equals the full-batch gradient exactly
    (tests/test_dapo.py). Leaving them None uses the local micro-batch counts: correct only when
    there is one micro-batch.

    The Dr. GRPO constant: "seq-mean-token-sum-norm" divides by num_seqs * max_len, as the Dr. GRPO
    paper (Liu et al., 2025, arXiv 2503.20783) and TRL's loss_type="dr_grpo" do. verl's mode of the
    same name divides by max_len only (a factor of the batch size larger, which matters under
    gradient-norm clipping); docs/algorithm.md "Departures" lists it.

    Args:
        loss_tok: (B, T) float, per-token loss from policy_loss (0 at mask == 0).
        mask: (B, T) bool or {0, 1} float, tokens that count.
        mode: one of LOSS_AGG_MODES.
        num_tokens: loss-token count of the whole optimizer step ("token-mean").
        num_seqs: response count of the whole optimizer step (the "seq-mean-*" modes).
        max_len: response token budget (the Dr. GRPO constant), "seq-mean-token-sum-norm" only.
        group_num_tokens: (B,) float, loss-token count of each response's whole group
            ("group-token-mean" only).
        num_groups: group count of the whole optimizer step ("group-token-mean" only).

    Returns:
        0-dim float32 tensor. 0 (still differentiable, never NaN) when the denominator is 0, e.g.
        every response of the step was overlong-filtered (docs/PITFALLS.md, failure 2).

    Raises:
        ValueError: unknown mode, missing denominator for the mode, mismatched shapes.
    """
    if loss_tok.shape != mask.shape or loss_tok.ndim != 2:
        raise ValueError(f"loss_tok {tuple(loss_tok.shape)} and mask {tuple(mask.shape)} must be the same (B, T)")
    m = mask.to(loss_tok.dtype)  # (B, T)
    masked = loss_tok * m  # (B, T)

    def safe_div(total: torch.Tensor, denom) -> torch.Tensor:
        denom = float(denom)
        return total / denom if denom > 0 else total * 0.0

    if mode == "token-mean":
        denom = m.sum() if num_tokens is None else num_tokens
        return safe_div(masked.sum(), denom)
    if mode == "group-token-mean":
        if group_num_tokens is None or num_groups is None:
            raise ValueError("mode 'group-token-mean' needs group_num_tokens (B,) and num_groups")
        if group_num_tokens.shape != loss_tok.shape[:1]:
            raise ValueError(f"group_num_tokens must be (B,), got {tuple(group_num_tokens.shape)}")
        per_seq = masked.sum(dim=1)  # (B,)
        g = group_num_tokens.to(per_seq.dtype)  # (B,)
        per_seq = torch.where(g > 0, per_seq / g.clamp(min=1.0), 0.0)  # (B,)
        return safe_div(per_seq.sum(), num_groups)
    if mode.startswith("seq-mean-"):
        n_seqs = loss_tok.shape[0] if num_seqs is None else num_seqs
        seq_sum = masked.sum(dim=1)  # (B,)
        if mode == "seq-mean-token-mean":
            seq_len = m.sum(dim=1)  # (B,)
            seq_val = torch.where(seq_len > 0, seq_sum / seq_len.clamp(min=1.0), 0.0)  # (B,)
            return safe_div(seq_val.sum(), n_seqs)
        if mode == "seq-mean-token-sum":
            return safe_div(seq_sum.sum(), n_seqs)
        if mode == "seq-mean-token-sum-norm":
            if max_len is None or max_len <= 0:
                raise ValueError("mode 'seq-mean-token-sum-norm' needs max_len > 0 (the response token budget)")
            return safe_div(seq_sum.sum(), n_seqs * max_len)
    raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {LOSS_AGG_MODES}")


# --- DAPO: Overlong Reward Shaping (section 3.4) ---------------------------------------------------


def overlong_penalty(
    lengths: torch.Tensor, *, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """Soft overlong punishment, added to the correctness reward.

    Paper section 3.4, eq. 13, with L_max = max_len and L_cache = buffer_len:
        0                                       if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache     if L_max - L_cache < |y| <= L_max
        -1                                      if |y| > L_max
    times penalty_factor. The penalty grows linearly over the last L_cache tokens of the budget, so
    length is punished gradually instead of only at the cutoff.

    Args:
        lengths: (B,) int, response lengths in tokens (EOS included when generated).
        max_len: L_max, the generation budget in tokens (paper 20480).
        buffer_len: L_cache, the soft buffer in tokens (paper 4096), 0 < buffer_len < max_len.
        penalty_factor: scale, >= 0 (paper 1.0).

    Returns:
        (B,) float32 in [-penalty_factor, 0], non-increasing in length.

    Raises:
        ValueError: buffer_len not in (0, max_len), negative penalty_factor.
    """
    if not (0 < buffer_len < max_len):
        raise ValueError(
            f"need 0 < buffer_len < max_len, got buffer_len={buffer_len}, max_len={max_len} "
            "(paper: 4096 and 20480)"
        )
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    penalty_start = max_len - buffer_len  # L_max - L_cache: longer responses are punished
    over = (lengths.float() - penalty_start).clamp(min=0.0, max=float(buffer_len))  # (B,) tokens into the buffer
    return -penalty_factor * over / buffer_len  # (B,) reaches -factor exactly at and beyond max_len


def overlong_filter(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Zero the loss mask of truncated responses (Overlong Filtering).

    Paper section 3.4 (Fig. 5): a response cut off by the length budget says nothing reliable
    about whether its reasoning was wrong, so its tokens are left out of the loss. They still
    count in their group's reward mean and std (the paper is silent; the reimplementations we know keep them, and so does this one).
    "Truncated" must come from the engine's finish reason, never from pad == eos
    (docs/PITFALLS.md, failure 4).

    Args:
        mask: (B, T) bool or float loss mask.
        truncated: (B,) bool, True for responses that hit the budget without EOS.

    Returns:
        (B, T) new mask, same dtype as `mask`, rows of truncated responses all 0.

    Raises:
        ValueError: shapes disagree.
    """
    if truncated.shape != mask.shape[:1]:
        raise ValueError(f"truncated must be (B,)={tuple(mask.shape[:1])}, got {tuple(truncated.shape)}")
    keep = ~truncated.bool()  # (B,)
    return mask * keep[:, None].to(mask.dtype)  # (B, T)


# --- DAPO: Dynamic Sampling (section 3.2, eq. 11) --------------------------------------------------


def dynamic_sampling_keep(correct: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups hold contrast: keep iff 0 < (correct answers) < G.

    Paper section 3.2, the constraint in eq. 11. A group whose answers are all correct or all
    wrong has advantage 0 for every answer and contributes no gradient, while still diluting the
    batch. The filter is on correctness, never on the shaped reward: with the overlong penalty an
    all-wrong group of mixed lengths has unequal rewards and would slip through.

    Args:
        correct: (B,) bool, verifier verdict of each response, groups contiguous.
        group_size: G.

    Returns:
        (n_groups,) bool.

    Raises:
        ValueError: B not divisible by G, G < 2.
    """
    n_groups = _check_group_size(correct.numel(), group_size, "correct")
    n_correct = correct.bool().view(n_groups, group_size).sum(dim=1)  # (n_groups,)
    return (n_correct > 0) & (n_correct < group_size)  # (n_groups,)


# --- after DAPO: CISPO and GSPO (not in the paper; --surrogate, default "clip" = policy_loss) -----------
# Both take policy_loss's arguments and return what it returns, so aggregation, both overlong
# treatments, dynamic sampling and offpolicy_loss compose with them unchanged. They differ from it
# only once the ratio leaves 1 (mini-batch 2 onward of a rollout step, or a lagging sampler).


def cispo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
               low: float = 0.0, high: float = 5.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token CISPO loss: REINFORCE weighted by the clipped, detached importance ratio.

    MiniMax-M1 (arXiv 2506.13585), the CISPO objective (1 / sum_i |o_i|) sum_i sum_t
    sg(clip(r_t)) A log pi_theta(o_t), r_t = pi_theta / pi_old. As a loss per token:
        loss_t = -sg(clamp(r_t, low, high)) * A * log pi_t,    d loss_t / d log pi_t = -clamp(r_t, low, high) * A
    Every token keeps a gradient; only its weight is bounded. DAPO's clip (policy_loss) sets the
    gradient of an A > 0 token to 0 once r > 1 + eps_high (A < 0: r < 1 - eps_low); MiniMax argues
    those are the rare tokens ("However", "Wait") where a chain of thought forks. On-policy
    (r = 1) the weight is 1 and the gradient -A, policy_loss's exactly: with the same --loss_agg
    (token-mean) CISPO's update is DAPO's until the ratio moves. The bounds are absolute, the
    weight lies in [low, high]: ScaleRL's clip(r, 0, 5) (arXiv 2510.13786: 4, 5 and 8 alike).
    No dual clip: high bounds the weight of A < 0 tokens too.

    Implementations disagree on what the two numbers mean:
      - TRL (loss_type="cispo", trl/trainer/grpo_trainer.py): an absolute cap min(r, epsilon_high);
        an offset-style 0.2 there caps every weight, on-policy ones too, at 0.2.
      - verl (compute_policy_loss_cispo, verl/trainer/ppo/core_algos.py), slime, NeMo-RL: offsets
        from 1, clip(r, 1 - eps_low, 1 + eps_high); NeMo-RL's recipe 1.0 / 5.0 is [0, 6].
      - SkyRL: offsets from 1 whose defaults 0 / 5 meant [1, 6], a floor at 1 under every weight,
        until NovaSky-AI/SkyRL PR 1928 made them 1 / 4 (ScaleRL's [0, 5]).
    A floor above 0 keeps tokens the policy already moved away from at a fixed weight instead of
    attenuating them, which can let the sampler/trainer KL run away off-policy
    (thinking-machines-lab/tinker-cookbook PR 763); above 1 it raises on-policy tokens too.

    Args:
        logp: (B, T) float, log pi_theta, with gradient. Ignored at mask == 0 (any value, NaN too).
        old_logp: (B, T) float, log pi_old (detached: no gradient reaches it). Ignored at mask == 0.
        advantages: (B,) or (B, T) float. mask: (B, T) bool or {0, 1} float.
        low, high: the weight's bounds, 0 <= low <= 1 <= high (math.inf: no cap).

    Returns:
        loss_tok: (B, T) float32, exactly 0 at mask == 0. Its value is -w A log pi, not an objective
            comparable with policy_loss's; only its gradient is CISPO's.
        stats: python floats over loss tokens: clipfrac_low / clipfrac_high (r < low / r > high:
            weight raised to low / lowered to high, either sign of A, gradient kept); clipfrac_dual
            0; ratio_mean, ratio_max, approx_kl as policy_loss.

    Raises:
        ValueError: bounds outside 0 <= low <= 1 <= high, shapes that disagree.
    """
    if not (0.0 <= low <= 1.0 <= high):
        raise ValueError(
            f"CISPO needs 0 <= low <= 1 <= high, got low={low}, high={high}: a bound on the wrong side "
            "of 1 moves the weight of on-policy tokens (r = 1) away from 1 (ScaleRL: low 0, high 5)"
        )
    valid, adv, log_ratio = _loss_inputs(logp, old_logp.detach(), advantages, mask)  # (B, T), (B, 1) or (B, T), (B, T)
    ratio = torch.exp(log_ratio.detach())  # (B, T), 1 at mask == 0
    weight = ratio.clamp(low, high)  # (B, T) sg(clip(r)): detached, a constant to autograd
    logp_valid = torch.where(valid, logp.float(), 0.0)  # (B, T): garbage at padding never enters
    loss_tok = torch.where(valid, -weight * adv * logp_valid, 0.0)  # (B, T)
    with torch.no_grad():
        frac = _token_share(valid)
        stats = {"clipfrac_low": frac(ratio < low), "clipfrac_high": frac(ratio > high), "clipfrac_dual": 0.0,
                 **_ratio_stats(ratio, log_ratio.detach(), valid)}
    return loss_tok, stats


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              eps_low: float = 3e-4, eps_high: float = 4e-4) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token GSPO loss (its GSPO-token form): one importance ratio and one clip per response.

    GSPO (Zheng et al., 2025, arXiv 2507.18071), eq. 5: objective (1/G) sum_i min(s_i A_i,
    clip(s_i, 1 - eps_low, 1 + eps_high) A_i), with the length-normalised sequence ratio
        s_i = exp(l_i),   l_i = (1 / |o_i|) sum_t log(pi_theta(o_t) / pi_old(o_t))   (masked mean)
    The GSPO-token form gives every token the value s_i and a gradient of its own:
        s_it = exp(sg(l_i) + log pi_t - sg(log pi_t))     (value s_i; d s_it / d log pi_t = s_i)
        loss_t = max(-A s_it, -A clamp(s_it, 1 - eps_low, 1 + eps_high))
    A token's ratio is a one-sample estimate, noisy on long answers; GSPO sets the trust region per
    response, where the reward is given: a response whose s_i leaves the band on the side its
    advantage pushes towards gets no gradient on any token. On-policy (s_i = 1) token t's gradient
    is -A, and under the seq-mean-token-mean aggregation GSPO needs, -A / (|o_i| B): GRPO's
    sample-level loss (GRPO eq. 5), which DAPO section 3.3 replaced. On-policy GSPO is GRPO's
    sequence mean, not DAPO.

    Where implementations disagree:
      - Aggregation: verl (compute_policy_loss_gspo, verl/trainer/ppo/core_algos.py) forces
        seq-mean-token-mean whatever loss_agg_mode says; PipelineRL weights each response by its
        length on purpose (pipelinerl/finetune/rl/__init__.py), TRL's token-level loss types by
        accident (huggingface/trl#3823). Here another --loss_agg is refused (plumbing/cli.py).
      - eps: the paper's 3e-4 / 4e-4 (section 5.1) suit a length-normalised ratio; recipes that
        keep PPO's 0.2 (NeMo-RL's GSPO recipe inherits ratio_clip 0.2) almost never clip.
      - The ratio: verl and SkyRL use the GSPO-token form; TRL, slime, NeMo-RL and OpenRLHF
        differentiate through the mean. With one advantage per response both give one gradient.
    No dual clip (verl's GSPO README lists one that its GSPO loss never reads).

    Args:
        logp: (B, T) float, log pi_theta, with gradient. Ignored at mask == 0 (any value): a masked
            position never enters l_i.
        old_logp: (B, T) float, log pi_old (detached here). Ignored at mask == 0.
        advantages: (B,) (GSPO) or (B, T) (GSPO-token) float. mask: (B, T) bool or {0, 1} float.
        eps_low, eps_high: the band (1 - eps_low, 1 + eps_high) of s_i; 0 < eps_low < 1, eps_high > 0.

    Returns:
        loss_tok: (B, T) float32, exactly 0 at mask == 0; aggregate it with seq-mean-token-mean.
        stats: python floats. Over loss tokens: clipfrac_low / clipfrac_high (tokens whose gradient
            the clip set to 0: A < 0 and s_i < 1 - eps_low / A > 0 and s_i > 1 + eps_high),
            clipfrac_dual 0, ratio_mean, ratio_max, approx_kl of the token ratios r_t as
            policy_loss. Over all B responses (the seq-mean denominator; one without loss tokens
            is never clipped): seq_clipfrac_low / seq_clipfrac_high, the same per response.

    Raises:
        ValueError: eps out of range, shapes that disagree.
    """
    if not (0.0 < eps_low < 1.0 and eps_high > 0.0):
        raise ValueError(f"GSPO needs 0 < eps_low < 1 and eps_high > 0, got {eps_low} and {eps_high} "
                         "(paper: 3e-4 and 4e-4, for a ratio normalised by the response length)")
    valid, adv, log_ratio = _loss_inputs(logp, old_logp.detach(), advantages, mask)  # (B, T), (B, 1) or (B, T), (B, T)
    seq_log_ratio = _response_mean(log_ratio.detach(), valid)  # (B,) l_i: masked mean (0 at mask == 0)
    logp_valid = torch.where(valid, logp.float(), 0.0)  # (B, T)
    s = torch.exp(seq_log_ratio[:, None] + logp_valid - logp_valid.detach())  # (B, T), value s_i
    unclipped = -adv * s  # (B, T)
    clipped = -adv * s.clamp(1.0 - eps_low, 1.0 + eps_high)  # (B, T)
    loss_tok = torch.where(valid, torch.maximum(unclipped, clipped), 0.0)  # (B, T)
    with torch.no_grad():
        s, a = s.detach(), adv.expand_as(s)  # (B, T) each
        low_tok, high_tok = valid & (a < 0) & (s < 1.0 - eps_low), valid & (a > 0) & (s > 1.0 + eps_high)  # (B, T)
        frac, rows = _token_share(valid), max(valid.shape[0], 1)
        stats = {"clipfrac_low": frac(low_tok), "clipfrac_high": frac(high_tok), "clipfrac_dual": 0.0,
                 **_ratio_stats(torch.exp(log_ratio.detach()), log_ratio.detach(), valid),
                 "seq_clipfrac_low": float(low_tok.any(dim=1).sum()) / rows,
                 "seq_clipfrac_high": float(high_tok.any(dim=1).sum()) / rows}
    return loss_tok, stats


# The one map from --surrogate to its per-token loss, read by train.token_loss and offpolicy_loss.
# A new surrogate takes policy_loss's arguments (plus knobs of its own, keyword-only) and returns
# what it returns; it is a function above and one entry here (docs/forking.md "Add a loss variant").
SURROGATES = {"clip": policy_loss, "cispo": cispo_loss, "gspo": gspo_loss}


# --- beyond the paper: off-policy correction (asynchronous training; not a DAPO intervention) -----

OFFPOLICY_OBJECTIVES = ("naive", "bypass", "decoupled")  # offpolicy_loss(objective=...)
OFFPOLICY_WEIGHT_MODES = ("cap", "mask")  # behaviour_weight(mode=...): what happens beyond C
OFFPOLICY_WEIGHT_LEVELS = ("token", "sequence")  # behaviour_weight(level=...): one weight per token, or per response


def behaviour_weight(
    prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, *, cap: float, mode: str = "cap",
    level: str = "token",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token weight w = pi_prox / mu of the decoupled objective, truncated or dropped beyond C.

    Hilton et al. (2021, arXiv 2110.00641), as in AReaL (arXiv 2505.24298): a token sampled by an
    older policy mu is re-weighted to the proximal policy pi_prox (the learner before the update).
    w = exp(log pi_prox - log mu), log-ratio clamped to +-LOG_RATIO_CLAMP, detached. Beyond C, mode
    "cap" gives exactly C, "mask" gives 0 (AReaL: the token drops out). C >= 1 keeps on-policy
    tokens (w = 1) intact; C < 1 caps or drops them too. With no lag, mu differs from pi_prox only
    by the sampler's kernels (vLLM, bf16): the "cap" weight is then truncated importance sampling
    (Yao et al., 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training").
    level "sequence" (gspo_loss's) gives each response one weight, the geometric mean of its token
    weights, exp(masked mean of log pi_prox - log mu), then C. Never exp of the sum (their product):
    a small per-token gap compounds to ~0 on long answers (NVIDIA-NeMo/RL PR 2269: 0.06 at step 1).

    Args:
        prox_logp, behav_logp: (B, T) float, log pi_prox (learner, recomputed) and log mu (the
            sampler's) of each sampled token. Ignored at mask == 0 (any value, NaN included).
        mask: (B, T) bool or {0, 1} float, 1 on response tokens that count in the loss.
        cap: C > 0 (math.inf: no truncation). mode: one of OFFPOLICY_WEIGHT_MODES.
        level: one of OFFPOLICY_WEIGHT_LEVELS.

    Returns:
        w: (B, T) float32 in [0, C], no gradient, 0 at mask == 0, exactly 1 where the two log-probs
            are equal (if C >= 1).
        stats: python floats over the N tokens with mask == 1: weight_mean/min/max (of w);
            capped_frac or masked_frac (share whose weight before the cap is > C; the other mode's is 0);
            ess = (sum w)^2 / (N sum w^2), the effective sample size as a share of N: 1 if all w
            are equal and > 0, 1/N if one is, 0 if none;
            behav_kl = mean of (r - 1) - log r, r = pi_prox / mu per token (at either level): the k3
            estimate of KL(mu || pi_prox) from samples of mu (J. Schulman, http://joschu.net/blog/kl-approx.html).
            N = 0: weight stats and ess 1, the others 0.

    Raises:
        ValueError: cap <= 0, unknown mode or level, mismatched shapes.
    """
    if not cap > 0:  # also rejects NaN; math.inf means no truncation
        raise ValueError(f"cap (C) must be > 0, got {cap}; C >= 1 (e.g. 2 or 5) leaves on-policy tokens untouched")
    if mode not in OFFPOLICY_WEIGHT_MODES:
        raise ValueError(f"unknown weight mode {mode!r}; choose one of {OFFPOLICY_WEIGHT_MODES}")
    if level not in OFFPOLICY_WEIGHT_LEVELS:
        raise ValueError(f"unknown weight level {level!r}; choose one of {OFFPOLICY_WEIGHT_LEVELS}")
    if prox_logp.shape != behav_logp.shape or prox_logp.shape != mask.shape or mask.ndim != 2:
        raise ValueError(f"prox_logp {tuple(prox_logp.shape)}, behav_logp {tuple(behav_logp.shape)} and mask "
                         f"{tuple(mask.shape)} must all be the same (B, T)")
    valid = mask.bool()  # (B, T)
    log_r = torch.where(valid, prox_logp.detach().float() - behav_logp.detach().float(), 0.0)  # (B, T)
    r = torch.exp(log_r.clamp_(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B, T), exp(0) = 1 exactly
    if level == "sequence":
        log_seq = _response_mean(log_r, valid)[:, None]  # (B, 1)
        r = torch.where(valid, torch.exp(log_seq), 1.0)  # (B, T): the geometric mean on each loss token
    over = valid & (r > cap)  # (B, T)
    w = torch.where(valid, r.clamp(max=cap) if mode == "cap" else torch.where(over, 0.0, r), 0.0)  # (B, T)
    n = int(valid.sum())
    if n == 0:
        return w, {"weight_mean": 1.0, "weight_min": 1.0, "weight_max": 1.0, "capped_frac": 0.0,
                   "masked_frac": 0.0, "ess": 1.0, "behav_kl": 0.0}
    wv, lv = w[valid].double(), log_r[valid].double()  # (N,), (N,)
    frac, sum_sq = float(over.sum()) / n, float((wv * wv).sum())
    return w, {"weight_mean": float(wv.mean()), "weight_min": float(wv.min()), "weight_max": float(wv.max()),
               "capped_frac": frac if mode == "cap" else 0.0, "masked_frac": frac if mode == "mask" else 0.0,
               "ess": float(wv.sum()) ** 2 / (n * sum_sq) if sum_sq > 0 else 0.0,
               "behav_kl": float((torch.expm1(lv) - lv).mean())}  # expm1: accurate near r = 1


def offpolicy_loss(
    logp: torch.Tensor, prox_logp: torch.Tensor | None, behav_logp: torch.Tensor | None,
    advantages: torch.Tensor, mask: torch.Tensor, *, objective: str, cap: float, weight_mode: str = "cap",
    surrogate: str = "clip", **params,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token loss of tokens sampled by an older policy mu, by one of OFFPOLICY_OBJECTIVES.

    Asynchronous generation: mu (the sampler's weights) lags pi_prox (the learner before the
    update). The loss is the surrogate's, of (logp, old): policy_loss (DAPO's clip), cispo_loss
    or gspo_loss:
        "naive"      old = pi_prox, mu ignored: the synchronous loss, blind to staleness.
        "bypass"     old = mu, no weight (verl's bypass mode); needs no recomputed log-probs.
                     CISPO anchored on mu is truncated-IS REINFORCE (PipelineRL's default loss).
        "decoupled"  old = pi_prox, times w = behaviour_weight(pi_prox, mu) (Hilton et al. 2021, AReaL):
                     the clip bounds the step around pi_prox, w corrects for sampling from mu.
                     mu == pi_prox gives "naive" exactly (w = 1). For GSPO w is one weight per
                     response (behaviour_weight level "sequence": the geometric mean).
    Weight mode "mask" zeroes a dropped token's loss and gradient but not `mask`: aggregate_loss
    still counts it in the denominator (as AReaL does), so dropping never scales up the rest.
    With both log-probs given the stats include behaviour_weight's, whatever the objective.

    Args:
        logp: (B, T) float, log pi_theta of each sampled token, with gradient. Ignored at mask == 0.
        prox_logp: (B, T) float, log pi_prox (learner, recomputed; detached here), or None for "bypass".
        behav_logp: (B, T) float, log mu (the sampler's; detached here), or None for "naive".
        advantages: (B,) or (B, T) float. mask: (B, T) bool or {0, 1}; pass it on to aggregate_loss.
        objective: one of OFFPOLICY_OBJECTIVES. cap, weight_mode: C and mode of behaviour_weight.
        surrogate: a key of SURROGATES ("clip": policy_loss, "cispo": cispo_loss, "gspo": gspo_loss).
        **params: that function's keyword arguments (clip: eps_low, eps_high, dual_clip; cispo: low,
            high; gspo: eps_low, eps_high); its defaults where absent.

    Returns:
        loss_tok: (B, T) float32, exactly 0 at mask == 0 and at tokens dropped by "mask".
        stats: the surrogate's (its ratio is pi_theta / old), plus behaviour_weight's.

    Raises:
        ValueError: unknown objective or surrogate, a log-prob the objective needs is None, or what the
            surrogate and behaviour_weight raise (the latter runs, and checks cap and mode, when both are given).
    """
    if objective not in OFFPOLICY_OBJECTIVES:
        raise ValueError(f"unknown off-policy objective {objective!r}; choose one of {OFFPOLICY_OBJECTIVES}")
    if surrogate not in SURROGATES:
        raise ValueError(f"unknown surrogate {surrogate!r}; choose one of {tuple(SURROGATES)}")
    if prox_logp is None and objective != "bypass":
        raise ValueError(f"objective {objective!r} needs prox_logp (the learner's recomputed log-probs)")
    if behav_logp is None and objective != "naive":
        raise ValueError(f"objective {objective!r} needs behav_logp (keep the sampler's log-probs)")
    old = (behav_logp if objective == "bypass" else prox_logp).detach()  # (B, T)
    loss_tok, stats = SURROGATES[surrogate](logp, old, advantages, mask, **params)  # (B, T)
    if prox_logp is not None and behav_logp is not None:
        level = "sequence" if surrogate == "gspo" else "token"
        w, w_stats = behaviour_weight(prox_logp, behav_logp, mask, cap=cap, mode=weight_mode, level=level)  # (B, T)
        stats.update(w_stats)
        if objective == "decoupled":
            loss_tok = loss_tok * w  # (B, T)
    return loss_tok, stats
