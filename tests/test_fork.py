"""The two fork guides of docs/forking.md, done exactly as they say.

"Add a task": the page's `mytask.py` (a task.Task subclass with its own problems, prompt and reward)
is written to a folder on the path, and the page's three commands run as they are written:
train.py --task mytask:UnitsDigit, eval.py --model RUN (which must take the run's task from its
config), preflight.py --task. Nothing in the repository is edited. The toy task asks additions but
rewards only the units digit of the answer.

"Add a loss variant": a new loss aggregation is a name in dapo.LOSS_AGG_MODES and a branch of
dapo.aggregate_loss (plus a count in dapo.loss_denominators if it needs one); a new surrogate is a
function and its entry in dapo.SURROGATES. With its knobs at their defaults, train.py is not touched
by either. The toy mode "token-sum" (no denominator) and the toy surrogate "double" are added here by
patching those names.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

import dapo
import eval as ev
import preflight
import train
from plumbing import distributed, policy
from task import task_of

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "docs" / "forking.md").read_text()


# --- Add a task ---------------------------------------------------------------------------------------


def _page_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE[PAGE.index("## Add a task"):PAGE.index("## Add a loss variant")], re.S)


@pytest.fixture
def mytask(tmp_path, monkeypatch):
    """docs/forking.md's mytask.py, importable as `mytask` (a fresh module for each test)."""
    (code,) = _page_blocks("python")
    (tmp_path / "mytask.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mytask", raising=False)
    return tmp_path


def _commands(run_dir: Path, out: Path) -> dict[str, list[str]]:
    """The page's commands as argv lists, with the run directory and outputs moved under the test's folder."""
    (block,) = _page_blocks("bash")
    cmds = {}
    for line in block.strip().splitlines():
        argv = shlex.split(line.split("#")[0])
        assert argv[0] == "python", line
        argv = [str(run_dir) if a == "runs/units" else a for a in argv[1:]]
        cmds[argv[0]] = argv[1:]
    small = ["--eval_limit", "8", "--eval_k", "2", "--prompts_per_step", "4", "--gen_prompts_per_round", "8",
             "--mini_batch_size", "32", "--probe_every", "0"]
    cmds["train.py"] += small
    cmds["eval.py"] += ["--limit", "8", "--greedy", "false", "--out", str(out / "eval")]
    cmds["preflight.py"] += ["--out", str(out / "preflight")]
    return cmds


def test_add_a_task_runs_through_train_eval_and_preflight(mytask, tmp_path):
    run = tmp_path / "units"
    cmds = _commands(run, tmp_path)
    summary = train.main(cmds["train.py"])
    config = json.loads((run / "config.json").read_text())["config"]
    assert config["task"] == "mytask:UnitsDigit" and json.loads(config["task_args"]) == {}
    records = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert records and {r["dataset"] for r in records} == {"units-digit:train"}
    for r in records:  # every verdict is the toy reward's, on the toy problems
        assert r["prompt_id"].startswith("units-False-") and r["ground_truth"] in "0123456789"
        assert r["correct"] == (r["pred"] == r["ground_truth"])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and all(m["policy/optimizer_steps"] >= 1 for m in metrics)
    assert 0.0 < sum(r["correct"] for r in records) < len(records)  # the toy reward separates answers
    assert "heldout/avg@2" in summary and summary["heldout/n_problems"] == 8

    # eval.py --model RUN: the run's task (from final/dapo_run.json), its held-out data, its reward
    res = ev.main(cmds["eval.py"])
    assert res["settings"]["task"] == "mytask:UnitsDigit" and res["settings"]["dataset"] == "units-digit:test"
    assert [r["id"] for r in res["per_problem"]] == [f"units-True-{i}" for i in range(8)]
    for r in res["per_problem"]:
        assert all(p is None or (len(p) == 1 and p.isdigit()) for p in r["preds"]) and r["answer"] in "0123456789"

    # preflight.py --task: the sheet samples the task's problems and scores them with its reward
    sheet = preflight.main(cmds["preflight.py"])
    assert sheet["settings"]["task"] == "mytask:UnitsDigit" and sheet["settings"]["data"] == "units-digit:train"
    assert len(sheet["prompt_ids"]) == 8 and all(p.startswith("units-False-") for p in sheet["prompt_ids"])


def test_a_task_given_from_python_is_recorded_and_its_options_reach_it(mytask, tmp_path):
    from mytask import UnitsDigit

    run = tmp_path / "py"
    cfg = train.parse_config(["--run_dir", str(run), "--steps", "1", "--data", "units", "--eval_data", "",
                              "--prompts_per_step", "4", "--gen_prompts_per_round", "8", "--mini_batch_size", "32",
                              "--probe_every", "0"])
    train.train(cfg, task=UnitsDigit(n_problems=70))
    config = json.loads((run / "config.json").read_text())["config"]
    assert config["task"] == "mytask:UnitsDigit" and json.loads(config["task_args"]) == {"n_problems": 70}
    task, _ = task_of(train.parse_config(["--task", config["task"], "--task_args", config["task_args"], "--data", "units"]))
    assert task == UnitsDigit(n_problems=70) and len(task.read("units", cfg, held_out=False)[0]) == 70


# --- Add a loss variant -----------------------------------------------------------------------------------


def _moves(modes: dict[str, dict]) -> tuple[dict[str, torch.Tensor], int]:
    """One optimizer step (plain SGD, no clipping, float64) of train.update_policy per named config change,
    on one fixed batch of 2 groups of 4: ({name: the weights' move}, the batch's response tokens)."""
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
    for name, change in modes.items():
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        stats = train.update_policy(model, opt, batch, dataclasses.replace(base, **change), distributed.Dist(), "cpu",
                                    tok.pad_token_id)
        assert stats["policy/optimizer_steps"] == 1
        moves[name] = torch.cat([(p - q).flatten() for p, q in zip(model.parameters(), model0.parameters())])
    assert moves[next(iter(modes))].abs().max() > 0
    return moves, sum(len(r) for r in responses)


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    # float64 weights and log-probs; elements that nearly cancel carry rounding of the scale
    return bool((got - expected).abs().max() <= 1e-5 * expected.abs().max())


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
    moves, n_tokens = _moves({"token-mean": dict(loss_agg="token-mean"), "token-sum": dict(loss_agg="token-sum")})
    assert _close(moves["token-sum"], moves["token-mean"] * n_tokens)


def test_add_a_surrogate_runs_through_the_update_and_the_offpolicy_loss(monkeypatch):
    """A surrogate is a function and one entry of dapo.SURROGATES, the map both train.token_loss and
    dapo.offpolicy_loss read: "double" (twice policy_loss, with its default knobs) takes exactly twice
    the step of "clip" under plain SGD, and offpolicy_loss gives twice clip's token losses."""

    def double(logp, old_logp, advantages, mask):  # the new surrogate: policy_loss's arguments and return value
        loss_tok, stats = dapo.policy_loss(logp, old_logp, advantages, mask)
        return 2 * loss_tok, stats

    monkeypatch.setitem(dapo.SURROGATES, "double", double)
    train.parse_config(["--surrogate", "double"])  # the config accepts the new surrogate
    moves, _ = _moves({"clip": dict(surrogate="clip"), "double": dict(surrogate="double")})
    assert _close(moves["double"], 2 * moves["clip"])
    logp, adv, mask = torch.randn(2, 3, dtype=torch.float64), torch.tensor([1.0, -1.0]), torch.ones(2, 3)
    old = logp + 0.3 * torch.randn(2, 3, dtype=torch.float64)
    got, _ = dapo.offpolicy_loss(logp, old, None, adv, mask, objective="naive", cap=2.0, surrogate="double")
    assert torch.equal(got, 2 * dapo.policy_loss(logp, old, adv, mask)[0])
