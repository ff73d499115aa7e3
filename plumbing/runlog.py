"""A run's directory: metrics and rollout logs, when to checkpoint and how to resume (the checkpoints
themselves: plumbing/checkpoints.py), signals and the time budget.

Plumbing a learner may skip on first reading (with plumbing/policy.py). What a run directory holds:

    config.json            run id, the whole config, data and verifier versions, engine
    metrics.jsonl          one line per rollout step (docs/metrics.md)
    rollouts.jsonl         one RolloutRecord per rollout, with its provenance (rollout.py)
    probe_rollouts.jsonl   the fixed probe set's rollouts
    checkpoints/           resumable checkpoints (plumbing/checkpoints.py: atomic, checksummed; `latest` names the newest)
    final/                 the trained model in HF format, with dapo_run.json (what eval.py reads)
    summary.json           held-out before and after, the run's duration, the prompts --prompt_truncation left cut
    tb/                    TensorBoard events (--tensorboard true)
    run.lock               held (flock) by the run using the directory, naming it (`claim_run_dir`)
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import math
import os
import resource
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from tqdm import tqdm

import rollout
import verifier
from rollout import RolloutWriter
from plumbing import checkpoints
from plumbing.cli import RunStopped
from plumbing.distributed import (Dist, all_gather_objects, all_reduce_max, broadcast_object, close_distributed,
                                  first_failure)
from plumbing.policy import save_hf
from task import FORMAT_ERRORS


# --- run logging --------------------------------------------------------------------------------


def clean(stats: dict) -> dict:
    """JSON-safe metrics: NaN/inf become null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in stats.items()}


def memory_gib(device) -> dict:
    """This process's memory high-water marks in GiB: "host" (peak RSS since the program started)
    and, on GPU, "gpu" and "gpu_reserved" (the most memory torch's allocator had allocated, and
    reserved from the driver, since the last torch.cuda.reset_peak_memory_stats)."""
    out = {"host": _peak_rss_bytes() / 2**30}
    if device.type == "cuda":
        out |= {"gpu": torch.cuda.max_memory_allocated(device) / 2**30,
                "gpu_reserved": torch.cuda.max_memory_reserved(device) / 2**30}
    return out


def load_memory(device, engine) -> dict:
    """memory_gib at the end of loading, the engine's start-up included. vLLM's memory profiling resets torch's GPU
    peak while the engine starts (vllm/utils/mem_utils.py memory_profiling; platforms/cuda.py): the GPU figures are
    the larger of the peak since then and the one the engine recorded before starting (VLLMEngine.peak_before_start)."""
    out = memory_gib(device)
    before = getattr(engine, "peak_before_start", None) or {}
    return out | {k: max(out[k], v) for k, v in before.items() if k in out}


def _peak_rss_bytes() -> int:
    """Peak resident set size: Linux's VmHWM, the high-water mark of this program's own memory. (ru_maxrss
    also counts the parent's resident set at the fork before exec: a child of a large process, a test
    or a benchmark, would report its parent's size.) Without /proc (macOS): ru_maxrss, in bytes there."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))  # kB
    except FileNotFoundError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def memory_metrics(after_load: dict, device, dist: Dist) -> tuple[dict, list[dict]]:
    """memory/* metrics, each the largest over ranks, and each rank's figures (a collective).

    after_load: this rank's memory_gib at the end of loading (Run records it, then resets the GPU
    peak, so the gpu figures of a step are the peak since loading).
    """
    now = memory_gib(device)
    mine = {"rank": dist.rank, **{f"{k}_load_gib": round(v, 4) for k, v in after_load.items()},
            **{f"{k}_peak_gib": round(v, 4) for k, v in now.items()}}
    ranks = all_gather_objects(mine, dist)
    out = {f"memory/{k}": max(r[k] for r in ranks) for k in mine if k != "rank"}
    out["memory/peak_gb"] = out["memory/gpu_peak_gib" if device.type == "cuda" else "memory/host_peak_gib"]
    return out, ranks


def rollout_metrics(generated: list, kept: list, step: int, cfg) -> dict:
    """Per-step diagnostics of everything generated, and of what was trained on (docs/metrics.md).

    generated, kept: train.Group lists. cfg: group_size, degenerate_min_len, degenerate_share.
    """
    m: dict = {"groups/generated": len(generated), "groups/kept": len(kept),
               "groups/kept_frac": len(kept) / max(len(generated), 1)}
    if generated:
        G = cfg.group_size
        lengths = np.array([len(s.token_ids) for g in generated for s in g.samples])
        correct = np.array([bool(c) for g in generated for c in g.correct])
        trunc = np.array([s.truncated for g in generated for s in g.samples])
        n_correct = np.array([int(g.correct.sum()) for g in generated])
        when = lambda sel, f: f(sel) if sel.any() else None  # noqa: E731
        m.update({
            "train/reward_mean": float(np.mean([float(r) for g in generated for r in g.reward])),
            "train/correct_frac": float(correct.mean()),
            # the answer format apart from its value: no single well-formed final answer; exactly "Answer: N" last
            "train/format_error_frac": float(np.mean([sc.reason in FORMAT_ERRORS for g in generated for sc in g.scores])),
            "train/exact_form_frac": float(np.mean([bool(x) for g in generated for x in g.exact_form] or [0.0])),
            "train/overlong_penalty_mean": float(np.mean([float(r) for g in generated for r in g.reward_overlong])),
            "groups/all_correct_frac": float((n_correct == G).mean()),
            "groups/all_wrong_frac": float((n_correct == 0).mean()),
            "length/mean": float(lengths.mean()),
            "length/median": float(np.median(lengths)),
            "length/p90": float(np.percentile(lengths, 90)),
            "length/max": int(lengths.max()),
            "length/truncated_frac": float(trunc.mean()),
            "length/correct_mean": when(correct, lambda c: float(lengths[c].mean())),
            "length/correct_p90": when(correct, lambda c: float(np.percentile(lengths[c], 90))),
            "length/wrong_mean": when(~correct, lambda w: float(lengths[w].mean())),
            "length/wrong_p90": when(~correct, lambda w: float(np.percentile(lengths[w], 90))),
            "length/truncated_frac_correct": when(correct, lambda c: float(trunc[c].mean())),
            "length/truncated_frac_wrong": when(~correct, lambda w: float(trunc[w].mean())),
            # A response made mostly of one repeated token is a sign of broken weights.
            "rollout/degenerate_frac": float(np.mean([degenerate(s.token_ids, cfg.degenerate_min_len, cfg.degenerate_share)
                                                      for g in generated for s in g.samples])),
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


def exhausted_line(step: int, rollouts, cfg) -> str:
    """An exhausted step (--on_exhausted partial or skip, groups/exhausted): what it trains on, why, what to change.

    rollouts: train.Rollouts (kept: the groups trained on; generated: every group of the step)."""
    G, gen = cfg.group_size, rollouts.generated
    right = [int(g.correct.sum()) for g in gen]
    wrong, easy, mixed = right.count(0), right.count(G), sum(0 < r < G for r in right)
    acc = sum(right) / max(G * len(gen), 1)
    why = (f"{wrong} of {len(gen)} groups had no right answer (training accuracy {acc:.3f}): the model rarely solves these "
           f"problems{' at --top_p 1.0, where a small model may write noise (try --top_p 0.7)' if cfg.top_p >= 1 else ''}, "
           "or misses the answer format (see verifier/* and train/format_error_frac)") if wrong >= easy else (
           f"{easy} of {len(gen)} groups had every answer right: the problems are too easy")
    return (f"step {step}: dynamic sampling kept {mixed} group(s) of the {cfg.prompts_per_step} wanted after "
            f"{cfg.max_gen_rounds} round(s); this step trains on {len(rollouts.kept)} (--on_exhausted {cfg.on_exhausted}). "
            f"{why}. Use other data, more --max_gen_rounds, or --on_exhausted error to stop")


def short_batch_planned(cfg) -> bool:
    """True where a short batch is the configured plan, not a failure: dynamic sampling under --on_exhausted
    partial with a round budget (max_gen_rounds x gen_prompts_per_round prompts) of at most prompts_per_step
    prompts, so that a step fills its batch only if every group it generates has contrast (the
    smollm2-arith preset: one round of 12 prompts for 12 groups)."""
    return (cfg.dynamic_sampling and cfg.on_exhausted == "partial"
            and cfg.max_gen_rounds * cfg.gen_prompts_per_round <= cfg.prompts_per_step)


def plan_line(cfg) -> str | None:
    """The line a run prints once at its start where a short batch is the plan (short_batch_planned), else None."""
    if not short_batch_planned(cfg):
        return None
    return (f"[plan] {cfg.max_gen_rounds} generation round(s) of {cfg.gen_prompts_per_round} prompts for "
            f"{cfg.prompts_per_step} groups a step, --on_exhausted partial: a step trains on the groups dynamic sampling "
            f"keeps, fewer than {cfg.prompts_per_step} whenever a group is all-right or all-wrong. That is the plan, not a "
            "failure: the progress bar's `groups` and the metrics groups/kept and groups/exhausted count them per step; "
            "only a step that keeps no group prints a warning")


def exhausted_warning(step: int, rollouts, cfg) -> str | None:
    """The warning of an exhausted step (groups/exhausted), or None where the short batch is the plan
    (plan_line said so at the start) and the step still trains on at least one group."""
    if short_batch_planned(cfg) and rollouts.kept:
        return None
    return f"[warning] {exhausted_line(step, rollouts, cfg)}"


def degenerate(tokens: list[int], min_len: int, share: float) -> bool:
    """True if a response of at least min_len tokens is >= share one single token."""
    return len(tokens) >= min_len and max(tokens.count(t) for t in set(tokens)) >= share * len(tokens)


class StopSignal:
    """SIGINT/SIGTERM: finish the step in flight, write a checkpoint, exit cleanly. A stop that comes
    before a step has started (the held-out evaluation before the first step, the probe at a step's
    start) ends the run before that step: what is in flight (an evaluation) finishes, no update is
    trained (Run.stop_before). Before the Run exists (loading), Ctrl-C is Python's KeyboardInterrupt.

    A second SIGINT (Ctrl-C twice) stops at once. A repeated SIGTERM does not: under torchrun
    the same stop arrives twice (a scheduler signals every process of the job, and torchrun
    forwards its own SIGTERM to the workers, torch/distributed/elastic/agent/server/api.py), and
    launchers escalate to SIGKILL on their own (torchrun --shutdown_timeout, default 30 s).
    """

    def __init__(self):
        self.hit, self.in_step = False, False  # in_step: a step's generation or update is in flight
        self._old = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self.hit:
            if signum == signal.SIGINT:  # Ctrl-C again: stop now
                raise KeyboardInterrupt
            return
        self.hit = True
        then = ("finishing the step in flight" if self.in_step else
                "stopping before the next step (an evaluation in flight finishes first; no update is trained)")
        print(f"\n[signal {signum}] {then}, then checkpoint and exit", file=sys.stderr, flush=True)

    def restore(self):
        for sig, old in self._old.items():
            signal.signal(sig, old)


class RunLog:
    """The files of a run directory, written by rank 0 only (other ranks hold a RunLog that writes nothing).

    config.json (run id, config, data and verifier versions, engine), metrics.jsonl (one line per
    rollout step), rollouts.jsonl (one RolloutRecord per rollout), probe_rollouts.jsonl, and
    optionally TensorBoard (RUN_DIR/tb) and Weights & Biases. A resumed run first drops the lines
    of the step that was in flight (step >= start), so every file holds each step exactly once.
    """

    FILES = ("metrics.jsonl", "rollouts.jsonl", "probe_rollouts.jsonl")

    def __init__(self, run_dir: Path, meta: dict, dist: Dist, *, start: int, tensorboard: bool, wandb_project: str):
        self.dist, self.tb, self.wb = dist, None, None
        if not dist.main:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in self.FILES:
            _truncate_jsonl(run_dir / name, lambda r: r["step"] < start)
        (run_dir / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
        self.rollouts = RolloutWriter(run_dir / "rollouts.jsonl")
        self.metrics = open(run_dir / "metrics.jsonl", "a")
        self.probes = open(run_dir / "probe_rollouts.jsonl", "a")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs `pip install tensorboard`

            self.tb = SummaryWriter(str(run_dir / "tb"))
        if wandb_project:
            import wandb  # needs `pip install wandb`

            self.wb = wandb.init(project=wandb_project, name=meta["run_id"], config=meta["config"], resume="allow")

    def scalars(self, scalars: dict, step: int) -> None:
        """Numbers to TensorBoard and W&B when asked for; the files get them regardless."""
        nums = {k: v for k, v in clean(scalars).items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        if self.tb:
            for k, v in nums.items():
                self.tb.add_scalar(k, v, step)
        if self.wb:
            self.wb.log(nums, step=step)

    def step(self, stats: dict, records: list, probe_records: list) -> None:
        """One rollout step: its rollout records, probe records and metrics line, flushed."""
        if not self.dist.main:
            return
        if probe_records:
            self.probes.write("".join(json.dumps(r) + "\n" for r in probe_records))
            self.probes.flush()
        self.rollouts.write(records)
        self.metrics.write(json.dumps(clean(stats)) + "\n")
        self.metrics.flush()
        self.scalars(stats, stats["step"])

    def close(self) -> None:
        if not self.dist.main:
            return
        for f in (self.rollouts, self.metrics, self.probes, self.tb):
            if f:
                f.close()
        if self.wb:
            self.wb.finish()


def _truncate_jsonl(path: Path, keep) -> None:
    """Keep only the lines of a JSONL file for which keep(record) is true (resume: drop the step in flight)."""
    if path.exists():
        lines = [l for l in path.read_text().splitlines() if l.strip() and keep(json.loads(l))]
        path.write_text("".join(l + "\n" for l in lines))


# --- a run's bookkeeping ----------------------------------------------------------------------------


class Run:
    """A run's bookkeeping: the step range and progress bar, records and metrics per step, the
    resource envelope, checkpoints, the wall-clock budget and SIGINT/SIGTERM, the end of the run.

    cfg: train.Config. prov: the provenance every rollout record carries (dataset, dataset_hash,
    template_hash, model_id). max_prompt_len: the longest training prompt, in tokens. state: the
    loop's counters (the non-finite streak, the held-out "before" numbers), saved with checkpoints.
    """

    def __init__(self, cfg, dist: Dist, device, run_id: str, start: int, log: RunLog, prov: dict, engine, tokenizer,
                 max_prompt_len: int, state: dict):
        self.cfg, self.dist, self.device, self.run_id, self.start, self.log = cfg, dist, device, run_id, start, log
        self.prov, self.engine, self.tokenizer, self.max_prompt_len = prov, engine, tokenizer, max_prompt_len
        self.state, self.prompts_cut = state, {}
        self.signal, self.interrupted, self.out_of_time = StopSignal(), False, False
        self.t_run = self.t_step = time.perf_counter()
        self.after_load = load_memory(device, engine)  # model, optimizer, engine and a resumed checkpoint are in memory
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # from here on the GPU peak is the run's

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """A run that ends by an exception gives the process its SIGINT/SIGTERM handlers back (a normal end
        does so in stop/finish): left installed, they would swallow the next SIGTERM of whoever called
        train.train, a test runner's pool workers forked from it included."""
        if exc_type is not None:
            self.signal.restore()
            release_run_dir(Path(self.cfg.run_dir))

    def steps(self):
        """Rollout step indices start..steps-1, with a progress bar; ends early on the time budget."""
        self.bar = tqdm(range(self.start, self.cfg.steps), disable=not self.dist.main, dynamic_ncols=True, desc="dapo",
                        initial=self.start, total=self.cfg.steps)
        self.t_run = time.perf_counter()
        for step in self.bar:
            self.t_step = time.perf_counter()
            self.last_step = step
            yield step
            if self.out_of_time:
                break

    def end_step(self, step: int, stats: dict, rollouts, batch, buffer: list, probe_records: list) -> None:
        """Timing, the resource envelope, every group that left the pipeline as rollout records, the
        metrics line; then whether a signal or the time budget ends the run after this step.

        rollouts: train.Rollouts; batch: the train.Batch trained on, or None; buffer: groups kept
        for later. Raises cli.RunStopped after --max_nonfinite_steps steps in a row whose every
        update was non-finite (a step that tried no update neither breaks nor extends such a run)."""
        cfg, generated, kept = self.cfg, rollouts.generated, rollouts.kept
        advantages = None if batch is None else batch.advantages.view(len(kept), cfg.group_size)  # (groups, G)
        now = time.time()
        for g in kept:  # the delay between generation and use (records: lag_s)
            g.lag_s = now - g.done_at
        stats["time/step"] = time.perf_counter() - self.t_step
        gen_tokens = sum(len(s.token_ids) for g in generated for s in g.samples)
        stats["perf/generated_tokens_per_s"] = gen_tokens / max(stats.get("time/generate", 0.0), 1e-9)
        stats["perf/samples_per_s"] = len(generated) * cfg.group_size / max(stats["time/step"], 1e-9)  # the pipeline's rate
        stats.update({"envelope/prompts_generated": len(generated), "envelope/samples_generated": len(generated) * cfg.group_size,
                      "envelope/active_samples": len(kept) * cfg.group_size,
                      "envelope/trained_tokens": sum(len(s.token_ids) for g in kept for s in g.samples),
                      "envelope/max_response_len": cfg.max_response_len, "envelope/max_prompt_len": self.max_prompt_len})
        stats.update(memory_metrics(self.after_load, self.device, self.dist)[0])
        records = []
        if self.dist.main:  # records of every group that left the pipeline this step: trained, thrown away, or expired
            in_buffer = {id(g) for g in buffer}
            adv_of = {id(g): advantages[i] for i, g in enumerate(kept)}
            done = list(kept) + [g for g in generated if id(g) not in adv_of and id(g) not in in_buffer] + rollouts.expired
            records = [r for g in done for r in rollout.group_records(
                g, run_id=self.run_id, learner_version=step, advantages=adv_of.get(id(g)), engine=self.engine, cfg=cfg,
                tokenizer=self.tokenizer, prov=self.prov)]
        stats["time/elapsed"] = time.perf_counter() - self.t_run  # since the loop started: curves against wall-clock
        self.log.step(stats, records, probe_records)
        if self.dist.main and step % cfg.log_every == 0 and "train/reward_mean" in stats:
            planned = {"groups": f"{len(kept)}/{cfg.prompts_per_step}"} if short_batch_planned(cfg) else {}  # trained/wanted
            self.bar.set_postfix(reward=f"{stats['train/reward_mean']:.2f}", correct=f"{stats['train/correct_frac']:.2f}",
                                 kept=f"{stats['groups/kept_frac']:.2f}", len=f"{stats['length/mean']:.0f}", **planned)
        warning = exhausted_warning(step, rollouts, cfg) if stats.get("groups/exhausted") else None
        if self.dist.main and warning:  # loudly, once per step: training on little or nothing, and not by plan
            print(warning, file=sys.stderr, flush=True)
        if self.dist.main and stats.get("rollout/degenerate_frac", 0) > cfg.degenerate_warn:
            print(f"[warning] step {step}: {stats['rollout/degenerate_frac']:.0%} of rollouts repeat one token: "
                  "the weights may be broken", file=sys.stderr, flush=True)
        self.interrupted = all_reduce_max(float(self.signal.hit), self.dist) > 0
        self.signal.in_step = False  # from here until the next step's generation, a stop comes before a step
        self.state["samples_generated"] = self.state.get("samples_generated", 0) + stats["envelope/samples_generated"]
        over = (cfg.max_seconds > 0 and time.perf_counter() - self.t_run >= cfg.max_seconds) or (
            cfg.max_samples > 0 and self.state["samples_generated"] >= cfg.max_samples)
        self.out_of_time = all_reduce_max(float(over), self.dist) > 0  # a budget of seconds or samples is spent
        if stats["policy/optimizer_steps"]:
            all_bad = stats.get("policy/nonfinite_grad_steps", 0) == stats["policy/optimizer_steps"]
            self.state["nonfinite_in_a_row"] = self.state.get("nonfinite_in_a_row", 0) + 1 if all_bad else 0
        if self.state.get("nonfinite_in_a_row", 0) >= cfg.max_nonfinite_steps:
            raise RunStopped(f"{self.state['nonfinite_in_a_row']} rollout steps in a row had only non-finite gradients (last "
                             f"at step {step}); the weights were left unchanged. Lower --lr, check the data, or raise "
                             "--max_nonfinite_steps")

    def checkpoint_due(self, step: int) -> bool:
        c = self.cfg
        return (self.interrupted or self.out_of_time or (c.save_every and (step + 1) % c.save_every == 0)
                or step + 1 == c.steps)

    def save_checkpoint(self, step: int, model, optimizer, scheduler, source_state: dict) -> None:
        """A resumable checkpoint after `step` rollout steps; source_state: the data position (and buffer)."""
        checkpoints.save_checkpoint(Path(self.cfg.run_dir), step, model, optimizer, scheduler,
                        {"run_id": self.run_id, "state": self.state, **source_state}, dataclasses.asdict(self.cfg), self.dist,
                        self.cfg.keep_checkpoints)

    def stop(self, step: int) -> dict:
        """After SIGINT/SIGTERM: the checkpoint is written; release everything and return."""
        if self.dist.main:
            print(f"[signal] checkpoint written after step {step}; resume with --resume latest", flush=True)
        return self._close({"run_id": self.run_id, "interrupted_after_step": step})

    def stop_requested(self, starting: bool = False) -> bool:
        """Whether SIGINT/SIGTERM came before the step about to start (during the held-out evaluation, or the
        probe at its start); a collective, so every rank stops at the same point. starting: the step's
        generation begins next when this is False (the signal's message then says the step is in flight)."""
        hit = all_reduce_max(float(self.signal.hit), self.dist) > 0
        self.signal.in_step = starting and not hit
        return hit

    def stop_before(self, step: int, model, optimizer, scheduler, source_state: dict) -> dict:
        """End the run before `step`, training nothing of it: a checkpoint after `step` rollout steps (the weights
        as they are, with what was done before, the held-out evaluation's "before" figures) unless `latest` is
        that one already (a resumed run stopped before its first step), then release everything."""
        root = Path(self.cfg.run_dir) / "checkpoints"
        name = f"step_{step:06d}"
        latest = (root / "latest").read_text().strip() if self.dist.main and (root / "latest").is_file() else None
        if broadcast_object(latest, self.dist) != name:
            self.save_checkpoint(step, model, optimizer, scheduler, source_state)
        if self.dist.main:
            print(f"[signal] stopped before step {step}: no update of it was trained; {root / name} holds the run so far; "
                  "resume with --resume latest", flush=True)
        return self._close({"run_id": self.run_id, "interrupted_before_step": step})

    def _close(self, out: dict) -> dict:
        self.signal.restore()
        self.log.close()
        self.release()
        return out

    def release(self) -> None:
        """The engine, then the process group, after the run's last collective. The order matters
        under torchrun with vLLM: the engine's shutdown tears down its own groups and must find
        the trainer's default group still alive (vllm_engine.VLLMEngine.close keeps it)."""
        self.engine.close()
        close_distributed(self.dist)
        release_run_dir(Path(self.cfg.run_dir))

    def finish(self, model, tokenizer, before: dict, after: dict) -> dict:
        """The trained model in HF format (RUN_DIR/final), summary.json, the before/after line."""
        cfg, run_dir = self.cfg, Path(self.cfg.run_dir)
        self.signal.restore()
        self.log.scalars(after, cfg.steps)
        summary = {"run_id": self.run_id, "steps": cfg.steps, "seconds": round(time.perf_counter() - self.t_run, 1), **before,
                   **{k.replace("heldout/", "heldout_after/"): v for k, v in after.items()}}
        if self.prompts_cut:  # --prompt_truncation left: how many prompts lost the start of their text, the first ids
            summary["prompts_cut"] = self.prompts_cut
        failure = None
        self.engine.sleep()  # colocated vLLM gives the GPU back while rank 0 gathers the whole model (no-op otherwise)
        try:
            save_hf(model, tokenizer, run_dir / "final", self.dist, {
                "run_id": self.run_id, "config": dataclasses.asdict(cfg), "verifier_version": verifier.VERSION,
                "template_hash": self.prov["template_hash"]})
        except (OSError, SafetensorError) as e:  # a full disk (safetensors reports its write errors as its own)
            failure = str(e)
        failure = first_failure(failure, self.dist)  # rank 0 writes: every rank stops with it
        if failure:
            release_run_dir(run_dir)  # the run ends here: a resume may take the directory (in this process too)
            raise RunStopped(checkpoints.final_failure(run_dir / "checkpoints", run_dir / "final", failure))
        memory, summary["memory_per_rank"] = memory_metrics(self.after_load, self.device, self.dist)  # final/ included
        summary |= memory
        if self.dist.main:
            (run_dir / "summary.json").write_text(json.dumps(clean(summary), indent=2) + "\n")
            if before and after:
                k = f"avg@{cfg.eval_k}"
                trained = after.get("heldout/trained_problems", 0)
                print(f"held-out {k}: before {before[f'heldout/{k}']:.3f} -> after {after[f'heldout/{k}']:.3f} "
                      f"({after['heldout/n_problems']} problems, {cfg.eval_k} samples each, T={cfg.eval_temperature}, "
                      f"top_p={cfg.eval_top_p}" + (f"; {trained} of them were trained on" if trained else "") + ")")
        self.log.close()
        self.release()
        return summary


# --- the run directory: one run at a time, never over another run's files ----------------------------------

LOCK = "run.lock"  # held (flock) by the run using the directory; it names its owner
RUN_FILES = ("config.json", *RunLog.FILES, "summary.json", "checkpoints", "final", "tb")  # what a run writes there
_HELD: dict[str, object] = {}  # lock file: its open file, for the run's life (this process's runs)


def claim_run_dir(cfg, dist: Dist) -> None:
    """Hold --run_dir for this run, and refuse to write over another run's files; a collective (rank 0 does it).

    The hold is an exclusive flock on RUN_DIR/run.lock, kept until the run ends. The kernel drops it
    when the process ends, however it ends (SIGKILL, a crash, a lost node), so a run that died leaves
    nothing to clean up; a pid file would need a liveness check instead, wrong across the hosts of a
    shared filesystem and after the pid is reused. The file holds the owner's pid, host and start
    time, which the refusal names. (A filesystem without locks gets a warning and no hold.)

    Unless --resume: a directory holding a run's files (RUN_FILES; other files do not count) is
    refused with one line saying what it holds and whether --resume latest continues it;
    --overwrite true replaces it (`start` removes those files when the run's own are first written).

    Raises RunStopped (on every rank).
    """
    failure = _claim(Path(cfg.run_dir), cfg) if dist.main else None
    failure = first_failure(failure, dist)
    if failure:
        raise RunStopped(failure)


def _claim(run_dir: Path, cfg) -> str | None:
    release_run_dir(run_dir)  # held still by a run of this process that ended by an exception
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        f = open(run_dir / LOCK, "a+")
    except OSError as e:
        return f"--run_dir {run_dir}: cannot write there ({e})"
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        owner = f.read().strip() or "it has not written its name yet"
        f.close()
        return (f"--run_dir {run_dir} is in use by another run ({owner}; {run_dir / LOCK}): wait for it to end, or pass "
                "another --run_dir")
    except OSError as e:  # ENOLCK, EOPNOTSUPP: a filesystem without locks
        print(f"[warning] --run_dir {run_dir}: cannot lock {LOCK} ({e}); a second run in this directory would not be "
              "refused", file=sys.stderr, flush=True)
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}, started "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC\n")
    f.flush()
    _HELD[str(run_dir.resolve() / LOCK)] = f
    found = [n for n in RUN_FILES if (run_dir / n).exists()]
    if cfg.resume or cfg.overwrite or not found:
        return None
    release_run_dir(run_dir)
    return _occupied(run_dir, found)


def _occupied(run_dir: Path, found: list[str]) -> str:
    """The refusal of a fresh run in a directory that holds a run: what it holds, and which flag continues or replaces it."""
    try:
        ckpt = checkpoints.find_checkpoint(run_dir, "latest")
    except FileNotFoundError:
        ckpt = None
    step = f"step {int(ckpt.name[5:])}" if ckpt and ckpt.name[5:].isdigit() else "its last step"
    head = f"--run_dir {run_dir} holds "
    if (run_dir / "summary.json").is_file() or (run_dir / "final" / "dapo_run.json").is_file():
        more = f", --resume latest with a larger --steps to train it further from {ckpt}" if ckpt else ""
        return (f"{head}a finished run ({', '.join(found)}), which a fresh run would write over. Pass another --run_dir"
                f"{more}, or --overwrite true to replace it")
    if ckpt:
        return (f"{head}a run that stopped after {step} ({ckpt}), which a fresh run would write over. Pass --resume latest "
                "to continue it, --overwrite true to replace it, or another --run_dir")
    return (f"{head}the files of a run that wrote no checkpoint ({', '.join(found)}), which a fresh run would write over. "
            "Pass --overwrite true to replace them, or another --run_dir")


def release_run_dir(run_dir: Path) -> None:
    """Let go of --run_dir (closing the lock file drops the flock); nothing when this process does not hold it."""
    f = _HELD.pop(str(Path(run_dir).resolve() / LOCK), None)
    if f is not None:
        f.close()


def _remove_run_files(run_dir: Path) -> None:
    """--overwrite true: the earlier run's files (RUN_FILES) go, nothing else of the directory."""
    gone = [n for n in RUN_FILES if (run_dir / n).exists()]
    for name in gone:
        if (run_dir / name).is_dir():
            shutil.rmtree(run_dir / name)
        else:
            (run_dir / name).unlink()
    if gone:
        print(f"[run] --overwrite true: removed the earlier run's {', '.join(gone)} from {run_dir}", flush=True)


def check_resume(cfg, dist: Dist) -> None:
    """With --resume: the checkpoint it names is there and undamaged (checkpoints.check_checkpoint), checked
    before the model loads (a 32B model takes minutes). Raises FileNotFoundError or CheckpointDamaged."""
    if cfg.resume:
        checkpoints.check_checkpoint(checkpoints.find_checkpoint(Path(cfg.run_dir), cfg.resume), dist)


def start(cfg, defaults, free_fields: set, model, optimizer, scheduler, engine, tokenizer, data, held_out, template_hash: str,
          dist: Dist, device) -> tuple[Run, dict | None]:
    """Resume (--resume) or start a run, and open its files.

    Resuming restores model, optimizer, scheduler and RNG states and syncs the engine to the restored
    weights. Returns (the Run, the checkpoint's trainer state, or None for a fresh run: the loop
    restores its data position, staleness buffer and counters from it).

    cfg, defaults: the run's train.Config and Config() (a field added after a checkpoint was written
    counts as its default); free_fields: fields that may change on resume.
    Raises FileNotFoundError / ValueError as find_checkpoint / load_checkpoint.
    """
    run_dir, start_step, resumed = Path(cfg.run_dir), 0, None
    run_id = cfg.run_id or f"{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%SZ}-s{cfg.seed}"
    if cfg.resume:
        ckpt = checkpoints.find_checkpoint(run_dir, cfg.resume)
        resumed = checkpoints.load_checkpoint(ckpt, model, optimizer, scheduler, dataclasses.asdict(cfg),
                                              dataclasses.asdict(defaults), free_fields, cfg.resume_allow_config_change,
                                              dist.world)
        start_step, run_id = resumed["step"], resumed["run_id"]
        rollout.sync_engine(engine, model, start_step, dist.world)
        if dist.main:
            print(f"[resume] {ckpt} at step {start_step}", flush=True)
    prov = {"dataset": data.name, "dataset_hash": data.hash, "template_hash": template_hash,
            "model_id": cfg.model or "assets/tiny-base"}
    meta = {"run_id": run_id, "config": dataclasses.asdict(cfg), "verifier_version": verifier.VERSION,
            "dataset": data.name, "dataset_hash": data.hash, "n_problems": len(data), "template_hash": template_hash,
            "world_size": dist.world, "torch": torch.__version__, "engine": f"{engine.name} {engine.version}"}
    if cfg.overwrite and dist.main:  # claim_run_dir let this fresh run replace the one in the directory
        _remove_run_files(run_dir)
    log = RunLog(run_dir, meta, dist, start=start_step, tensorboard=cfg.tensorboard, wandb_project=cfg.wandb_project)
    if dist.main:
        print(json.dumps(meta["config"]), flush=True)
        print(f"[data] {len(data)} training problems from {data.name} ({data.hash}); {len(held_out or [])} held-out, "
              f"{min(cfg.probe_size, len(held_out or [])) if cfg.probe_every else 0} in the probe set", flush=True)
        if plan_line(cfg):  # a short batch by design: said once here, not as a warning at every step
            print(plan_line(cfg), flush=True)
    run = Run(cfg, dist, device, run_id, start_step, log, prov, engine, tokenizer, max(map(len, data.prompt_ids)),
              resumed["state"] if resumed else {"nonfinite_in_a_row": 0})
    run.prompts_cut = {flag: {"count": d.info["prompts_cut"], "first": d.info.get("prompts_cut_first", [])}
                       for flag, d in (("data", data), ("eval_data", held_out)) if d and d.info.get("prompts_cut")}
    return run, resumed

