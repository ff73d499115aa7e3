"""Generation in a pool of processes of its own (plumbing/generator.py, --max_policy_lag), on the real entry point.

End-to-end kind, on the tiny default: the pool at lag 0 reproduces the inline loop bit for bit
with one worker and with two, by either weight transport (which proves the transfer, the
per-worker shards and the batch hand-over); at lag 1 no group is trained more than one version
behind and every record and metric says how far behind it was; a worker that fails stops the
learner with its error (no hang, no process left); SIGTERM checkpoints and stops every process; a
resumed run regenerates what was in flight and continues the data stream; 2 learner ranks and 2
workers equal the inline loop on 2 ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import cpu_ranks_env
from safetensors.torch import load_file

import train

REPO = Path(__file__).resolve().parents[1]
SHAPE = ["--eval_limit", "8", "--eval_k", "2", "--prompts_per_step", "8", "--gen_prompts_per_round", "12",
         "--mini_batch_size", "32", "--micro_batch_size", "16", "--run_id", "t", "--device", "cpu"]  # also on a GPU host
SMALL = ["--task_args", '{"train_size": 500}', *SHAPE]  # the tiny task with 500 training problems: less to tokenise per process


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _strip(rows: list[dict], drop=("time/", "perf/", "memory/", "async/", "gen_wall_s", "lag_s", "admission",
                                   "gen_group")) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]


@pytest.fixture(scope="module")
def inline_two_shards(tmp_path_factory):
    """The inline loop, 2 steps, the prompts of each round in 2 shards (the anchor of the pools below)."""
    run = tmp_path_factory.mktemp("inline") / "run"
    train.main(["--run_dir", str(run), "--steps", "2", "--gen_shards", "2", *SMALL])
    return run


@pytest.mark.parametrize("pool", [["--generator_workers", "1", "--gen_shards", "2", "--generator_weights", "shared_memory"],
                                  ["--generator_workers", "2"]], ids=["1-worker-shm", "2-workers-broadcast"])
def test_pool_at_lag_0_reproduces_the_inline_loop(tmp_path, inline_two_shards, pool):
    """One worker sampling both shards (weights through shared memory), and two workers sampling one
    each (--gen_shards 0 = one per worker; weights by broadcast): the inline loop's rollouts,
    metrics and final weights, exactly."""
    inline, proc = inline_two_shards, tmp_path / "proc"
    train.main(["--run_dir", str(proc), "--steps", "2", "--generator_process", "true", *pool, *SMALL])
    for name in ("metrics.jsonl", "rollouts.jsonl", "probe_rollouts.jsonl"):
        assert _strip(_jsonl(inline / name)) == _strip(_jsonl(proc / name)), name
    a, b = load_file(inline / "final/model.safetensors"), load_file(proc / "final/model.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    m = _jsonl(proc / "metrics.jsonl")
    workers = int(pool[1])
    assert [r["async/lag"] for r in m] == [0, 0] and all(r["async/workers"] == workers for r in m)
    # every step waits for its batch; step 0 sends weights version 1, the last step (1) sends none
    assert all("async/learner_idle_s" in r for r in m)
    assert "async/weight_transfer_s" in m[0] and "async/weight_transfer_s" not in m[-1]
    records = _jsonl(proc / "rollouts.jsonl")
    assert {r["admission"] for r in records if r["kept"]} == {"lag 0 <= max_policy_lag 0"}
    assert {(r["gen_shard"], r["gen_group"]) for r in records} == {(c, c % workers) for c in (0, 1)}  # shard c on worker c % K


def test_lag_1_never_trains_on_older_groups_and_says_how_old(tmp_path):
    run = tmp_path / "lag1"
    train.main(["--run_dir", str(run), "--steps", "4", "--max_policy_lag", "1", "--probe_every", "0",
                "--offpolicy_objective", "decoupled", "--generator_workers", "2", *SMALL])
    metrics, records = _jsonl(run / "metrics.jsonl"), _jsonl(run / "rollouts.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    for m in metrics:
        assert 0 <= m["async/lag"] <= 1 and m["async/queue_depth"] <= 2
        ages = {int(k.split("/")[1]) for k in m if k.startswith("age/") and k.endswith("/groups")}
        assert ages == {m["async/lag"]}  # the lag histogram: one batch, one generating version
        assert 0.0 < m["offpolicy/weight_mean"] and m["offpolicy/ess"] <= 1.0 + 1e-9  # the decoupled weight's diagnostics
    kept = [r for r in records if r["kept"]]
    assert kept and all(r["lag_versions"] == r["learner_version"] - r["policy_version"] <= 1 for r in kept)
    assert all(r["admission"] == f"lag {r['lag_versions']} <= max_policy_lag 1" and r["lag_s"] >= 0 for r in kept)
    assert metrics[0]["async/lag"] == 0  # the first batch can only come from the starting weights


def test_a_failing_generator_stops_the_learner_with_its_error(tmp_path):
    """Answers no policy can match: dynamic sampling keeps nothing and, under --on_exhausted error,
    the worker fails at its first batch; the learner raises that error at once."""
    data = tmp_path / "impossible.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i}+{i}?", "answer": "123456789"}) + "\n" for i in range(20)))
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"generator worker 0 \(pid \d+\) failed: .*dynamic sampling kept 0/8 groups"):
        train.main(["--run_dir", str(tmp_path / "r"), "--steps", "3", "--max_policy_lag", "1", "--data", str(data),
                    "--eval_data", "", "--instruction", "none", "--on_exhausted", "error", "--max_gen_rounds", "1", *SHAPE])
    assert time.perf_counter() - t0 < 300  # generous: the point is that it returns at all


def test_sigterm_checkpoints_and_stops_every_process(tmp_path):
    import psutil

    from procs import left

    run = tmp_path / "sig"
    cmd = [sys.executable, "train.py", "--run_dir", str(run), "--steps", "200", "--max_policy_lag", "1", "--eval_data", "",
           "--generator_workers", "2", *SMALL]
    proc = subprocess.Popen(cmd, cwd=REPO, env=cpu_ranks_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()):  # a step has finished
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 3, children  # the two workers and multiprocessing's resource tracker
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "checkpoint written" in out and "Traceback" not in out
    assert left(children, 10) == []
    state = json.loads((run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip() / "trainer_state.json")
                       .read_text())
    metrics = _jsonl(run / "metrics.jsonl")
    assert state["step"] == len(metrics) and state["buffer"] == []
    assert state["stream_position"] == sum(m["groups/generated"] for m in metrics)  # prompts of trained batches only


def test_resume_regenerates_what_was_in_flight_and_continues_the_stream(tmp_path):
    run = tmp_path / "res"
    args = ["--run_dir", str(run), "--max_policy_lag", "1", "--eval_data", "", "--generator_workers", "2", *SMALL]
    train.main([*args, "--steps", "2"])
    first = json.loads((run / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    train.main([*args, "--steps", "4", "--resume", "latest"])
    metrics, records = _jsonl(run / "metrics.jsonl"), _jsonl(run / "rollouts.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert first["stream_position"] == sum(m["groups/generated"] for m in metrics[:2])
    # After the resume the generator starts from the checkpoint's weights (version 2): batch 2 has lag 0.
    assert metrics[2]["async/lag"] == 0 and 0 <= metrics[3]["async/lag"] <= 1
    final = json.loads((run / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    assert final["stream_position"] == sum(m["groups/generated"] for m in metrics)  # every prompt used once, in order
    assert len({r["group_id"] for r in records}) == len(records) // 8  # group ids unique across the resume


def _run_watching_children(cmd: list[str], env: dict, log: Path) -> tuple[str, list]:
    """Run cmd to its end (stderr into log); (its stderr, every process it started: polled, by PID)."""
    import psutil

    seen: dict[int, psutil.Process] = {}
    with open(log, "w") as f, subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=f) as proc:
        deadline = time.time() + 900
        while proc.poll() is None and time.time() < deadline:
            with contextlib.suppress(psutil.NoSuchProcess):
                seen.update({c.pid: c for c in psutil.Process(proc.pid).children(recursive=True)})
            time.sleep(0.2)
        if proc.poll() is None:  # past the deadline: kill the run and everything it started, then fail below
            proc.kill()
            for p in seen.values():
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
    err = log.read_text()
    assert proc.returncode == 0, err[-3000:]
    return err, list(seen.values())


@pytest.mark.skipif(sys.platform != "linux", reason="gloo torchrun test runs on Linux")
def test_two_learner_ranks_and_two_workers_equal_the_inline_loop_on_two_ranks(tmp_path):
    """torchrun with 2 learner ranks (FSDP2; rank 0 spawns the 2 workers, which take the weights
    streamed from the shards) at lag 0 against the inline loop on 2 ranks, both with --gen_shards 2:
    the same rollouts, weights within the float tolerance of tests/test_distributed.py (lr 1e-5);
    every worker generated with every version (so each received it and passed the probe check),
    and no process of the run outlives it."""
    from procs import left

    args = ["--steps", "2", "--eval_data", "", "--lr", "1e-5", "--group_size", "4", "--prompts_per_step", "4",
            "--gen_prompts_per_round", "6", "--mini_batch_size", "8", "--micro_batch_size", "3", "--gen_shards", "2",
            "--seed", "3", "--run_id", "t", "--task_args", '{"train_size": 500}']
    env = cpu_ranks_env()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "train.py"]
    inline, pool = tmp_path / "inline", tmp_path / "pool"
    out = subprocess.run([*torchrun, "--run_dir", str(inline), *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    err, started = _run_watching_children(
        [*torchrun, "--run_dir", str(pool), "--generator_process", "true", "--generator_workers", "2", *args], env, tmp_path / "pool.log")
    assert "Traceback" not in err and "Traceback" not in out.stderr
    assert len(started) >= 4, started  # torchrun's 2 learner ranks, rank 0's 2 workers (and the resource tracker)
    assert left(started, 10) == []
    records = _jsonl(pool / "rollouts.jsonl")
    assert _strip(_jsonl(inline / "rollouts.jsonl")) == _strip(records)
    # inline: ranks; pool: workers. At lag 0 step s is generated by version s on both workers.
    assert {(r["gen_group"], r["policy_version"]) for r in records} == {(c, s) for c in (0, 1) for s in (0, 1)}
    assert [m["async/lag"] for m in _jsonl(pool / "metrics.jsonl")] == [0, 0]
    w1, w2 = load_file(inline / "final/model.safetensors"), load_file(pool / "final/model.safetensors")
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) <= 1e-5
