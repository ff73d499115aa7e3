"""The memory plan (bench/memory_plan.py) against measurement: CPU runs of train.py on 1, 2 and 4 gloo ranks, per-rank peaks side by side.

    OMP_NUM_THREADS=1 python bench/bench_memory_plan.py            # all (needs ~9 GiB of RAM at once; 18 min on 2 cores)
    OMP_NUM_THREADS=1 python bench/bench_memory_plan.py --worlds 1 2 --models tiny   # a part
    OMP_NUM_THREADS=1 python bench/bench_memory_plan.py --only steps0            # the loading measurement only
    python bench/bench_memory_plan.py --only count                               # the activation formula, counted

Models: the shipped tiny policy (assets/tiny-base) and a random Qwen2-style model of 277M
parameters (16 layers, hidden 1024, MLP 4096, 16 query / 4 key-value heads, vocabulary 32768,
tied embeddings), saved as bf16 safetensors with the tiny tokenizer beside it, built once under
runs/bench/. For each model, number of ranks and forward layout (--layouts: the default padded
rows with the shared prompt pass, the padded pass without it, the packed row), train.py runs 2
steps (JOB_FLAGS: one micro-batch of 16/ranks responses of up to 16 tokens per rank; no dynamic
sampling, since the random model answers nothing right; the second step is the first with
AdamW's moments) and its summary.json gives each rank's peak RSS (VmHWM) after loading and over
the whole run; the plan is run with the same flags (--device cpu, --prompt_len the longest
training prompt) and its predicted peaks are printed beside them, with the ratio. The target:
every predicted peak within 25% of the measured one. --reuse takes the measured figures from the
run directories of an earlier compare with the same flags (each job's config.json is checked)
and only runs the plan again. `steps0` is the loading measurement: 4 ranks,
`--steps 0`, GNU time's max RSS of each rank, the 277M model's job minus the tiny model's, in
multiples of the fp32 model (the ranks that do not write final/ must stay at or below 0.5x), then
each rank's peak per phase of the same job (bench/load_phases.py).
`count` counts the bytes forward.logprobs's passes save for backward (torch.autograd.graph.saved_tensors_hooks),
per decoder layer and outside the layers, for each layout, fp32 and bf16, with and without
activation checkpointing, and prints them beside the plan's formulas.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import SCRATCH_ROOT, machine_line, title_line

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import memory_plan  # noqa: E402  (bench/ is on sys.path: this script's folder)

GiB = 2**30
TINY = REPO / "assets" / "tiny-base"
RANDOM_SHAPE = dict(vocab_size=32768, hidden_size=1024, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=16,
                    num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=512)
JOB_FLAGS = ["--steps", "2", "--eval_data=", "--probe_every", "0", "--group_size", "4", "--prompts_per_step", "4",
             "--gen_prompts_per_round", "4", "--mini_batch_size", "16", "--micro_batch_size", "16", "--max_response_len", "16",
             "--overlong_buffer", "4", "--dynamic_sampling", "false", "--lr", "1e-5", "--task_args", '{"train_size": 2000}']
# The forward layouts (forward.logprobs), by train.py's flags: the default, and the two others.
LAYOUTS = {"shared": [], "padded": ["--share_prompt_forward", "false"], "packed": ["--pack_micro_batches", "true"]}


def build_random_model(out: Path, shape: dict | None = None) -> Path:
    """A Qwen2 model of `shape` (default RANDOM_SHAPE) with random weights, saved as bf16 safetensors with
    the tiny tokenizer (once)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    config = Qwen2Config(**(shape or RANDOM_SHAPE), eos_token_id=1, pad_token_id=0, bos_token_id=None)
    model = AutoModelForCausalLM.from_config(config)
    model.to(torch.bfloat16).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / f, out / f)
    return out


def longest_prompt(flags: list[str]) -> int:
    """The longest training prompt of the tiny data, in tokens (what the plan is told as --prompt_len)."""
    from plumbing import policy
    import train
    from task import Task

    cfg = train.parse_config(flags)
    data, _ = train.load_data(cfg, Task(), policy.load_tokenizer(""))
    return max(map(len, data.prompt_ids))


def run_job(model: Path, world: int, run_dir: Path, flags: list[str], live: bool = False) -> list[dict]:
    """train.py on `world` ranks (plain python for 1); each rank's memory figures from its summary.json.

    live: run with MALLOC_MMAP_THRESHOLD_=65536, so glibc returns every freed tensor of 64 KiB or more
    to the kernel at once and the RSS follows the live tensors (by default glibc keeps freed blocks
    under 32 MiB for reuse, and the peak RSS includes whatever it kept).
    """
    shutil.rmtree(run_dir, ignore_errors=True)
    launch = [sys.executable] if world == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  f"--nproc_per_node={world}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"MALLOC_MMAP_THRESHOLD_": "65536"} if live else {})}
    out = subprocess.run([*launch, "train.py", "--model", str(model), "--run_dir", str(run_dir), *flags], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"train.py on {world} ranks failed:\n{out.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())["memory_per_rank"]


def earlier_job(model: Path, world: int, run_dir: Path, flags: list[str]) -> list[dict]:
    """run_job's figures from the run directory an earlier compare left. Raises ValueError if that job ran
    other settings (its config.json differs from train.py's parse of the flags) or did not finish."""
    import train

    # through JSON, as config.json was written (tuples become lists)
    want = json.loads(json.dumps(dataclasses.asdict(train.parse_config(["--model", str(model), "--run_dir", str(run_dir),
                                                                         *flags]))))
    cfg_file, summary = run_dir / "config.json", run_dir / "summary.json"
    if not (cfg_file.is_file() and summary.is_file()):
        raise ValueError(f"--reuse: {run_dir} has no finished job (config.json and summary.json); run without --reuse")
    got = json.loads(cfg_file.read_text())["config"]
    ranks = json.loads(summary.read_text())["memory_per_rank"]
    diff = sorted(k for k in want if got.get(k, want[k]) != want[k])
    if diff or len(ranks) != world:
        raise ValueError(f"--reuse: the job in {run_dir} ran other settings ({', '.join(diff) or f'{len(ranks)} ranks'}); "
                         "run without --reuse")
    return ranks


def predict(model: Path, world: int, prompt_len: int, flags: list[str], device: str = "cpu", extra=()) -> dict:
    """The plan's per-rank figures (GiB) for the job: {"rank 0": {"host": {phase: GiB}, "gpu": ...}, "other ranks": ...}."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        out = memory_plan.main(["--model_config", str(model), "--device", device, "--gpus", str(world), "--prompt_len",
                                str(prompt_len), *extra, *flags])
    return out["per_rank"]


def compare(args, random_model: Path) -> None:
    """Each model x number of ranks x layout: run the job, run the plan, print both per rank, layouts side by side."""
    prompt_len = longest_prompt(JOB_FLAGS)
    layouts = "; ".join(f"{k}: {' '.join(LAYOUTS[k]) or 'the defaults'}" for k in args.layouts)
    print(f"# jobs: train.py {' '.join(JOB_FLAGS)}, + per layout ({layouts}); longest prompt {prompt_len} tokens")
    print("# measured: each rank's peak RSS (summary.json memory_per_rank), the jobs run with "
          + ("glibc's default allocator (freed blocks under 32 MiB kept for reuse)" if args.default_malloc else
             "MALLOC_MMAP_THRESHOLD_=65536 (freed tensors go back to the kernel: RSS follows the live tensors the plan "
             "counts; --default_malloc measures with glibc's default)"))
    print("# GiB; per layout: plan's peak, measured peak, plan/measured, the plan's peak phase; load from the first layout's run")
    print(f"{'model':>6} {'ranks':>5} {'rank':>4} | {'load plan':>9} {'meas.':>5} | "
          + " | ".join(f"{k + ': plan':>12} {'meas.':>5} {'ratio':>5} {'phase':>12}" for k in args.layouts))
    worst = 0.0
    for name in args.models:
        model = TINY if name == "tiny" else random_model
        for world in args.worlds:
            rows = {}
            for layout in args.layouts:
                flags = JOB_FLAGS + LAYOUTS[layout]
                run_dir = SCRATCH_ROOT / "memory_plan" / f"{name}-{world}-{layout}"
                measured = (earlier_job(model, world, run_dir, flags) if args.reuse else
                            run_job(model, world, run_dir, flags, live=not args.default_malloc))
                plan = predict(model, world, prompt_len, flags)
                for r in measured:
                    p = plan["rank 0" if r["rank"] == 0 else "other ranks"]["host"]
                    peak, phase = max(p.values()), max(p, key=p.get)
                    worst = max(worst, abs(peak / r["host_peak_gib"] - 1))
                    rows.setdefault(r["rank"], [f"{p['load']:>9.2f} {r['host_load_gib']:>5.2f}"]).append(
                        f"{peak:>12.2f} {r['host_peak_gib']:>5.2f} {peak / r['host_peak_gib']:>5.2f} {phase:>12}")
            for rank, cells in rows.items():
                print(f"{name:>6} {world:>5} {rank:>4} | " + " | ".join(cells), flush=True)
    print(f"largest |plan/measured - 1| of the peaks: {worst:.0%} (target <= 25%)")


def steps0(random_model: Path) -> None:
    """The loading measurement of the task: 4 ranks, --steps 0, GNU time per rank, the 277M job minus the tiny job."""
    import torch
    from safetensors import safe_open

    fp32 = 0
    with safe_open(str(random_model / "model.safetensors"), framework="pt") as f:
        fp32 = sum(4 * torch.Size(f.get_slice(k).get_shape()).numel() for k in f.keys())
    rss = {}
    for name, model in (("random", random_model), ("tiny", TINY)):
        run_dir = SCRATCH_ROOT / "memory_plan" / f"steps0-{name}"
        shutil.rmtree(run_dir, ignore_errors=True)
        timing = run_dir.parent / f"steps0-{name}.time"
        timing.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "--no-python",
               "/usr/bin/time", "-a", "-o", str(timing), "-f", "maxrss_kb %M", sys.executable, "train.py", "--model",
               str(model), "--steps", "0", "--eval_data=", "--probe_every", "0", "--run_dir", str(run_dir)]
        out = subprocess.run(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                             timeout=3600)
        if out.returncode != 0:
            raise RuntimeError(f"--steps 0 job failed:\n{out.stderr[-3000:]}")
        rss[name] = sorted(int(line.split()[1]) * 1024 for line in timing.read_text().splitlines())  # bytes, per rank
        per_rank = json.loads((run_dir / "summary.json").read_text())["memory_per_rank"]
        print(f"# {name}: GNU time maxrss per rank (sorted) {[round(x / GiB, 3) for x in rss[name]]} GiB; "
              f"summary.json per rank {[r['host_peak_gib'] for r in per_rank]} GiB")
    base = max(rss["tiny"])
    print(f"fp32 model {fp32 / GiB:.3f} GiB; each rank minus the tiny job's largest, in fp32 models: "
          + ", ".join(f"{(x - base) / fp32:.2f}x" for x in rss["random"])
          + " (the largest is rank 0, which writes final/; target for the others <= 0.50x)")
    run_dir = SCRATCH_ROOT / "memory_plan" / "steps0-phases"
    shutil.rmtree(run_dir, ignore_errors=True)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                          "bench/load_phases.py", str(fp32), "--model", str(random_model), "--steps", "0", "--eval_data=",
                          "--probe_every", "0", "--run_dir", str(run_dir)], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"bench/load_phases.py failed:\n{out.stderr[-3000:]}")
    print("# where each rank's peak goes (bench/load_phases.py; multiples of the fp32 model, the process's own memory "
          "included):\n" + "\n".join(sorted(line for line in out.stdout.splitlines() if line.startswith("rank "))))


def count() -> None:
    """Bytes saved for backward by forward.logprobs's passes, counted, beside the plan's formulas: per decoder
    layer (a 2-layer model minus a 1-layer one) and outside the layers, per layout, dtype and checkpointing."""
    import types

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from plumbing import forward
    from plumbing import policy

    shape = dict(RANDOM_SHAPE, vocab_size=1000)
    s = memory_plan.Shape("", 0, 0, 0, 0, 0, 1, shape["hidden_size"], shape["intermediate_size"],
                          shape["num_attention_heads"], 256, 1000, True, shape["hidden_size"] // shape["num_attention_heads"])
    b_rows, group, P, T = 8, 4, 24, 40  # two groups; ragged lengths, so every pass of several rows is padded
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 1000, (P - 3 * g,), generator=gen).tolist() for g in range(b_rows // group)]
    batch = forward.Responses([prompts[i // group] for i in range(b_rows)],
                              [torch.randint(2, 1000, (T - i % 3,), generator=gen).tolist() for i in range(b_rows)],
                              torch.ones(b_rows))

    def saved(model, inputs, cfg) -> int:
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen = {}

        def pack(x):
            if x.untyped_storage().data_ptr() not in params:
                seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            forward.logprobs(model, inputs, cfg)
        return sum(seen.values())

    print(f"# count: {b_rows} responses of {T - 2}-{T} tokens in {b_rows // group} groups, prompts of {P - 3}-{P} tokens, "
          f"hidden {s.hidden}, MLP {s.inter}, {s.heads} heads; bytes saved for backward")
    for dtype, b in ((torch.float32, 4), (torch.bfloat16, 2)):
        for ckpt in (False, True):
            models = []
            for layers in (1, 2):
                torch.manual_seed(0)
                model = AutoModelForCausalLM.from_config(Qwen2Config(**{**shape, "num_hidden_layers": layers}), dtype=dtype)
                policy.set_activation_checkpointing(model, ckpt)
                models.append(model.train())
            for layout in ("padded", "shared", "packed"):
                if ckpt and layout == "shared":
                    continue  # no KV cache under checkpointing: forward.logprobs runs the padded pass
                cfg = types.SimpleNamespace(temperature=1.0, logprob_chunk=64, share_prompt_forward=layout == "shared")
                inputs = forward.micro_batch(batch, list(range(b_rows)), 0, "cpu", packed=layout == "packed")
                one, two = (saved(mdl, inputs, cfg) for mdl in models)
                m = memory_plan.Micro(layout, b_rows, b_rows // group, inputs.prompt_len, inputs.real.shape[1],
                                      int(inputs.tokens.numel()), int(inputs.input_ids.numel()))
                per_layer = m.L * s.hidden * b if ckpt else memory_plan.layer_saved(s, b, m, False)[0]
                emb, _, kept, _ = memory_plan.outside_saved(s, b, m, False)
                # checkpointed: the rotary cos/sin are the layers' arguments, held by the checkpoint, not saved tensors
                rotary = m.L * 2 * s.head_dim * b if ckpt else 0
                print(f"{str(dtype):>15} {layout:>6} {'checkpointed' if ckpt else '':>12}: per layer counted {two - one:>9} "
                      f"formula {per_layer:>9.0f}; outside the layers counted {2 * one - two:>8} formula {emb + kept - rotary:>8.0f}"
                      + (f" (+ cos/sin {rotary}, held as arguments)" if ckpt else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--models", nargs="+", choices=("tiny", "random"), default=["tiny", "random"])
    ap.add_argument("--layouts", nargs="+", choices=tuple(LAYOUTS), default=["shared", "packed"],
                    help="compare: the forward layouts to run (shared: the default; padded: --share_prompt_forward false; "
                         "packed: --pack_micro_batches true)")
    ap.add_argument("--only", choices=("compare", "steps0", "count"), default="")
    ap.add_argument("--default_malloc", action="store_true", help="compare: measure with glibc's default allocator")
    ap.add_argument("--reuse", action="store_true",
                    help="compare: the measured figures of an earlier compare's run directories; only the plan runs again")
    args = ap.parse_args()
    print(title_line("bench_memory_plan"))
    print(machine_line())
    random_model = build_random_model(SCRATCH_ROOT / "memory_plan" / "random-277m")
    if args.only in ("", "count"):
        count()
    if args.only in ("", "compare"):
        compare(args, random_model)
    if args.only in ("", "steps0"):
        steps0(random_model)


if __name__ == "__main__":
    main()
