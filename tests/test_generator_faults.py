"""Faults of the generator process (generator.py), each provoked at its bad moment through the real entry point.

1. The learner killed (SIGKILL) while the generator has a batch half-written into a pipe nobody
   reads: neither the generator nor multiprocessing's resource tracker survives it.
2. The generator killed in its first second, before it read its start-up arguments: the learner
   is not blocked in Process.start() and stops with the generator's exit status.
3. The generator dead while it holds the shared-weights lock (DAPO_TEST_FAULT): the learner's
   next publish does not block; it checkpoints the step it trained and stops with that error.
4. A probe mismatch after a weight transfer raises the check's own error with the measured gap.

Each waits with a deadline, asserts a clear error within seconds, and checks by PID that no process
of the run is left. Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_generator_faults.py
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.multiprocessing as mp

import generator
import plumbing
import rollout

REPO = Path(__file__).resolve().parents[1]
RUN = ["--max_policy_lag", "1", "--prompts_per_step", "8", "--eval_data", "", "--mini_batch_size", "32",
       "--micro_batch_size", "16", "--run_id", "t"]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process faults are provoked with Linux signals")


@pytest.fixture
def learner(tmp_path):
    """start(*args, env=...) launches train.py in the background; on teardown the learner and every
    process of it the test has seen are killed (so a failing test leaves nothing behind either)."""
    procs: list = []

    def start(*args: str, env: dict | None = None) -> subprocess.Popen:
        cmd = [sys.executable, "train.py", "--run_dir", str(tmp_path / "run"), *RUN, *args]
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        proc.seen = []  # its descendants, as _descendants finds them
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        for p in proc.seen:
            if p.is_running():
                p.kill()


def _descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    kids = psutil.Process(proc.pid).children(recursive=True)
    proc.seen.extend(kids)
    return kids


def _wait(condition, seconds: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            proc.kill()
            raise AssertionError(f"{what} not within {seconds} s; learner output: {proc.communicate()[1][-2000:]}")
        time.sleep(0.01)


def _generator_of(proc: subprocess.Popen) -> psutil.Process | None:
    """The learner's generator process (a spawn child), or None; the other child is the resource tracker."""
    for p in _descendants(proc):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "--multiprocessing-fork" in p.cmdline():
                return p
    return None


def _left(procs: list[psutil.Process], seconds: float) -> list[int]:
    """PIDs of `procs` still running (not zombies) after up to `seconds`."""
    deadline = time.time() + seconds
    while True:
        alive = [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.05)


def _stops_within(proc: subprocess.Popen, seconds: float, what: str) -> str:
    """The learner's stderr once it has exited, which it must within `seconds`."""
    try:
        return proc.communicate(timeout=seconds)[1]
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the learner hangs after {what}") from None


def test_a_killed_learner_leaves_no_generator_and_no_resource_tracker(tmp_path, learner):
    proc = learner("--steps", "50")
    metrics = tmp_path / "run" / "metrics.jsonl"
    _wait(lambda: metrics.exists() and metrics.read_text(), 120, "the first step", proc)
    kids = _descendants(proc)
    assert len(kids) == 2, [k.cmdline() for k in kids]  # the generator and the resource tracker
    proc.send_signal(signal.SIGSTOP)  # it reads nothing more: the generator's next batch fills the pipe
    time.sleep(4)
    proc.kill()
    proc.wait(10)
    assert _left(kids, 10) == []


def test_a_generator_killed_in_its_first_second_stops_the_learner(learner):
    proc = learner("--steps", "3")
    found: list = []
    _wait(lambda: found.append(_generator_of(proc)) or found[-1] is not None, 120, "the generator's start", proc)
    gen, kids = found[-1], _descendants(proc)
    gen.kill()  # while it imports the learner's main module, before it has read its arguments
    err = _stops_within(proc, 30, "its generator died at start-up")
    assert proc.returncode == 2, err[-2000:]
    assert f"error: the generator process (pid {gen.pid}) was killed by SIGKILL without sending batch 0" in err
    assert _left(kids, 10) == []


def test_a_generator_that_dies_holding_the_weights_lock_stops_the_learner_after_a_checkpoint(tmp_path, learner):
    proc = learner("--steps", "3", env={generator.FAULT_ENV: "exit_holding_lock"})
    found: list = []
    _wait(lambda: found.append(_generator_of(proc)) or found[-1] is not None, 120, "the generator's start", proc)
    gen, kids = found[-1], _descendants(proc)
    _wait(lambda: not gen.is_running() or gen.status() == psutil.STATUS_ZOMBIE, 120, "the injected fault", proc)
    err = _stops_within(proc, 30, "its generator died holding the lock")
    assert proc.returncode == 2, err[-2000:]
    assert (f"error: the generator process (pid {gen.pid}) exited with code 86 holding the shared-weights lock (during "
            "a weight copy); the learner checkpointed the 2 rollout steps it had trained") in err, err[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert _left(kids, 10) == []


def test_a_probe_mismatch_raises_the_sync_check_with_the_measured_gap():
    model = plumbing.load_model("", torch.device("cpu"))
    probe = list(range(3, 23))
    reference = generator.probe_logprobs(model, probe, 8)  # (8,)
    shared = generator.SharedWeights(model.state_dict(), probe, 8, mp.get_context("spawn"))
    shared.publish(model.state_dict(), 1, reference + 0.5, lambda: None)  # the learner's reference off by 0.5
    with pytest.raises(rollout.WeightSyncError, match=r"version 1: probe log-probs differ from the learner's by 0\.5 > "):
        generator._load_weights(shared, model, None, 1e-5, lambda: None)  # raises before the engine is touched
