"""torchrun with 2 processes (gloo, FSDP2) takes the same steps as 1 process.

The condition: both runs pass the same --gen_shards (here 2). The prompts of a generation round
are cut into gen_shards shards, each sampled with its own seed; the default (0) is one shard per
process, so `python train.py` and `torchrun --nproc_per_node=2 train.py` would draw different
rollouts. `python train.py --gen_shards 2` reproduces the 2-process run on one process.

Responses have uneven lengths, so a per-rank or per-micro-batch loss denominator would show up
as a difference in the weights (docs/PITFALLS.md, failure 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
# lr 1e-5: Adam divides by sqrt(v), so on parameters whose gradient is ~0 a float-order difference
# in the summed gradient can move the update by up to ~lr; a small lr keeps that below the 1e-5 bar
# while the steps still move the weights (checked below).
ARGS = ["--lr", "1e-5", "--steps", "2", "--eval_data=", "--group_size", "4", "--prompts_per_step", "4", "--gen_prompts_per_round", "6",
        "--mini_batch_size", "8", "--micro_batch_size", "3", "--gen_shards", "2", "--seed", "3"]


def _run(cmd, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.skipif(sys.platform != "linux", reason="gloo torchrun test runs on Linux")
def test_two_ranks_equal_one_rank(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, "train.py", "--run_dir", str(one), *ARGS], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29631", "train.py",
          "--run_dir", str(two), *ARGS], tmp_path)
    m1 = [json.loads(l) for l in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(l) for l in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(m1) == len(m2) == 2
    for a, b in zip(m1, m2):
        assert a["train/reward_mean"] == b["train/reward_mean"]  # identical rollouts
        assert a["groups/kept"] == b["groups/kept"] and a["policy/optimizer_steps"] == b["policy/optimizer_steps"]
        assert abs(a["policy/loss"] - b["policy/loss"]) <= 1e-5
    lengths = {json.loads(l)["response_tokens"] for l in (one / "rollouts.jsonl").read_text().splitlines()}
    assert len(lengths) > 1, "the test needs uneven response lengths"
    w1, w2 = load_file(one / "final/model.safetensors"), load_file(two / "final/model.safetensors")
    base = load_file(REPO / "assets/tiny-base/model.safetensors")
    shared = set(w1) & set(w2)
    assert "model.embed_tokens.weight" in shared
    assert max((w1[k] - base[k]).abs().max().item() for k in shared) > 1e-5  # the steps moved the weights
    assert max((w1[k] - w2[k]).abs().max().item() for k in shared) <= 1e-5
