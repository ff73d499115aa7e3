"""torchrun with 2 processes (gloo, FSDP2) takes the same steps as 1 process.

The condition: both runs pass the same --gen_shards (here 2). The prompts of a generation round
are cut into gen_shards shards, each sampled with its own seed; the default (0) is one shard per
process, so `python train.py` and `torchrun --nproc_per_node=2 train.py` would draw different
rollouts. `python train.py --gen_shards 2` reproduces the 2-process run on one process.

Responses have uneven lengths, so a per-rank or per-micro-batch loss denominator would show up
as a difference in the weights (docs/PITFALLS.md, failure 1). The run uses --surrogate gspo, whose
ratio is per response and whose loss is a mean over the step's responses, so the same launch
checks that neither depends on how responses are spread over ranks and micro-batches (3 per pass,
groups of 4). The default surrogate's token-mean is checked on 2 ranks by
tests/test_async.py (two learner ranks and a generator) and tests/test_faults.py (the skip decision).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_ranks_env
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
# lr 1e-5: Adam divides by sqrt(v), so on parameters whose gradient is ~0 a float-order difference
# in the summed gradient can move the update by up to ~lr; a small lr keeps that below the 1e-5 bar
# while the steps still move the weights (checked below).
ARGS = ["--task_args", '{"train_size": 500}', "--lr", "1e-5", "--steps", "2", "--eval_data=", "--group_size", "4", "--prompts_per_step", "4", "--gen_prompts_per_round", "6",
        "--mini_batch_size", "8", "--micro_batch_size", "3", "--gen_shards", "2", "--seed", "3",
        "--surrogate", "gspo", "--loss_agg", "seq-mean-token-mean"]


def _run(cmd, tmp_path):
    env = cpu_ranks_env()  # the ranks and the one process they are compared with on the CPU, also on a GPU machine
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.skipif(sys.platform != "linux", reason="gloo torchrun test runs on Linux")
def test_two_ranks_equal_one_rank(tmp_path):
    """Also: the 2-rank run's checkpoint after step 1 resumed by one process ends like both runs."""
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    _run([sys.executable, "train.py", "--run_dir", str(one), *ARGS], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "train.py",
          "--run_dir", str(two), "--save_every", "1", *ARGS], tmp_path)
    _run([sys.executable, "train.py", "--run_dir", str(resumed), "--resume", str(two / "checkpoints" / "step_000001"),
          *ARGS], tmp_path)
    m1 = [json.loads(l) for l in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(l) for l in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(m1) == len(m2) == 2
    for a, b in zip(m1, m2):
        assert a["train/reward_mean"] == b["train/reward_mean"]  # identical rollouts
        assert a["groups/kept"] == b["groups/kept"] and a["policy/optimizer_steps"] == b["policy/optimizer_steps"]
        assert abs(a["policy/loss"] - b["policy/loss"]) <= 1e-5
        assert a["policy/seq_clipfrac_low"] == b["policy/seq_clipfrac_low"]  # per-response stats, counted over ranks
        assert a["policy/seq_clipfrac_high"] == b["policy/seq_clipfrac_high"]
    lengths = {json.loads(l)["response_tokens"] for l in (one / "rollouts.jsonl").read_text().splitlines()}
    assert len(lengths) > 1, "the test needs uneven response lengths"
    w1, w2 = load_file(one / "final/model.safetensors"), load_file(two / "final/model.safetensors")
    base = load_file(REPO / "assets/tiny-base/model.safetensors")
    shared = set(w1) & set(w2)
    assert "model.embed_tokens.weight" in shared
    assert max((w1[k] - base[k]).abs().max().item() for k in shared) > 1e-5  # the steps moved the weights
    assert max((w1[k] - w2[k]).abs().max().item() for k in shared) <= 1e-5
    w3 = load_file(resumed / "final/model.safetensors")  # FSDP2 shards of 2 ranks resharded to one process
    assert set(w3) == set(w1) and max((w3[k] - w1[k]).abs().max().item() for k in w1) <= 1e-5
    m3 = [json.loads(l) for l in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in m3] == [1] and m3[0]["train/reward_mean"] == m2[1]["train/reward_mean"]


def test_resume_on_other_shards_is_refused(tmp_path):
    """A checkpoint of 2 processes with --gen_shards 0 (one shard each) resumed by one process would draw other rollouts."""
    from plumbing import checkpoints
    import train

    (tmp_path / "trainer_state.json").write_text(json.dumps({"config": {"gen_shards": 0, "vllm_tp": 1}, "world_size": 2}))
    cfg = {**dataclasses.asdict(train.Config()), "gen_shards": 0}
    with pytest.raises(ValueError, match=r"written by 2 processes .* 2 prompt shards; this run \(1 processes\) would cut 1.* --gen_shards 2"):
        checkpoints.load_checkpoint(tmp_path, None, None, None, cfg, dataclasses.asdict(train.Config()), set(), False, world=1)


# --- tensor-parallel engine groups: the request check, without vLLM ------------------------------------

GROUP_CHECK = r'''
import json, os, sys, types
import torch.distributed as dist
from plumbing import distributed
from rollout import SamplingParams
from plumbing.vllm_engine import VLLMEngine  # vLLM itself is imported only when an engine is built

dist.init_process_group("gloo")
rank = dist.get_rank()
engine = types.SimpleNamespace(group=distributed.new_engine_group(2))  # the check reads only the engine's group
out = {"ranks": dist.get_process_group_ranks(engine.group)}
cases = {  # (prompts, seed) per rank; only group [0, 1] is given different requests
    "same": ([[5, 6, 7], [8]], 11),
    "seed": ([[5, 6, 7], [8]], 11 + (rank == 1)),
    "prompts": ([[5, 6, 7], [8 + (rank == 1)]], 11),
}
for name, (prompts, seed) in cases.items():
    try:
        VLLMEngine._same_request_in_group(engine, "generate", prompts, SamplingParams(n=2, max_new_tokens=4, seed=seed))
        out[name] = "accepted"
    except distributed.GroupMismatchError as e:
        out[name] = str(e)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
dist.barrier()  # no rank tears down gloo while another still uses it
dist.destroy_process_group()
'''


@pytest.mark.skipif(sys.platform != "linux", reason="gloo torchrun test runs on Linux")
def test_engine_group_refuses_different_seeds_or_prompts(tmp_path):
    """4 gloo ranks in two engine groups ([0, 1], [2, 3]): the request check a tensor-parallel engine
    runs before every generate accepts identical requests, and raises on every rank of a group
    whose ranks were given a different seed or different prompts, leaving the other group alone."""
    script = tmp_path / "group_check.py"
    script.write_text(GROUP_CHECK)
    env = cpu_ranks_env(PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", "--standalone",
                          str(script), str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["ranks"] for r in res] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all(r["same"] == "accepted" for r in res)
    for r in res[:2]:  # both ranks of the group raise, so neither generates or waits on the other
        assert r["seed"].startswith("the ranks of one vLLM tensor-parallel engine were given different generate requests")
        assert "rank 0: (11," in r["seed"] and "rank 1: (12," in r["seed"]
        assert "rank 0: (11," in r["prompts"] and "rank 1: (11," in r["prompts"] and "accepted" not in r["prompts"]
    assert all(r["seed"] == r["prompts"] == "accepted" for r in res[2:])
