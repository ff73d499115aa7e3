"""Processes and collectives under torchrun: this process's rank, the few collectives the loop needs, generation engine groups, seeding, splitting evaluation problems across ranks.

Plumbing a learner may skip. With one process (no torchrun) every collective here is a no-op,
so a single-GPU fork can delete this file's callers' distributed branches without changing
results. Imports nothing of this repository: every other module may import it.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as tdist


# --- processes ------------------------------------------------------------------------------


@dataclass
class Dist:
    """This process's place under torchrun (rank 0 of 1 without it)."""

    rank: int = 0
    world: int = 1
    one_rank_mesh: bool = False  # one process that still shards with FSDP2, over a mesh of 1 rank (train.py on CUDA)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """Whether FSDP2 shards the model: more than one process, or one over a 1-rank mesh."""
        return self.world > 1 or self.one_rank_mesh


ONE_RANK_MESH_ENV = "DAPO_ONE_RANK_MESH"  # "1": take the 1-rank FSDP2 path on the CPU too (tests, gpu_check.sh --cpu)


def init_distributed(device: str = "auto", *, one_rank_mesh: bool = False) -> tuple[Dist, torch.device]:
    """One process, or torchrun's N processes (nccl + gloo on GPU, gloo on CPU). device: auto | cpu | cuda.

    one_rank_mesh (train.py): one process on CUDA becomes a torchrun job of 1 (single_process_env)
    whose model FSDP2 shards over a 1-rank mesh, so that one GPU runs the N-GPU path: bf16 mixed
    precision (FSDP2's MixedPrecisionPolicy), --cpu_offload, the sharded loader, NCCL. Without it one
    process would train in fp32 with --bf16 and --cpu_offload silently ignored. The CPU keeps its
    plain single process (the default CPU run is unchanged) unless $DAPO_ONE_RANK_MESH is "1".
    """
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    mesh = one_rank_mesh and (use_cuda or os.environ.get(ONE_RANK_MESH_ENV) == "1")
    if "RANK" not in os.environ:
        if not mesh:
            return Dist(), torch.device("cuda" if use_cuda else "cpu")
        os.environ.update(single_process_env())
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local)
    if not tdist.is_initialized():
        # On GPU: NCCL for CUDA tensors, gloo for the CPU-tensor collectives of the loop
        # (all_reduce_sum, rollout.sync_engine's gap) that NCCL alone would reject.
        tdist.init_process_group("cpu:gloo,cuda:nccl" if use_cuda else "gloo")
    return Dist(rank, world, mesh and world == 1), torch.device(f"cuda:{local}" if use_cuda else "cpu")


def single_process_env() -> dict[str, str]:
    """The variables torchrun gives a job of one process (rank 0 of 1, on this host, a free port): what
    init_process_group reads, and what vLLM's external launcher reads (vllm_engine.launch_kwargs)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def close_distributed(dist: Dist) -> None:
    """Tear down the process group at the end of a torchrun run, after a last barrier (nothing with one process).

    Raises RuntimeError: under torchrun the group is already gone (something else destroyed the
    trainer's group, e.g. a generation engine's shutdown: vllm_engine.VLLMEngine.close must not).
    """
    if not dist.sharded:
        return
    if not torch.distributed.is_initialized():
        raise RuntimeError("the trainer's process group was destroyed before the end of the run (by the engine's shutdown?)")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def all_gather_objects(obj, dist: Dist) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if dist.world == 1:
        return [obj]
    out = [None] * dist.world
    torch.distributed.all_gather_object(out, obj)
    return out


def broadcast_object(obj, dist: Dist):
    """Rank 0's `obj` on every rank (pickled through the default process group)."""
    if dist.world == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def first_failure(failure: str | None, dist: Dist) -> str | None:
    """The first rank's failure (a text, or None), on every rank (a collective): the ranks stop together or none does."""
    return next((f for f in all_gather_objects(failure, dist) if f is not None), None)


def all_reduce_sum(x: float, dist: Dist) -> float:
    """Sum of a number over all ranks, in float64 (a collective)."""
    return _all_reduce(x, dist, torch.distributed.ReduceOp.SUM)


def all_reduce_max(x: float, dist: Dist) -> float:
    """Max of a number over all ranks, in float64 (a collective)."""
    return _all_reduce(x, dist, torch.distributed.ReduceOp.MAX)


def _all_reduce(x: float, dist: Dist, op) -> float:
    if dist.world == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64)  # (1,)
    torch.distributed.all_reduce(t, op=op)
    return float(t.item())


def gather_engine_shards(local: list[tuple], dist: Dist, tp: int = 1) -> list[tuple]:
    """Every rank's generated shards on every rank, one copy of each, sorted by shard index.

    local: this rank's (shard index, seed, wall seconds, prompt indices, samples) tuples, samples
    a list (per prompt) of lists of rollout.Sample. With tp > 1 the tp consecutive ranks of an
    engine group generated the same shards: only the group's first rank sends its samples, the
    others a digest of their tokens, which must match (same prompts, seed and weights give the
    same tokens; docs/PITFALLS.md, failure 13). A collective.

    Raises GroupMismatchError: the ranks of one group drew different tokens for a shard.
    """
    leader = dist.rank % tp == 0
    def digest(samples) -> str:
        return hashlib.sha256(repr([[s.token_ids for s in g] for g in samples]).encode()).hexdigest()[:16]

    mine = [(*x[:4], x[4] if leader else None, digest(x[4]) if tp > 1 else None) for x in local]
    parts = all_gather_objects(mine, dist)
    if tp > 1:
        for c in {x[0] for part in parts for x in part}:
            drew = {r: x[5] for r, part in enumerate(parts) for x in part if x[0] == c}
            if len(set(drew.values())) > 1:
                raise GroupMismatchError(f"ranks {sorted(drew)} (engine group {min(drew) // tp}) drew different tokens "
                                         f"for shard {c}")
    return sorted((x[:5] for part in parts for x in part if x[4] is not None), key=lambda x: x[0])


def barrier(dist: Dist) -> None:
    """Wait until every rank reaches this line (nothing to wait for in one process)."""
    if dist.world > 1:
        torch.distributed.barrier()


class GroupMismatchError(RuntimeError):
    """Ranks that must act as one (the ranks of one tensor-parallel engine) were given different inputs."""


def engine_groups(world: int, tp: int) -> list[list[int]]:
    """The ranks of each generation engine: `tp` consecutive ranks per engine, [[0..tp-1], [tp..2tp-1], ...].

    The layout vLLM's external launcher gives its tensor-parallel groups
    (vllm/distributed/parallel_state.py, initialize_model_parallel), and TRL's colocate mode's
    (trl/generation/vllm_generation.py). Raises ValueError unless tp >= 1 divides world.
    """
    if tp < 1 or world % tp:
        raise ValueError(f"--vllm_tp {tp} must be >= 1 and divide the number of processes ({world})")
    return [list(range(g * tp, (g + 1) * tp)) for g in range(world // tp)]


def new_engine_group(tp: int):
    """This rank's group of `engine_groups` as a gloo process group (a collective: every rank calls it)."""
    mine, _ = tdist.new_subgroups_by_enumeration(engine_groups(tdist.get_world_size(), tp), backend="gloo")
    return mine


def assert_same_in_group(key, group, what: str) -> None:
    """Raise GroupMismatchError on every rank of `group` unless all of them pass an equal `key`.

    key: any picklable value (e.g. (seed, hash of the prompts)). A collective over `group`.
    """
    keys = [None] * tdist.get_world_size(group)
    tdist.all_gather_object(keys, key, group=group)
    if any(k != keys[0] for k in keys):
        ranks = tdist.get_process_group_ranks(group)
        raise GroupMismatchError(f"{what}: " + ", ".join(f"rank {r}: {k}" for r, k in zip(ranks, keys)))


def clock() -> float:
    """time.perf_counter() once the GPU's queued work is done: CUDA kernels run asynchronously, so a
    phase's clock read without torch.cuda.synchronize stops before its last kernels ran and the next
    phase is charged for them. The same as time.perf_counter() without CUDA."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def seed_everything(seed: int, threads: int = 0, *, offload: bool = False) -> None:
    """Seed python, numpy and torch; set torch's CPU threads (0 = $OMP_NUM_THREADS or 1; with offload,
    --cpu_offload's AdamW on the host, 0 = this host's cores shared among its ranks: torchrun sets
    OMP_NUM_THREADS=1, which would run the optimizer step of a 32B shard on one core per rank)."""
    if not threads and offload:
        threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- generator workers' devices (plumbing/generator.py) ----------------------------------------

WORKER_GPU_ENV = "DAPO_WORKER_GPU"  # set in a worker's environment on GPU: the one device it sees (worker_env)


def worker_device(cfg, c: int, learners_here: int) -> torch.device:
    """Worker c's device: the CPU, or on GPU the one after the node's learner ranks (LOCAL_WORLD_SIZE + c).

    Raises ValueError: the node has fewer GPUs than its learner ranks and workers need (NCCL does not
    let two members of one group share a GPU)."""
    if cfg.device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    index = learners_here + c
    if index >= torch.cuda.device_count():
        raise ValueError(f"--generator_workers {cfg.generator_workers} beside {learners_here} learner rank(s) needs "
                         f"{learners_here + cfg.generator_workers} GPUs on this node, found {torch.cuda.device_count()}: "
                         "lower --generator_workers or --nproc_per_node (docs/async.md \"A pool of generator workers\")")
    return torch.device(f"cuda:{index}")


def worker_env(device: torch.device, c: int, workers: int, visible: str | None) -> dict[str, str]:
    """The environment worker c starts with (spawn copies the parent's at Process.start).

    On GPU the worker sees only its own device (CUDA_VISIBLE_DEVICES: the learner's `device` index
    among the GPUs the learner sees, `visible` being the learner's CUDA_VISIBLE_DEVICES or None), as
    device 0, rank c of the pool: what vLLM's executors read (LOCAL_RANK for the external launcher;
    the single-process executor takes device 0), so no engine, context or NCCL communicator of a
    worker lands on the learner's GPU 0. On the CPU nothing changes ({}).
    """
    if device.type != "cuda":
        return {}
    gpu = visible.split(",")[device.index] if visible else str(device.index)
    return {"CUDA_VISIBLE_DEVICES": gpu, WORKER_GPU_ENV: gpu, "RANK": str(c), "LOCAL_RANK": "0", "WORLD_SIZE": str(workers),
            "LOCAL_WORLD_SIZE": str(workers)}


# --- splitting evaluation problems across ranks ---------------------------------------------------


def shard(n: int, rank: int, world: int) -> tuple[list[int], int]:
    """Problem indices rank `rank` generates: (indices, how many are real).

    Rank r takes problems r::world, padded with copies of problem 0 up to ceil(n / world), so
    every rank makes the same number of generate calls (transformers' synced_gpus under FSDP hangs
    otherwise). Results of the padding are dropped before the gather.
    """
    if not (0 <= rank < world and n >= 1):
        raise ValueError(f"shard needs 0 <= rank < world and n >= 1, got rank={rank}, world={world}, n={n}")
    real = list(range(rank, n, world))
    return real + [0] * (-(-n // world) - len(real)), len(real)


def unshard(parts: list[list], world: int) -> list:
    """Inverse of `shard`: parts[r] holds rank r's real results in order; returns them in problem order."""
    out = [None] * sum(map(len, parts))
    for r, part in enumerate(parts):
        for j, x in enumerate(part):
            out[r + j * world] = x
    return out


def rank_seed(seed: int, rank: int, world: int) -> int:
    """Sampler seed of one rank's request: `seed` itself on one process, else a hash of (seed, rank)."""
    if world == 1:
        return seed
    return int.from_bytes(hashlib.sha256(f"eval-{seed}-{rank}".encode()).digest()[:4], "little")
