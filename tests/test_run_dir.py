"""A run's directory held by one run, and a stop asked for before a step, on the real entry point.

Faults provoked at their bad moment (plumbing/runlog.py):
1. A second train.py on the directory of a run that is going is refused with one line naming the
   owner (pid, host, start time), before the model loads; the owner's hold is an flock, which the
   kernel drops when the owner is killed (SIGKILL), so a dead run leaves nothing stuck.
2. A fresh run in a directory that holds a run (finished; stopped with a checkpoint; or with files
   but no checkpoint) is refused with one line saying which and what continues or replaces it
   (--resume latest, --overwrite true), and nothing there changes; --overwrite true replaces the
   earlier run's files and keeps the directory's other files.
3. SIGINT before a step starts (during the held-out evaluation before step 0, during a step's
   probe, in a resumed run) ends the run before that step: no update of it is trained, the
   checkpoint holds the weights as they were (the "before" figures kept), and a resume from it
   is the uninterrupted run, bit for bit.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_run_dir.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from evaluation import measure
import train
from plumbing import cli, policy, runlog
from plumbing.distributed import Dist
from plumbing.loading import tied_names

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--group_size", "4", "--prompts_per_step", "4", "--gen_prompts_per_round", "6", "--mini_batch_size", "8",
         "--task_args", '{"train_size": 200}', "--eval_limit", "4", "--eval_k", "1", "--probe_every", "1",
         "--probe_size", "2", "--run_id", "t"]


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:") or "Traceback" in line]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 1-step run (a checkpoint after step 1, final/, summary.json) in a folder that held another file first."""
    run = tmp_path_factory.mktemp("rundir") / "run"
    run.mkdir()
    (run / "notes.txt").write_text("a file of the user's: not a run's, so it does not stop a run\n")
    train.main(["--run_dir", str(run), *SMALL, "--steps", "1", "--save_every", "1"])
    assert (run / "final" / "dapo_run.json").is_file() and (run / "checkpoints" / "latest").is_file()
    return run


@pytest.fixture
def copy(finished, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    return run


# --- 1. one run at a time ---------------------------------------------------------------------------

HOLDER = """
import sys, time
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
from plumbing import distributed, runlog
runlog.claim_run_dir(SimpleNamespace(run_dir=sys.argv[2], resume="", overwrite=False), distributed.Dist())
print("holding", flush=True)
time.sleep(600)
"""


def test_a_second_run_on_a_held_directory_is_refused_naming_the_owner_and_a_killed_owner_frees_it(tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(REPO), str(run)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert holder.stdout.readline().strip() == "holding"
        capsys.readouterr()
        assert cli.run_cli(train.main, ["--run_dir", str(run), *SMALL, "--steps", "1"]) == 2
        lines = _errors(capsys)
        assert len(lines) == 1 and lines[0].startswith(
            f"error: --run_dir {run} is in use by another run (pid {holder.pid} on {socket.gethostname()}, started "), lines
        assert lines[0].endswith(f"{run / 'run.lock'}): wait for it to end, or pass another --run_dir"), lines
        assert sorted(p.name for p in run.iterdir()) == ["run.lock"]  # nothing of the refused run was written
    finally:
        holder.kill()  # SIGKILL: no handler runs, the kernel drops the flock
        holder.wait()
    assert f"pid {holder.pid} " in (run / "run.lock").read_text()  # the dead owner's name is still in the file ...
    cfg = SimpleNamespace(run_dir=str(run), resume="", overwrite=False)
    runlog.claim_run_dir(cfg, Dist())  # ... but nothing holds it
    assert f"pid {os.getpid()} " in (run / "run.lock").read_text()
    runlog.release_run_dir(run)


# --- 2. never over another run's files -----------------------------------------------------------------


@pytest.mark.parametrize("state", ["finished", "stopped", "no-checkpoint"])
def test_a_fresh_run_in_a_directory_holding_a_run_is_refused_saying_which(copy, capsys, state):
    if state != "finished":
        shutil.rmtree(copy / "final")
        (copy / "summary.json").unlink()
    if state == "no-checkpoint":
        shutil.rmtree(copy / "checkpoints")
    before = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file() and p.name != "run.lock"}
    capsys.readouterr()
    assert cli.run_cli(train.main, ["--run_dir", str(copy), *SMALL, "--steps", "1"]) == 2
    lines = _errors(capsys)
    assert len(lines) == 1 and lines[0].startswith(f"error: --run_dir {copy} holds "), lines
    expected = {
        "finished": ("a finished run (config.json, metrics.jsonl, rollouts.jsonl, probe_rollouts.jsonl, summary.json, "
                     "checkpoints, final), which a fresh run would write over. Pass another --run_dir, --resume latest "
                     f"with a larger --steps to train it further from {copy / 'checkpoints' / 'step_000001'}, or "
                     "--overwrite true to replace it"),
        "stopped": (f"a run that stopped after step 1 ({copy / 'checkpoints' / 'step_000001'}), which a fresh run would "
                    "write over. Pass --resume latest to continue it, --overwrite true to replace it, or another --run_dir"),
        "no-checkpoint": ("the files of a run that wrote no checkpoint (config.json, metrics.jsonl, rollouts.jsonl, "
                          "probe_rollouts.jsonl), which a fresh run would write over. Pass --overwrite true to replace "
                          "them, or another --run_dir"),
    }[state]
    assert lines[0] == f"error: --run_dir {copy} holds {expected}", lines[0]
    after = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file() and p.name != "run.lock"}
    assert after == before  # nothing of the earlier run changed


def test_overwrite_replaces_the_earlier_run_and_keeps_other_files(copy, capsys):
    capsys.readouterr()
    summary = train.main(["--run_dir", str(copy), *SMALL, "--steps", "0", "--overwrite", "true", "--run_id", "new"])
    out = capsys.readouterr().out
    assert (f"[run] --overwrite true: removed the earlier run's config.json, metrics.jsonl, rollouts.jsonl, "
            f"probe_rollouts.jsonl, summary.json, checkpoints, final from {copy}") in out
    assert summary["run_id"] == "new" and json.loads((copy / "summary.json").read_text())["steps"] == 0
    assert not (copy / "checkpoints").exists() and (copy / "metrics.jsonl").read_text() == ""  # nothing of the old run
    assert json.loads((copy / "final" / "dapo_run.json").read_text())["run_id"] == "new"
    assert (copy / "notes.txt").is_file()


# --- 3. a stop before a step ---------------------------------------------------------------------------------


def _interrupt_during(monkeypatch, name: str, when) -> None:
    """SIGINT to this process while evaluation.measure.<name> (held_out or probe: the loop's calls) runs, in the call
    `when(args)` picks."""
    real = getattr(measure, name)

    def wrapped(*args, **kwargs):
        if when(args):
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(measure, name, wrapped)


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The model tensors a checkpoint holds (torch.distributed.checkpoint), keyed as the model's state dict."""
    model, _ = policy.load_policy("", torch.device("cpu"))
    sd = {k: torch.empty_like(v) for k, v in model.state_dict().items() if k not in tied_names(model)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": sd}, checkpoint_id=str(ckpt))
    return sd


def _steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_stop_during_the_first_held_out_evaluation_trains_nothing_and_resumes_as_the_whole_run(
        tmp_path, monkeypatch, capsys, finished):
    run = tmp_path / "r"
    _interrupt_during(monkeypatch, "held_out", lambda args: args[-1] == "before")
    capsys.readouterr()
    assert train.main(["--run_dir", str(run), *SMALL, "--steps", "1", "--save_every", "1"]) == {
        "run_id": "t", "interrupted_before_step": 0}
    out, err = capsys.readouterr()
    assert "[signal 2] stopping before the next step (an evaluation in flight finishes first; no update is trained)" in err
    assert f"[signal] stopped before step 0: no update of it was trained; {run / 'checkpoints' / 'step_000000'}" in out
    assert _steps(run) == [] and not (run / "final").exists()
    ckpt = run / "checkpoints" / "step_000000"
    assert (run / "checkpoints" / "latest").read_text().strip() == ckpt.name
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["step"] == 0 and "heldout/avg@1" in state["state"]["heldout_before"]  # the evaluation is kept
    base, _ = policy.load_policy("", torch.device("cpu"))
    assert all(torch.equal(v, base.state_dict()[k]) for k, v in _weights(ckpt).items())  # no update in it
    monkeypatch.undo()
    train.main(["--run_dir", str(run), *SMALL, "--steps", "1", "--save_every", "1", "--resume", "latest"])
    assert "[held-out before]" not in capsys.readouterr().out and _steps(run) == [0]
    mine, whole = load_file(run / "final" / "model.safetensors"), load_file(finished / "final" / "model.safetensors")
    assert mine.keys() == whole.keys() and all(torch.equal(mine[k], whole[k]) for k in mine)  # the uninterrupted run's


def test_a_stop_during_the_probe_ends_the_run_before_its_step(tmp_path, monkeypatch, capsys):
    run = tmp_path / "p"
    _interrupt_during(monkeypatch, "probe", lambda args: args[6] == 0)  # probe(engine, tok, data, cfg, task, dist, step, seed)
    assert train.main(["--run_dir", str(run), *SMALL, "--steps", "3"]) == {"run_id": "t", "interrupted_before_step": 0}
    assert _steps(run) == [] and (run / "checkpoints" / "latest").read_text().strip() == "step_000000"
    assert (run / "probe_rollouts.jsonl").read_text() == ""  # the step was not logged: a resume probes it again


def test_a_resumed_run_stopped_before_its_first_step_keeps_its_checkpoint(copy, monkeypatch):
    ckpt = copy / "checkpoints" / "step_000001"
    written = (ckpt / "trainer_state.json").stat().st_mtime_ns
    _interrupt_during(monkeypatch, "probe", lambda args: args[6] == 1)
    assert train.main(["--run_dir", str(copy), *SMALL, "--steps", "2", "--save_every", "1", "--resume", "latest"]) == {
        "run_id": "t", "interrupted_before_step": 1}
    assert _steps(copy) == [0] and (copy / "checkpoints" / "latest").read_text().strip() == ckpt.name
    assert (ckpt / "trainer_state.json").stat().st_mtime_ns == written  # the checkpoint resumed from, not written again
