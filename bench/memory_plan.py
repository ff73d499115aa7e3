"""Memory plan of a train.py run: every term per GPU and per host, with its arithmetic; does it fit, and if not which flag to change.

    python bench/memory_plan.py --model_config qwen2.5-32b --preset paper --gpus 8 --nodes 1 --engine vllm \
        --vllm_tp 8 --activation_checkpointing true --cpu_offload true --micro_batch_tokens 22528
    python bench/memory_plan.py --model_config DIR --device cpu --gpus 4 [train.py flags]   # CPU processes (gloo)

--model_config: a model directory (its config.json) or a built-in config, copied from the public
config.json files: qwen2.5-7b, qwen2.5-32b (no download). Every other flag is train.py's (same
presets, same checks, for --gpus x --nodes processes). The parameter counts are exact (the model is
built on the meta device); everything else is arithmetic on the shapes, per rank, in each phase of a
step, and the peak is the largest phase:

  load      each rank's fp32 shard, read from its slices of the files (plumbing.load_model)
  generate  the sampler: transformers generate on the FSDP2 model (KV cache, and with
            --sampler_logprobs every step's logits), or vLLM's --vllm_gpu_memory_utilization share
  train     forward + backward of the largest micro-batch, at the start of backward
  step      gradient clip and AdamW
  sync      weights streamed to vLLM one gathered tensor at a time (rollout.stream_weights)
  final     rank 0 gathers the whole model to write final/ (loading.gather_on_rank0)

Activation bytes per token and decoder layer were counted from the tensors transformers 5.24's
Qwen2 layer (sdpa attention) saves for backward, with torch.autograd.graph.saved_tensors_hooks
(bench/bench_memory_plan.py --count prints the count beside the formula): two float32 H-sized
tensors inside the RMSNorms, plus in the compute dtype b: 8 H + 4 I + t (the padded path's
attention mask, expanded per layer) with a mask, 6.5 H + 4 I + 2 kv without one (packed rows).
The shared prompt pass (--share_prompt_forward) is planned as the plain pass, an upper bound.

--forward picks the log-prob pass: packed-hidden (micro-batches of --micro_batch_tokens real
tokens, log-probs from the hidden states by a chunked head: no (positions, vocab) tensor) or
padded-logits (padded micro-batches and the full logits of the response positions, the pass of
plumbing.forward_logprobs before the chunked head). Sizes are GiB (2^30 bytes). GPU figures are what
torch's allocator holds (torch.cuda.max_memory_allocated); --gpu_reserve_gib is kept free for the
CUDA context, NCCL and fragmentation. Figures for GPUs are arithmetic, not measurements (the CPU
ones are checked against measurement by bench/bench_memory_plan.py; bench/gpu_check.sh checks a GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import cli  # noqa: E402
import train  # noqa: E402

GiB = 2**30
# Public config.json of the Qwen2.5 base models (huggingface.co/Qwen/Qwen2.5-7B, Qwen/Qwen2.5-32B), the fields that set shapes.
BUILTIN = {
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, max_position_embeddings=131072,
                       tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen2.5-32b": dict(model_type="qwen2", hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                        num_attention_heads=40, num_key_value_heads=8, vocab_size=152064, max_position_embeddings=131072,
                        tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-5),
}
# Host memory of one rank before any model: python, torch, transformers, gloo, the tokenised tiny data
# (measured on CPU: the tiny model's run peaks at 0.43-0.45 GiB per rank, its own weights 5 MB).
CPU_RUNTIME_GIB = 0.44
GPU_HOST_RUNTIME_GIB = 5.0  # a CUDA process: the CUDA libraries and context on the host (an allowance)


# --- the model's shapes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """Exact parameter counts of a causal LM (from its meta-device build) and the shapes activations use."""

    name: str
    params: int  # every parameter once (tied ones once)
    root: int  # parameters outside the decoder layers: embeddings, output head (untied), final norm
    layer: int  # parameters of the largest decoder layer
    largest: int  # elements of the largest tensor
    file_bytes: int  # the checkpoint's size (bf16 for built-ins)
    layers: int
    hidden: int
    inter: int
    heads: int
    kv: int  # key/value width: kv heads x head dim
    vocab: int
    tied: bool


def model_shape(spec: str) -> Shape:
    """Shape of a built-in name or a model directory. Raises FileNotFoundError for neither."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec in BUILTIN:
        config, name = AutoConfig.for_model(**BUILTIN[spec]), spec
    elif (Path(spec) / "config.json").is_file():
        config, name = AutoConfig.from_pretrained(spec), Path(spec).name
    else:
        raise FileNotFoundError(f"--model_config {spec!r}: neither a built-in ({', '.join(BUILTIN)}) nor a directory "
                                "with a config.json")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    params = sum(p.numel() for p in model.parameters())
    layer = max(sum(p.numel() for p in m.parameters()) for m in layers)
    files = list(Path(spec).glob("*.safetensors")) if spec not in BUILTIN else []
    c = config.get_text_config()
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return Shape(name, params, params - sum(sum(p.numel() for p in m.parameters()) for m in layers), layer,
                 max(p.numel() for p in model.parameters()), sum(f.stat().st_size for f in files) or 2 * params,
                 len(layers), c.hidden_size, c.intermediate_size, c.num_attention_heads,
                 c.num_key_value_heads * head_dim, c.vocab_size, bool(getattr(c, "tie_word_embeddings", False)))


# --- terms ----------------------------------------------------------------------------------------------


@dataclass
class Term:
    """One line of the plan: what holds memory, the arithmetic, its bytes, and where (gpu or host)."""

    what: str
    arithmetic: str
    bytes: float
    where: str = "gpu"  # gpu | host (on --device cpu everything is host)


def n(x: float) -> str:
    """A count for the arithmetic column: 32.76B, 778.6M, 22528."""
    for unit, div in (("B", 1e9), ("M", 1e6)):
        if x >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:g}"


@dataclass(frozen=True)
class Setup:
    """What the plan needs besides the model: the run's config and where it runs."""

    cfg: train.Config
    ranks: int
    ranks_per_node: int
    device: str  # gpu | cpu
    forward: str  # packed-hidden | padded-logits
    prompt_len: int  # the longest prompt, tokens
    gpu_gib: float
    gpu_reserve_gib: float
    host_gib: float
    runtime_gib: float

    @property
    def b(self) -> int:  # bytes of the compute dtype: bf16 under FSDP2 mixed precision (--bf16, GPU, >1 rank), else fp32
        return 2 if self.device == "gpu" and self.cfg.bf16 and self.ranks > 1 else 4

    @property
    def engine(self) -> str:
        e = self.cfg.engine
        return ("vllm" if self.device == "gpu" else "hf") if e == "auto" else e


def micro_batch(s: Setup) -> tuple[int, int, int, str]:
    """(rows, tokens, response positions, arithmetic) of the largest micro-batch one rank trains on."""
    c, seq = s.cfg, s.prompt_len + s.cfg.max_response_len
    per_rank = max(1, c.mini_batch_size // s.ranks)  # responses of a mini-batch on one rank
    if s.forward == "packed-hidden":
        budget = c.micro_batch_tokens if c.micro_batch_tokens > 0 else c.micro_batch_size * seq
        rows = max(1, min(per_rank, budget // seq))
        return rows, max(seq, rows * seq), rows * c.max_response_len, f"packed: {rows} x {seq} tokens within {budget}"
    if c.micro_batch_tokens > 0:  # padded to the longest, as many rows as fit the budget (at least one)
        rows = max(1, min(per_rank, c.micro_batch_tokens // seq))
    else:
        rows = min(per_rank, c.micro_batch_size)
    return rows, rows * seq, rows * c.max_response_len, f"padded: {rows} rows x {seq} tokens"


def per_layer_token_bytes(s: Shape, b: int, masked_len: int) -> float:
    """Bytes one decoder layer saves for backward per token, compute dtype of b bytes (the counted formula of
    this file's docstring); masked_len: the padded length under an attention mask, 0 for packed rows."""
    if masked_len:
        return 8 * s.hidden + b * (8 * s.hidden + 4 * s.inter + masked_len)
    return 8 * s.hidden + b * (6.5 * s.hidden + 4 * s.inter + 2 * s.kv)


def phases(s: Shape, su: Setup, rank0: bool) -> dict[str, list[Term]]:
    """The terms of each phase for one rank (rank0: the rank that writes final/)."""
    c, N, b, gpu = su.cfg, su.ranks, su.b, su.device == "gpu"
    P, fsdp = s.params, su.ranks > 1
    state = "host" if (c.cpu_offload and fsdp) or not gpu else "gpu"
    where = "gpu" if gpu else "host"
    out: dict[str, list[Term]] = {}
    runtime = [Term("process: python, torch, transformers, data", f"{su.runtime_gib:g} GiB", su.runtime_gib * GiB, "host")]
    master = Term("fp32 weights (shard)" if fsdp else "fp32 weights", f"4 B x {n(P)} / {N}", 4 * P / N, state)
    grads = Term("fp32 gradients (shard)" if fsdp else "fp32 gradients", f"4 B x {n(P)} / {N}", 4 * P / N, state)
    adam = Term("AdamW exp_avg + exp_avg_sq, fp32", f"8 B x {n(P)} / {N}", 8 * P / N, state)
    root = [Term("root group gathered (embeddings, head, final norm)", f"{b} B x {n(s.root)}", b * s.root, where)] if fsdp else []
    layer = lambda k, what: Term(what, f"{k} x {b} B x {n(s.layer)}", k * b * s.layer, where)  # noqa: E731

    # load: the shard, filled from the rank's slices of the files (the pages read count in RSS while mapped)
    out["load"] = runtime + [master, Term("checkpoint pages read (its slices of the files)", f"{s.file_bytes / 1e9:.2f} GB / {N}",
                                          s.file_bytes / N, "host")]
    if not fsdp and gpu:  # from_pretrained builds the model on the host before .to(device)
        out["load"].append(Term("from_pretrained's host copy", f"4 B x {n(P)}", 4 * P, "host"))

    # generate
    rows_of = lambda prompts, k: min(c.engine_max_batch, math.ceil(prompts) * k)  # noqa: E731
    shards = c.gen_shards or max(1, N // c.vllm_tp)
    gen_rows = rows_of(c.gen_prompts_per_round / shards, c.group_size)
    rows = max(gen_rows, rows_of(c.eval_limit / N, c.eval_k) if c.eval_data else 0)
    seq = su.prompt_len + c.max_response_len
    gen = runtime + [master, adam]
    if su.engine == "vllm":
        gen.append(Term("vLLM (weights, KV cache, workspace)", f"{c.vllm_gpu_memory_utilization:g} x {su.gpu_gib:g} GiB",
                        c.vllm_gpu_memory_utilization * su.gpu_gib * GiB, "gpu"))
        gen += root  # gathered by the sync check's forward, kept (FSDP2 reshards the root only after a backward)
    else:
        gen += root + ([layer(1, "one decoder layer gathered")] if fsdp else [])
        gen.append(Term("KV cache", f"{rows} rows x {seq} tokens x {s.layers} layers x 2 x {s.kv} x {b} B",
                        rows * seq * s.layers * 2 * s.kv * b, where))
        gen.append(Term("prefill: one layer's MLP and attention mask", f"{rows} x {su.prompt_len} x ({3 * s.inter} + "
                        f"{su.prompt_len}) x {b} B", rows * su.prompt_len * (3 * s.inter + su.prompt_len) * b, where))
        if c.sampler_logprobs:
            gen.append(Term("every step's logits (--sampler_logprobs)", f"{rows} x {c.max_response_len} x {s.vocab} x 4 B",
                            rows * c.max_response_len * s.vocab * 4, where))
    out["generate"] = gen

    # train: forward + backward of the largest micro-batch
    mrows, tokens, positions, shape = micro_batch(su)
    masked = seq if su.forward == "padded-logits" else 0
    act = per_layer_token_bytes(s, b, masked)
    tr = runtime + [master, grads, adam] + root
    if fsdp:
        tr += [Term("root group's unsharded gradient (the head's backward comes first)", f"{b} B x {n(s.root)}",
                    b * s.root, where),
               layer(2, "decoder layers gathered (current + prefetched)"),
               Term("one layer's unsharded gradient + reduce-scatter buffer", f"({b} + 4) B x {n(s.layer)}",
                    (b + 4) * s.layer, where)]
    if c.activation_checkpointing:
        tr.append(Term("checkpointed layer inputs", f"{tokens} tokens x {s.layers} layers x {s.hidden} x {b} B",
                       tokens * s.layers * s.hidden * b, where))
        tr.append(Term("one layer recomputed, and its gradients", f"2 x {tokens} tokens x {act:.0f} B", 2 * tokens * act, where))
    else:
        tr.append(Term(f"activations ({shape})", f"{tokens} tokens x {s.layers} layers x {act:.0f} B",
                       tokens * s.layers * act, where))
        tr.append(Term("gradients of one layer's activations", f"{tokens} tokens x {act:.0f} B", tokens * act, where))
    tr.append(Term("embedding output, final norm", f"{tokens} tokens x {s.hidden} x (8 + 3 x {b}) B",
                   tokens * s.hidden * (8 + 3 * b), where))
    chunk = min(c.logprob_chunk, positions)
    if su.forward == "padded-logits":
        tr.append(Term("logits, their copy and gradient", f"3 x {positions} positions x {s.vocab} x {b} B",
                       3 * positions * s.vocab * b, where))
        tr.append(Term("log-prob chunk, fp32", f"{chunk} x {s.vocab} x 4 B", chunk * s.vocab * 4, where))
    else:
        tr.append(Term("chunked head: logits and gradient of one chunk, fp32", f"2 x {chunk} x {s.vocab} x 4 B",
                       2 * chunk * s.vocab * 4, where))
        tr.append(Term("chunked head: fp32 gradient of the head weight", f"4 B x {s.vocab} x {s.hidden}",
                       4 * s.vocab * s.hidden, where))
    out["train"] = tr

    # step
    temp = (4 * P / N, f"4 B x {n(P)} / {N}") if state == "gpu" else (2 * 4 * s.largest / N, f"2 x 4 B x {n(s.largest)} / {N}")
    out["step"] = runtime + [master, grads, adam, Term("AdamW temporaries (foreach on GPU, one tensor on CPU)", temp[1],
                                                       temp[0], state)]

    # sync (vLLM only)
    if su.engine == "vllm":
        out["sync"] = runtime + [master, adam] + root + [
            Term("vLLM (awake)", f"{c.vllm_gpu_memory_utilization:g} x {su.gpu_gib:g} GiB",
                 c.vllm_gpu_memory_utilization * su.gpu_gib * GiB, "gpu"),
            Term("streamed tensor, bf16, and the engine's copy", f"2 x 2 B x {n(s.largest)}", 4 * s.largest, where)]
        if gpu:  # while the trainer works, the sleeping engine's weights wait in host memory (vLLM sleep level 1)
            for k in ("train", "step"):
                out[k].append(Term("sleeping vLLM weights (bf16, its share)", f"2 B x {n(P)} / {c.vllm_tp}",
                                   2 * P / c.vllm_tp, "host"))

    # final: rank 0 gathers the model
    fin = runtime + [master, adam]
    if rank0 and fsdp:
        fin.append(Term("final/: the whole model gathered", f"4 B x {n(P)}", 4 * P, "host"))
    out["final"] = fin
    return out


def total(terms: list[Term], where: str) -> float:
    """Bytes of the terms held in `where` (gpu | host)."""
    return sum(t.bytes for t in terms if t.where == where)


# --- the plan -------------------------------------------------------------------------------------------


def plan(s: Shape, su: Setup) -> dict:
    """Peaks per rank (rank 0 and the others) and per node, each phase's total, and whether it fits."""
    res = {"ranks": {}}
    for who, rank0 in (("rank 0", True), ("other ranks", False)):
        if who == "other ranks" and su.ranks == 1:
            continue
        ph = phases(s, su, rank0)
        res["ranks"][who] = {"phases": ph, "gpu": {k: total(v, "gpu") for k, v in ph.items()},
                             "host": {k: total(v, "host") for k, v in ph.items()}}
    peak = lambda who, where: max(res["ranks"][who][where].values())  # noqa: E731
    r0 = peak("rank 0", "host")
    others = peak("other ranks", "host") if su.ranks > 1 else 0.0
    res["node_host"] = r0 + (su.ranks_per_node - 1) * others  # the node of rank 0 (the others: ranks_per_node x others)
    res["gpu_peak"] = max(peak(w, "gpu") for w in res["ranks"])
    res["fits_gpu"] = su.device == "cpu" or res["gpu_peak"] <= (su.gpu_gib - su.gpu_reserve_gib) * GiB
    res["fits_host"] = res["node_host"] <= su.host_gib * GiB
    return res


def suggestions(s: Shape, su: Setup) -> list[str]:
    """The first of a few changes (cumulative) that makes the run fit: flags to add, then more nodes."""
    seq = su.prompt_len + su.cfg.max_response_len
    tries = []
    if not su.cfg.activation_checkpointing:
        tries.append(("--activation_checkpointing true", {"activation_checkpointing": True}))
    if su.cfg.micro_batch_tokens == 0 or su.cfg.micro_batch_tokens > seq:
        tries.append((f"--micro_batch_tokens {seq}", {"micro_batch_tokens": seq}))
    if not su.cfg.cpu_offload:
        tries.append(("--cpu_offload true", {"cpu_offload": True}))
    cfg, flags = su.cfg, []
    for flag, change in tries:
        cfg, flags = dataclasses.replace(cfg, **change), flags + [flag]
        p = plan(s, dataclasses.replace(su, cfg=cfg))
        if p["fits_gpu"] and p["fits_host"]:
            return [f"fits with {' '.join(flags)} (peak {p['gpu_peak'] / GiB:.1f} GiB per GPU, "
                    f"{p['node_host'] / GiB:.0f} GiB host on rank 0's node)"]
    for nodes in (2, 4, 8, 16):
        p = plan(s, dataclasses.replace(su, cfg=cfg, ranks=su.ranks_per_node * nodes))
        if p["fits_gpu"] and p["fits_host"]:
            return [f"fits with {' '.join(flags)} on {nodes} nodes of {su.ranks_per_node} GPUs (peak "
                    f"{p['gpu_peak'] / GiB:.1f} GiB per GPU)"]
    return ["does not fit with the changes tried (checkpointing, one sequence per micro-batch, CPU offload, up to 16 nodes)"]


def render(s: Shape, su: Setup, res: dict) -> str:
    """The printed plan: the setting, rank 0's terms phase by phase, the other ranks' totals, the verdict."""
    c = su.cfg
    lines = [f"memory plan: {s.name}: {n(s.params)} parameters ({s.layers} layers of {n(s.layer)}, hidden {s.hidden}, MLP "
             f"{s.inter}, vocabulary {s.vocab}, {'tied' if s.tied else 'untied'} head; outside the layers {n(s.root)})",
             f"  {su.ranks} ranks ({su.ranks_per_node} per node) on {su.device}"
             + (f", {su.gpu_gib:g} GiB per GPU ({su.gpu_reserve_gib:g} kept free), {su.host_gib:g} GiB host per node"
                if su.device == "gpu" else ""),
             f"  forward {su.forward}; engine {su.engine}" + (f" (tp {c.vllm_tp})" if su.engine == "vllm" else "")
             + f"; compute {'bf16' if su.b == 2 else 'fp32'}; activation checkpointing {c.activation_checkpointing}; "
             f"cpu_offload {c.cpu_offload}; micro-batch {micro_batch(su)[3]}; prompt {su.prompt_len} + response "
             f"{c.max_response_len} tokens"]
    for who, r in res["ranks"].items():
        if who == "other ranks":  # rank 0's terms without final/'s gather: only the totals
            lines.append("  other ranks (rank 0's terms, without the gather of final/): " + ", ".join(
                f"{ph} " + (f"gpu {r['gpu'][ph] / GiB:.2f} / host {r['host'][ph] / GiB:.2f}" if su.device == "gpu"
                            else f"{r['host'][ph] / GiB:.2f}") for ph in r["phases"]) + " GiB")
        else:
            for ph, terms in r["phases"].items():
                lines.append(f"  {who}, {ph}: gpu {r['gpu'][ph] / GiB:.2f} GiB, host {r['host'][ph] / GiB:.2f} GiB"
                             if su.device == "gpu" else f"  {who}, {ph}: {r['host'][ph] / GiB:.2f} GiB")
                for t in terms:
                    lines.append(f"      {t.what:58s} {t.arithmetic:52s} {t.bytes / GiB:8.2f} GiB"
                                 + (f"  {t.where}" if su.device == "gpu" else ""))
        peak_where = "gpu" if su.device == "gpu" else "host"
        ph = max(r[peak_where], key=r[peak_where].get)
        lines.append(f"  {who}: peak {r[peak_where][ph] / GiB:.2f} GiB per {'GPU' if su.device == 'gpu' else 'process'}"
                     f" ({ph})" + (f", host peak {max(r['host'].values()) / GiB:.2f} GiB" if su.device == "gpu" else ""))
    if su.device == "gpu":
        lines.append(f"fits: GPU {'yes' if res['fits_gpu'] else 'NO'} (peak {res['gpu_peak'] / GiB:.1f} of "
                     f"{su.gpu_gib - su.gpu_reserve_gib:g} GiB), host {'yes' if res['fits_host'] else 'NO'} (rank 0's node "
                     f"{res['node_host'] / GiB:.0f} of {su.host_gib:g} GiB)")
        if su.engine == "vllm":
            kv_tok = s.layers * 2 * s.kv * 2  # bytes per token of an engine, bf16
            avail = c.vllm_gpu_memory_utilization * su.gpu_gib * GiB - 2 * s.params / c.vllm_tp - 2 * GiB
            per_engine = avail * c.vllm_tp / kv_tok
            seq = su.prompt_len + c.max_response_len
            lines.append(f"vLLM KV cache: {avail / GiB:.1f} GiB per GPU after its weights ({2 * s.params / c.vllm_tp / GiB:.1f}"
                         f" GiB) and ~2 GiB workspace = {per_engine / 1e3:.0f}k tokens per engine of {c.vllm_tp} GPUs "
                         f"({kv_tok / 1024:.0f} KiB per token) = {per_engine / seq:.0f} sequences of {seq} tokens"
                         + ("" if per_engine >= seq else ": NOT ONE; raise --vllm_gpu_memory_utilization or --vllm_tp"))
        if not (res["fits_gpu"] and res["fits_host"]):
            lines += [f"change: {x}" for x in suggestions(s, su)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """Print the plan; returns its figures (GiB) per rank and phase. Raises ValueError / FileNotFoundError on bad input."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s --model_config DIR_OR_NAME [plan flags] [train.py flags]")
    ap.add_argument("--model_config", required=True, help=f"a model directory or one of {', '.join(BUILTIN)}")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs (processes) per node; with --device cpu: processes")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--forward", choices=("packed-hidden", "padded-logits"), default="packed-hidden")
    ap.add_argument("--prompt_len", type=int, default=0, help="longest prompt in tokens (0 = --max_prompt_len)")
    ap.add_argument("--gpu_gib", type=float, default=79.6,
                    help="memory of one GPU (an 80 GB H100 or A100 shows 81,559 MiB: 79.6 GiB; a 141 GB H200 140)")
    ap.add_argument("--gpu_reserve_gib", type=float, default=4.0, help="kept free per GPU (CUDA context, NCCL, fragmentation)")
    ap.add_argument("--host_gib", type=float, default=2048.0, help="host memory of one node")
    ap.add_argument("--runtime_gib", type=float, default=0.0,
                    help=f"host memory of one process before the model (0 = {CPU_RUNTIME_GIB} on CPU, {GPU_HOST_RUNTIME_GIB} on GPU)")
    ap.add_argument("--json", default="", help="also write the plan's figures to this file")
    args, rest = ap.parse_known_args(argv)
    if args.gpus < 1 or args.nodes < 1:
        raise ValueError(f"--gpus and --nodes must be >= 1, got {args.gpus} and {args.nodes}")
    ranks = args.gpus * args.nodes
    saved_world = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(ranks)  # train.py's checks for this many processes (groups split across ranks)
    try:
        cfg = train.parse_config(rest)
    finally:  # a caller's environment (the benchmark's jobs) keeps its own
        if saved_world is None:
            del os.environ["WORLD_SIZE"]
        else:
            os.environ["WORLD_SIZE"] = saved_world
    if args.device == "cpu" and cfg.engine == "vllm":
        raise ValueError("--device cpu --engine vllm: the plan models vLLM on GPUs only (its share of GPU memory); plan "
                         "CPU runs with --engine hf")
    su = Setup(cfg, ranks, args.gpus, args.device, args.forward, args.prompt_len or cfg.max_prompt_len, args.gpu_gib,
               args.gpu_reserve_gib, args.host_gib,
               args.runtime_gib or (CPU_RUNTIME_GIB if args.device == "cpu" else GPU_HOST_RUNTIME_GIB))
    s = model_shape(args.model_config)
    res = plan(s, su)
    print(render(s, su, res))
    out = {"model": s.name, "ranks": ranks, "gpu_peak_gib": res["gpu_peak"] / GiB, "node_host_gib": res["node_host"] / GiB,
           "fits": bool(res["fits_gpu"] and res["fits_host"]),
           "per_rank": {w: {"gpu": {k: v / GiB for k, v in r["gpu"].items()}, "host": {k: v / GiB for k, v in r["host"].items()}}
                        for w, r in res["ranks"].items()}}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
