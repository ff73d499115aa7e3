"""Inputs that pass a glance and break a run later, refused or reported at load by the real entry points.

1. A pad or EOS token outside the model's vocabulary (a token added to the tokenizer, the
   embeddings not resized) would index past the embedding at the first padded batch (IndexError
   on CPU, a device-side assert on GPU): train.py, eval.py and preflight.py refuse the directory
   with one line naming the token and the fix, before the model loads.
2. Prompts the tokenizer changes: a character it cannot write is dropped without an unknown token
   (the tiny tokenizer turns `What is 12×34?` into `What is 1234?`). Every prompt is checked at
   load; the changed ones are counted (in the data's info, which eval.py's report carries) and
   reported on one line, the changes in the problem's own text apart from those around it (the
   official instruction's quotes), the first few named with the characters lost. The default run
   reports nothing; a real tokenizer (SmolLM2's byte-level BPE) round-trips the official AIME file.
3. One id on two different problems (or answers) is refused with both rows named; identical
   repeated rows (the official AIME file's 32 copies of each problem) stay fine.
4. A non-finite reward names the task's `score` and the problem.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_inputs.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import eval as ev
import preflight
import train
import verifier
from plumbing import cli, policy
from task import Task
from tasks.tiny import TinyTask

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SMALL = ["--eval_data", "", "--probe_every", "0", "--group_size", "4", "--prompts_per_step", "4",
         "--gen_prompts_per_round", "6", "--mini_batch_size", "8", "--task_args", '{"train_size": 200}', "--steps", "1"]


def _errors(capsys) -> list[str]:
    err = capsys.readouterr().err
    return [line for line in err.splitlines() if line.startswith("error:") or "Traceback" in line]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return str(path)


# --- 1. special tokens outside the vocabulary -------------------------------------------------------


@pytest.fixture(params=["pad", "eos"])
def outside(request, tmp_path) -> tuple[str, str]:
    """(model directory, token kind): the tiny base policy whose tokenizer gained a pad (or EOS) token at id 82, one
    past its 82 embeddings, with the model not resized."""
    model = tmp_path / "model"
    shutil.copytree(REPO / "assets" / "tiny-base", model)
    tok = policy.load_tokenizer(str(model))
    tok.add_special_tokens({f"{request.param}_token": "<|new|>"})
    assert tok.convert_tokens_to_ids("<|new|>") == 82 and json.loads((model / "config.json").read_text())["vocab_size"] == 82
    policy.save_plain_tokenizer(tok, model)
    return str(model), request.param


def _refusal(model: str, kind: str) -> str:
    return (f"error: the tokenizer of {model} has its {kind} token '<|new|>' at id 82, outside the model's vocabulary of 82 "
            "embeddings (config.json vocab_size)")


def test_train_refuses_a_special_token_outside_the_vocabulary(outside, capsys):
    model, kind = outside
    assert cli.run_cli(train.main, ["--model", model, "--run_dir", str(Path(model).parent / "run"), *SMALL]) == 2
    lines = _errors(capsys)
    assert len(lines) == 1 and lines[0].startswith(_refusal(model, kind)), lines
    assert "model.resize_token_embeddings(len(tokenizer))" in lines[0]


def test_eval_and_preflight_refuse_it_too(outside, capsys):
    model, kind = outside
    for main, argv in ((ev.main, ["--model", model, "--data", "tiny", "--k", "1", "--limit", "2"]),
                       (preflight.main, ["--model", model, "--n", "2", "--out", str(Path(model).parent / "pf")])):
        assert cli.run_cli(main, argv) == 2
        lines = _errors(capsys)
        assert len(lines) == 1 and lines[0].startswith(_refusal(model, kind)), lines


# --- 2. prompts the tokenizer changes --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tok():
    return policy.load_tokenizer("")


def test_prompts_the_tokenizer_changes_are_counted_and_named(tmp_path, tiny_tok, capsys):
    rows = [{"id": "a", "problem": "What is 2+3?", "answer": "5"},
            {"id": "b", "problem": "What is 12×34?", "answer": "408"},
            {"id": "c", "problem": "Réponse: 3+4?", "answer": "7"},
            {"id": "d", "problem": "What is 4+4?", "answer": "8"}]
    path = _jsonl(tmp_path / "d.jsonl", rows)
    capsys.readouterr()
    data = Task().load(path, tiny_tok, train.Config(instruction="none"), held_out=False)
    assert len(data) == 4 and data.info["prompts_changed_by_tokenizer"] == 2
    assert capsys.readouterr().err == (
        f"[data] 2 of 4 prompts of {path} change in the tokenizer's round trip, and the model sees the changed text: 2 in "
        "the problem's own text, 0 only around it (the instruction); first: problem b: 'What is 12×34?' becomes 'What is "
        "1234?'; problem c: 'Réponse: 3+4?' becomes 'Rponse: 3+4?'. Characters the tokenizer cannot write: '×', 'é'. A "
        "tokenizer that covers them changes nothing (a byte-level BPE covers every character)\n")


def test_the_instruction_changed_around_every_problem_is_counted_too(tmp_path, tiny_tok, capsys):
    """The official instruction's quotes are not in the tiny tokenizer: every prompt loses them."""
    path = _jsonl(tmp_path / "d.jsonl", [{"problem": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(3)])
    capsys.readouterr()
    data = Task().load(path, tiny_tok, train.Config(), held_out=False)
    assert len(data) == 3 and data.info["prompts_changed_by_tokenizer"] == 3
    assert capsys.readouterr().err == (
        f"[data] 3 of 3 prompts of {path} change in the tokenizer's round trip, and the model sees the changed text: 0 in "
        "the problem's own text, 3 only around it (the instruction); first: problem 0 (around its text). Characters the "
        "tokenizer cannot write: '\"'. A tokenizer that covers them changes nothing (a byte-level BPE covers every "
        "character)\n")


def test_the_default_task_round_trips_silently(tiny_tok, capsys):
    capsys.readouterr()
    cfg = train.Config()
    for held_out in (False, True):
        TinyTask(train_size=2000).load("tiny", tiny_tok, cfg, held_out=held_out, limit=256 if held_out else 0)
    assert capsys.readouterr().err == ""


@pytest.mark.engine  # transformers: a real tokenizer and chat template
def test_a_real_tokenizer_round_trips_the_official_aime_file(smollm2_dir, capsys):
    tok = policy.load_tokenizer(str(smollm2_dir))
    capsys.readouterr()
    data = Task().load(str(FIXTURES / "aime2024_dapo_eval.parquet"), tok, train.Config(), held_out=True)
    assert len(data) == 30 and data.info["prompts_changed_by_tokenizer"] == 0 and capsys.readouterr().err == ""


# --- 3. one id, two problems ------------------------------------------------------------------------------


def test_an_id_on_two_different_rows_is_refused_with_both_named(tmp_path, tiny_tok):
    rows = [{"id": 7, "problem": "What is 2+3?", "answer": "5"}, {"id": 8, "problem": "What is 1+1?", "answer": "2"},
            {"id": 7, "problem": "What is 2+4?", "answer": "6"}, {"id": 8, "problem": "What is 1+1?", "answer": "3"}]
    path = _jsonl(tmp_path / "d.jsonl", rows)
    for held_out in (False, True):
        with pytest.raises(ValueError) as e:
            Task().load(path, tiny_tok, train.Config(instruction="none"), held_out=held_out)
        assert str(e.value) == (
            f"2 id(s) of {path} name different rows, which training would record under one id and evaluation would "
            "reduce to the first; first: id '7': rows 0 ('What is 2+3?', answer '5') and 2 ('What is 2+4?', answer "
            "'6'); id '8': rows 1 ('What is 1+1?', answer '2') and 3 ('What is 1+1?', answer '3'). Give each problem "
            "its own id (JSONL: the `id` field; parquet: extra_info.index)")


def test_identical_repeated_rows_stay_fine(tmp_path, tiny_tok):
    row = {"id": 7, "problem": "What is 2+3?", "answer": "5"}
    path = _jsonl(tmp_path / "d.jsonl", [row, {"id": 8, "problem": "What is 1+1?", "answer": "2"}, row])
    assert [p.id for p in Task().load(path, tiny_tok, train.Config(instruction="none"), held_out=True).problems] == ["7", "8"]
    aime = Task().load(str(FIXTURES / "aime2024_dapo_eval.parquet"), tiny_tok, train.Config(), held_out=True)
    assert len(aime) == 30 and aime.info["rows_per_problem"] == 32  # 32 copies of each problem, one problem each


# --- 4. a non-finite reward ---------------------------------------------------------------------------


class NaNTask(TinyTask):
    """A forked task (the tiny one here) whose score returns NaN for the second response of every group."""

    def score(self, responses, problem, cfg):
        scores = super().score(responses, problem, cfg)
        scores[1] = verifier.Score(**{**scores[1].__dict__, "reward": float("nan")})
        return scores


def test_a_nonfinite_reward_names_the_task_score_and_the_problem(tmp_path):
    cfg = train.parse_config(["--run_dir", str(tmp_path / "r"), *SMALL])
    with pytest.raises(ValueError, match=r"NaNTask\.score gave reward nan to response 1 of problem \S+ \(rewards must be "
                                         r"finite; the task's score is the likely source\)"):
        train.train(cfg, task=NaNTask(train_size=200))
