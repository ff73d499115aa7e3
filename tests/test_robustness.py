"""Runs that survive (interruption, resume, numerical faults, bad data) and bounded staleness,
on the real entry points.

Exact resume: 6 steps in one process equal 3 steps + resume in a new process + 3 steps
(parameters, metrics, rollout records, probe records). SIGTERM finishes the step in flight and
writes a checkpoint. A non-finite update never reaches the weights. Bad data is named up front.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import dapo
import train
from plumbing import policy
from task import Task

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--task_args", '{"train_size": 500}', "--group_size", "4", "--prompts_per_step", "4", "--gen_prompts_per_round", "6", "--mini_batch_size", "8",
         "--eval_limit", "8", "--eval_k", "2", "--probe_every", "2", "--probe_size", "4", "--run_id", "fixed", "--seed", "1"]
VOLATILE = ("time/", "perf/", "memory/")  # wall-clock figures differ between any two runs


def _cli(args, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, **kw)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def _stable(rows: list[dict], drop=("gen_wall_s", "lag_s")) -> list[dict]:  # lag_s: seconds from generation to training
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE) and k not in drop} for r in rows]


def test_exact_resume_in_a_new_process(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    extra = ["--max_rollout_age", "1", "--dynamic_sampling", "false"]  # the buffer must survive the checkpoint too
    out = _cli(["--run_dir", str(a), "--steps", "6", *SMALL, *extra])
    assert out.returncode == 0, out.stderr[-3000:]
    out = _cli(["--run_dir", str(b), "--steps", "3", *SMALL, *extra])
    assert out.returncode == 0, out.stderr[-3000:]
    assert (b / "checkpoints" / "latest").read_text().strip() == "step_000003"
    out = _cli(["--run_dir", str(b), "--steps", "6", "--resume", "latest", *SMALL, *extra])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[resume]" in out.stdout
    ma, mb = _jsonl(a / "metrics.jsonl"), _jsonl(b / "metrics.jsonl")
    assert [m["step"] for m in mb] == list(range(6))
    assert _stable(ma) == _stable(mb)
    assert any(m.get("age/1/groups") for m in ma), "the staleness buffer was never used"
    assert _stable(_jsonl(a / "rollouts.jsonl")) == _stable(_jsonl(b / "rollouts.jsonl"))
    assert _jsonl(a / "probe_rollouts.jsonl") == _jsonl(b / "probe_rollouts.jsonl")
    wa, wb = load_file(a / "final/model.safetensors"), load_file(b / "final/model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_refuses_a_changed_config(tmp_path):
    run = tmp_path / "r"
    assert _cli(["--run_dir", str(run), "--steps", "1", *SMALL, "--eval_data="]).returncode == 0
    out = _cli(["--run_dir", str(run), "--steps", "2", "--resume", "latest", *SMALL, "--eval_data=", "--lr", "0.5"])
    assert out.returncode != 0 and "config differs from the checkpoint" in out.stderr and "'lr'" in out.stderr
    # A checkpoint written before a Config field existed resumes: the missing field counts as its default. (Such a
    # checkpoint also predates checksums.json, which would refuse the edited file: plumbing/checkpoints.py.)
    ck = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip() / "trainer_state.json"
    state = json.loads(ck.read_text())
    del state["config"]["share_prompt_forward"]
    ck.write_text(json.dumps(state))
    (ck.parent / "checksums.json").unlink()
    out = _cli(["--run_dir", str(run), "--steps", "2", "--resume", "latest", *SMALL, "--eval_data="])
    assert out.returncode == 0, out.stderr[-3000:]


def test_sigterm_finishes_the_step_and_checkpoints(tmp_path):
    run = tmp_path / "s"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "train.py", "--run_dir", str(run), "--steps", "500", *SMALL, "--eval_data="],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    steps = len(_jsonl(run / "metrics.jsonl"))
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{steps:06d}" and steps < 500
    assert not list((run / "checkpoints").glob("*.tmp")), "a temporary checkpoint was left behind"
    state = json.loads((run / "checkpoints" / latest / "trainer_state.json").read_text())
    assert state["step"] == steps and state["stream_position"] > 0


def test_nonfinite_update_never_reaches_the_weights(tmp_path, monkeypatch):
    real = dapo.policy_loss

    def nan_loss(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        return loss * float("nan"), stats

    base, _ = policy.load_policy("", torch.device("cpu"))
    monkeypatch.setitem(dapo.SURROGATES, "clip", nan_loss)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(RuntimeError, match="3 rollout steps in a row had only non-finite gradients"):
        train.main(["--run_dir", str(tmp_path / "n"), "--steps", "10", *SMALL, "--eval_data=", "--dynamic_sampling", "false"])
    # A run that raises gives back the signal handlers it installed (left behind, they swallowed the
    # SIGTERM that multiprocessing.Pool.terminate sends its forked workers: a hang of the test suite).
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    metrics = _jsonl(tmp_path / "n" / "metrics.jsonl")
    assert len(metrics) == 3 and all(m["policy/nonfinite_grad_steps"] == m["policy/optimizer_steps"] for m in metrics)
    # The run stopped before any checkpoint; what it holds in memory is checked through a short
    # run that trains 1 step with NaN and is then saved by a normal end.
    monkeypatch.setitem(dapo.SURROGATES, "clip", nan_loss)
    train.main(["--run_dir", str(tmp_path / "m"), "--steps", "1", *SMALL, "--eval_data=", "--dynamic_sampling", "false"])
    after = load_file(tmp_path / "m" / "final/model.safetensors")
    assert all(torch.equal(after[k], p.detach()) for k, p in base.state_dict().items() if k in after)


def test_extreme_log_prob_gap_stays_finite():
    logp = torch.tensor([[60.0, -60.0]], requires_grad=True)
    loss, _ = dapo.policy_loss(logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2))
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()


def test_staleness_buffer_reuses_surplus_groups(tmp_path):
    run = tmp_path / "age"
    train.main(["--run_dir", str(run), "--steps", "3", *SMALL, "--eval_data=", "--dynamic_sampling", "false",
                "--max_rollout_age", "1", "--gen_prompts_per_round", "8"])
    metrics = _jsonl(run / "metrics.jsonl")
    # 8 prompts generated at step 0, 4 trained; the other 4 are trained at step 1 (age 1) with no generation.
    assert metrics[0]["groups/buffered"] == 4 and metrics[1]["age/1/groups"] == 4 and metrics[1]["groups/gen_rounds"] == 0
    records = _jsonl(run / "rollouts.jsonl")
    aged = [r for r in records if r["learner_version"] - r["policy_version"] == 1]
    assert len(aged) == 4 * 4 and all(r["kept"] and r["advantage"] is not None for r in aged)
    assert all(r["learner_version"] - r["policy_version"] <= 1 for r in records)


@pytest.mark.parametrize("row, field", [
    ({"problem": "", "answer": "3"}, "'problem'"),
    ({"problem": "What is 1+2?"}, "'answer'"),
    ({"problem": "What is 1+2?", "answer": 3}, "'answer'"),
    ({"problem": "What is 1+2?", "answer": "x+1"}, r"ground truth 'x\+1' cannot be scored"),
])
def test_bad_rows_are_named_before_training(tmp_path, row, field):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": "What is 2+2?", "answer": "4"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=field):
        Task().read(str(path), train.Config(), held_out=False)
    problems, _, _ = Task().read(str(path), train.Config(skip_bad_rows=True), held_out=False)
    assert [p.answer for p in problems] == ["4"]


def test_malformed_parquet_chat_and_unreadable_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": [[{"role": "user", "content": "What is 1+1?"}], []],
                             "reward_model": [{"ground_truth": "2"}, {"ground_truth": "3"}]}), path)
    with pytest.raises(ValueError, match=r"bad.parquet row 1: field 'prompt'"):
        Task().read(str(path), train.Config(), held_out=False)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="not a readable parquet file"):
        Task().read(str(junk), train.Config(), held_out=False)


def test_prompt_longer_than_the_budget(tmp_path):
    tok = policy.load_tokenizer("")
    path = tmp_path / "five.jsonl"
    path.write_text("".join(json.dumps({"problem": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(5)))
    with pytest.raises(ValueError, match="exceed --max_prompt_len 10"):
        Task().load(str(path), tok, train.Config(max_prompt_len=10), held_out=False)
    data = Task().load(str(path), tok, train.Config(max_prompt_len=10, prompt_truncation="left", instruction="none"),
                       held_out=False)
    assert len(data) == 5 and all(len(x) == 10 for x in data.prompt_ids)  # the start of each problem's text cut
    with pytest.raises(ValueError, match="cannot be cut within --max_prompt_len 10 by the start of its text"):
        Task().load(str(path), tok, train.Config(max_prompt_len=10, prompt_truncation="left"), held_out=False)  # the
        # official instruction alone is longer: a cut never takes it (tests/test_task_faults.py)
    with pytest.raises(ValueError, match="no prompt of .* fits"):
        Task().load(str(path), tok, train.Config(max_prompt_len=10, prompt_truncation="skip"), held_out=False)


def test_safe_loading_refuses_pickled_weights(tmp_path):
    """Weights load from safetensors only: a directory holding a pickle (.bin) is refused."""
    import shutil

    model_dir = tmp_path / "m"
    shutil.copytree(REPO / "assets/tiny-base", model_dir)
    weights = load_file(model_dir / "model.safetensors")
    (model_dir / "model.safetensors").unlink()
    torch.save(weights, model_dir / "pytorch_model.bin")
    with pytest.raises(OSError, match="safetensors|model.safetensors"):
        policy.load_policy(str(model_dir), torch.device("cpu"))
