"""What the checksums of a resumable checkpoint cost (plumbing/checkpoints.py): hashing on writing and on reading.

    OMP_NUM_THREADS=1 python bench/bench_checksums.py               # the tiny policy's checkpoint and a 1 GiB one
    OMP_NUM_THREADS=1 python bench/bench_checksums.py --gib 4 --repeats 3

Two checkpoints, each written --repeats times into runs/bench/checksums:
  * the tiny policy's (assets/tiny-base with its AdamW state after one step: what `python train.py` writes),
    through checkpoints.save_checkpoint, the function a run calls, checksums included;
  * a state of --gib GiB of random fp32 tensors (256 MiB each), written by torch.distributed.checkpoint.
For each: the write alone (dcp.save), sha256 of the files written (what save_checkpoint adds), the check
before a resume (checkpoints.check_checkpoint: sizes and sha256 of every file) and the read alone (dcp.load).
Medians, in seconds, and the sha256 throughput. One process hashes every file here; under torchrun each
rank hashes its share (files r, r + world, ...), so a rank's cost is its share of the bytes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path

from common import SCRATCH_ROOT, machine_line, title_line

REPO = Path(__file__).resolve().parents[1]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="size of the large state in GiB (default 1)")
    ap.add_argument("--repeats", type=int, default=3, help="writes of each checkpoint (default 3)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import train
    from plumbing import checkpoints, policy
    from plumbing.distributed import Dist

    torch.set_num_threads(1)
    print(title_line("bench_checksums.py"))
    print(machine_line())
    out = SCRATCH_ROOT / "checksums"
    shutil.rmtree(out, ignore_errors=True)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    rows = []

    # the tiny policy's checkpoint, through the function a run calls
    model = policy.load_model("", torch.device("cpu"))
    cfg = train.Config()
    optimizer, scheduler = policy.make_optimizer(model, cfg)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's two moments exist, as in a run's checkpoint
    times = {"write": [], "write + checksums": [], "check": [], "read": []}
    for r in range(args.repeats):
        run = out / f"tiny{r}"
        sd = dict(zip(("model", "optim"), get_state_dict(model, optimizer)))  # as save_checkpoint writes them
        times["write"].append(_timed(lambda: dcp.save(sd, checkpoint_id=str(run / "plain"))))
        times["write + checksums"].append(_timed(lambda: checkpoints.save_checkpoint(
            run, 1, model, optimizer, scheduler, {}, {}, Dist(), keep=1)))
        ckpt = run / "checkpoints" / "step_000001"
        times["check"].append(_timed(lambda: checkpoints.check_checkpoint(ckpt, Dist())))
        times["read"].append(_timed(lambda: dcp.load(sd, checkpoint_id=str(ckpt))))
    size = sum(f.stat().st_size for f in (out / "tiny0" / "checkpoints" / "step_000001").iterdir())
    rows.append(("tiny policy + AdamW (save_checkpoint)", size, {k: statistics.median(v) for k, v in times.items()}))

    # a large state: DCP's write and read against hashing the same files
    n = max(1, round(args.gib * 4))  # 256 MiB tensors
    state = {f"t{i}": torch.randn(64 * 2**20) for i in range(n)}  # (64 Mi,) fp32 each
    times = {"write": [], "sha256 of the files": [], "check": [], "read": []}
    for r in range(args.repeats):
        d = out / f"large{r}"
        times["write"].append(_timed(lambda: dcp.save(state, checkpoint_id=str(d))))
        names = sorted(p.name for p in d.iterdir())
        times["sha256 of the files"].append(_timed(lambda: checkpoints._digests(d, names)))
        digests = checkpoints._digests(d, names)
        (d / checkpoints.STATE).write_text("{}\n")
        digests |= checkpoints._digests(d, [checkpoints.STATE])
        (d / checkpoints.MANIFEST).write_text(json.dumps({"sha256": {k: v[0] for k, v in digests.items()},
                                                          "bytes": {k: v[1] for k, v in digests.items()}}))
        times["check"].append(_timed(lambda: checkpoints.check_checkpoint(d, Dist())))
        times["read"].append(_timed(lambda: dcp.load(state, checkpoint_id=str(d))))
        shutil.rmtree(d)
    rows.append((f"{n * 256 / 1024:g} GiB of fp32 tensors (dcp.save)", n * 2**28, {k: statistics.median(v) for k, v in times.items()}))
    shutil.rmtree(out, ignore_errors=True)

    print(f"# medians of {args.repeats} writes; seconds; one process")
    print("| checkpoint | bytes | " + " | ".join(rows[0][2]) + " |")
    print("|---|---:|" + "---:|" * len(rows[0][2]))
    for name, nbytes, t in rows:
        print(f"| {name} | {nbytes / 2**20:.1f} MiB | " + " | ".join(f"{v:.3f}" for v in t.values()) + " |")
    name, nbytes, t = rows[-1]
    print(f"sha256: {nbytes / t['sha256 of the files'] / 2**30:.2f} GiB/s on one core (files just written, in the page cache); "
          f"the check before a resume: {nbytes / t['check'] / 2**30:.2f} GiB/s")


if __name__ == "__main__":
    main()
