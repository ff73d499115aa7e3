"""Generation engines, weight sync, and the rollout record.

A rollout is one response sampled from the policy for one prompt; G rollouts of one prompt form a
group. This file turns prompts (token ids) into rollouts and says exactly how each was made:

  * `Engine`: the interface every generation backend implements. Token ids go in and come out
    (never decoded and re-encoded); the finish reason says whether a response was cut by the token
    budget ("length") or ended with EOS ("stop"), so truncation never depends on pad == eos
    (DAPO_FACTS.md section 6, failure 4).
  * `HFEngine`: transformers `generate` on the training model itself (colocated, no copy, so a
    weight sync is only a version bump). Works everywhere, including under FSDP.
  * `VLLMEngine` (issue 4) plugs in behind the same interface.
  * `RolloutRecord` and `RolloutWriter`: one JSON line per rollout with the provenance that
    makes every number of a run traceable (run id, policy version, verifier version, dataset
    revision, seed, sampling parameters, engine), appended and flushed every step.
"""

from __future__ import annotations

import json
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
    logprobs: list[float] | None = None  # sampler's log-prob of each token, after temperature/top-p

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class Engine:
    """Generation backend interface.

    Attributes:
        name, version: recorded with every rollout.
        policy_version: the number of weight updates the engine's weights reflect; the trainer
            bumps it through `sync_weights` after every optimizer step.
        seeded: whether SamplingParams.seed reaches the sampler (recorded with every rollout).
    """

    name = "abstract"
    version = "0"
    seeded = False

    def __init__(self) -> None:
        self.policy_version = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """Sample params.n responses for each prompt; returns [len(prompts)][n] in input order."""
        raise NotImplementedError

    def sync_weights(self, model: torch.nn.Module, policy_version: int) -> float:
        """Make the engine generate from `model`'s current weights; returns seconds spent."""
        raise NotImplementedError


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


class HFEngine(Engine):
    """transformers `generate` on the policy being trained (no second copy of the weights).

    Sampling is the plain distribution at `temperature` with nucleus `top_p`: top_k is set to 0
    because transformers otherwise applies top_k=50 silently (ENGINES.md), which would make the
    sampler differ from the policy the trainer scores. The request seed is applied with
    torch.manual_seed before each batch, so runs on the same hardware repeat exactly.
    """

    name = "hf-generate"
    seeded = True

    def __init__(self, model, tokenizer, *, max_batch: int = 256, return_logprobs: bool = True, synced_gpus: bool = False):
        super().__init__()
        import transformers

        self.version = transformers.__version__
        self.model, self.tokenizer = model, tokenizer
        self.max_batch, self.return_logprobs, self.synced_gpus = max_batch, return_logprobs, synced_gpus
        self.stop_ids = _stop_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

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
        greedy = params.temperature == 0
        sampling = {} if greedy else dict(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        gen = self.model.generate(
            input_ids=ids.to(device), attention_mask=attn.to(device), max_new_tokens=params.max_new_tokens,
            pad_token_id=self.pad_id, eos_token_id=self.stop_ids, return_dict_in_generate=True,
            output_scores=self.return_logprobs, synced_gpus=self.synced_gpus,
            **({"do_sample": False, "top_k": None, "top_p": None, "temperature": None} if greedy else sampling),
        )
        new = gen.sequences[:, P:].cpu()  # (N, <= max_new_tokens)
        if self.return_logprobs:
            # scores are the processed logits (after temperature and top-p): the sampler's distribution.
            steps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in gen.scores], 1).cpu()  # (N, t, V)
            lp = steps.gather(2, new[:, :, None]).squeeze(2)  # (N, t)
        stop = torch.tensor(self.stop_ids)
        samples = []
        for i in range(new.shape[0]):
            is_stop = torch.isin(new[i], stop).nonzero()
            if len(is_stop):  # ends at the first stop token, which is kept
                end, reason = int(is_stop[0]) + 1, "stop"
            else:
                end, reason = new.shape[1], "length"
            samples.append(Sample(new[i, :end].tolist(), reason, lp[i, :end].tolist() if self.return_logprobs else None))
        return samples


# --- plumbing: the rollout record -----------------------------------------------------------------------


@dataclass
class RolloutRecord:
    """One rollout and everything needed to trace it (one JSON line in rollouts.jsonl)."""

    run_id: str
    step: int  # optimizer-step index of the rollout step that consumed it (learner version)
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


def timed_generate(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[Sample]], float]:
    """engine.generate plus its wall time in seconds."""
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    return out, time.perf_counter() - t0
