"""Memory plan of a train.py run: every term per GPU and per host, with its arithmetic; does it fit, and if not which flag to change.

    python bench/memory_plan.py --model_config qwen2.5-32b --preset paper --gpus 8 --nodes 1 --engine vllm \
        --vllm_tp 8 --activation_checkpointing true --cpu_offload true --micro_batch_tokens 22528
    python bench/memory_plan.py --model_config DIR --device cpu --gpus 4 [train.py flags]   # CPU processes (gloo)

--model_config: a model directory (its config.json) or a built-in config, copied from the public
config.json files: qwen2.5-7b, qwen2.5-32b (no download). Every other flag is train.py's (same
presets, same checks, for --gpus x --nodes processes), and they decide the forward pass planned
as they decide train.py's: padded rows with the shared prompt pass (the default), padded rows
without it (--share_prompt_forward false, or under --activation_checkpointing), or one packed row
(--pack_micro_batches true); log-probs always by plumbing/forward.py's chunked head. The parameter counts
are exact (the model is built on the meta device); everything else is arithmetic on the shapes,
per rank, in each phase of a step, and the peak is the largest phase:

  load          each rank's fp32 shard, read from its slices of the files (policy.load_model; on one
                GPU too: FSDP2 over a 1-rank mesh), and the pages of the file read
  generate      the sampler: plumbing/decoding.py on the FSDP2 model (KV cache, one step's logits and
                the sampler's copies of them), or vLLM's --vllm_gpu_memory_utilization share
  train-head    the largest micro-batch's activations, at the head's backward (its fp32 dW
                accumulator and one chunk of logits)
  train-layers  the same, at the first decoder layer's backward, the last layer's (the hidden states'
                gradient, one layer's gradients, the head weight's gradient held to the end of
                backward); in both, the full fp32 gradients only when a rank's mini-batch has several
                micro-batches (accumulated), else they do not exist yet
  train-prompts the shared prompt pass only: the start of the prompts' backward, when the
                responses' part of every layer's weight gradient waits unsharded in autograd
  step          gradient clip and AdamW
  sync          weights streamed to vLLM one gathered tensor at a time (rollout.stream_weights), counted
                with vLLM's whole share awake (an upper bound: its KV cache wakes after the stream).
                Reserved = allocated here: rollout.sync_engine releases the trainer's cached blocks
                (torch.cuda.empty_cache) before vLLM wakes, which it maps outside torch's allocator
  final         rank 0 gathers the whole model to write final/ (loading.gather_on_rank0)

Activation bytes were counted from the tensors transformers 5.24's Qwen2 layers save for backward
in forward.logprobs's passes, with torch.autograd.graph.saved_tensors_hooks
(bench/bench_memory_plan.py --only count prints the count beside these formulas, per layout):
per token and decoder layer 8 H + b (6.5 H + 4 I) + 4 heads + 8, plus b (1.5 H + t) under an
attention mask over t keys (b: bytes of the compute dtype; a pass with padding, a packed row of
several sequences on sdpa, the shared pass's responses); the shared pass adds each row's copy of
its prompt's keys and values, b x P x 2 H per layer; outside the layers 4 H + b (H + 2 head_dim) + 12 per
token and b H + 36 per response token (the head's saved hidden states, logsumexp, ids, unpack
map); checkpointed layers keep H x b per token. Sizes are GiB (2^30 bytes). GPU figures are what
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
import train  # noqa: E402
from plumbing import cli, policy  # noqa: E402

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
# (measured on CPU by bench/bench_memory_plan.py: the tiny model's jobs hold 0.35-0.36 GiB per rank
# after loading, its own weights 5 MB; an older tree of this repository held 0.41-0.42).
CPU_RUNTIME_GIB = 0.35
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
    head_dim: int


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
                 c.num_key_value_heads * head_dim, c.vocab_size, bool(getattr(c, "tie_word_embeddings", False)), head_dim)


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
    prompt_len: int  # the longest prompt, tokens
    gpu_gib: float
    gpu_reserve_gib: float
    host_gib: float
    runtime_gib: float
    flash_attn: bool  # packed rows on GPU run flash_attention_2 (flash-attn installed: forward.prepare switches it on)

    @property
    def fsdp(self) -> bool:  # FSDP2 shards the model: several ranks, or one GPU (a 1-rank mesh, distributed.init_distributed)
        return self.ranks > 1 or self.device == "gpu"

    @property
    def b(self) -> int:  # bytes of the compute dtype: bf16 under FSDP2 mixed precision (--bf16, GPU), else fp32
        return 2 if self.device == "gpu" and self.cfg.bf16 else 4

    @property
    def engine(self) -> str:
        e = self.cfg.engine
        return ("vllm" if self.device == "gpu" else "hf") if e == "auto" else e

    @property
    def flash(self) -> bool:  # forward.prepare's condition for flash_attention_2 on packed rows
        return self.flash_attn and self.device == "gpu" and self.b == 2 and self.cfg.pack_micro_batches


@dataclass(frozen=True)
class Micro:
    """The shape of one micro-batch as forward.micro_batch lays it out (the plan: its largest one)."""

    layout: str  # padded | shared (padded rows, one pass per distinct prompt) | packed (one row)
    b: int  # responses
    u: int  # distinct prompts among them
    P: int  # longest prompt, tokens
    T: int  # longest response, tokens
    N: int  # response tokens (what the log-prob head projects)
    L: int  # tokens of the packed row (sum of prompt + response); padded: b x (P + T)


def micro_batch(s: Setup) -> Micro:
    """The largest micro-batch one rank trains on: every prompt at P and every response at T tokens.

    Rows: --micro_batch_size, or with --micro_batch_tokens as many full-length sequences as the
    budget holds (at least one; padded and packed cost the same at equal lengths). A micro-batch
    holds whole groups (update.micro_batches keeps a rank's rows in order, groups contiguous), so
    u = ceil(b / group_size). The layout is forward.logprobs's: packed with --pack_micro_batches;
    the shared prompt pass when --share_prompt_forward and some prompt repeats (u < b), not under
    activation checkpointing (no KV cache); else the plain padded pass.
    """
    c, P, T = s.cfg, s.prompt_len, s.cfg.max_response_len
    per_rank = max(1, c.mini_batch_size // s.ranks)  # responses of a mini-batch on one rank
    if c.micro_batch_tokens > 0:
        b = max(1, min(per_rank, c.micro_batch_tokens // (P + T)))
    else:
        b = min(per_rank, c.micro_batch_size)
    u = min(b, -(-b // c.group_size))
    if c.pack_micro_batches:
        layout = "packed"
    elif c.share_prompt_forward and not c.activation_checkpointing and u < b and T >= 2:
        layout = "shared"
    else:
        layout = "padded"
    return Micro(layout, b, u, P, T, b * T, b * (P + T))


def describe(m: Micro, flash: bool) -> str:
    """One line: the layout and its shape."""
    if m.layout == "packed":
        return (f"packed: one row of {m.b} sequence{'s' if m.b > 1 else ''}, {m.L} tokens, "
                + ("flash_attention_2 (no mask)" if flash else "sdpa (block-diagonal mask)" if m.b > 1 else "one sequence"))
    rows = f"{m.b} row{'s' if m.b > 1 else ''} x ({m.P} + {m.T}) tokens"
    return f"shared prompt pass: {m.u} prompt{'s' if m.u > 1 else ''}, then {rows}" if m.layout == "shared" else f"padded: {rows}"


def decoder_passes(m: Micro, flash: bool) -> list[tuple[int, int]]:
    """(tokens, key length under an attention mask (0: none)) of each decoder pass of a micro-batch.

    transformers drops the mask of a pass without padding (one row, one prompt, one packed
    sequence); the plan assumes padding wherever rows can differ. The shared pass's response rows
    always attend under a mask (their queries follow the cached prompt).
    """
    if m.layout == "packed":
        return [(m.L, 0 if m.b == 1 or flash else m.L)]  # the packed row
    if m.layout == "padded":
        return [(m.b * (m.P + m.T), m.P + m.T if m.b > 1 else 0)]  # the padded rows
    return [(m.u * m.P, m.P if m.u > 1 else 0),  # the prompts, then the responses after the prompts' cache
            (m.b * (m.T - 1), m.P + m.T - 1)]  # (the last token predicts nothing)


def layer_token_bytes(s: Shape, b: int, t: int) -> float:
    """Bytes one decoder layer saves for backward per token (the counted formula of this file's
    docstring), compute dtype of b bytes; t: the key length under an attention mask, 0 without one."""
    base = 8 * s.hidden + b * (6.5 * s.hidden + 4 * s.inter) + 4 * s.heads + 8
    return base + b * (1.5 * s.hidden + t) if t else base


def layer_saved(s: Shape, b: int, m: Micro, flash: bool) -> tuple[float, str]:
    """Bytes one decoder layer saves for backward over a whole micro-batch, and the arithmetic."""
    total, parts = 0.0, []
    for tokens, t in decoder_passes(m, flash):
        per = layer_token_bytes(s, b, t)
        total, parts = total + tokens * per, parts + [f"{tokens} x {per:.0f} B"]
    if m.layout == "shared":  # each row's copy of its prompt's keys and values, repeated to the query heads
        total += m.b * m.P * 2 * s.hidden * b
        parts.append(f"{m.b} x {m.P} x 2 x {s.hidden} x {b} B prompt keys/values")
    return total, " + ".join(parts)


def outside_saved(s: Shape, b: int, m: Micro, flash: bool) -> tuple[float, str, float, str]:
    """Bytes saved for backward outside the decoder layers, with the arithmetic: per decoder token the
    embedding output, the final norm's tensors and the rotary cos/sin (2 x head_dim; under checkpointing
    kept as the layers' arguments for the recompute); per response token the head's (its hidden
    states, logsumexp, token ids and the unpack map)."""
    tokens = sum(t for t, _ in decoder_passes(m, flash))
    return (tokens * (4 * s.hidden + s.hidden * b + 2 * s.head_dim * b + 12),
            f"{tokens} tokens x (4 x {s.hidden} + {b} x ({s.hidden} + 2 x {s.head_dim}) + 12) B",
            m.N * (b * s.hidden + 36), f"{m.N} x ({b} x {s.hidden} + 36) B")


def vllm_share(c) -> float:
    """The share of a GPU the learner's vLLM engine takes (policy.vllm_gpu_share: the flag, or 0.3 beside the trainer)."""
    return policy.vllm_gpu_share(c.vllm_gpu_memory_utilization)


def phases(s: Shape, su: Setup, rank0: bool) -> dict[str, list[Term]]:
    """The terms of each phase for one rank (rank0: the rank that writes final/)."""
    c, N, b, gpu = su.cfg, su.ranks, su.b, su.device == "gpu"
    P, fsdp = s.params, su.fsdp
    state = "host" if (c.cpu_offload and fsdp) or not gpu else "gpu"
    where = "gpu" if gpu else "host"
    out: dict[str, list[Term]] = {}
    runtime = [Term("process: python, torch, transformers, data", f"{su.runtime_gib:g} GiB", su.runtime_gib * GiB, "host")]
    master = Term("fp32 weights (shard)" if fsdp else "fp32 weights", f"4 B x {n(P)} / {N}", 4 * P / N, state)
    grads = Term("fp32 gradients (shard)" if fsdp else "fp32 gradients", f"4 B x {n(P)} / {N}", 4 * P / N, state)
    adam = Term("AdamW exp_avg + exp_avg_sq, fp32", f"8 B x {n(P)} / {N}", 8 * P / N, state)
    root = [Term("root group gathered (embeddings, head, final norm)", f"{b} B x {n(s.root)}", b * s.root, where)] if fsdp else []
    layer = lambda k, what: Term(what, f"{k} x {b} B x {n(s.layer)}", k * b * s.layer, where)  # noqa: E731

    # load: the shard, filled from the rank's slices of the files. Measured per phase (bench/load_phases.py, 4 gloo
    # ranks, a 277M model stored in bf16): the peak is inside torch.distributed.checkpoint's read, where the rank holds
    # its shard (to_empty reserves it, the copy makes it resident), the file's pages of its slices, mapped by
    # safe_open until the file is closed (half the shard's size for a bf16 file), and one slice in flight.
    file_dtype_bytes = max(1, round(s.file_bytes / s.params))  # 2 for a bf16 checkpoint
    out["load"] = runtime + [master, Term("checkpoint pages read (its slices of the files)", f"{s.file_bytes / 1e9:.2f} GB / {N}",
                                          s.file_bytes / N, "host"),
                             Term("one slice in flight (the largest tensor's, as stored)", f"{file_dtype_bytes:g} B x "
                                  f"{n(s.largest)} / {N}", file_dtype_bytes * s.largest / N, "host")]

    # generate
    rows_of = lambda prompts, k: min(c.engine_max_batch, math.ceil(prompts) * k)  # noqa: E731
    shards = c.gen_shards or max(1, N // c.vllm_tp)
    gen_rows = rows_of(c.gen_prompts_per_round / shards, c.group_size)
    rows = max(gen_rows, rows_of(c.eval_limit / N, c.eval_k) if c.eval_data else 0)
    seq = su.prompt_len + c.max_response_len
    gen = runtime + [master, adam]
    if su.engine == "vllm":
        gen.append(Term("vLLM (weights, KV cache, workspace)", f"{vllm_share(c):g} x {su.gpu_gib:g} GiB",
                        vllm_share(c) * su.gpu_gib * GiB, "gpu"))
        gen += root  # gathered by the sync check's forward, kept (FSDP2 reshards the root only after a backward)
    else:
        gen += root + ([layer(1, "one decoder layer gathered")] if fsdp else [])
        gen.append(Term("KV cache", f"{rows} rows x {seq} tokens x {s.layers} layers x 2 x {s.kv} x {b} B",
                        rows * seq * s.layers * 2 * s.kv * b, where))
        gen.append(Term("prefill: one layer's MLP and attention mask", f"{rows} x {su.prompt_len} x ({3 * s.inter} + "
                        f"{su.prompt_len}) x {b} B", rows * su.prompt_len * (3 * s.inter + su.prompt_len) * b, where))
        # plumbing/decoding.py keeps one step's logits: fp32 from the head and a copy, float64 probabilities
        # and their cumulative sum in the draw and the top-p filter (the log-prob is one float per token)
        gen.append(Term("one decoding step's logits and the sampler's copies", f"{rows} x {s.vocab} x 32 B",
                        rows * s.vocab * 32, where))
    out["generate"] = gen

    # train: forward + backward of the largest micro-batch, at the two moments of its backward that can peak
    m, V, D = micro_batch(su), s.vocab, s.hidden
    per_layer, per_layer_text = layer_saved(s, b, m, su.flash)
    tokens = sum(t for t, _ in decoder_passes(m, su.flash))  # positions the decoder runs
    held = root + [Term("micro-batch: ids, position ids, masks (forward.MicroBatch)",
                        f"{m.L} x {8 * (2 if m.layout == 'packed' else 3)} B + 2 x {m.b} x {m.T} x 4 B",
                        m.L * 8 * (2 if m.layout == "packed" else 3) + 2 * m.b * m.T * 4, where)]
    if fsdp:
        held.append(layer(2, "decoder layers gathered (current + prefetched)"))
    ckpt = c.activation_checkpointing
    if ckpt:
        held.append(Term("checkpointed layer inputs", f"{tokens} tokens x {s.layers} layers x {D} x {b} B",
                         tokens * s.layers * D * b, where))
        if any(t for _, t in decoder_passes(m, su.flash)):  # the layers' mask argument, kept for the recompute
            held.append(Term("attention mask (bool) kept for the recompute", f"{m.b} x ({m.P} + {m.T})^2 B"
                             if m.layout == "padded" else f"{m.L}^2 B", m.b * (m.P + m.T) ** 2 if m.layout == "padded"
                             else m.L**2, where))
    else:
        held.append(Term(f"decoder activations ({m.layout})", f"{s.layers} layers x ({per_layer_text})",
                         s.layers * per_layer, where))
    emb, emb_text, kept, kept_text = outside_saved(s, b, m, su.flash)
    held.append(Term("embedding output, final norm, rotary cos/sin", emb_text, emb, where))
    head = [Term("head: saved hidden states, logsumexp, token ids, unpack map", kept_text, kept, where),
            Term("head backward: fp32 dW accumulator" + (" + its bf16 cast" if b == 2 else ""),
                 f"{V} x {D} x {4 + (b if b == 2 else 0)} B", V * D * (4 + (b if b == 2 else 0)), where)]
    chunk = min(c.logprob_chunk, m.N)
    head.append(Term("head backward: one chunk's fp32 logits" + (" + bf16 product/copy" if b == 2 else ""),
                     f"{chunk} x {V} x {4 + (b if b == 2 else 0)} B", chunk * V * (4 + (b if b == 2 else 0)), where))
    head.append(Term("head backward: dh", f"{m.N} x {D} x {b} B", m.N * D * b, where))
    rows_out = m.b * m.T if m.layout == "shared" else m.L  # the last hidden states the head read from
    layers = [Term("gradient of the last hidden states (the head's gather, dense)", f"{rows_out} x {D} x {b} B",
                   rows_out * D * b, where)]
    # The fp32 gradients of earlier micro-batches exist during a backward only when a rank's mini-batch
    # has several micro-batches (accumulation; zero_grad(set_to_none=True) after each optimizer step
    # frees them). With one micro-batch, gradients appear as the backward reaches each parameter: none
    # at the head's backward, the head's and one layer's at the first decoder layer's.
    accumulating = -(-max(1, c.mini_batch_size // su.ranks) // m.b) > 1
    if fsdp or s.tied or not accumulating:  # FSDP2 reduces the root's gradient after the whole backward; a tied one waits
        layers.append(Term("the head weight's gradient, held to the end of backward", f"{V} x {D} x {b} B", V * D * b, where))
    if not (fsdp or accumulating):
        layers.append(Term("one layer's fp32 gradient", f"4 B x {n(s.layer)}", 4 * s.layer, where))
    if ckpt:
        layers.append(Term("one layer recomputed", per_layer_text, per_layer, where))
    layers.append(Term("one layer's backward (gradients as large as its activations)", per_layer_text, per_layer, where))
    if fsdp:
        layers.append(Term("one layer's unsharded gradient + reduce-scatter buffer", f"({b} + 4) B x {n(s.layer)}",
                           (b + 4) * s.layer, where))
    state3 = runtime + [master] + ([grads] if accumulating else []) + [adam]
    out["train-head"] = state3 + held + head
    out["train-layers"] = state3 + held + layers
    if m.layout == "shared":
        # The shared pass runs every decoder layer twice (prompts, then responses after their cache), so
        # autograd sums each weight's two gradients before it accumulates them: the responses' part of
        # every layer's weight gradient waits, unsharded (FSDP2 gathers the layer again for the prompts'
        # backward), until the prompts' backward reaches that layer. The start of the prompts' backward
        # then holds all of them, with the gradient of every layer's cached keys/values. Seen on 2 gloo
        # ranks: no layer has a gradient, sharded or not, until the prompts' backward reaches it, and
        # the peak this term predicts is the measured one (bench/bench_memory_plan.py).
        prompts, t = decoder_passes(m, su.flash)[0]
        per_token = layer_token_bytes(s, b, t)
        out["train-prompts"] = state3 + [t for t in held if not t.what.startswith("decoder activations")] + [
            Term("the prompts' decoder activations", f"{s.layers} layers x {prompts} tokens x {per_token:.0f} B",
                 s.layers * prompts * per_token, where),
            Term("the responses' part of every layer's weight gradient, unsharded", f"{b} B x {n(s.params - s.root)}",
                 b * (s.params - s.root), where),
            Term("gradient of the cached keys/values, every layer", f"{s.layers} x {m.b} x {m.P} x 2 x {s.kv} x {b} B",
                 s.layers * m.b * m.P * 2 * s.kv * b, where)]
        out["train-prompts"] += [t for t in layers if t.what.startswith("the head weight's")]
        if fsdp:
            out["train-prompts"].append(Term("one layer's unsharded gradient + reduce-scatter buffer",
                                             f"({b} + 4) B x {n(s.layer)}", (b + 4) * s.layer, where))

    # step
    temp = (4 * P / N, f"4 B x {n(P)} / {N}") if state == "gpu" else (2 * 4 * s.largest / N, f"2 x 4 B x {n(s.largest)} / {N}")
    out["step"] = runtime + [master, grads, adam, Term("AdamW temporaries (foreach on GPU, one tensor on CPU)", temp[1],
                                                       temp[0], state)]

    # sync (vLLM only)
    if su.engine == "vllm":
        out["sync"] = runtime + [master, adam] + root + [
            Term("vLLM (awake)", f"{vllm_share(c):g} x {su.gpu_gib:g} GiB",
                 vllm_share(c) * su.gpu_gib * GiB, "gpu"),
            Term("streamed tensor, bf16, and the engine's copy", f"2 x 2 B x {n(s.largest)}", 4 * s.largest, where)]
        if gpu:  # while the trainer works, the sleeping engine's weights wait in host memory (vLLM sleep level 1)
            for k in [k for k in out if k.startswith("train")] + ["step"]:
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


def largest_micro_batch(s: Shape, su: Setup) -> int:
    """The most full-length sequences per micro-batch (--micro_batch_tokens k x (P + T)) that fit, 0 if not one."""
    seq, best = su.prompt_len + su.cfg.max_response_len, 0
    for k in range(1, max(1, su.cfg.mini_batch_size // su.ranks) + 1):
        p = plan(s, dataclasses.replace(su, cfg=dataclasses.replace(su.cfg, micro_batch_tokens=k * seq)))
        if not (p["fits_gpu"] and p["fits_host"]):
            break
        best = k
    return best


def render(s: Shape, su: Setup, res: dict) -> str:
    """The printed plan: the setting, rank 0's terms phase by phase, the other ranks' totals, the verdict."""
    c = su.cfg
    lines = [f"memory plan: {s.name}: {n(s.params)} parameters ({s.layers} layers of {n(s.layer)}, hidden {s.hidden}, MLP "
             f"{s.inter}, vocabulary {s.vocab}, {'tied' if s.tied else 'untied'} head; outside the layers {n(s.root)})",
             f"  {su.ranks} ranks ({su.ranks_per_node} per node) on {su.device}"
             + (f", {su.gpu_gib:g} GiB per GPU ({su.gpu_reserve_gib:g} kept free), {su.host_gib:g} GiB host per node"
                if su.device == "gpu" else ""),
             f"  engine {su.engine}" + (f" (tp {c.vllm_tp})" if su.engine == "vllm" else "")
             + f"; compute {'bf16' if su.b == 2 else 'fp32'}; activation checkpointing {c.activation_checkpointing}; "
             f"cpu_offload {c.cpu_offload}; prompt {su.prompt_len} + response {c.max_response_len} tokens",
             f"  micro-batch: {describe(micro_batch(su), su.flash)}; log-probs by the chunked head, "
             f"{min(c.logprob_chunk, micro_batch(su).N)} positions a chunk"]
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
                    lines.append(f"      {t.what:64s} {t.bytes / GiB:7.2f} GiB" + (f" {t.where:4s}" if su.device == "gpu" else "")
                                 + f"  = {t.arithmetic}")
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
            avail = vllm_share(c) * su.gpu_gib * GiB - 2 * s.params / c.vllm_tp - 2 * GiB
            per_engine = avail * c.vllm_tp / kv_tok
            seq = su.prompt_len + c.max_response_len
            lines.append(f"vLLM KV cache: {avail / GiB:.1f} GiB per GPU after its weights ({2 * s.params / c.vllm_tp / GiB:.1f}"
                         f" GiB) and ~2 GiB workspace = {per_engine / 1e3:.0f}k tokens per engine of {c.vllm_tp} GPUs "
                         f"({kv_tok / 1024:.0f} KiB per token) = {per_engine / seq:.0f} sequences of {seq} tokens"
                         + ("" if per_engine >= seq else ": NOT ONE; raise --vllm_gpu_memory_utilization or --vllm_tp"))
        k, seq = largest_micro_batch(s, su), su.prompt_len + c.max_response_len
        lines.append(f"micro-batch: at most {k} sequence{'s' if k > 1 else ''} of {seq} tokens fit in this layout "
                     f"(--micro_batch_tokens {k * seq})"
                     if k else "micro-batch: not even one sequence fits in this layout")
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
    ap.add_argument("--flash_attn", type=cli.parse_bool, default=True, metavar="true|false",
                    help="GPU, --pack_micro_batches true: flash-attn is installed, so packed rows run flash_attention_2 "
                         "(no mask); false: sdpa with the row's block-diagonal mask")
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
    su = Setup(cfg, ranks, args.gpus, args.device, args.prompt_len or cfg.max_prompt_len, args.gpu_gib,
               args.gpu_reserve_gib, args.host_gib,
               args.runtime_gib or (CPU_RUNTIME_GIB if args.device == "cpu" else GPU_HOST_RUNTIME_GIB), args.flash_attn)
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
