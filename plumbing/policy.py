"""Plumbing a learner may skip on first reading: processes and collectives, model loading and FSDP2.

Nothing here is DAPO. train.py and eval.py call these so that their own code reads as the
algorithm; a single-GPU fork can delete the FSDP and collective parts (with one process every
collective below is a no-op). Sections, in order:

  the repository    the commit a run or report records
  model             policy and tokenizer loading, dropout off, FSDP2 wrapping, saving in HF format,
                    the optimizer and the generation engine (of a name, and of a config)

The other plumbing: plumbing/distributed.py (torchrun ranks, collectives, engine groups, seeding), plumbing/loading.py
(a model sharded from the start under torchrun), plumbing/forward.py (the trainer's forward passes, micro-batches, the optimizer step),
plumbing/cli.py (flags, config checks, one-line errors), plumbing/runlog.py (the run directory:
logs, checkpoints, the run's bookkeeping), plumbing/generator.py (generation beside the learner),
plumbing/vllm_engine.py (the vLLM engine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import rollout
from plumbing import forward, loading, vllm_engine
from plumbing.distributed import Dist

REPO = Path(__file__).resolve().parents[1]  # this file lives in plumbing/
DEFAULT_MODEL = REPO / "assets" / "tiny-base"  # the tiny base policy (tasks/tiny.py)


# --- plumbing: the repository ----------------------------------------------------------------------


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


def load_model(path: str, device: torch.device, *, trust_remote_code: bool = False, world: int = 1, fsdp=None,
               shard: bool | None = None):
    """The causal LM of an HF directory ('' = the tiny base policy) in float32, dropout off (disable_dropout),
    wrapped by wrap_fsdp; safetensors only, no remote code unless asked.

    One process (world 1): transformers' from_pretrained onto `device`, as it always was
    (loading.load_whole). Under torchrun (world > 1, a collective): FSDP2 shards from the start,
    each rank reading only its slices of the files (loading.load_sharded: no rank ever holds the
    whole model). Both check that the checkpoint's tensors are exactly the model's.

    fsdp: the FSDP2 settings wrap_fsdp reads (a train.Config); None = FSDPSettings().
    shard: FSDP2 shards the model (the sharded loader); None = world > 1. train.py passes
        Dist.sharded, so one process on CUDA shards over a 1-rank mesh (distributed.init_distributed).

    Raises:
        FileNotFoundError: no config.json, or no safetensors weights (loading.model_config).
        ValueError: an architecture transformers does not know; a missing, unexpected or
            misshapen tensor; tied embeddings stored with different values.
    """
    path = path or str(DEFAULT_MODEL)
    shard = world > 1 if shard is None else shard
    fsdp, dist = fsdp or FSDPSettings(), Dist(torch.distributed.get_rank() if shard else 0, world, shard and world == 1)
    if shard:
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
    path = path or str(DEFAULT_MODEL)
    if not Path(path).is_dir():
        raise FileNotFoundError(f"--model {path!r} is not a directory with an HF model (config.json + safetensors)")
    tok_cfg = Path(path) / "tokenizer_config.json"
    tok_class = json.loads(tok_cfg.read_text()).get("tokenizer_class") if tok_cfg.exists() else None
    if tok_class == "PreTrainedTokenizerFast":
        # AutoTokenizer would rebuild a plain tokenizers-library tokenizer as the model family's own
        # (qwen2: byte-level BPE) and silently mangle text (tiny.build_tokenizer); load it as it was saved.
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        tokenizer.dapo_plain_fast = True  # save_hf writes the class back (transformers 5 would not)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    probe = "What is 12+34?\nAnswer: 46"
    if tokenizer.decode(tokenizer(probe, add_special_tokens=False)["input_ids"]) != probe:
        raise ValueError(f"tokenizer of {path} does not round-trip {probe!r}; it would corrupt prompts and answers")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_vocabulary(tokenizer, path)
    tokenizer.padding_side = "left"  # set after construction, it is not saved by save_pretrained
    return tokenizer


def check_vocabulary(tokenizer, path: str) -> None:
    """Every special token (pad, EOS, ...) has an id inside the model's vocabulary (config.json's vocab_size).

    A token added to a tokenizer (a pad token, most often) without resizing the model's embeddings
    gets an id past them, and the first batch holding it fails inside the embedding lookup
    (IndexError on CPU, a device-side assert on GPU). Checked before the model loads.

    Raises ValueError naming the token and the fix.
    """
    config = Path(path) / "config.json"
    c = json.loads(config.read_text()) if config.is_file() else {}
    vocab = c.get("vocab_size") or (c.get("text_config") or {}).get("vocab_size")  # a multimodal config: its text model's
    if not vocab:
        return
    named = [("pad", tokenizer.pad_token, tokenizer.pad_token_id), ("eos", tokenizer.eos_token, tokenizer.eos_token_id)]
    for kind, token, i in named + [("special", t, i) for t, i in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids)]:
        if i is not None and i >= vocab:
            raise ValueError(f"the tokenizer of {path} has its {kind} token {token!r} at id {i}, outside the model's vocabulary "
                             f"of {vocab} embeddings (config.json vocab_size): the first batch holding it would fail in the "
                             "embedding lookup. Resize the model to its tokenizer and save both (model.resize_token_embeddings("
                             "len(tokenizer)), then save_pretrained), or use a token of the vocabulary (for padding: "
                             "tokenizer.pad_token = tokenizer.eos_token)")


def save_plain_tokenizer(tokenizer, out_dir: Path) -> None:
    """Save a plain tokenizers-library tokenizer and mark its class as PreTrainedTokenizerFast.

    transformers 5 records "TokenizersBackend", and AutoTokenizer on a qwen2 folder would then
    rebuild it as Qwen's own and mangle text (tasks/tiny.py, build_tokenizer); load_tokenizer reads this mark
    and loads it as saved.
    """
    tokenizer.save_pretrained(out_dir)
    tc = Path(out_dir) / "tokenizer_config.json"
    tc.write_text(json.dumps({**json.loads(tc.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2) + "\n")


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
    pytorch/pytorch#176076). Mixed precision on GPU: bf16 compute and communication of parameters,
    fp32 gradient reduction and fp32 master weights (the optimizer sees fp32 shards). CPU stays
    fp32 (gloo). Reads cfg.activation_checkpointing, cfg.bf16, cfg.cpu_offload. One process shards
    only over a 1-rank mesh (dist.one_rank_mesh: train.py on CUDA), else it is returned as it is.

    Raises ValueError: the model does not name its decoder layers (_no_split_modules).
    """
    if cfg.activation_checkpointing:
        set_activation_checkpointing(model, True)
    if not dist.sharded:
        return model
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
    state = loading.gather_on_rank0(model, dist.rank, dist.world) if dist.sharded else None
    if dist.main:
        model.save_pretrained(out, state_dict=state, safe_serialization=True)
        if getattr(tokenizer, "dapo_plain_fast", False):
            save_plain_tokenizer(tokenizer, out)  # keeps the class load_tokenizer needs
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


def build_engine(name: str, *, model, tokenizer, model_dir: str | Path, device, seed: int, max_model_len: int, world: int = 1,
                sampler_logprobs: bool = True, max_batch: int = 256, gpu_memory_utilization: float | None = None,
                temperature: float = 1.0, top_p: float = 1.0, announce: bool = True, tp: int = 1,
                dtype: str = "float32", colocated: bool = True) -> rollout.Engine:
    """The generation engine for --engine (rollout.resolve_engine), the one factory of train.py and eval.py.

    "hf": HFEngine on `model` itself (under torchrun with synced_gpus, as FSDP requires).
    "vllm": vllm_engine.VLLMEngine loaded from model_dir in `dtype`, holding max_model_len tokens
    (prompt + response), tensor-parallel over `tp` consecutive ranks (every rank calls this); on
    GPU it sleeps while the trainer works (gpu_memory_utilization of the GPU when awake). It
    generates from model_dir's weights until the caller syncs it (rollout.sync_engine). Its log-probs
    are taken raw at temperature 1 and processed otherwise (VLLMEngine, "Log-probs"). colocated: the
    GPU is shared with the trainer (sleep mode); a generator worker owns its GPU and never sleeps.

    announce: print (stderr) the checkpoint's generation_config.json fields that neither engine
    applies, and whether the sampler's log-probs at (temperature, top_p) are the trainer's.

    Raises ValueError as resolve_engine, or tp > 1 with the hf engine or a world it does not divide.
    """
    name = rollout.resolve_engine(name)
    if tp != 1 and name != "vllm":
        raise ValueError(f"--vllm_tp {tp} needs --engine vllm (the hf engine generates on the FSDP-sharded trainer)")
    if name == "hf":
        engine = rollout.HFEngine(model, tokenizer, max_batch=max_batch, return_logprobs=sampler_logprobs, synced_gpus=world > 1)
    else:
        loading.check_weight_files(model_dir)  # vLLM reads the files itself: a damaged one is named here first
        kw = {"logprobs_mode": "raw_logprobs" if temperature == 1.0 else "processed_logprobs"}
        if getattr(device, "type", device) == "cuda":
            # Colocated: the engine sleeps (weights and KV cache dropped) while the trainer works.
            kw.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=colocated)
        engine = vllm_engine.VLLMEngine(model_dir, tokenizer, seed=seed, max_model_len=max_model_len, tp=tp, dtype=dtype, **kw)
    if announce:
        notice = rollout.generation_config_notice(rollout._GenerationConfigOf(str(model_dir)).generation_config, str(model_dir))
        if notice:
            print(notice, file=sys.stderr, flush=True)
        if sampler_logprobs and temperature > 0 and not engine.logprobs_available(
                rollout.SamplingParams(n=1, max_new_tokens=1, temperature=temperature, top_p=top_p)):
            print(f"[engine] {engine.name} cannot return log-probs of softmax(logits / {temperature}) with top_p "
                  f"{top_p}: the sampler/* metrics are off for this run", file=sys.stderr, flush=True)
    return engine


COLOCATED_VLLM_SHARE = 0.3  # of the GPU, for a vLLM engine beside the trainer (it sleeps while the trainer works)


def vllm_gpu_share(flag: float, colocated: bool = True, device=None, mem_get_info=None) -> float:
    """vLLM's gpu_memory_utilization: --vllm_gpu_memory_utilization when set (> 0); else COLOCATED_VLLM_SHARE beside the
    trainer, and on a generator worker's own GPU (colocated False, CUDA) what is free there now (after the worker's
    model copy: vLLM refuses a share above the free memory, vllm/v1/worker/utils.py request_memory) less 0.05,
    at most 0.9. mem_get_info: torch.cuda.mem_get_info's stand-in, (free, total) bytes of `device`."""
    if flag > 0:
        return flag
    if colocated or getattr(device, "type", device) != "cuda":
        return COLOCATED_VLLM_SHARE
    free, total = (mem_get_info or torch.cuda.mem_get_info)(device)
    return round(min(0.9, max(0.05, free / total - 0.05)), 2)


def engine_dtype(device, bf16: bool = True) -> str:
    """The generation engine's weight dtype: bf16 on GPU (with --bf16), else fp32 (vLLM's GPU default would be the
    checkpoint's dtype, fp32 for an fp32 checkpoint: twice the memory and slower kernels)."""
    return "bfloat16" if getattr(device, "type", device) == "cuda" and bf16 else "float32"


def make_engine(cfg, model, tokenizer, device, world: int, longest_prompt: int, *, announce: bool, probe=None,
                colocated: bool = True):
    """The generation engine of a train.Config (build_engine), holding the longest prompt plus
    the response budget (capped at the model's position limit); vLLM runs in bf16 on GPU with
    --bf16, else in float32, tensor-parallel over --vllm_tp ranks. An engine with weights of its own
    (vLLM) still holds the checkpoint's: sync it (rollout.sync_engine) before generating; `probe`
    (prompt ids, reference answer ids) is what sync_engine then scores on both sides to check it: the
    engine's log-probs of it now, on the checkpoint's weights, are what the first sync compares with
    (rollout.sync_failure). The trainer's output head computes in fp32 (forward.set_fp32_head) when
    the engine's does, or shares it (hf): both sides or neither."""
    max_len = engine_max_len(cfg.model, longest_prompt + cfg.max_response_len)
    engine = build_engine(cfg.engine, model=model, tokenizer=tokenizer, model_dir=cfg.model or str(DEFAULT_MODEL),
                                 device=device, seed=cfg.seed, world=world, sampler_logprobs=cfg.sampler_logprobs,
                                 max_model_len=max_len, max_batch=cfg.engine_max_batch,
                                 gpu_memory_utilization=vllm_gpu_share(cfg.vllm_gpu_memory_utilization, colocated, device),
                                 temperature=cfg.temperature,
                                 top_p=cfg.top_p, announce=announce, tp=cfg.vllm_tp,
                                 dtype=engine_dtype(device, cfg.bf16), colocated=colocated)
    forward.set_fp32_head(model, engine.shares_module or getattr(engine, "fp32_head", False))
    if not engine.shares_module and probe is not None:
        engine.sync_probe = rollout.sync_probe(probe[0], probe[1], max_len)
        engine.sync_atol = cfg.vllm_sync_atol or engine.sync_atol
        engine.probe_seen = engine.probe_logprobs(*engine.sync_probe)  # (T,) both sides on the checkpoint's weights
    return engine
