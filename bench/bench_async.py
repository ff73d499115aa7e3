"""Generation beside the learner (--max_policy_lag, a pool of --generator_workers): speed, learning per wall-clock, the lag x objective ablation, the weight transports.

    OMP_NUM_THREADS=1 python bench/bench_async.py speed --steps 20 --repeats 3    # samples/s: inline vs lag 1, 2 workers
    OMP_NUM_THREADS=1 python bench/bench_async.py learn                           # the pool against inline, same held-out problems
    OMP_NUM_THREADS=1 python bench/bench_async.py ablation --seeds 3              # lag {0,1,2} x {naive, decoupled}, 2 workers
    OMP_NUM_THREADS=1 python bench/bench_async.py transport                       # broadcast vs shared memory, one host

Every run is `python train.py` in a fresh process with its defaults (the tiny task, full DAPO), one
torch thread per process, all processes on the cores of --cores (taskset; default: every core of
the machine, the kernel's scheduler places the processes): inline is one process, a pool is a
learner and K worker processes. After every run the script checks, by PID, that no process the
run started is left.

speed: --steps rollout steps per run, held-out evaluation and the probe off, runs alternating
inline and the pool (--lag, --workers); samples/s = samples generated / the loop's wall time
(metrics.jsonl time/elapsed), also after step 0 and over the whole process (start-up included:
the pool's workers start, import torch and transformers and take the first weights before the
loop's clock starts). Then where a step's time goes (means over steps 1..): generation (a batch's
generation wall time, on the workers), update (old log-probs + the optimizer steps), the
learner's waits (for the next batch; in publish, for the workers to finish theirs), the weight
transfer, and on the workers the weights' loading and the wait for admission.
learn: an inline run of --steps steps (its final held-out avg@4, wall time T), then a pool run
with --max_seconds --budget x T; both final models are evaluated by eval.py on the same 256
held-out problems with the same seed, and `eval.py compare` gives the paired difference (pool - inline).
ablation: for each lag in --lags and objective in --objectives, --seeds seeds, each run stopping
after --samples generated samples (--max_samples; equal generated samples, not equal steps), with
a pool of --workers (lag 0: --generator_process true, the inline loop's rollouts with --gen_shards
K); held-out avg@4 at the end (95% Student-t interval over seeds), wall time, samples/s, the
decoupled weight's diagnostics (offpolicy/*, mean over steps), and reward and pass rate of the
trained groups sliced by age (= lag in versions) beside the base policy's pass rate on the very
prompts of each age slice (avg@4 of assets/tiny-base), so that "old rollouts look better" can be
told apart from "old rollouts came from easier prompts".
transport: the two weight transports of plumbing/transport.py, side by side on one host: a learner process
and --workers worker processes, a state dict of --params random fp32 parameters (the shapes of a
small decoder of 4 layers: an embedding and attention and MLP matrices), --reps versions each sent
after every worker said READY and timed until every worker has LOADED it (the rendezvous of
plumbing/generator.py, without generation).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil

from common import SCRATCH_ROOT, machine_line, title_line
from ladder import t_interval

REPO = Path(__file__).resolve().parents[1]
SCRATCH = SCRATCH_ROOT / "async"
CORES: list[int] = []  # --cores: where every process of a run may run (taskset)


def run_train(name: str, flags: list[str]) -> Path:
    """`python train.py` with flags into SCRATCH/name, under taskset on CORES; returns the run directory
    (its process wall time in RUN/wall_s). Raises RuntimeError when it fails or leaves a process behind."""
    run = SCRATCH / name
    subprocess.run(["rm", "-rf", str(run)], check=True)
    run.mkdir(parents=True)
    cmd = ["taskset", "-c", ",".join(map(str, CORES)), sys.executable, "train.py", "--run_dir", str(run), "--run_id", name,
           *flags]
    seen: dict[int, psutil.Process] = {}
    t0 = time.perf_counter()
    with open(run.with_suffix(".log"), "w") as log:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
        while p.poll() is None:  # every process it starts (workers, multiprocessing's resource tracker), by PID
            try:
                seen.update({c.pid: c for c in psutil.Process(p.pid).children(recursive=True)})
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.2)
    (run / "wall_s").write_text(f"{time.perf_counter() - t0:.2f}\n")
    if p.returncode != 0:
        raise RuntimeError(f"train.py failed (rc {p.returncode}); see {run.with_suffix('.log')}")
    time.sleep(1)
    left = [pid for pid, c in seen.items() if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    if left:
        raise RuntimeError(f"{name}: processes {left} outlived train.py")
    return run


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def throughput(run: Path) -> tuple[float, int, float, float, float]:
    """(samples generated per second of the loop, samples, seconds, samples per second after step 0,
    samples per second of the whole process, start-up included)."""
    m = jsonl(run / "metrics.jsonl")
    samples, seconds = sum(r["envelope/samples_generated"] for r in m), m[-1]["time/elapsed"]
    steady = (samples - m[0]["envelope/samples_generated"]) / (seconds - m[0]["time/elapsed"])
    return samples / seconds, samples, seconds, steady, samples / float((run / "wall_s").read_text())


BREAKDOWN = {  # where a step's time goes: name -> metric keys summed (means over the steps 1.. that log them)
    "generation": ("time/generate",), "update": ("time/old_logprobs", "time/update"),
    "learner waits for the batch": ("async/learner_idle_s",), "learner waits in publish": ("async/publish_wait_s",),
    "weight transfer": ("async/weight_transfer_s",), "workers load weights": ("async/generator_load_s",),
    "workers wait for admission": ("async/generator_idle_s",), "step": ("time/step",)}


def breakdown(run: Path) -> dict[str, float]:
    """Mean seconds per step of each BREAKDOWN row over steps 1.., each over the steps that log it (the last
    step publishes nothing: async/publish_wait_s and async/weight_transfer_s are absent there, not 0)."""
    m = jsonl(run / "metrics.jsonl")[1:]
    means = {name: [sum(r[k] for k in keys if k in r) for r in m if any(k in r for k in keys)]
             for name, keys in BREAKDOWN.items()}
    return {name: statistics.mean(v) for name, v in means.items() if v}


def speed(args) -> None:
    flags = ["--steps", str(args.steps), "--eval_data", "", "--probe_every", "0"]
    modes = {"inline": []} | {f"lag {args.lag}, {k} worker{'s' * (k > 1)}": [
        "--max_policy_lag", str(args.lag), "--generator_workers", str(k)] for k in args.workers}
    res, steady, whole, parts = defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list)
    for rep in range(args.repeats):
        for mode, extra in modes.items():
            run = run_train(f"speed-{mode.replace(', ', '-').replace(' ', '')}-{rep}", flags + extra)
            sps, n, sec, after_step_0, process = throughput(run)
            res[mode].append(sps)
            steady[mode].append(after_step_0)
            whole[mode].append(process)
            parts[mode].append(breakdown(run))
            lag = max(r.get("async/lag", 0) for r in jsonl(run / "metrics.jsonl"))
            print(f"  run {rep} {mode}: {n} samples in {sec:.1f} s = {sps:.1f} samples/s (after step 0: {after_step_0:.1f}; "
                  f"whole process {process:.1f}), largest lag {lag}, no process left, load {os.getloadavg()[0]:.2f}",
                  flush=True)
    for name, r in (("whole loop", res), ("after step 0", steady), ("whole process", whole)):
        a = statistics.median(r["inline"])
        print(f"{name}: " + "; ".join(f"{mode} {statistics.median(r[mode]):.1f} samples/s (runs "
                                      f"{', '.join(f'{x:.1f}' for x in r[mode])})" for mode in modes) + "; "
              + ", ".join(f"{mode} / inline = {statistics.median(r[mode]) / a:.2f}x" for mode in modes if mode != "inline"))
    print("seconds per step (means over steps 1.., median over runs):")
    for mode in modes:
        names = [k for k in BREAKDOWN if all(k in p for p in parts[mode])]
        print(f"  {mode}: " + ", ".join(f"{k} {statistics.median(p[k] for p in parts[mode]):.3f}" for k in names))


def evaluate(run: Path, out: Path) -> dict:
    cmd = [sys.executable, "eval.py", "--model", str(run), "--data", "tiny", "--k", "4", "--limit", "256", "--seed", "7",
           "--greedy", "false", "--out", str(out)]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads((out / "report.json").read_text())


def learn(args) -> None:
    sync = run_train("learn-inline", ["--steps", str(args.steps), "--probe_every", "0"])
    t_sync = jsonl(sync / "metrics.jsonl")[-1]["time/elapsed"]
    budget = args.budget * t_sync
    pool = run_train("learn-pool", ["--steps", "100000", "--max_seconds", f"{budget:.1f}", "--probe_every", "0",
                                    "--max_policy_lag", str(args.lag), "--generator_workers", str(args.workers)])
    for run in (sync, pool):
        m, s = jsonl(run / "metrics.jsonl"), json.loads((run / "summary.json").read_text())
        print(f"  {run.name}: {len(m)} steps, {sum(r['envelope/samples_generated'] for r in m)} samples, loop "
              f"{m[-1]['time/elapsed']:.1f} s, whole process {float((run / 'wall_s').read_text()):.1f} s; train.py's "
              f"held-out avg@4 {s['heldout/avg@4']:.3f} -> {s['heldout_after/avg@4']:.3f}")
    a, b = evaluate(pool, SCRATCH / "eval-pool"), evaluate(sync, SCRATCH / "eval-inline")
    reports = [str((SCRATCH / name / "report.json").relative_to(REPO)) for name in ("eval-pool", "eval-inline")]
    out = subprocess.run([sys.executable, "eval.py", "compare", *reports], cwd=REPO, capture_output=True, text=True, check=True)
    print(f"inline: {args.steps} steps in {t_sync:.1f} s; lag {args.lag} with {args.workers} workers given {budget:.1f} s "
          f"({args.budget}x): eval.py avg@4 pool {a['metrics']['avg@4']:.3f}, inline {b['metrics']['avg@4']:.3f}")
    print(out.stdout.strip())


def age_slices(run: Path) -> dict[int, dict]:
    """Trained groups by age: reward, correct fraction, and their prompt ids."""
    out: dict[int, dict] = defaultdict(lambda: {"reward": [], "correct": [], "prompts": set()})
    for r in jsonl(run / "rollouts.jsonl"):
        if r["kept"] and r["advantage"] is not None:
            s = out[r["lag_versions"]]
            s["reward"].append(r["reward"])
            s["correct"].append(float(r["correct"]))
            s["prompts"].add(r["prompt_id"])
    return out


def base_pass_rates(prompt_ids: set[str], seed: int = 11) -> dict[str, float]:
    """avg@4 of the base policy (assets/tiny-base) on each of these training prompts."""
    import torch

    import eval as ev
    import train
    from plumbing import policy
    from rollout import HFEngine, SamplingParams
    from task import Dataset
    from tasks.tiny import TinyTask

    torch.set_num_threads(1)
    cfg = train.Config()
    model, tok = policy.load_policy("", torch.device("cpu"))
    task = TinyTask()
    data = task.load("tiny", tok, cfg, held_out=False)
    idx = [i for i, p in enumerate(data.problems) if p.id in prompt_ids]
    sub = Dataset([data.problems[i] for i in idx], [data.prompt_ids[i] for i in idx], data.name, data.hash)
    params = SamplingParams(n=4, max_new_tokens=cfg.max_response_len, temperature=1.0, top_p=1.0, seed=seed)
    res = ev.evaluate(HFEngine(model, tok, return_logprobs=False), tok, sub, params, cfg, task, n_boot=1)
    return {r["id"]: r["accuracy"] for r in res["per_problem"]}


def ablation(args) -> None:
    rows, slices = [], {}
    for seed in range(args.seeds):
        for lag in args.lags:
            for obj in args.objectives:
                name = f"abl-lag{lag}-{obj}-s{seed}"
                run = run_train(name, ["--steps", "100000", "--max_samples", str(args.samples), "--seed", str(seed),
                                       "--probe_every", "0", "--max_policy_lag", str(lag), "--offpolicy_objective", obj,
                                       "--generator_process", "true", "--generator_workers", str(args.workers)])
                m, s = jsonl(run / "metrics.jsonl"), json.loads((run / "summary.json").read_text())
                sps, n, sec, _, _ = throughput(run)
                diag = {k: statistics.mean(r[k] for r in m if k in r) for k in
                        ("offpolicy/weight_mean", "offpolicy/weight_min", "offpolicy/weight_max", "offpolicy/over_cap_frac",
                         "offpolicy/ess", "offpolicy/kl_k3") if any(k in r for r in m)}
                rows.append({"lag": lag, "objective": obj, "seed": seed, "acc": s["heldout_after/avg@4"],
                             "base": s["heldout/avg@4"], "samples": n, "seconds": sec, "sps": sps, "steps": len(m), **diag})
                slices[name] = age_slices(run)
                print(f"  {name}: {len(m)} steps, {n} samples, {sec:.0f} s, held-out avg@4 {s['heldout_after/avg@4']:.3f}",
                      flush=True)
    prompts = set().union(*(s["prompts"] for sl in slices.values() for s in sl.values()))
    base = base_pass_rates(prompts)
    out = [f"| lag | objective | held-out avg@4 (95% CI over {args.seeds} seeds) | samples | wall s | samples/s | "
           "weight mean / min / max | over cap | ESS | KL k3 | by age: reward, pass rate, base pass rate of those prompts |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for lag in args.lags:
        for obj in args.objectives:
            rs = [r for r in rows if r["lag"] == lag and r["objective"] == obj]
            mean, lo, hi = t_interval([r["acc"] for r in rs])
            ci = f"{mean:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None else f"{mean:.3f}"
            f = lambda k, nd=3: f"{statistics.mean(r[k] for r in rs):.{nd}f}" if all(k in r for r in rs) else "-"  # noqa: E731
            ages = defaultdict(lambda: {"reward": [], "correct": [], "prompts": []})
            for r in rs:
                for age, s in slices[f"abl-lag{lag}-{obj}-s{r['seed']}"].items():
                    ages[age]["reward"] += s["reward"]
                    ages[age]["correct"] += s["correct"]
                    ages[age]["prompts"] += [base[p] for p in s["prompts"]]
            by_age = "; ".join(f"age {a}: {statistics.mean(v['reward']):.2f}, {statistics.mean(v['correct']):.2f}, "
                               f"{statistics.mean(v['prompts']):.2f} ({len(v['reward']) // 8} groups)"
                               for a, v in sorted(ages.items()))
            out.append(f"| {lag} | {obj} | {ci} | {f('samples', 0)} | {f('seconds', 0)} | {f('sps', 1)} | "
                       f"{f('offpolicy/weight_mean')} / {f('offpolicy/weight_min')} / {f('offpolicy/weight_max')} | "
                       f"{f('offpolicy/over_cap_frac')} | {f('offpolicy/ess')} | {f('offpolicy/kl_k3', 4)} | {by_age} |")
    table = "\n".join(out)
    print(table)
    (SCRATCH / "ablation.md").write_text(table + "\n")
    (SCRATCH / "ablation.json").write_text(json.dumps(rows, indent=2) + "\n")


def _transport_worker(spec: dict, handles: tuple, control_t, port: int | None, c: int, reps: int) -> None:
    """A worker of `transport`: receive versions 0..reps-1 into a state dict of zeros, as plumbing/generator.py does."""
    import datetime

    import torch
    import torch.distributed as tdist

    from plumbing import transport

    torch.set_num_threads(1)
    control = transport.Control(control_t)
    own = {name: torch.zeros(shape, dtype=dtype) for name, dtype, shape in spec["layout"]}
    store = None if port is None else tdist.TCPStore("127.0.0.1", port, is_master=False,
                                                      timeout=datetime.timedelta(seconds=60))
    weights = transport.worker_end(spec, handles, control, store, c, torch.device("cpu"), 60.0)
    for v in range(reps):
        control.set_ready(c, v)
        weights.receive(own, v, lambda: None)
        control.set_loaded(c, v)


def transport_bench(args) -> None:
    import datetime

    import torch
    import torch.distributed as tdist
    import torch.multiprocessing as mp

    from plumbing import transport

    torch.set_num_threads(1)
    for params in args.params:
        # a decoder of 4 layers: attention 4 h x h, MLP 3 h x 2.75h, two norms; an embedding of 16h x h
        layers, hidden = 4, max(16, round((params / 65) ** 0.5 / 16) * 16)
        inter, vocab = round(2.75 * hidden), 16 * hidden
        gen = torch.Generator().manual_seed(0)
        state = {"embed.weight": torch.randn(vocab, hidden, generator=gen)}  # (V, h)
        for i in range(layers):
            for m in ("q", "k", "v", "o"):
                state[f"layers.{i}.attn.{m}.weight"] = torch.randn(hidden, hidden, generator=gen)  # (h, h)
            for m in ("gate", "up", "down"):
                shape = (hidden, inter) if m == "down" else (inter, hidden)
                state[f"layers.{i}.mlp.{m}.weight"] = torch.randn(*shape, generator=gen)  # (2.75h, h) or (h, 2.75h)
            state[f"layers.{i}.norm1.weight"] = state[f"layers.{i}.norm2.weight"] = torch.ones(hidden)  # (h,)
        n = sum(t.numel() for t in state.values())
        mib = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
        for kind in ("broadcast", "shared_memory"):
            ctx = mp.get_context("spawn")
            control = transport.Control.create(args.workers)
            spec = transport.make_spec(kind, state, 16, args.workers)
            store = None
            if kind == "broadcast":
                store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=60))
            weights = transport.learner_end(spec, control, ctx, store, torch.device("cpu"), 60.0)
            procs = [ctx.Process(target=_transport_worker, args=(spec, weights.handles(), control.t,
                                                                 store.port if store else None, c, args.reps))
                     for c in range(args.workers)]
            for p in procs:
                p.start()
            times = []
            for v in range(args.reps):
                while not all(control.ready(c) == v for c in range(args.workers)):
                    time.sleep(transport.POLL_S)
                t0 = time.perf_counter()
                weights.send(v, torch.zeros(16, dtype=torch.float64), state.items(), lambda: None)
                while not all(control.loaded(c) == v for c in range(args.workers)):
                    time.sleep(transport.POLL_S)
                times.append(time.perf_counter() - t0)
            for p in procs:
                p.join(60)
            steady = times[1:] or times  # version 0 of broadcast also makes the group
            print(f"  {n / 1e6:.1f}M parameters ({mib:.0f} MiB, {len(state)} tensors), {args.workers} workers, {kind}: "
                  f"first {times[0]:.3f} s, then median {statistics.median(steady):.3f} s "
                  f"(min {min(steady):.3f}, max {max(steady):.3f}) = {mib / statistics.median(steady):.0f} MiB/s per worker",
                  flush=True)


def main() -> None:
    global CORES
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", type=int, nargs="+", default=sorted(os.sched_getaffinity(0)),
                    help="cores every process of a run may use (taskset); default: all of them")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--steps", type=int, default=20, help="rollout steps per run")
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--lag", type=int, default=1)
    s.add_argument("--workers", type=int, nargs="+", default=[2], help="pool sizes to run beside inline")
    le = sub.add_parser("learn")
    le.add_argument("--steps", type=int, default=100, help="rollout steps of the inline run (train.py's default)")
    le.add_argument("--budget", type=float, default=0.7, help="the pool's wall-clock, as a fraction of the inline run's")
    le.add_argument("--lag", type=int, default=1)
    le.add_argument("--workers", type=int, default=2)
    ab = sub.add_parser("ablation")
    ab.add_argument("--lags", type=int, nargs="+", default=[0, 1, 2])
    ab.add_argument("--objectives", nargs="+", default=["naive", "decoupled"])
    ab.add_argument("--seeds", type=int, default=3)
    ab.add_argument("--samples", type=int, default=8000, help="generated samples per run (--max_samples)")
    ab.add_argument("--workers", type=int, default=2)
    tr = sub.add_parser("transport")
    tr.add_argument("--params", type=float, nargs="+", default=[1.2e6, 1e8], help="parameters of each state dict")
    tr.add_argument("--workers", type=int, default=2)
    tr.add_argument("--reps", type=int, default=6)
    args = ap.parse_args()
    CORES = args.cores
    SCRATCH.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    import torch
    print(title_line(f"bench_async {args.cmd}"))
    print(machine_line(f"; python {sys.version.split()[0]}, torch {torch.__version__}; settings: {vars(args)}; every "
                       f"process of a run on cores {','.join(map(str, CORES))} (taskset), one torch thread each"), flush=True)
    t0 = time.time()
    {"speed": speed, "learn": learn, "ablation": ablation, "transport": transport_bench}[args.cmd](args)
    print(f"# {time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
