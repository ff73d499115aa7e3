"""The two fork guides of docs/forking.md, done exactly as they say.

"Add a task": a new task is a subclass of task.Task with its own problems (`read`), prompt
(`messages`) and reward (`score`), passed to train.train; nothing else is edited. The toy task
below asks the tiny task's addition questions but rewards only the units digit of the answer.

"Add a loss variant": a new loss aggregation is a name in dapo.LOSS_AGG_MODES and a branch of
dapo.aggregate_loss (plus a count in dapo.loss_denominators if it needs one); train.py is not
touched. The toy mode "token-sum" (no denominator) is added here by patching those two names.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random

import torch

import dapo
import train
import verifier
from plumbing import distributed, policy
from task import Problem, Task

# --- Add a task ---------------------------------------------------------------------------------------


class UnitsDigit(Task):
    """What is a+b? Right when the last number of the response ends in the units digit of a+b."""

    def read(self, spec, cfg, *, held_out, limit=0):
        rng = random.Random(1 if held_out else 0)
        pairs = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(max(limit, 64))]
        problems = [Problem(f"units-{held_out}-{i}", [{"role": "user", "content": f"What is {a}+{b}?"}], str((a + b) % 10),
                            bare=False) for i, (a, b) in enumerate(pairs)]
        return problems, f"units-digit:{'test' if held_out else 'train'}", "v1"

    def messages(self, problem, cfg):
        return problem.messages  # the question as it is: no instruction around it

    def score(self, responses, problem, cfg):
        out = []
        for text in responses:
            digits = [w for w in text.replace("=", " ").split() if w.isdigit()]
            pred = digits[-1][-1] if digits else None
            ok = pred == problem.answer
            out.append(verifier.Score(ok, 1.0 if ok else -1.0, pred, "ok" if ok else ("wrong" if pred else "no_answer")))
        return out

    def check_answer(self, problem, cfg):
        if not problem.answer.isdigit():
            raise ValueError("the answer must be a digit")


def test_add_a_task_trains_two_steps(tmp_path):
    run = tmp_path / "units"
    cfg = train.parse_config(["--run_dir", str(run), "--steps", "2", "--eval_limit", "8", "--eval_k", "2",
                              "--prompts_per_step", "4", "--gen_prompts_per_round", "8", "--mini_batch_size", "32",
                              "--probe_every", "0"])
    summary = train.train(cfg, task=UnitsDigit())
    records = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert records and {r["dataset"] for r in records} == {"units-digit:train"}
    for r in records:  # every verdict is the toy reward's, on the toy problems
        assert r["prompt_id"].startswith("units-False-") and r["ground_truth"] in "0123456789"
        assert r["correct"] == (r["pred"] == r["ground_truth"])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and all(m["policy/optimizer_steps"] >= 1 for m in metrics)
    assert 0.0 < sum(r["correct"] for r in records) < len(records)  # the toy reward separates answers
    assert "heldout/avg@2" in summary and summary["heldout/n_problems"] == 8


# --- Add a loss variant -----------------------------------------------------------------------------------


def test_add_a_loss_variant_runs_through_the_update(monkeypatch):
    """"token-sum" (sum of token losses, no denominator) takes exactly num_tokens times the step of
    "token-mean" under plain SGD: the mode reached the update and nothing else changed."""
    real = dapo.aggregate_loss

    def aggregate_loss(loss_tok, mask, mode, **den):
        if mode == "token-sum":  # the new branch
            return (loss_tok * mask.to(loss_tok.dtype)).sum()
        return real(loss_tok, mask, mode, **den)

    monkeypatch.setattr(dapo, "LOSS_AGG_MODES", dapo.LOSS_AGG_MODES + ("token-sum",))
    monkeypatch.setattr(dapo, "aggregate_loss", aggregate_loss)
    train.parse_config(["--loss_agg", "token-sum"])  # the config accepts the new mode

    model0, tok = policy.load_policy("", torch.device("cpu"))
    model0 = model0.double()  # an exact ratio, in float64
    g = torch.Generator().manual_seed(0)
    prompts = [[int(x) for x in torch.randint(4, 30, (8,), generator=g)] for _ in range(2) for _ in range(4)]
    responses = [[int(x) for x in torch.randint(4, 30, (int(n),), generator=g)] for n in torch.randint(2, 9, (8,), generator=g)]
    rewards = torch.tensor([1.0, -1, -1, 1, -1, 1, 1, 1])
    batch = train.Batch(prompts, responses, dapo.group_advantages(rewards, 4), torch.ones(8), torch.arange(2).repeat_interleave(4),
                        [None] * 8)
    base = train.Config(group_size=4, prompts_per_step=2, mini_batch_size=8, micro_batch_size=3, grad_clip=1e9)
    moves = {}
    for mode in ("token-mean", "token-sum"):
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        stats = train.update_policy(model, opt, batch, dataclasses.replace(base, loss_agg=mode), distributed.Dist(), "cpu",
                                    tok.pad_token_id)
        assert stats["policy/optimizer_steps"] == 1
        moves[mode] = torch.cat([(p - q).flatten() for p, q in zip(model.parameters(), model0.parameters())])
    n_tokens = sum(len(r) for r in responses)
    assert moves["token-mean"].abs().max() > 0
    expected = moves["token-mean"] * n_tokens
    # float64 weights and log-probs; elements that nearly cancel carry rounding of the scale
    assert (moves["token-sum"] - expected).abs().max() <= 1e-5 * expected.abs().max()
