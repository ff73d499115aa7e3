"""The arithmetic task (tasks/arith.py) and the prompt and format pieces of task.Task it uses.

Kind: unit tests, no model.
1. Problems: right answers, the digits of each level, no negative difference, the held-out split by
   expression (never trained on, in either wording), stable ids, bad options refused.
2. Prompts: --instruction templates, --few_shot (the task's examples, or a .jsonl) as chat turns,
   and the rules that refuse bad values; the tiny task refuses a tokenizer that is not its own.
3. The format apart from the answer: task.FORMAT_ERRORS, Task.exact_form, and both as eval.py
   report metrics with intervals and in `eval.py compare`.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_arith.py
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import train
import verifier
from evaluation import compare
from evaluation.estimators import problem_scores
from plumbing import cli
from task import FORMAT_ERRORS, Problem, Task, load_task, task_spec
from tasks import arith, tiny
from tasks.arith import LEVELS, Arithmetic

_BARE = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def _value(expression: str) -> int:
    a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)", expression).groups()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_each_level_has_its_digits_and_right_answers(level):
    _, ops, da, db = LEVELS[level]
    rows = Arithmetic(levels=[level]).rows(300, held_out=False, seed=1)
    assert len(rows) >= 120  # level 1 has 155 expressions in all (100 sums, 55 differences), 90% for training
    for r in rows:
        a, op, b = _BARE.fullmatch(r["problem"]).groups()
        assert op in ops and int(r["answer"]) == _value(r["expression"]) >= 0
        assert r["solution"] == f"{a} {op} {b} = {r['answer']}\nAnswer: {r['answer']}"
        assert (len(a), len(b)) == (da, db) or op == "-"  # a difference is written larger first
        assert sorted((len(a), len(b))) == sorted((da, db))


def test_held_out_expressions_are_never_generated_for_training_in_any_wording():
    task = Arithmetic(levels=[1, 2, 3], style="both")
    train_rows = task.rows(5000, held_out=False, seed=0)
    test_rows = task.rows(400, held_out=True, seed=0)
    assert {r["expression"] for r in train_rows}.isdisjoint({r["expression"] for r in test_rows})
    assert all(arith.is_held_out(r["expression"], 10) for r in test_rows)
    assert {"What is" in r["problem"] for r in train_rows} == {True, False}  # both wordings occur
    worded = [r for r in train_rows if "What is" not in r["problem"]]
    assert all(str(int(x)) in r["problem"] for r in worded for x in re.findall(r"\d+", r["expression"]))


def test_reading_is_deterministic_and_ids_are_hashes_of_the_text():
    cfg = train.Config(seed=3)
    a, name, h = Arithmetic().read("arith", cfg, held_out=True, limit=50)
    b, _, h2 = Arithmetic().read("arith", cfg, held_out=True, limit=50)
    assert [p.id for p in a] == [p.id for p in b] and h == h2 and "test" in name
    assert len({p.id for p in a}) == len(a) >= 50
    tr, _, _ = Arithmetic().read("arith", cfg, held_out=False)
    assert {p.id for p in tr}.isdisjoint({p.id for p in a})
    assert all(p.bare for p in a)  # wrapped in the instruction by Task.messages


@pytest.mark.parametrize("kwargs", [{"levels": []}, {"levels": [9]}, {"style": "poem"}, {"heldout_percent": 0}])
def test_bad_options_are_refused(kwargs):
    with pytest.raises(ValueError, match="arithmetic task"):
        Arithmetic(**kwargs)


def test_only_its_own_data_is_read():
    with pytest.raises(ValueError, match="--data arith"):
        Arithmetic().read("tiny", train.Config(), held_out=False)
    assert isinstance(load_task(task_spec("", "arith")), Arithmetic)
    assert load_task(task_spec("", "arith"), '{"levels": [4], "style": "worded"}').levels == [4]


# --- 2. prompts -------------------------------------------------------------------------------------------


def test_instruction_templates_and_few_shot_turns(tmp_path):
    p = Problem("x", [{"role": "user", "content": "What is 2 + 3?"}], "5")
    task = Arithmetic()
    cfg = train.Config(instruction="Q: {problem} End with Answer: N.")
    assert task.messages(p, cfg) == [{"role": "user", "content": "Q: What is 2 + 3? End with Answer: N."}]
    assert task.messages(p, train.Config(instruction="none"))[-1]["content"] == "What is 2 + 3?"
    shots = task.messages(p, train.Config(instruction="none", few_shot="2"))
    assert [m["role"] for m in shots] == ["user", "assistant", "user", "assistant", "user"]
    assert all(m["content"].endswith(f"Answer: {_value(m['content'].split(' = ')[0].replace(' ', ''))}")
               for m in shots[1:4:2])
    path = tmp_path / "shots.jsonl"
    path.write_text(json.dumps({"problem": "What is 1 + 1?", "response": "1 + 1 = 2\nAnswer: 2"}) + "\n")
    msgs = Task().messages(p, train.Config(few_shot=str(path)))
    assert msgs[0]["content"].startswith("Solve the following") and "What is 1 + 1?" in msgs[0]["content"]
    assert msgs[1] == {"role": "assistant", "content": "1 + 1 = 2\nAnswer: 2"}
    with pytest.raises(ValueError, match="no worked examples"):
        Task().messages(p, train.Config(few_shot="1"))


@pytest.mark.parametrize("flags,match", [
    (["--instruction", "Solve it."], "template holding {problem}"),
    (["--few_shot", "two"], "--few_shot must be"),
    (["--few_shot", "0"], "--few_shot must be"),
])
def test_bad_instruction_flags_are_refused(flags, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        train.parse_config(flags)


def test_the_tiny_task_refuses_a_tokenizer_not_its_own():
    class Other:
        def get_vocab(self):
            return {"hello": 0, "world": 1}

    with pytest.raises(ValueError, match="toy task of the shipped character-level policy"):
        tiny.TinyTask().load("tiny", Other(), train.Config(), held_out=True)
    tiny.check_tokenizer(tiny.build_tokenizer())  # its own passes


# --- 3. the format apart from the answer --------------------------------------------------------------------


def test_format_errors_are_the_verdicts_without_one_well_formed_answer():
    assert "ok" not in FORMAT_ERRORS and "wrong" not in FORMAT_ERRORS
    assert not FORMAT_ERRORS & verifier.EXCEPTION_REASONS and {"no_answer", "multiple_answers", "malformed"} <= FORMAT_ERRORS
    reasons = {r: verifier.score(r, "11").reason for r in ("Answer: 11", "Answer: 12", "so 11", "Answer: 11 or 12")}
    assert [reasons[r] in FORMAT_ERRORS for r in reasons] == [False, False, True, True]


@pytest.mark.parametrize("response,exact", [
    ("62 + 17 = 79\nAnswer: 79", True), ("Answer: 79\n\n", True), ("Answer: -3", True),
    ("79 - 62 = Answer: 11", False), ("**Answer:** 11", False), ("Answer: 11.", False), ("Answer:11", False),
    ("Answer: 11\nDone.", False), (" Answer: 11", False), ("", False),
])
def test_exact_form_is_the_last_line_exactly(response, exact):
    assert Task().exact_form(response, train.Config()) is exact


def test_exact_form_under_the_math_verifier_takes_any_answer():
    assert Task().exact_form("x\nAnswer: \\frac{1}{2}", train.Config(verifier="math"))
    assert not Task().exact_form("x\nAnswer: \\frac{1}{2}", train.Config())


def test_format_metrics_per_problem_and_in_compare():
    def rec(pid, correct, fmt, exact):
        return {"id": pid, "correct": correct, "maj_correct": any(correct), "format_error": fmt, "exact_form": exact}

    a = [rec("p", [True, False], [False, False], [True, False]), rec("q", [False, False], [True, False], [False, False])]
    b = [rec("q", [False, False], [True, True], [False, False]), rec("p", [False, False], [True, True], [False, False])]
    s = problem_scores(a)
    assert np.allclose(s["format_error"], [0.0, 0.5]) and np.allclose(s["exact_form"], [0.5, 0.0])
    res = compare.compare({"per_problem": a, "settings": {"k": 2}}, {"per_problem": b, "settings": {"k": 2}},
                          n_boot=200, level=0.95, seed=0)
    assert res["metrics"]["format_error"]["diff"] == pytest.approx(0.25 - 1.0)
    assert res["metrics"]["exact_form"]["diff"] == pytest.approx(0.25)


def test_eval_flags_share_the_rules():
    import eval as ev

    with pytest.raises(ValueError, match="template holding"):
        ev.parse_args(["--instruction", "Solve it."])
    assert ev.parse_args(["--instruction", "Q: {problem}", "--few_shot", "1"]).few_shot == "1"
    assert not any(fails for fails, _ in cli.instruction_rules("", "", allow_empty=True))  # '' = the checkpoint's
    assert any(fails for fails, _ in cli.instruction_rules("", "", allow_empty=False))
