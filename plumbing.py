"""Plumbing a learner may skip on first reading: processes and collectives, model loading and FSDP2.

Nothing here is DAPO. train.py and eval.py call these so that their own code reads as the
algorithm; a single-GPU fork can delete the FSDP and collective parts (with one process every
collective below is a no-op). Sections, in order:

  processes         torchrun ranks, the few collectives the loop needs, generation engine groups; seeding
  evaluation split  problems across ranks; the repository commit
  model             policy and tokenizer loading, dropout off, FSDP2 wrapping, saving in HF format,
                    the optimizer and the generation engine of a config

The other plumbing: forward.py (the trainer's forward passes, micro-batches, the optimizer step),
cli.py (flags, config checks, one-line errors), runlog.py (the run directory:
logs, checkpoints, the run's bookkeeping), generator.py (generation beside the learner),
vllm_engine.py (the vLLM engine).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import loading

REPO = Path(__file__).resolve().parent
DEFAULT_MODEL = REPO / "assets" / "tiny-base"  # the tiny base policy (tiny.py)


# --- plumbing: processes ------------------------------------------------------------------------------


@dataclass
class Dist:
    """This process's place under torchrun (rank 0 of 1 without it)."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto") -> tuple[Dist, torch.device]:
    """One process, or torchrun's N processes (nccl + gloo on GPU, gloo on CPU). device: auto | cpu | cuda."""
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if "RANK" not in os.environ:
        return Dist(), torch.device("cuda" if use_cuda else "cpu")
    import torch.distributed as tdist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local)
    if not tdist.is_initialized():
        # On GPU: NCCL for CUDA tensors, gloo for the CPU-tensor collectives of the loop
        # (all_reduce_sum, rollout.sync_engine's gap) that NCCL alone would reject.
        tdist.init_process_group("cpu:gloo,cuda:nccl" if use_cuda else "gloo")
    return Dist(rank, world), torch.device(f"cuda:{local}" if use_cuda else "cpu")


def close_distributed(dist: Dist) -> None:
    """Tear down the process group at the end of a torchrun run, after a last barrier (nothing with one process).

    Raises RuntimeError: under torchrun the group is already gone (something else destroyed the
    trainer's group, e.g. a generation engine's shutdown: vllm_engine.VLLMEngine.close must not).
    """
    if dist.world == 1:
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


def all_reduce_sum(x: float, dist: Dist, op: str = "sum") -> float:
    """Sum (or max) of a number over all ranks, in float64."""
    if dist.world == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX)
    return float(t.item())


def all_reduce_max(x: float, dist: Dist) -> float:
    return all_reduce_sum(x, dist, op="max")


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
    import torch.distributed as tdist

    mine, _ = tdist.new_subgroups_by_enumeration(engine_groups(tdist.get_world_size(), tp), backend="gloo")
    return mine


def assert_same_in_group(key, group, what: str) -> None:
    """Raise GroupMismatchError on every rank of `group` unless all of them pass an equal `key`.

    key: any picklable value (e.g. (seed, hash of the prompts)). A collective over `group`.
    """
    import torch.distributed as tdist

    keys = [None] * tdist.get_world_size(group)
    tdist.all_gather_object(keys, key, group=group)
    if any(k != keys[0] for k in keys):
        ranks = tdist.get_process_group_ranks(group)
        raise GroupMismatchError(f"{what}: " + ", ".join(f"rank {r}: {k}" for r, k in zip(ranks, keys)))


def seed_everything(seed: int, threads: int = 0) -> None:
    """Seed python, numpy and torch; set torch's CPU threads (0 = $OMP_NUM_THREADS or 1)."""
    torch.set_num_threads(threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- plumbing: splitting evaluation problems across ranks ---------------------------------------------------


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


def repo_commit() -> str:
    """`git rev-parse HEAD` of this repository (+"-dirty" with uncommitted changes), else "unknown"."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):  # no git binary, or a hung filesystem
        return "unknown"
    if head.returncode != 0:  # not a repository, or no commit yet
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


# --- plumbing: model ------------------------------------------------------------------------------------


def load_policy(path: str, device: torch.device, *, trust_remote_code: bool = False, world: int = 1, fsdp=None):
    """(model, tokenizer) from an HF directory ('' = the tiny base policy): load_tokenizer + load_model.

    Raises FileNotFoundError / ValueError as load_tokenizer and load_model.
    """
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    return load_model(path, device, trust_remote_code=trust_remote_code, world=world, fsdp=fsdp), tokenizer


@dataclass(frozen=True)
class FSDPSettings:
    """What wrap_fsdp reads (train.Config has the same fields): here fp32, no checkpointing, no offload."""

    activation_checkpointing: bool = False
    bf16: bool = False
    cpu_offload: bool = False


def load_model(path: str, device: torch.device, *, trust_remote_code: bool = False, world: int = 1, fsdp=None):
    """The causal LM of an HF directory ('' = the tiny base policy) in float32, dropout off (disable_dropout),
    wrapped by wrap_fsdp; safetensors only, no remote code unless asked.

    One process (world 1): transformers' from_pretrained onto `device`, as it always was
    (loading.load_whole). Under torchrun (world > 1, a collective): FSDP2 shards from the start,
    each rank reading only its slices of the files (loading.load_sharded: no rank ever holds the
    whole model). Both check that the checkpoint's tensors are exactly the model's.

    fsdp: the FSDP2 settings wrap_fsdp reads (a train.Config); None = FSDPSettings().

    Raises:
        FileNotFoundError: no config.json, or no safetensors weights (loading.model_config).
        ValueError: an architecture transformers does not know; a missing, unexpected or
            misshapen tensor; tied embeddings stored with different values.
    """
    path = path or str(DEFAULT_MODEL)
    fsdp, dist = fsdp or FSDPSettings(), Dist(torch.distributed.get_rank() if world > 1 else 0, world)
    if world > 1:
        model = loading.load_sharded(path, device, lambda m: wrap_fsdp(m, fsdp, device, dist),
                                     trust_remote_code=trust_remote_code, offload=fsdp.cpu_offload)
    else:
        model = wrap_fsdp(loading.load_whole(path, device, trust_remote_code=trust_remote_code), fsdp, device, dist)
    disable_dropout(model)
    return model


def disable_dropout(model) -> int:
    """Set every dropout rate in `model` to 0; returns how many were non-zero.

    The ratio pi_theta / pi_old must be exactly 1 before the first optimizer step (the old
    log-probs of the first mini-batch are its own forward pass's, train.update_policy), and
    dropout in the trainer's forward would make it random noise instead. RL fine-tuning of LLMs
    runs without dropout; HF models keep attention dropout as a float attribute, not a module.
    """
    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) and m.p > 0:
            m.p, n = 0.0, n + 1
        for name in ("attention_dropout", "dropout", "attn_dropout"):
            if isinstance(getattr(m, name, None), float) and getattr(m, name) > 0:
                setattr(m, name, 0.0)
                n += 1
    for name in ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop"):
        if isinstance(getattr(model.config, name, None), float):
            setattr(model.config, name, 0.0)
    return n


def load_tokenizer(path: str, *, trust_remote_code: bool = False):
    """The tokenizer of an HF model directory, checked to round-trip text; pad set, left padding.

    Raises FileNotFoundError (not a directory) or ValueError (the tokenizer corrupts a probe text).
    """
    from transformers import AutoTokenizer

    path = path or str(DEFAULT_MODEL)
    if not Path(path).is_dir():
        raise FileNotFoundError(f"--model {path!r} is not a directory with an HF model (config.json + safetensors)")
    tok_cfg = Path(path) / "tokenizer_config.json"
    tok_class = json.loads(tok_cfg.read_text()).get("tokenizer_class") if tok_cfg.exists() else None
    if tok_class == "PreTrainedTokenizerFast":
        # AutoTokenizer would rebuild a plain tokenizers-library tokenizer as the model family's own
        # (qwen2: byte-level BPE) and silently mangle text (tiny.build_tokenizer); load it as it was saved.
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        tokenizer.dapo_plain_fast = True  # save_hf writes the class back (transformers 5 would not)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    probe = "What is 12+34?\nAnswer: 46"
    if tokenizer.decode(tokenizer(probe, add_special_tokens=False)["input_ids"]) != probe:
        raise ValueError(f"tokenizer of {path} does not round-trip {probe!r}; it would corrupt prompts and answers")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # set after construction, it is not saved by save_pretrained
    return tokenizer


def engine_max_len(model_dir: str, wanted: int) -> int:
    """`wanted` tokens (prompt + response), capped at the model's position limit (config.json)."""
    cfg_path = Path(model_dir or DEFAULT_MODEL) / "config.json"
    limit = json.loads(cfg_path.read_text()).get("max_position_embeddings") if cfg_path.exists() else None
    return min(wanted, int(limit)) if limit else wanted


def set_activation_checkpointing(model, on: bool) -> None:
    """Turn HF activation checkpointing on or off (non-reentrant); transformers 5.24 renamed the
    methods from gradient_checkpointing_* to activation_checkpointing_*."""
    if hasattr(model, "activation_checkpointing_enable"):
        if on:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def wrap_fsdp(model, cfg, device: torch.device, dist: Dist):
    """FSDP2 (`fully_shard`) on every decoder layer and at the root, under torchrun; activation checkpointing if asked.

    Works on a built model or on the meta device (loading.load_sharded calls it before any
    weight exists). The root group holds the embeddings and the output head, so tied embeddings
    are one parameter of one group (torch 2.13 refuses a parameter shared between two groups;
    pytorch/pytorch issue 176076). Mixed precision on GPU: bf16 compute and communication of parameters,
    fp32 gradient reduction and fp32 master weights (the optimizer sees fp32 shards). CPU stays
    fp32 (gloo). Reads cfg.activation_checkpointing, cfg.bf16, cfg.cpu_offload.

    Raises ValueError: the model does not name its decoder layers (_no_split_modules).
    """
    if cfg.activation_checkpointing:
        set_activation_checkpointing(model, True)
    if dist.world == 1:
        return model
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kw = {}
    if device.type == "cuda" and cfg.bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cfg.cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    layer_names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_names]
    if not layers:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard (no _no_split_modules)")
    for layer in layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def save_hf(model, tokenizer, out: Path, dist: Dist, extra: dict) -> None:
    """Full weights in HF format on rank 0, the tokenizer, and `extra` as dapo_run.json (what eval.py
    reads back: config, verifier version). Under torchrun only rank 0 ever holds the whole
    model: the shards are gathered to it one tensor at a time (loading.gather_on_rank0)."""
    state = loading.gather_on_rank0(model, dist.rank, dist.world) if dist.world > 1 else None
    if dist.main:
        model.save_pretrained(out, state_dict=state, safe_serialization=True)
        if getattr(tokenizer, "dapo_plain_fast", False):
            import tiny

            tiny.save_plain_tokenizer(tokenizer, out)  # keeps the class load_tokenizer needs
        else:
            tokenizer.save_pretrained(out)
        (out / "dapo_run.json").write_text(json.dumps(extra, indent=2) + "\n")


def make_optimizer(model, cfg):
    """AdamW (cfg.lr, cfg.weight_decay) and a linear warm-up over cfg.warmup_steps rollout steps, then a
    constant learning rate (paper 4.1); the scheduler steps once per rollout step, as in the official code."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    warm = cfg.warmup_steps
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)


def step_schedule(scheduler) -> None:
    """One scheduler step per rollout step, also after a step whose updates were all skipped (the
    warning PyTorch gives when no optimizer.step came first is expected then, and silenced)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
        scheduler.step()


def make_engine(cfg, model, tokenizer, device, world: int, longest_prompt: int, *, announce: bool, probe=None):
    """The generation engine of a train.Config (rollout.make_engine), holding the longest prompt plus
    the response budget (capped at the model's position limit); vLLM runs in bf16 on GPU with
    --bf16, else in float32, tensor-parallel over --vllm_tp ranks. An engine with weights of its own
    (vLLM) still holds the checkpoint's: sync it (rollout.sync_engine) before generating; `probe`
    (prompt ids, reference answer ids) is what sync_engine then scores on both sides to check it."""
    import rollout

    max_len = engine_max_len(cfg.model, longest_prompt + cfg.max_response_len)
    engine = rollout.make_engine(cfg.engine, model=model, tokenizer=tokenizer, model_dir=cfg.model or str(DEFAULT_MODEL),
                                 device=device, seed=cfg.seed, world=world, sampler_logprobs=cfg.sampler_logprobs,
                                 max_model_len=max_len, max_batch=cfg.engine_max_batch,
                                 gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, temperature=cfg.temperature,
                                 top_p=cfg.top_p, announce=announce, tp=cfg.vllm_tp,
                                 dtype="bfloat16" if device.type == "cuda" and cfg.bf16 else "float32")
    if not engine.shares_module and probe is not None:
        engine.sync_probe = rollout.sync_probe(probe[0], probe[1], max_len)
        engine.sync_atol = cfg.vllm_sync_atol or engine.sync_atol
    return engine
