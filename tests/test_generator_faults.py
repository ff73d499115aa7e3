"""Faults of the generator workers (plumbing/generator.py), each provoked at its bad moment through the real entry point.

A pool of two workers (weights by broadcast) at lag 1 unless said otherwise:
1. The learner killed (SIGKILL) while worker 0 has a batch half-written into a pipe nobody reads:
   neither worker nor multiprocessing's resource tracker survives it.
2. A worker killed in its first second, before it read its start-up arguments: the learner is not
   blocked in Process.start() and stops with the worker's exit status.
3. A worker that dies in the middle of a generation round, while the other waits for its shard in
   a collective: the learner names the dead one (not the other's failed collective) and stops.
4. A worker stopped (SIGSTOP: alive, silent): the learner stops after --generator_timeout_s.
5. A worker dead during a weight transfer (DAPO_TEST_FAULT): the learner's publish does not block;
   it checkpoints the step it trained and stops with that error.
6. A probe mismatch after a weight transfer raises the check's own error with the measured gap.
7. A worker's normal end never aborts: its real entry point with no batch left, 20 times, each
   process ending as a spawned one does, under a heartbeat that never pauses and a GIL that
   changes hands every 10 microseconds. Before the fix 14 of 80 of these ends aborted
   (`terminate called without an active exception`, exit -6): at interpreter finalization Python
   ends a daemon thread that asks for the GIL back with pthread_exit, and the heartbeat thread
   asks for it inside torch's C++ code, whose destructors must not unwind (pytorch/pytorch#38228,
   python/cpython#87135); the learner then saw a worker killed by SIGABRT and stopped.

Each waits with a deadline, asserts a clear error within seconds, and checks by PID that no process
of the run is left. Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_generator_faults.py
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

import psutil
import pytest
import torch
import torch.multiprocessing as mp

import rollout
from plumbing import generator, policy, transport
from procs import left

REPO = Path(__file__).resolve().parents[1]
RUN = ["--max_policy_lag", "1", "--generator_workers", "2", "--prompts_per_step", "8", "--eval_data", "",
       "--mini_batch_size", "32", "--micro_batch_size", "16", "--run_id", "t", "--device", "cpu",  # cpu: also on a GPU host
       "--task_args", '{"train_size": 500}']  # 500 training problems: each process tokenises fewer prompts

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


def _workers_of(proc: subprocess.Popen, n: int = 2) -> list[psutil.Process] | None:
    """The learner's n generator workers (spawn children, in start order), or None before all are
    there; the other child is the resource tracker."""
    found = []
    for p in _descendants(proc):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "--multiprocessing-fork" in p.cmdline():
                found.append(p)
    return sorted(found, key=lambda p: p.create_time()) if len(found) >= n else None


def _wait_for_workers(proc: subprocess.Popen) -> list[psutil.Process]:
    found: list = []
    _wait(lambda: found.append(_workers_of(proc)) or found[-1] is not None, 120, "the workers' start", proc)
    return found[-1]


def _stops_within(proc: subprocess.Popen, seconds: float, what: str) -> str:
    """The learner's stderr once it has exited, which it must within `seconds`."""
    try:
        return proc.communicate(timeout=seconds)[1]
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the learner hangs after {what}") from None


def test_a_killed_learner_leaves_no_worker_and_no_resource_tracker(tmp_path, learner):
    proc = learner("--steps", "50")
    metrics = tmp_path / "run" / "metrics.jsonl"
    _wait(lambda: metrics.exists() and metrics.read_text(), 120, "the first step", proc)
    kids = _descendants(proc)
    assert len(kids) == 3, [k.cmdline() for k in kids]  # the two workers and the resource tracker
    proc.send_signal(signal.SIGSTOP)  # it reads nothing more: worker 0's next batch fills the pipe
    time.sleep(4)
    proc.kill()
    proc.wait(10)
    assert left(kids, 10) == []


def test_a_worker_killed_in_its_first_second_stops_the_learner(learner):
    proc = learner("--steps", "3")
    workers = _wait_for_workers(proc)
    kids = _descendants(proc)
    workers[1].kill()  # while it imports the learner's main module, before it has read its arguments
    err = _stops_within(proc, 30, "its worker died at start-up")
    assert proc.returncode == 2, err[-2000:]
    assert (f"error: generator worker 1 (pid {workers[1].pid}) was killed by SIGKILL, while the learner handed over "
            "weights version 0") in err, err[-2000:]
    assert left(kids, 10) == []


def test_a_worker_dead_in_a_generation_round_is_named_as_the_cause(tmp_path, learner):
    proc = learner("--steps", "50")
    metrics = tmp_path / "run" / "metrics.jsonl"
    _wait(lambda: metrics.exists() and metrics.read_text(), 120, "the first step", proc)
    workers, kids = _workers_of(proc), _descendants(proc)
    workers[1].kill()  # worker 0 is generating too, then waits for worker 1's shard in the round's gather
    err = _stops_within(proc, 30, "a worker died mid-round")
    assert proc.returncode == 2, err[-2000:]
    assert f"error: generator worker 1 (pid {workers[1].pid}) was killed by SIGKILL" in err, err[-2000:]
    # the survivor's failed gather is one line above the learner's (no traceback: DAPO_DEBUG=1 shows it)
    assert "Traceback" not in err, err[-3000:]
    assert len([line for line in err.splitlines() if line.startswith("[generator worker 0]")]) <= 1, err[-3000:]
    assert left(kids, 10) == []


def test_a_stopped_worker_stops_the_learner_after_the_timeout(tmp_path, learner):
    proc = learner("--steps", "50", "--generator_timeout_s", "4")
    metrics = tmp_path / "run" / "metrics.jsonl"
    _wait(lambda: metrics.exists() and metrics.read_text(), 120, "the first step", proc)
    workers, kids = _workers_of(proc), _descendants(proc)
    workers[0].send_signal(signal.SIGSTOP)  # alive and silent: no batch, no heartbeat, no error, no exit
    t0 = time.time()
    err = _stops_within(proc, 40, "its worker stopped")
    assert proc.returncode == 2, err[-2000:]
    assert (f"error: generator worker 0 (pid {workers[0].pid}) has not been heard from for 4 s (--generator_timeout_s 4): "
            "the process is stopped") in err, err[-2000:]
    assert time.time() - t0 < 30
    assert left(kids, 10) == []


def test_a_worker_dead_in_a_weight_transfer_stops_the_learner_after_a_checkpoint(tmp_path, learner):
    proc = learner("--steps", "4", env={generator.FAULT_ENV: "exit_in_transfer"})
    workers = _wait_for_workers(proc)
    kids = _descendants(proc)
    _wait(lambda: not workers[1].is_running() or workers[1].status() == psutil.STATUS_ZOMBIE, 120, "the injected fault",
          proc)
    err = _stops_within(proc, 30, "its worker died in a weight transfer")
    assert proc.returncode == 2, err[-2000:]
    assert (f"error: generator worker 1 (pid {workers[1].pid}) exited with code 86 (during the weight transfer), while "
            "the learner handed over weights version 1; the learner wrote a checkpoint after 1 rollout steps") in err, \
        err[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert left(kids, 10) == []


def test_a_probe_mismatch_raises_the_sync_check_with_the_measured_gap():
    model = policy.load_model("", torch.device("cpu"))
    probe = list(range(3, 23))
    reference = transport.probe_logprobs(model, probe, 8)  # (8,)
    control = transport.Control.create(1)
    spec = transport.make_spec("shared_memory", model.state_dict(), 8, 1)
    weights = transport.SharedMemoryWeights.create(spec, control, mp.get_context("spawn"), 5.0)
    weights.send(1, reference + 0.5, model.state_dict().items(), lambda: None)  # the learner's reference off by 0.5
    with pytest.raises(rollout.WeightSyncError, match=r"version 1: probe log-probs differ from the learner's by 0\.5 > "):
        generator._load_weights(weights, control, 0, 1, model.state_dict(), model, None, probe, 1e-5, lambda: None)
    assert control.ready(0) == control.loaded(0) == 1  # received whole; raised before the engine is touched


EXIT_LOOP = r"""
import json, multiprocessing, multiprocessing.process as mpp, os, sys
from plumbing import generator, transport

transport.HEARTBEAT_S = 0.0  # the heartbeat never pauses: the race's window is always open
sys.setswitchinterval(1e-5)  # and the GIL changes hands often, so the end meets a beat in flight
generator._generate_forever = lambda *args: None  # a worker with no batch left goes straight to its end
control, startup, codes = transport.Control.create(1), generator._to_shared_bytes({}), []
for _ in range(int(sys.argv[1])):
    sentinel_r, sentinel_w = os.pipe()  # the learner's sentinel, as spawn gives each worker
    reader, writer = multiprocessing.Pipe(duplex=False)
    pid = os.fork()
    if pid == 0:  # a worker: its real entry point, then the interpreter's normal end (spawn ends with sys.exit)
        os.close(sentinel_w)
        mpp._parent_process = mpp._ParentProcess("learner", os.getppid(), sentinel_r)
        generator._worker_main(startup, control.t, (), writer, 0)
        sys.exit(0)
    os.close(sentinel_r)
    writer.close()
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    os.close(sentinel_w)
    reader.close()
print(json.dumps(codes))
"""


def test_a_workers_normal_end_never_aborts():
    out = subprocess.run([sys.executable, "-c", EXIT_LOOP, "20"], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    codes = json.loads(out.stdout.splitlines()[-1])
    assert codes == [0] * 20, (codes, out.stderr[-2000:])
    assert "terminate called" not in out.stderr
