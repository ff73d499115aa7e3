"""Where the sharded load's peak memory goes: each rank's peak RSS per phase of `train.py --steps 0`.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=4 bench/load_phases.py FP32_BYTES --model DIR \
        --steps 0 --eval_data= --probe_every 0 --run_dir runs/bench/load_phases

Wraps the loader's steps (plumbing/loading.py: the meta-device model, to_empty, the buffers' rebuild,
torch.distributed.checkpoint's read of the safetensors slices), then the optimizer, the run's start
and the save of final/, and around each resets Linux's high-water mark of the process
(/proc/self/clear_refs, "5"), so that VmHWM afterwards is that phase's own peak. Prints per rank and
phase, in multiples of FP32_BYTES (the fp32 model's size): RSS before, the phase's peak, RSS after,
and after it the anonymous and the file-backed parts (RssAnon: tensors; RssFile: mapped files, the
checkpoint's pages while safe_open maps it). Linux only. bench/bench_memory_plan.py --only steps0 runs it.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

import train  # noqa: E402
from plumbing import loading, policy, runlog  # noqa: E402

ROWS: list[tuple] = []


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _phase(name: str, fn, unit: float):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        before = _status()["VmRSS"]
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        out = fn(*args, **kwargs)
        s = _status()
        ROWS.append((name, before / unit, s["VmHWM"] / unit, s["VmRSS"] / unit, s["RssAnon"] / unit, s["RssFile"] / unit))
        return out
    return wrapped


def main(argv: list[str]) -> None:
    unit = float(argv[0])
    loading.meta_model = _phase("meta model + checks", loading.meta_model, unit)
    torch.nn.Module.to_empty = _phase("to_empty (shards)", torch.nn.Module.to_empty, unit)
    loading.rebuild_buffers = _phase("rebuild_buffers", loading.rebuild_buffers, unit)
    loading.dcp.load = _phase("dcp.load (slices read)", loading.dcp.load, unit)
    train.policy.make_optimizer = _phase("make_optimizer", policy.make_optimizer, unit)
    train.runlog.start = _phase("runlog.start", runlog.start, unit)
    runlog.save_hf = _phase("save_hf (final/)", runlog.save_hf, unit)
    try:
        train.main(argv[1:])
    finally:
        rank = os.environ.get("RANK", "0")
        print("\n".join(f"rank {rank} {n:24s} rss {a:.3f} -> peak {b:.3f} -> rss {c:.3f} (anon {d:.3f}, file {e:.3f})"
                        for n, a, b, c, d, e in ROWS), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
