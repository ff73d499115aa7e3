"""DAPO training: the config, one DAPO step, and the loop.

    python train.py                                   # the tiny default: learns on 2 CPU cores
    python train.py --preset grpo                     # same run, every DAPO switch off (plain GRPO)
    python train.py --preset paper --model DIR --data dapo_math_17k.parquet   # the paper's settings
    torchrun --nproc_per_node=8 train.py --preset paper --model DIR --data ...  # several processes
    torchrun --nproc_per_node=8 train.py --engine vllm --vllm_tp 4 ...   # two vLLM engines of 4 GPUs each

Read it top to bottom: `Config` (every hyper-parameter), then one rollout step in the order it runs,
then `train`, whose loop names each stage:

  1. generate G responses for each prompt of a generation round (rollout.py)    collect_groups
  2. score them (task.py: verdict +1/-1) and add the soft overlong punishment   score_group
  3. keep only groups with mixed correctness (Dynamic Sampling); repeat 1-3 until the batch
     holds `prompts_per_step` groups or the round budget is spent               collect_groups
  4. group advantages; overlong filtering of the loss mask                      build_batch
  5. old log-probs, recomputed by the trainer (not taken from the sampler)      update_policy
  6. one clipped, token-level optimizer step per mini-batch                     update_policy
  7. hand the new weights to the generation engine                              rollout.sync_engine

The math of each stage is one function of dapo.py. The machinery a first reading can skip lives in
plumbing/: the forward passes (plumbing/forward.py), building the policy and its engine
(plumbing/policy.py), processes (plumbing/distributed.py), the run directory and its log files
(plumbing/runlog.py), checkpoints (plumbing/checkpoints.py). How this code departs from the paper and
the official code: docs/algorithm.md "Departures from the paper and the official code".
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

# the algorithm and the task: the reading set
import dapo
import rollout
from rollout import Sample, SamplingParams
from task import Dataset, Problem, PromptStream, Task, task_of

# the measurements the loop takes (evaluation/measure.py: held-out before and after, the probe set)
from evaluation import measure, overlap

# the machinery a first reading skips (plumbing/: processes, forward passes, run files)
from plumbing import cli, distributed, forward, generator, models, policy, runlog, update
from plumbing.cli import F
from plumbing.distributed import Dist, all_reduce_sum, clock

# --- config ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Every hyper-parameter of a run. Paper symbols in brackets; units in the help text."""

    # DAPO switches (each off = GRPO)
    eps_low: float = F(0.2, "[eps_low] lower clip range (paper 0.2)")
    eps_high: float = F(0.28, "[eps_high] upper clip range; = eps_low turns Clip-Higher off (paper 0.28)")
    dual_clip: float = F(0.0, "[c] dual-clip cap for negative advantages; 0 = off (official scripts 10)")
    dynamic_sampling: bool = F(True, "keep only groups with 0 < correct < G (Dynamic Sampling)")
    loss_agg: str = F("token-mean", f"loss aggregation, one of {dapo.LOSS_AGG_MODES}; GRPO: seq-mean-token-mean")
    overlong_filter: bool = F(False, "mask the loss of truncated responses (paper 3.4; on in Table 1 rows 2-6, off "
                                     "here: the soft punishment alone)")
    overlong_penalty: bool = F(True, "add the soft overlong punishment to the reward (paper eq. 13)")
    overlong_buffer: int = F(8, "[L_cache] soft punishment buffer in tokens (paper 4096)")
    overlong_factor: float = F(1.0, "soft punishment factor (paper 1.0)")
    scale_adv_by_std: bool = F(True, "divide advantages by the group std (False = Dr. GRPO)")
    verifier: str = F("dapo", "answer rule: dapo | dapo-official | math (verifier.py)")
    surrogate: str = F("clip", f"policy loss, one of {tuple(dapo.SURROGATES)}: clip (DAPO's, eps_low/eps_high), after "
                       "DAPO: cispo (MiniMax-M1), gspo (Qwen; needs --loss_agg seq-mean-token-mean); "
                       "docs/algorithm.md \"After DAPO\"")
    cispo_low: float = F(0.0, "[1 - eps_IS_low] --surrogate cispo: lowest importance weight, absolute, in [0, 1] "
                              "(ScaleRL 0)")
    cispo_high: float = F(5.0, "[1 + eps_IS_high] --surrogate cispo: highest importance weight, absolute, >= 1 "
                               "(ScaleRL 5)")
    gspo_eps_low: float = F(3e-4, "[eps_low] --surrogate gspo: band 1 - this for the sequence ratio s_i (paper 3e-4)")
    gspo_eps_high: float = F(4e-4, "[eps_high] --surrogate gspo: band 1 + this for the sequence ratio s_i (paper "
                                   "4e-4)")
    # run
    run_dir: str = F("runs/default", "output directory (config, metrics.jsonl, rollouts.jsonl, final/)")
    run_id: str = F("", "run id recorded with every rollout; empty = derived from time and seed")
    seed: int = F(0, "one seed for python, numpy, torch, data order and every sampling request")
    steps: int = F(100, "rollout steps (each: generate, filter, then several optimizer steps)")
    max_seconds: float = F(0.0, "wall-clock budget in seconds: after the step that crosses it the run ends as if it "
                                "were the last step (checkpoint, held-out evaluation, final/); 0 = no budget")
    max_samples: int = F(0, "budget of generated samples (responses), the same way: 0 = no budget")
    device: str = F("auto", "auto | cpu | cuda")
    threads: int = F(0, "torch CPU threads; 0 = $OMP_NUM_THREADS or 1")
    # model and data
    model: str = F("", "HF model directory; empty = the tiny base policy shipped in assets/tiny-base")
    trust_remote_code: bool = F(False, "allow model code from the model directory (off: safe loading)")
    task: str = F("", "the task, module:Class (a task.Task subclass importable from the repository root or "
                      "PYTHONPATH); '' = the task that generates --data (tiny: tasks.tiny:TinyTask), else task:Task "
                      "(DAPO math)")
    task_args: str = F("{}", 'the task\'s options, a JSON object of its fields, e.g. \'{"train_size": 2000}\' for the '
                             "tiny task")
    data: str = F("tiny", "training data: a name the task generates ('tiny'), a DAPO parquet, or JSONL with "
                          "problem/answer")
    eval_data: str = F("tiny", "held-out data evaluated before and after training ('' = none)")
    eval_limit: int = F(256, "held-out problems evaluated (0 = all)")
    allow_heldout_overlap: bool = F(False, "train although held-out problems are training ones (same text), counting "
                                           "them (heldout/trained_problems); false: refused at load")
    eval_k: int = F(4, "samples per held-out problem for avg@k / pass@k")
    eval_temperature: float = F(1.0, "held-out sampling temperature (paper 1.0)")
    eval_top_p: float = F(0.7, "held-out nucleus top_p (paper evaluation 0.7)")
    heldout_seed_offset: int = F(12345, "held-out evaluation samples with seed + this (a seed no training request "
                                        "uses)")
    instruction: str = F("dapo", "how bare problems become prompts: 'dapo' (official instruction), 'none', or a "
                                 "template holding {problem}; prompts holding it, and the tiny task, stay as they are")
    few_shot: str = F("", "worked examples before each problem: N (the task's own) or a .jsonl of {problem, response}")
    max_prompt_len: int = F(2048, "prompt token budget in tokens (paper 2048)")
    prompt_truncation: str = F("error", "a prompt over max_prompt_len: 'error' (before training starts), 'left' (cut "
                                        "from the left, as the official scripts), 'skip' (drop the row, counted)")
    skip_bad_rows: bool = F(False, "drop malformed dataset rows (counted in the log) instead of stopping")
    # sampling
    group_size: int = F(8, "[G] responses per prompt (paper 16)")
    prompts_per_step: int = F(16, "groups trained on per rollout step (paper 512 groups = 8192 responses)")
    gen_prompts_per_round: int = F(24, "prompts generated per dynamic-sampling round (paper 1536)")
    max_gen_rounds: int = F(4, "generation rounds per step before `on_exhausted` applies (paper 10)")
    on_exhausted: str = F("partial", "when rounds run out: 'error' (official), 'partial' (train on what was kept), "
                                     "'skip' (train on nothing this step)")
    max_response_len: int = F(48, "[L_max] response token budget, EOS included (paper 20480)")
    temperature: float = F(1.0, "training sampling temperature (paper 1.0)")
    top_p: float = F(1.0, "training nucleus top_p (paper 1.0)")
    # off-policy correction (docs/async.md): naive = the paper's loss
    offpolicy_objective: str = F("naive", f"one of {dapo.OFFPOLICY_OBJECTIVES}: naive (old = the learner's "
                                 "recomputed log-probs, the official loss), bypass (old = the sampler's), decoupled "
                                 "(clip around the learner's, each token weighted by min(pi_old / pi_sampler, C): "
                                 "truncated importance sampling at no lag)")
    offpolicy_cap: float = F(2.0, "[C] the decoupled objective's weight cap (Yao et al. 2025 and verl's examples: 2)")
    offpolicy_weight_mode: str = F("cap", "decoupled, a weight above C: 'cap' (truncated to C) or 'mask' (token "
                                          "dropped)")
    max_policy_lag: int = F(0, "[eta] generate in a process of its own, at most this many policy versions behind the "
                               "learner (admission control: no batch is started that would be older when used); 0 = "
                               "inline (official)")
    generator_process: bool = F(False, "generate in a process of its own also at --max_policy_lag 0 (the processes "
                                       "then reproduce the inline loop; for testing the pipeline)")
    generator_workers: int = F(1, "[K] generator processes; worker c % K samples shard c (docs/async.md, the pool)")
    generator_weights: str = F("broadcast", "weights to the workers: broadcast (torch.distributed, gloo/nccl) or "
                                            "shared_memory")
    generator_timeout_s: float = F(60.0, "a generator worker silent this long, or a weight transfer this slow, stops "
                                         "the run (s)")
    # optimisation
    lr: float = F(2e-4, "AdamW learning rate after warm-up (paper 1e-6)")
    warmup_steps: int = F(0, "linear warm-up, in rollout steps (paper 20, scripts 10)")
    weight_decay: float = F(0.0, "AdamW weight decay (scripts 0.1)")
    grad_clip: float = F(1.0, "gradient-norm clip (scripts 1.0)")
    mini_batch_size: int = F(64, "responses per optimizer step (paper 512 of 8192: 16 optimizer steps per rollout "
                                 "step; here 64 of 128: 2)")
    micro_batch_size: int = F(64, "responses per forward/backward pass (memory knob; does not change the math)")
    micro_batch_tokens: int = F(0, "if > 0, micro-batches by a token budget instead of a count, counted as real "
                                   "tokens (prompt + response) when packed, or (longest prompt + longest response) x "
                                   "responses when padded")
    logprob_chunk: int = F(1024, "response positions per chunk of the log-prob/entropy routine (memory: chunk x "
                                 "vocabulary x 4 B)")
    pack_micro_batches: bool = F(False, "one row of unpadded sequences per micro-batch instead of padded rows (no "
                                        "shared prompt pass); slower on CPU, where sdpa scores the whole row "
                                        "(bench/bench_packing.py); meant for flash-attn on GPU")
    share_prompt_forward: bool = F(True, "padded micro-batches: run each group's prompt once per forward pass and "
                                         "reuse its KV cache for the G responses (same math, about half the "
                                         "trainer's work on short answers)")
    engine: str = F("hf", "generation engine: hf (the training model itself, in plumbing/decoding.py's decoding loop), "
                          "vllm (vLLM, weights synced after every step), auto (vllm if importable, else hf)")
    engine_max_batch: int = F(256, "--engine hf: sequences decoded together (a memory knob: each sequence draws "
                                   "from a seeded stream of its own, so samples do not change beyond float rounding)")
    sampler_logprobs: bool = F(True, "keep the sampler's log-prob of each token (sampler/* metrics, bypass/decoupled)")
    vllm_gpu_memory_utilization: float = F(0.0, "vLLM on GPU: fraction of GPU memory for its weights and KV cache; 0 = "
                                                "0.3 beside the trainer, what is free less 0.05 on a worker's own GPU")
    vllm_tp: int = F(1, "--engine vllm under torchrun: tensor-parallel size of each engine; N consecutive ranks run "
                        "one engine together (N must divide the number of processes) and generation work is split "
                        "across these groups, not ranks")
    vllm_sync_atol: float = F(0.0, "--engine vllm: stop when the engine's and the trainer's log-probs of a fixed "
                                   "probe differ after a weight sync by more (mean over its tokens) than 4x their gap "
                                   "on identical weights and this floor; 0 = 1e-4 (fp32 engine) / 0.05 (bf16); < 0 = "
                                   "record only")
    # scale-out (torchrun)
    gen_shards: int = F(0, "prompt shards per generation round, each sampled with its own seed; shard c runs on "
                           "engine group c % groups (groups = processes / vllm_tp, or --generator_workers). 0 = one "
                           "per group. Equal values give equal rollouts on any number of ranks: `python train.py "
                           "--gen_shards N` reproduces `torchrun --nproc_per_node=N train.py`, also with --vllm_tp")
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
    degenerate_min_len: int = F(8, "rollout/degenerate_frac counts responses of at least this many tokens ...")
    degenerate_share: float = F(0.8, "... that are at least this share one repeated token (a sign of broken weights)")
    degenerate_warn: float = F(0.5, "print a warning when rollout/degenerate_frac exceeds this")
    tensorboard: bool = F(False, "also log metrics to RUN_DIR/tb (needs the tensorboard package); rank 0 only")
    wandb_project: str = F("", "also log metrics to this Weights & Biases project (needs wandb); rank 0 only")
    save_every: int = F(0, "write a resumable checkpoint every N steps (0 = only at the end and on SIGINT/SIGTERM)")
    keep_checkpoints: int = F(2, "most recent checkpoints kept")
    resume: str = F("", "resume from a checkpoint directory, or 'latest' (RUN_DIR/checkpoints/latest)")
    overwrite: bool = F(False, "a fresh run in a --run_dir that holds a run replaces it (else refused); never with --resume")
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
# After DAPO: row 6 with one other surrogate each (not cumulative); GSPO's row takes the aggregation it requires.
SUCCESSORS = [("ladder-6-cispo", dict(surrogate="cispo")),
              ("ladder-6-gspo", dict(surrogate="gspo", loss_agg="seq-mean-token-mean"))]


def _ladder_presets() -> dict[str, dict]:
    out, acc = {}, {}
    for name, change in LADDER:
        acc = {**acc, **change}
        out[name] = dict(acc)
    return out | {name: {**acc, **change} for name, change in SUCCESSORS}


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
    # SmolLM2-135M-Instruct on integer arithmetic (tasks/arith.py) in 30 minutes on 2 CPU cores (docs/results.md
    # "SmolLM2 on arithmetic" says what was tried). Evaluation as the paper's (T 1.0, top_p 0.7); training at top_p
    # 0.7 too: at 1.0 this model's samples are mostly noise and no group has a right answer. One round of 12
    # prompts for 12 groups: a short batch is the plan (said once at the start; groups/exhausted counts it).
    "smollm2-arith": dict(
        model="smollm2-135m-instruct", task="tasks.arith:Arithmetic", task_args='{"levels": [1, 2, 3], "style": "bare"}',
        data="arith", eval_data="arith", eval_limit=64, eval_k=4,
        group_size=8, prompts_per_step=12, gen_prompts_per_round=12, max_gen_rounds=1, on_exhausted="partial",
        max_response_len=48, overlong_buffer=8, top_p=0.7, lr=2e-5, mini_batch_size=96, micro_batch_size=32,
        sampler_logprobs=False, probe_every=0, steps=15, max_seconds=1380.0, run_dir="runs/smollm2-arith"),
    **_ladder_presets(),
}

# Fields that may differ between a run and its resumption without changing what it computes.
RESUME_FREE_FIELDS = {"steps", "max_seconds", "max_samples", "resume", "resume_allow_config_change", "run_dir", "log_every",
                      "threads", "save_every", "keep_checkpoints", "tensorboard", "wandb_project", "device", "vllm_sync_atol",
                      "generator_weights", "generator_timeout_s", "vllm_gpu_memory_utilization", "overwrite"}


def parse_config(argv: list[str] | None = None) -> Config:
    """Config from a preset plus command-line flags; every field is a flag with its help."""
    ap = cli.ArgumentParser(usage="%(prog)s [--preset NAME] [--FLAG VALUE ...]   (every flag below)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="starting values, then flags override")
    cli.add_dataclass_flags(ap, Config, defaults=False)
    args = vars(ap.parse_args(argv))
    values = dict(PRESETS[args.pop("preset")])
    values.update({k: v for k, v in args.items() if v is not None})
    cfg = Config(**values)
    cli.check_config(cfg)
    task_of(cfg)  # a --task or --task_args that cannot build the task stops here, before any work
    return dataclasses.replace(cfg, task_args=json.dumps(json.loads(cfg.task_args), sort_keys=True))  # one spelling


# --- DAPO: one rollout step -------------------------------------------------------------------------


@dataclass
class Group:
    """G rollouts of one prompt, scored."""

    problem: Problem
    prompt_ids: list[int]
    samples: list[Sample]  # G of them
    scores: list  # G verifier.Score
    reward_overlong: torch.Tensor  # (G,) soft overlong punishment
    reward: torch.Tensor  # (G,) total reward: correctness +-1 plus the overlong term
    correct: torch.Tensor  # (G,) bool
    gen_round: int
    gen_wall_s: float
    group_id: str
    kept: bool = False
    seed: int = 0  # seed of the generation request that produced the group
    policy_version: int = 0  # weight version that generated it (inline: the rollout step it was generated in)
    gen_shard: int = 0  # prompt shard of its round (the seed is derived from it)
    gen_group: int = 0  # engine that generated it (= rank with one engine per process)
    done_at: float = 0.0  # time.time() when its generation round finished
    admission: str = "inline"  # why it was admitted: generated by the learner, or within --max_policy_lag
    lag_s: float = 0.0  # seconds from done_at to the step that trained on it
    exact_form: list = dataclasses.field(default_factory=list)  # (G,) bool: the response ends in exactly "Answer: N"


def score_group(problem: Problem, prompt_ids: list[int], samples: list[Sample], cfg: Config, task: Task, tokenizer, *,
                gen_round: int = 0, gen_wall_s: float = 0.0, group_id: str = "") -> Group:
    """Correctness (+1/-1, the task's verdict) plus the soft overlong punishment (paper eq. 13)."""
    texts = [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in samples]
    scores = task.verdicts(texts, problem, cfg)  # the task's score, checked: one finite verdict per response
    r_correct = torch.tensor([float(s.reward) for s in scores], dtype=torch.float32)  # (G,)
    lengths = torch.tensor([len(s.token_ids) for s in samples])  # (G,)
    if cfg.overlong_penalty:
        r_over = dapo.overlong_penalty(lengths, max_len=cfg.max_response_len, buffer_len=cfg.overlong_buffer,
                                       penalty_factor=cfg.overlong_factor)  # (G,)
    else:
        r_over = torch.zeros(len(samples))  # (G,)
    return Group(problem=problem, prompt_ids=prompt_ids, samples=samples, scores=scores, reward_overlong=r_over,
                 reward=r_correct + r_over, correct=torch.tensor([s.correct for s in scores]), gen_round=gen_round,
                 gen_wall_s=gen_wall_s, group_id=group_id, exact_form=[task.exact_form(t, cfg) for t in texts])


@dataclass
class Rollouts:
    """What one step's generation produced."""

    kept: list[Group]  # trained on this step (at most prompts_per_step)
    generated: list[Group]  # every group generated this step
    expired: list[Group]  # buffered groups that grew older than --max_rollout_age, never trained on
    stats: dict  # groups/gen_rounds, groups/exhausted, groups/buffered, time/generate, time/score


def collect_groups(step: int, engine, stream: PromptStream, data: Dataset, cfg: Config, dist: Dist, tokenizer,
                   task: Task, buffer: list[Group], *, version: int | None = None,
                   learners: int = 0) -> Rollouts:
    """Generate, score and filter until `prompts_per_step` groups are kept (Dynamic Sampling, paper 3.2).

    Each round's prompts are cut into `gen_shards` shards; shard c is sampled with seed
    (seed, step, round, c) by engine c % n_engines (an engine: one rank, or the `engine.tp` ranks of
    one tensor-parallel vLLM engine, which all submit it; plumbing/distributed.py calls these ranks an engine
    group, not to be confused with a group of G responses), so the same run on 1 or N processes
    draws the same rollouts (for equal gen_shards). Every rank receives every group, each once
    (distributed.gather_engine_shards), so all ranks make the same keep/stop decision and no
    collective can hang (docs/PITFALLS.md, failures 3 and 13).

    Bounded staleness: the official code throws away kept groups beyond the batch. With
    cfg.max_rollout_age > 0 they go to `buffer` instead (changed in place), and later steps train
    on them first while their age (this step - the step that generated them) is at most
    max_rollout_age.

    version: the weights version generating (default `step`: inline, the learner's own weights);
    learners: the ranks that train the batch (default dist.world; generator workers pass the
    learner's). Generator workers pass their own `dist` (worker c of K, one engine each), so one
    shard per engine is one per worker there.

    Raises:
        cli.RunStopped: the round budget ran out under --on_exhausted error.
        distributed.GroupMismatchError: the ranks of one engine group drew different tokens.
    """
    fresh = [g for g in buffer if step - g.policy_version <= cfg.max_rollout_age]
    expired = [g for g in buffer if step - g.policy_version > cfg.max_rollout_age]
    kept = fresh[: cfg.prompts_per_step]
    buffer[:] = fresh[cfg.prompts_per_step :]
    generated, stats, rounds = [], {"time/score": 0.0, "time/generate": 0.0}, 0
    params = dict(n=cfg.group_size, max_new_tokens=cfg.max_response_len, temperature=cfg.temperature, top_p=cfg.top_p)
    n_engines, my_engine = dist.world // engine.tp, dist.rank // engine.tp
    n_shards = cfg.gen_shards or n_engines
    version = step if version is None else version
    while len(kept) < cfg.prompts_per_step and rounds < cfg.max_gen_rounds:
        rnd, rounds = rounds, rounds + 1
        # Without dynamic sampling (and no buffer to keep surplus) generate only what is trained.
        wanted = cfg.gen_prompts_per_round
        if not cfg.dynamic_sampling and cfg.max_rollout_age == 0:
            wanted = min(wanted, cfg.prompts_per_step - len(kept))
        idx = stream.take(wanted)  # (same on every rank)
        shard_size = math.ceil(len(idx) / n_shards)
        local = []
        for c in range(my_engine, n_shards, n_engines):  # shard c on engine c % n_engines
            shard = idx[c * shard_size : (c + 1) * shard_size]
            seed = request_seed(cfg.seed, step, rnd, c)
            samples, wall = rollout.timed_generate(engine, [data.prompt_ids[i] for i in shard], SamplingParams(seed=seed, **params))
            local.append((c, seed, wall, shard, samples))
        t0 = time.perf_counter()
        shards = distributed.gather_engine_shards(local, dist, engine.tp)  # one copy of each, ranks of a group checked
        round_groups = []
        for c, seed, wall, shard, samples in shards:
            for i, s in zip(shard, samples):
                g = score_group(data.problems[i], data.prompt_ids[i], s, cfg, task, tokenizer, gen_round=rnd, gen_wall_s=wall,
                                group_id=f"{step}-{rnd}-{len(round_groups)}")
                g.seed, g.policy_version, g.gen_shard, g.gen_group, g.done_at = seed, version, c, c % n_engines, time.time()
                round_groups.append(g)
        stats["time/score"] += time.perf_counter() - t0
        stats["time/generate"] += max(wall for _, _, wall, _, _ in shards)  # the slowest engine
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
    if len(kept) < cfg.prompts_per_step:
        msg = (f"step {step}: dynamic sampling kept {len(kept)}/{cfg.prompts_per_step} groups after "
               f"{cfg.max_gen_rounds} rounds of {cfg.gen_prompts_per_round} prompts: nearly every group is all-correct "
               f"or all-wrong for model {cfg.model or 'tiny'} on data {cfg.data}. Use easier/harder data, a larger "
               f"--max_gen_rounds or --gen_prompts_per_round, or --on_exhausted partial/skip.")
        if cfg.on_exhausted == "error":
            raise cli.RunStopped(msg)
        stats["groups/exhausted"] = 1.0
        # skip: train on nothing; partial: whole groups, a multiple of the world size so every
        # rank gets the same count. Groups not trained go back to the buffer when there is one.
        cut = 0 if cfg.on_exhausted == "skip" else len(kept) - len(kept) % (learners or dist.world)
        kept, unused = kept[:cut], kept[cut:]
        if cfg.max_rollout_age > 0:
            buffer[:0] = unused  # oldest first, trained on first later
        else:
            for g in unused:
                g.kept = False
    stats["groups/buffered"] = len(buffer)
    return Rollouts(kept, generated, expired, stats)


PROBE_ROUND = -1  # the probe set's request seed is that of "round -1" of its step (no generation round has it)


def request_seed(seed: int, step: int, rnd: int, shard: int) -> int:
    """Sampler seed of one generation request: a hash of (seed, step, round, shard), recorded with each rollout."""
    return int.from_bytes(hashlib.sha256(f"{seed}-{step}-{rnd}-{shard}".encode()).digest()[:4], "little")


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


def update_policy(model, optimizer, batch: Batch | None, cfg: Config, dist: Dist, device, pad_id: int) -> dict:
    """Old log-probs, then one clipped, token-level optimizer step per mini-batch (paper: 16 per rollout step).

    Loss denominators (dapo.loss_denominators) are counted over the whole mini-batch on all ranks
    before its first backward, so the gradient is the same for any split into micro-batches and
    ranks (docs/PITFALLS.md, failure 1; tests/test_train.py). A mini-batch without a single loss
    token on any rank (every response overlong-filtered) takes no step at all: its gradient would
    be 0, but AdamW's momentum and weight decay would still move the weights. Returns the
    policy/* metrics (policy/optimizer_steps counts the steps taken, policy/skipped_minibatches
    the others).
    """
    if batch is None:  # nothing kept this step: nothing to train on
        return {"policy/optimizer_steps": 0, "policy/skipped_minibatches": 0}
    minibatches = update.split_minibatches(batch, cfg.mini_batch_size, dist)  # this rank's rows of each
    den = [step_denominators(batch, mb, dist) for mb in minibatches]  # ({counts over all ranks}, {per-row counts})
    trained = [m for m, (counts, _) in enumerate(den) if counts["num_tokens"] > 0]  # the same list on every rank
    stats, old = {}, update.OldLogprobs(batch)  # old log-probs, entropy, sampler gap per response
    # 5. Old log-probs: the learner's before this update (inline: the weights that generated the batch),
    # recomputed by the trainer. The first trained mini-batch trains before any optimizer step, so its old
    # log-probs are its own forward pass's (ratio exactly 1); only later mini-batches need this pass.
    t0 = clock()
    old.compute(model, [i for m in trained[1:] for i in minibatches[m]], cfg, dist, device, pad_id)
    stats["time/old_logprobs"] = clock() - t0

    # 6. One optimizer step per mini-batch.
    t0 = clock()
    keys = ("clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl", "ratio_mean") + (
        ("seq_clipfrac_low", "seq_clipfrac_high") if cfg.surrogate == "gspo" else ())  # GSPO's per-response fractions
    sums = dict.fromkeys(("loss", *keys), 0.0)
    norms = []
    for m in trained:
        mb, (counts, per_row) = minibatches[m], den[m]
        row_of = {i: r for r, i in enumerate(mb)}
        for micro, real_pass in update.micro_batches_all_ranks(mb, batch, cfg, dist):  # 0.0: a pass keeping ranks in step
            inputs = forward.micro_batch(batch, micro, pad_id, device, cfg)  # packed or padded
            logp, ent = forward.logprobs(model, inputs, cfg)  # (b, T), (b, T)
            first = m == trained[0] and real_pass  # no optimizer step yet: old = this pass, detached
            old_logp = old.first_pass(micro, logp, ent, inputs.real) if first else old.rows(micro, logp)  # (b, T)
            adv = batch.advantages[micro].to(device)  # (b,)
            # --- DAPO: the clipped per-token loss (Clip-Higher, eq. 10), then the token-level mean (eq. 8)
            loss_tok, st = token_loss(logp, old_logp, adv, inputs.mask, old, micro, cfg)  # (b, T)
            loss = dapo.aggregate_loss(loss_tok, inputs.mask, cfg.loss_agg, max_len=cfg.max_response_len, **counts,
                                       **{k: v[[row_of[i] for i in micro]].to(device) for k, v in per_row.items()})
            # The loss is already the global mean; FSDP averages gradients over ranks, so undo that.
            (loss * real_pass * dist.world).backward()
            # --- plumbing: the step's statistics, each weighted by this pass's share of the mini-batch
            n_loss = float(inputs.mask.sum())  # loss tokens of this pass
            old.count_weights(st, n_loss * real_pass)  # the behaviour weight's diagnostics, over loss tokens
            share = real_pass * n_loss / counts["num_tokens"]  # this pass's share of the tokens
            sums["loss"] += real_pass * float(loss.detach())
            for k in keys:  # seq_*: weighted by this pass's share of the responses (the seq-mean denominator)
                sums[k] += st[k] * (real_pass * len(micro) / counts["num_seqs"] if k.startswith("seq_") else share)
        norms.append(update.clip_and_step(model, optimizer, cfg.grad_clip, stats))
    sums = {k: all_reduce_sum(v, dist) for k, v in sums.items()}  # every rank calls, also with nothing trained
    if trained:
        stats |= {f"policy/{k}": v / len(trained) for k, v in sums.items()} | {"policy/grad_norm": float(np.mean(norms))}
    stats |= old.metrics(dist)
    stats["policy/optimizer_steps"], stats["policy/skipped_minibatches"] = len(trained), len(minibatches) - len(trained)
    stats["time/update"] = clock() - t0
    return stats


def token_loss(logp, old_logp, adv, mask, old: update.OldLogprobs, micro: list[int], cfg: Config) -> tuple:
    """The per-token policy loss of a micro-batch and its statistics (each tensor (b, T)).

    By default DAPO's clipped objective with Clip-Higher, dapo.policy_loss (paper eq. 10); --surrogate
    picks a successor from dapo.SURROGATES (dapo.cispo_loss, dapo.gspo_loss), with its knobs from the
    config (`params`: a new surrogate adds its entry). With generation beside the learner,
    --offpolicy_objective wraps it in dapo.offpolicy_loss, whose "naive" objective is this same call.
    """
    params = {"clip": dict(eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip or None),
              "cispo": dict(low=cfg.cispo_low, high=cfg.cispo_high),
              "gspo": dict(eps_low=cfg.gspo_eps_low, eps_high=cfg.gspo_eps_high)}.get(cfg.surrogate, {})
    if cfg.offpolicy_objective == "naive":  # the paper's loss: old = the learner's recomputed log-probs
        return dapo.SURROGATES[cfg.surrogate](logp, old_logp.detach(), adv, mask, **params)
    behav = old.sampler_rows(micro, old_logp)  # (b, T) log mu, the sampler's
    return dapo.offpolicy_loss(logp, old_logp, behav, adv, mask, objective=cfg.offpolicy_objective, cap=cfg.offpolicy_cap,
                               weight_mode=cfg.offpolicy_weight_mode, surrogate=cfg.surrogate, **params)


def step_denominators(batch: Batch, mb: list[int], dist: Dist) -> tuple[dict, dict]:
    """dapo.loss_denominators of a mini-batch: counts summed over all ranks, per-row counts of this rank's rows."""
    tokens = batch.mask_rows[mb] * torch.tensor([len(batch.response_ids[i]) for i in mb], dtype=torch.float32)  # (m,)
    counts, per_row = dapo.loss_denominators(tokens, batch.group_index[mb])
    return {k: all_reduce_sum(v, dist) for k, v in counts.items()}, per_row


# --- the loop ---------------------------------------------------------------------------------------


def train(cfg: Config, task: Task | None = None) -> dict:
    """Run DAPO end to end; returns the summary (also written to RUN_DIR/summary.json).

    task: the task to train on; None = the config's (--task, --task_args). A task given here is
    recorded in the run's config as module:Class with its options, so eval.py and a resume find it.
    """
    task, cfg = task_of(dataclasses.replace(cfg, model=models.resolve(cfg.model)), task)  # a named model: its dir
    # --- plumbing: processes, data, policy, optimizer, engine, resume, run files (skip on first reading)
    dist, device = distributed.init_distributed(cfg.device, one_rank_mesh=True)  # one GPU: FSDP2 over a 1-rank mesh
    distributed.seed_everything(cfg.seed, cfg.threads, offload=cfg.cpu_offload)
    tokenizer = policy.load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    data, held_out = load_data(cfg, task, tokenizer)  # before the model: bad data fails fast
    runlog.claim_run_dir(cfg, dist)  # one run per directory; a fresh run never writes over another's files
    runlog.check_resume(cfg, dist)  # so does a damaged checkpoint
    rollout.resolve_engine(cfg.engine)  # so does --engine vllm without vLLM (a 32B model takes minutes to load)
    model = policy.load_model(cfg.model, device, trust_remote_code=cfg.trust_remote_code, world=dist.world, fsdp=cfg,
                              shard=dist.sharded)
    forward.prepare(model, cfg, device, dist.world)  # the log-prob pass as a method of the FSDP root; packing's attention
    # before any forward: after a forward without backward FSDP2 leaves the root's parameters unsharded (registered as
    # the full tensors), and an optimizer built then (after sync_engine's probe, say) would hold those, not the shards
    optimizer, scheduler = policy.make_optimizer(model, cfg)
    engine = policy.make_engine(cfg, model, tokenizer, device, dist.world, max(map(len, data.prompt_ids + (
        held_out.prompt_ids if held_out else []))), announce=dist.main,
        probe=(data.prompt_ids[0], tokenizer.encode(data.problems[0].answer, add_special_tokens=False)))
    rollout.sync_engine(engine, model, 0, dist.world)  # start from the trainer's weights, whatever the directory holds
    run, resumed = runlog.start(cfg, Config(), RESUME_FREE_FIELDS, model, optimizer, scheduler, engine, tokenizer, data,
                                held_out, task.template_hash(tokenizer, cfg), dist, device)
    if "heldout_before" not in run.state:  # a resumed run keeps its first evaluation
        run.state["heldout_before"] = measure.held_out(engine, tokenizer, held_out, cfg, task, dist, "before")
        run.log.scalars(run.state["heldout_before"], run.start)  # held-out curves: "before" at step 0, "after" at the end

    source = generator.make_source(cfg, task, model, engine, data, dist, run.start, resumed, collect_groups, Group)
    with run, source:  # the learner generates inline, or a generator process beside it (--max_policy_lag)
        for step in run.steps():
            if run.stop_requested():  # SIGINT/SIGTERM before this step (during the held-out evaluation): none of it trained
                return run.stop_before(step, model, optimizer, scheduler, source.state())
            stats, probe_records = {"step": step, "policy/lr": scheduler.get_last_lr()[0]}, []
            if held_out and cfg.probe_every and step % cfg.probe_every == 0:  # the fixed probe set, on held-out prompts
                probe, probe_records = measure.probe(engine, tokenizer, held_out.head(cfg.probe_size), cfg, task, dist,
                                                     step, request_seed(cfg.seed, step, PROBE_ROUND, 0))
                stats |= probe
            if run.stop_requested(starting=True):  # ... or during its probe
                return run.stop_before(step, model, optimizer, scheduler, source.state())
            # --- DAPO 1-3: G responses per prompt, scored (verdict + soft overlong punishment), groups with contrast kept
            if source.inline:  # the official loop: the learner samples with the weights it has just trained
                rollouts = collect_groups(step, engine, source.stream, data, cfg, dist, tokenizer, task, source.buffer)
            else:  # generator processes beside the learner ran the same collect_groups (docs/async.md)
                rollouts = source.next(step)
            engine.sleep()  # colocated vLLM on GPU: free its memory for the update (no-op otherwise)
            stats |= rollouts.stats | runlog.rollout_metrics(rollouts.generated, rollouts.kept, step, cfg)
            # --- DAPO 4: group advantages; overlong filtering of the loss mask
            batch = build_batch(rollouts.kept, cfg) if rollouts.kept else None
            # --- DAPO 5-6: old log-probs, then one clipped, token-level optimizer step per mini-batch
            stats |= update_policy(model, optimizer, batch, cfg, dist, device, tokenizer.pad_token_id)
            policy.step_schedule(scheduler)  # warm-up counts rollout steps
            # --- DAPO 7: hand the new weights on: rollouts of step + 1 (or, with a lag, later) come from them
            stats |= source.publish(model, step + 1)  # rollout.sync_engine (vLLM: woken, streamed, then checked)
            run.end_step(step, stats, rollouts, batch, source.buffer, probe_records)  # records, metrics, non-finite streak
            if run.checkpoint_due(step) or source.failed:  # --save_every, the last step, the time budget, SIGINT/SIGTERM,
                # or a generator process that died during publish: keep the step just trained, then next() raises
                run.save_checkpoint(step + 1, model, optimizer, scheduler, source.state())
            if run.interrupted:
                return run.stop(step)
    after = measure.held_out(engine, tokenizer, held_out, cfg, task, dist, "after")
    return run.finish(model, tokenizer, run.state["heldout_before"], after)


# --- plumbing of the loop: setup (skip on first reading) ---------------------------------------------------


def load_data(cfg: Config, task: Task, tokenizer) -> tuple[Dataset, Dataset | None]:
    """Training data and held-out data (None with --eval_data ''), every prompt tokenised once."""
    data = task.load(cfg.data, tokenizer, cfg, held_out=False, flag="--data")
    held_out = None if not cfg.eval_data else task.load(cfg.eval_data, tokenizer, cfg, held_out=True, limit=cfg.eval_limit,
                                                         flag="--eval_data")
    if held_out is not None:  # held-out figures are about problems never trained on: compared by text, at load
        overlap.check_held_out(data, held_out, allow=cfg.allow_heldout_overlap)
    return data, held_out


def main(argv: list[str] | None = None) -> dict:
    return train(parse_config(argv))


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
