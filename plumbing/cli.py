"""Command lines: flags from config dataclasses, the rules that refuse a config that cannot train, one-line errors.

Plumbing a learner may skip on first reading. Every entry point (train.py, eval.py, report.py,
preflight.py) parses its flags with `ArgumentParser` and `add_dataclass_flags`, and runs through
`run_cli`, so bad input ends the same way everywhere: one line `error: <what is wrong and how to
fix it>` on stderr and exit status 2 (DAPO_DEBUG=1 shows the traceback instead).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import types
import typing

import torch

import dapo
import rollout
import verifier

DEBUG_ENV = "DAPO_DEBUG"  # set to 1 to see the full traceback of a bad-input error


# --- command lines ------------------------------------------------------------------------


class RunStopped(RuntimeError):
    """The run cannot go on for a reason the user can act on (named in the message)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag ends in one line, `error: ... (see --help)`, and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def parse_bool(s: str) -> bool:
    """The one boolean flag style of every command line here: `--flag true|false` (also 1/0, yes/no, on/off)."""
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def F(default, help: str):
    """A config field whose help text becomes its command-line flag's `--help`."""
    return dataclasses.field(default=default, metadata={"help": help})


def add_dataclass_flags(ap: argparse.ArgumentParser, cls, *, defaults: bool) -> None:
    """One flag per field of a config dataclass, its help from the field's metadata ("help").

    defaults=False makes every flag default to None, so the caller can tell "given" from "not given"
    (train.py applies a preset first, then the given flags).
    """
    for f in dataclasses.fields(cls):
        text = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
        default = f.default if defaults else None
        if f.type in ("bool", bool):
            ap.add_argument(f"--{f.name}", type=parse_bool, default=default, metavar="BOOL", help=f"{text} (default {f.default})")
        else:
            ap.add_argument(f"--{f.name}", type=type(f.default), default=default, help=f"{text} (default {f.default!r})")


def run_cli(main, argv: list[str] | None = None) -> int:
    """Run an entry point; bad input (flags, data, paths, checkpoints) ends in one line and exit status 2.

    `main(argv)` raises ValueError or OSError (FileNotFoundError, ...) with a message that names the
    input and the fix, or RunStopped; that message is printed as `error: <message>` on stderr,
    without a traceback, and the exit status is 2. DAPO_DEBUG=1 re-raises instead, for the full
    traceback, and so does an exception marked `keep_traceback` (raised by a task's own `score`:
    task.Task.verdicts names the problem on the line above it). A second Ctrl-C (the first one
    finishes the step in flight) exits with 130. Any other exception is a bug and keeps its
    traceback. Returns the exit status (0 on success).
    """
    try:
        main(argv)
    except (ValueError, OSError, RunStopped) as e:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0") or getattr(e, "keep_traceback", False):
            raise
        print(f"error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


def instruction_rules(instruction: str, few_shot: str, allow_empty: bool = False):
    """(fails, message) for --instruction and --few_shot, shared by train.py and eval.py ('' = the checkpoint's there)."""
    yield (not (instruction in ("dapo", "none") or "{problem}" in instruction or (allow_empty and not instruction)),
           f"--instruction must be dapo, none or a template holding {{problem}}, got {instruction!r}")
    yield (bool(few_shot) and not (few_shot.isdigit() and int(few_shot) > 0 or few_shot.endswith(".jsonl")),
           f"--few_shot must be a number of the task's worked examples or a .jsonl of {{problem, response}}, got {few_shot!r}")


def check_config(cfg) -> None:
    """Refuse a train.Config that cannot train, before any work starts: one line naming the flag and the fix.

    Single values out of range, and combinations that would stop, hang or silently do nothing
    later (zero temperature for training, a group size dynamic sampling can never split, a
    response budget within the overlong buffer, ...). tests/test_faults.py has one row per rule.

    Raises:
        ValueError: the first rule broken.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    engine = rollout.resolve_engine("auto") if cfg.engine == "auto" else cfg.engine
    for fails, message in _config_rules(cfg, world, engine):  # in order: later rules divide by earlier sizes
        if fails:
            raise ValueError(message)


def _config_rules(c, world: int, engine: str):
    """(fails, message) for each rule of check_config, lazily: a message is formatted only when reached."""
    inf = math.inf
    yield (c.steps < 0, f"--steps must be >= 0, got {c.steps}")
    yield (c.seed < 0, f"--seed must be >= 0 (numpy's generators refuse negative seeds), got {c.seed}")
    yield (c.threads < 0, f"--threads must be >= 0 (0 = $OMP_NUM_THREADS or 1), got {c.threads}")
    yield (c.max_seconds < 0, f"--max_seconds must be >= 0 (0 = no budget), got {c.max_seconds}")
    yield (c.max_samples < 0, f"--max_samples must be >= 0 (0 = no budget), got {c.max_samples}")
    yield (c.device not in ("auto", "cpu", "cuda"), f"--device must be auto, cpu or cuda, got {c.device!r}")
    yield (c.device == "cuda" and not torch.cuda.is_available(),
          "--device cuda but torch sees no CUDA device: use --device cpu (or auto), or a CUDA build of torch")
    yield (c.engine not in rollout.ENGINES, f"--engine must be auto, hf or vllm, got {c.engine!r}")
    yield from instruction_rules(c.instruction, c.few_shot)
    yield (c.prompt_truncation not in ("error", "left", "skip"),
          f"--prompt_truncation must be error, left or skip, got {c.prompt_truncation!r}")
    yield (c.on_exhausted not in ("error", "partial", "skip"), f"--on_exhausted must be error, partial or skip, got {c.on_exhausted!r}")
    yield (c.verifier not in verifier.MODES, f"--verifier must be one of {verifier.MODES}, got {c.verifier!r}")
    yield (c.loss_agg not in dapo.LOSS_AGG_MODES, f"--loss_agg {c.loss_agg!r} is not one of {dapo.LOSS_AGG_MODES}")
    # sizes first: the rules after them divide by these
    yield (c.group_size < 2 and c.dynamic_sampling,
          f"--group_size {c.group_size}: dynamic sampling keeps groups with 0 < correct < G, which no group of fewer "
          "than 2 answers has: use --group_size >= 2 (paper 16)")
    yield (c.group_size < 2, f"--group_size {c.group_size}: a group of fewer than 2 answers has no relative advantage "
          "(and no std): use --group_size >= 2 (paper 16)")
    yield (c.prompts_per_step < 1, f"--prompts_per_step must be >= 1, got {c.prompts_per_step}")
    yield (c.mini_batch_size < 1, f"--mini_batch_size must be >= 1, got {c.mini_batch_size}")
    yield (c.micro_batch_size < 1, f"--micro_batch_size must be >= 1, got {c.micro_batch_size}")
    yield (c.gen_prompts_per_round < 1, f"--gen_prompts_per_round must be >= 1, got {c.gen_prompts_per_round}")
    yield (c.max_gen_rounds < 1, f"--max_gen_rounds must be >= 1, got {c.max_gen_rounds}")
    yield (c.max_response_len < 1, f"--max_response_len must be >= 1 token, got {c.max_response_len}")
    yield (c.max_prompt_len < 1, f"--max_prompt_len must be >= 1 token, got {c.max_prompt_len}")
    yield (c.overlong_penalty and not 0 < c.overlong_buffer < c.max_response_len,
          f"--overlong_buffer must be in (0, --max_response_len={c.max_response_len}) while --overlong_penalty is on, got "
          f"{c.overlong_buffer}: lower --overlong_buffer or raise --max_response_len")
    yield (not c.temperature > 0 or not math.isfinite(c.temperature),
          f"--temperature must be > 0 for training, got {c.temperature}: at 0 the G answers of a group are identical "
          "greedy ones and the trainer's softmax(logits / T) is undefined; use 1.0 (paper)")
    yield (not 0 < c.top_p <= 1, f"--top_p must be in (0, 1] (1 = off, paper), got {c.top_p}")
    yield (not 0 <= c.eval_temperature < inf, f"--eval_temperature must be >= 0 (0 = greedy), got {c.eval_temperature}")
    yield (not 0 < c.eval_top_p <= 1, f"--eval_top_p must be in (0, 1] (paper 0.7), got {c.eval_top_p}")
    yield (c.eval_k < 1, f"--eval_k must be >= 1 sample per held-out problem, got {c.eval_k}")
    yield (c.eval_limit < 0, f"--eval_limit must be >= 0 (0 = all), got {c.eval_limit}")
    yield (not 0 < c.eps_low <= c.eps_high, f"the clip range needs 0 < --eps_low <= --eps_high, got {c.eps_low} and {c.eps_high}")
    yield (c.dual_clip and c.dual_clip <= 1, f"--dual_clip must be 0 (off) or > 1, got {c.dual_clip}")
    yield (c.surrogate not in dapo.SURROGATES, f"--surrogate must be one of {tuple(dapo.SURROGATES)}, got {c.surrogate!r}")
    yield (c.surrogate == "cispo" and not 0 <= c.cispo_low <= 1,
           f"--cispo_low must be in [0, 1], got {c.cispo_low}: the bounds are absolute, and a floor above 1 raises the weight "
           "of every on-policy token (SkyRL's old [1, 6]); use 0 (ScaleRL)")
    yield (c.surrogate == "cispo" and not c.cispo_high >= 1,
           f"--cispo_high must be >= 1, got {c.cispo_high}: the bounds are absolute (not offsets from 1), and a cap below 1 "
           "lowers the weight of every on-policy token; use 5 (ScaleRL)")
    yield (c.surrogate != "clip" and c.dual_clip,
           f"--dual_clip caps the loss of the clip surrogate; --surrogate {c.surrogate} has none to cap ("
           + ("CISPO bounds its weight by --cispo_high" if c.surrogate == "cispo" else "GSPO clips its sequence ratio to "
              "[1 - --gspo_eps_low, 1 + --gspo_eps_high]") + "): pass --dual_clip 0")
    yield (c.surrogate == "gspo" and c.loss_agg != "seq-mean-token-mean",
           f"--surrogate gspo needs --loss_agg seq-mean-token-mean (GSPO's objective is a mean over responses), got "
           f"{c.loss_agg!r}: pass --loss_agg seq-mean-token-mean")
    yield (c.surrogate == "gspo" and not (0 < c.gspo_eps_low < 1 and c.gspo_eps_high > 0),
           f"--gspo_eps_low must be in (0, 1) and --gspo_eps_high > 0, got {c.gspo_eps_low} and {c.gspo_eps_high} "
           "(paper 3e-4 and 4e-4)")
    yield (not 0 <= c.overlong_factor < inf, f"--overlong_factor must be >= 0 (a negative one rewards length), got {c.overlong_factor}")
    yield (c.offpolicy_objective not in dapo.OFFPOLICY_OBJECTIVES,
           f"--offpolicy_objective must be one of {dapo.OFFPOLICY_OBJECTIVES}, got {c.offpolicy_objective!r}")
    yield (c.offpolicy_weight_mode not in dapo.OFFPOLICY_WEIGHT_MODES,
           f"--offpolicy_weight_mode must be one of {dapo.OFFPOLICY_WEIGHT_MODES}, got {c.offpolicy_weight_mode!r}")
    yield (not c.offpolicy_cap > 0, f"--offpolicy_cap must be > 0 (C >= 1 leaves on-policy tokens alone), got {c.offpolicy_cap}")
    yield (c.offpolicy_objective != "naive" and not c.sampler_logprobs,
           f"--offpolicy_objective {c.offpolicy_objective} needs the sampler's log-probs: pass --sampler_logprobs true")
    yield (c.offpolicy_objective != "naive" and c.top_p < 1 and c.temperature != 1 and engine == "vllm",
           f"--offpolicy_objective {c.offpolicy_objective} with --top_p < 1 needs --temperature 1 with vLLM (its log-probs "
           "are taken either after top-p or before temperature, neither the trainer's distribution): set --top_p 1, "
           "--temperature 1 or --engine hf")
    yield (c.max_policy_lag < 0, f"--max_policy_lag must be >= 0 (0 = generate inline), got {c.max_policy_lag}")
    yield (c.generator_workers < 1, f"--generator_workers must be >= 1, got {c.generator_workers}")
    yield (c.generator_workers > 1 and not (c.max_policy_lag > 0 or c.generator_process),
           f"--generator_workers {c.generator_workers} runs a pool of generator processes, which the inline loop does not "
           "have: pass --max_policy_lag >= 1 or --generator_process true")
    yield (c.generator_weights not in ("broadcast", "shared_memory"),
           f"--generator_weights must be broadcast or shared_memory, got {c.generator_weights!r}")
    yield (not 0 < c.generator_timeout_s < inf, f"--generator_timeout_s must be > 0 seconds, got {c.generator_timeout_s}")
    yield ((c.max_policy_lag > 0 or c.generator_process) and c.max_rollout_age > 0,
           "--max_rollout_age (reuse of surplus groups) and a generator process (--max_policy_lag) are two ways of training "
           "on older rollouts: use one of them")
    yield (not 0 <= c.lr < inf, f"--lr must be >= 0 and finite, got {c.lr}")
    yield (c.warmup_steps < 0, f"--warmup_steps must be >= 0, got {c.warmup_steps}")
    yield (not 0 <= c.weight_decay < inf, f"--weight_decay must be >= 0, got {c.weight_decay}")
    yield (not c.grad_clip > 0, f"--grad_clip must be > 0 (inf = no clipping), got {c.grad_clip}: 0 zeroes every update")
    yield (c.mini_batch_size >= 1 and c.group_size >= 1 and bool(
           (c.prompts_per_step * c.group_size) % c.mini_batch_size or c.mini_batch_size % c.group_size),
          f"prompts_per_step * group_size = {c.prompts_per_step * c.group_size} responses must be a multiple of "
          f"--mini_batch_size {c.mini_batch_size}, itself a multiple of --group_size {c.group_size}")
    yield (c.group_size >= 1 and bool((c.mini_batch_size // c.group_size) % world or c.prompts_per_step % world),
          f"with {world} processes, --prompts_per_step ({c.prompts_per_step}) and the groups per mini-batch "
          f"({c.mini_batch_size // c.group_size}) must be multiples of {world}: every rank trains whole groups")
    yield (c.gen_prompts_per_round * c.max_gen_rounds < c.prompts_per_step,
          f"--gen_prompts_per_round {c.gen_prompts_per_round} x --max_gen_rounds {c.max_gen_rounds} prompts can never fill "
          f"--prompts_per_step {c.prompts_per_step} groups: raise one of the first two or lower the third")
    yield (c.logprob_chunk < 1, f"--logprob_chunk must be >= 1 position, got {c.logprob_chunk}")
    yield (c.engine_max_batch < 1, f"--engine_max_batch must be >= 1, got {c.engine_max_batch}")
    yield (c.gen_shards < 0, f"--gen_shards must be >= 0 (0 = one per engine), got {c.gen_shards}")
    yield (c.vllm_tp < 1 or world % c.vllm_tp != 0,
           f"--vllm_tp {c.vllm_tp} must be >= 1 and divide the number of processes ({world})")
    yield (c.vllm_tp > 1 and engine != "vllm", f"--vllm_tp {c.vllm_tp} needs --engine vllm")
    yield (c.vllm_tp > 1 and (c.max_policy_lag > 0 or c.generator_process),
           f"--vllm_tp {c.vllm_tp}: a generator process (--max_policy_lag) runs one engine on one device; use --vllm_tp 1 "
           "with it, or the inline loop (--max_policy_lag 0) with tensor parallelism")
    yield (not 0 <= c.vllm_gpu_memory_utilization <= 1,
          f"--vllm_gpu_memory_utilization must be in [0, 1] (0: automatic), got {c.vllm_gpu_memory_utilization}")
    yield (c.max_rollout_age < 0, f"--max_rollout_age must be >= 0, got {c.max_rollout_age}")
    yield (c.log_every < 1, f"--log_every must be >= 1 step, got {c.log_every}")
    yield (c.probe_every < 0, f"--probe_every must be >= 0 (0 = off), got {c.probe_every}")
    yield (c.probe_every > 0 and c.probe_size < 1,
          f"--probe_size must be >= 1 while --probe_every is on, got {c.probe_size}: raise it or pass --probe_every 0")
    yield (c.overwrite and bool(c.resume), f"--overwrite true replaces the run in --run_dir and --resume {c.resume} "
           "continues it: pass one of them")
    yield (c.save_every < 0, f"--save_every must be >= 0 (0 = only at the end), got {c.save_every}")
    yield (c.keep_checkpoints < 1, f"--keep_checkpoints must be >= 1, got {c.keep_checkpoints}")
    yield (c.max_nonfinite_steps < 1, f"--max_nonfinite_steps must be >= 1, got {c.max_nonfinite_steps}")


# --- the options of a dataclass given as JSON (--task_args) --------------------------------------------


def check_options(cls, values: dict, flag: str) -> None:
    """Refuse a value of the wrong type for a field of the dataclass `cls` (values: {field: JSON value}; unknown
    fields are the caller's to refuse). Each field's type is its annotation resolved (`option_types`), so the
    check is the same whether or not the class's module has `from __future__ import annotations`.

    Raises ValueError: `{flag}: {Class}'s option 'x' is int, got 'a'`.
    """
    hints = option_types(cls)
    for key, value in values.items():  # JSON gives str, int, float, bool, list, dict, None
        if key in hints and _accepts(hints[key], value) is False:
            raise ValueError(f"{flag}: {cls.__name__}'s option {key!r} is {_type_name(hints[key])}, got {value!r}")


def option_types(cls) -> dict:
    """{field: type} of a task dataclass, its annotations resolved to types (typing.get_type_hints) whether or not its
    module has `from __future__ import annotations` (which leaves them as text). Where one field's text cannot be
    resolved (a name imported only for type checkers), each field is resolved alone and that one keeps its text."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # NameError, or anything a bad annotation raises: field by field, in the class's module
        out = {}
        for f in dataclasses.fields(cls):
            one = type("_Option", (), {"__annotations__": {f.name: f.type}, "__module__": cls.__module__})
            try:
                out[f.name] = typing.get_type_hints(one)[f.name]
            except Exception:
                out[f.name] = f.type
        return out


def _accepts(tp, value) -> bool | None:
    """Whether the JSON value `value` is of type `tp` (None: a type this cannot check, accepted)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any or tp is object:
        return True
    if tp is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        verdicts = [_accepts(a, value) for a in args]
        return True if True in verdicts else (None if None in verdicts else False)
    if origin is typing.Literal:
        return value in args
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    container = origin or tp
    if container in (list, tuple, set, frozenset):  # JSON has lists only
        if not isinstance(value, list):
            return False
        inner = [a for a in args if a is not Ellipsis]
        if len(inner) == 1 or (container is not tuple and inner):
            verdicts = [_accepts(inner[0], v) for v in value]
            return False if False in verdicts else True
        return True
    if container is dict:
        return isinstance(value, dict)
    return None


def _type_name(tp) -> str:
    return tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else str(tp).replace("typing.", "")
