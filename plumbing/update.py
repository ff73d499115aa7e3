"""The plumbing of one update (train.update_policy): which responses each rank trains in which pass, their
old log-probs, and the optimizer step.

Nothing here changes the DAPO math (the loss and its denominators are dapo.py's, called by train.py);
it decides how a rollout batch is cut so that every rank takes the same optimizer steps whatever the
number of ranks and whatever fits in memory:

  mini-batches   split_minibatches: the same responses in mini-batch m on any number of ranks, whole
                 groups to each rank, balanced by tokens
  micro-batches  micro_batches: by count or by a token budget (memory only); micro_batches_all_ranks:
                 the same number of forward passes on every rank (FSDP collectives)
  old log-probs  OldLogprobs: log pi_old per response, the entropy, the gap to the sampler, the
                 behaviour weight's statistics (DAPO step 5)
  the step       clip_and_step: gradient-norm clip, and no non-finite gradient reaches the weights

The passes themselves (log-probs from hidden states, the padded and packed layouts) are plumbing/forward.py's.
"""

from __future__ import annotations

import math

import torch

from plumbing.distributed import Dist, all_reduce_max, all_reduce_sum
from plumbing.forward import inference, logprobs, micro_batch


def tokens_of(batch, i: int) -> int:
    """Real tokens (prompt + response) of response i of `batch`."""
    return len(batch.prompt_ids[i]) + len(batch.response_ids[i])


def micro_batches(idx: list[int], batch, cfg) -> list[list[int]]:
    """Split a mini-batch's responses (this rank's) into micro-batches. Memory only: the math is unchanged.

    By count (cfg.micro_batch_size, in index order), or with cfg.micro_batch_tokens > 0 by a token
    budget: longest first, each response into the first micro-batch it fits (first-fit
    decreasing). What counts against the budget is what the layout processes: real tokens when
    packed (cfg.pack_micro_batches), (longest prompt + longest response) x responses when padded.
    A response longer than the budget gets a micro-batch of its own.
    """
    if cfg.micro_batch_tokens <= 0:
        return [idx[s : s + cfg.micro_batch_size] for s in range(0, len(idx), cfg.micro_batch_size)]

    def cost(rows: list[int]) -> int:
        if cfg.pack_micro_batches:
            return sum(tokens_of(batch, i) for i in rows)
        return len(rows) * (max(len(batch.prompt_ids[i]) for i in rows) + max(len(batch.response_ids[i]) for i in rows))

    out: list[list[int]] = []
    for i in sorted(idx, key=lambda i: tokens_of(batch, i), reverse=True):
        fit = next((m for m in out if cost(m + [i]) <= cfg.micro_batch_tokens), None)
        if fit is None:
            out.append([i])
        else:
            fit.append(i)
    return out


def split_minibatches(batch, mini_batch_size: int, dist: Dist) -> list[list[int]]:
    """This rank's response indices in each mini-batch of a rollout batch (train.Batch), in index order.

    Mini-batch m is the same set of responses [m*M, (m+1)*M) whatever the number of ranks. Its
    groups go to the ranks whole (never a group across two ranks), the same number to each, and
    balanced by real tokens: longest group first, each to the rank with the fewest tokens so far
    that still takes groups. Sums over ranks do not depend on who holds what, so 1 process and N
    processes take the same optimizer steps (up to float order).
    """
    M, n = mini_batch_size, len(batch.response_ids)
    out = []
    for start in range(0, n, M):
        rows = range(start, min(start + M, n))
        groups = sorted({int(batch.group_index[i]) for i in rows})
        per_rank = len(groups) // dist.world
        size = {g: sum(tokens_of(batch, i) for i in rows if int(batch.group_index[i]) == g) for g in groups}
        load, count, owner = [0] * dist.world, [0] * dist.world, {}
        for g in sorted(groups[: per_rank * dist.world], key=lambda g: (-size[g], g)):
            r = min((r for r in range(dist.world) if count[r] < per_rank), key=lambda r: (load[r], r))
            owner[g], load[r], count[r] = r, load[r] + size[g], count[r] + 1
        out.append([i for i in rows if owner.get(int(batch.group_index[i])) == dist.rank])
    return out


def micro_batches_all_ranks(mb: list[int], batch, cfg, dist: Dist) -> list[tuple[list[int], float]]:
    """(micro-batch, real_pass) pairs of a mini-batch: every rank runs the same number of forward passes
    (FSDP collectives), so a rank with fewer micro-batches (a token budget) adds padding passes
    (real_pass 0.0, 1.0 otherwise) over its shortest response. A collective (all ranks call it)."""
    micros = micro_batches(mb, batch, cfg)
    n_passes = int(all_reduce_max(len(micros), dist))
    spare = [min(mb, key=lambda i: tokens_of(batch, i))] if mb else []
    return [(m, 1.0) for m in micros] + [(spare, 0.0)] * (n_passes - len(micros))


class OldLogprobs:
    """Old log-probs per response of a train.Batch (log pi_old, the learner before this update: the
    weights that generated the batch when generation is inline), the entropy of the sampling
    distribution, the gap to the sampler's own log-probs, and the behaviour weight's diagnostics;
    used by train.update_policy (DAPO step 5)."""

    def __init__(self, batch):
        self.batch, self.logp, self.sampler_diff = batch, {}, []
        self.entropy = [0.0, 0.0]  # sum over response tokens, tokens
        self.weights = {"n": 0.0, "sum": 0.0, "sq": 0.0, "min": math.inf, "max": -math.inf, "over": 0.0, "kl": 0.0}

    def compute(self, model, rows: list[int], cfg, dist: Dist, device, pad_id: int) -> None:
        """A no-grad forward pass over `rows` (indices into the batch: the responses of mini-batches 2 and
        later), in eval mode; a collective under FSDP. device: the model's; pad_id: the tokenizer's pad token."""
        with inference(model):
            for micro, real_pass in micro_batches_all_ranks(rows, self.batch, cfg, dist):
                inputs = micro_batch(self.batch, micro, pad_id, device, cfg)
                lp, ent = logprobs(model, inputs, cfg)  # (b, T), (b, T)
                if real_pass:  # a padding pass only keeps the ranks in step
                    self._record(micro, lp, ent, inputs.real)

    def first_pass(self, micro: list[int], logp: torch.Tensor, ent: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Mini-batch 1: no optimizer step yet, so old = the current pass, detached (b, T)."""
        self._record(micro, logp, ent, real)
        return logp.detach()

    def rows(self, micro: list[int], like: torch.Tensor) -> torch.Tensor:
        """(b, T) old log-probs of a micro-batch, 0 on padding (a padding pass repeats the mini-batch's shortest
        response, whose old log-probs are recorded by then)."""
        out = torch.zeros_like(like)  # (b, T)
        for r, i in enumerate(micro):
            out[r, : len(self.logp[i])] = self.logp[i].to(like.device)
        return out

    def sampler_rows(self, micro: list[int], old_logp: torch.Tensor) -> torch.Tensor:
        """(b, T) the sampler's log-probs; rows without them take the old log-probs (weight 1)."""
        out = old_logp.clone()  # (b, T)
        for r, i in enumerate(micro):
            if self.batch.sampler_logp[i] is not None:
                out[r, : len(self.batch.sampler_logp[i])] = torch.tensor(self.batch.sampler_logp[i], device=out.device)
        return out

    def count_weights(self, st: dict, n: float) -> None:
        """Add one pass's behaviour-weight stats (dapo.behaviour_weight, over its n loss tokens) to the step's."""
        if n <= 0 or "ess" not in st:
            return
        w = self.weights
        w_sum = st["weight_mean"] * n
        w["sq"] += w_sum**2 / (n * st["ess"]) if st["ess"] > 0 else 0.0  # ess = (sum w)^2 / (n sum w^2)
        w["n"], w["sum"], w["over"] = w["n"] + n, w["sum"] + w_sum, w["over"] + (st["capped_frac"] + st["masked_frac"]) * n
        w["min"], w["max"], w["kl"] = min(w["min"], st["weight_min"]), max(w["max"], st["weight_max"]), w["kl"] + st["behav_kl"] * n

    def _record(self, micro: list[int], lp: torch.Tensor, ent: torch.Tensor, real: torch.Tensor) -> None:
        self.entropy = [self.entropy[0] + float((ent * real).sum()), self.entropy[1] + float(real.sum())]
        lp = lp.detach().cpu()  # (b, T): one copy to the host per micro-batch, not one per response
        for r, i in enumerate(micro):
            self.logp[i] = lp[r, : len(self.batch.response_ids[i])]  # (len_i,)
            if self.batch.sampler_logp[i] is not None:
                self.sampler_diff.append((self.logp[i] - torch.tensor(self.batch.sampler_logp[i])).abs())

    def metrics(self, dist: Dist) -> dict:
        """policy/entropy (of the generating weights, per response token forwarded), sampler/logprob_absdiff_*
        and, with the sampler's log-probs in the loss, the behaviour weight's offpolicy/* (all ranks)."""
        n_tok, ent = all_reduce_sum(self.entropy[1], dist), all_reduce_sum(self.entropy[0], dist)
        out = {"policy/entropy": ent / n_tok} if n_tok > 0 else {}
        if self.sampler_diff:
            d = torch.cat(self.sampler_diff)
            out["sampler/logprob_absdiff_mean"], out["sampler/logprob_absdiff_max"] = float(d.mean()), float(d.max())
        w = {k: (all_reduce_max(v, dist) if k == "max" else -all_reduce_max(-v, dist) if k == "min" else all_reduce_sum(v, dist))
             for k, v in self.weights.items()}
        if w["n"] > 0:  # pi_old / pi_sampler over loss tokens: 1 when the sampler is the learner (docs/metrics.md)
            out |= {"offpolicy/weight_mean": w["sum"] / w["n"], "offpolicy/weight_min": w["min"], "offpolicy/weight_max": w["max"],
                    "offpolicy/over_cap_frac": w["over"] / w["n"], "offpolicy/kl_k3": w["kl"] / w["n"],
                    "offpolicy/ess": w["sum"] ** 2 / (w["n"] * w["sq"]) if w["sq"] > 0 else 0.0}
        return out


def clip_and_step(model, optimizer, grad_clip: float, stats: dict) -> float:
    """Clip the gradient norm and take the optimizer step; a non-finite gradient never reaches the
    weights (counted in stats["policy/nonfinite_grad_steps"]). Returns the pre-clip norm."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a DTensor
    if torch.isfinite(norm):
        optimizer.step()
    else:
        stats["policy/nonfinite_grad_steps"] = stats.get("policy/nonfinite_grad_steps", 0) + 1
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
