"""Tests of `python preflight.py`: the fixed prompt set, the counts, the order of the sheet, the command.

  - the prompt set depends only on the data (not on the row order), is deduplicated by id, and its
    hash on the tiny default is pinned (a change of it changes every run's pre-flight set);
  - counts and the sheet's order on scripted answers whose every verdict, format error, group and
    length is known by construction (one dapo/official disagreement, unusual reasons, answer
    routes, truncation, the overlong buffer);
  - the command end to end on the tiny default (repeatable: same set, same answers), on a parquet
    fixture's prompt set, and its one-line errors.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_preflight.py
"""

import dataclasses
import json
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import preflight  # noqa: E402
import train  # noqa: E402
from plumbing import cli
from rollout import Sample  # noqa: E402
from task import Problem, Task  # noqa: E402
from tasks.tiny import TinyTask  # noqa: E402
from tasks import tiny  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
TOKENIZER = tiny.build_tokenizer()


# --- the fixed prompt set ---------------------------------------------------------------------------------


def test_prompt_set_depends_only_on_the_data():
    rows, _, _ = TinyTask().read("tiny", train.Config(), held_out=False)
    chosen = preflight.select_prompts(rows, 100)
    shuffled = list(rows)
    random.Random(1).shuffle(shuffled)
    assert [p.id for p in preflight.select_prompts(shuffled, 100)] == [p.id for p in chosen]  # row order does not matter
    assert len({p.id for p in chosen}) == 100
    # pinned: the pre-flight set of the tiny default (train.Config(): seed 0, 20000 problems)
    assert preflight.set_hash(chosen) == "d3395ff058519b08"
    assert preflight.select_prompts(rows, 5) == chosen[:5]  # a smaller set is a prefix of a larger one


def test_prompt_set_of_repeated_rows_counts_problems_by_id():
    rows, _, _ = Task().read(os.path.join(FIXTURES, "aime2024_dapo_eval.parquet"), train.Config(), held_out=False)
    assert len(rows) == 960  # 30 problems x 32 rows
    chosen = preflight.select_prompts(rows, 100)
    assert len(chosen) == 30 and len({p.id for p in chosen}) == 30


# --- counts and the sheet on scripted answers --------------------------------------------------------------


def sample(text: str, truncated: bool = False) -> Sample:
    """A response as an engine returns it: one token per character, EOS kept unless cut by the budget."""
    ids = TOKENIZER(text, add_special_tokens=False)["input_ids"]
    return Sample(ids, "length") if truncated else Sample(ids + [TOKENIZER.eos_token_id], "stop")


CFG = dataclasses.replace(train.Config(), group_size=4, max_response_len=24, overlong_buffer=4)  # punished above 20 tokens
PROBLEMS = [Problem("p0", [{"role": "user", "content": "What is 12+30?"}], "42", bare=False),
            Problem("p1", [{"role": "user", "content": "What is 5+7?"}], "12", bare=False),
            Problem("p2", [{"role": "user", "content": "What is 3+4?"}], "7", bare=False)]
CUT = "1+1=2\n" * 4  # 24 characters: the budget
TEXTS = [["Answer: 42"] * 4,  # all right, 11 tokens each (10 characters + EOS)
         ["Answer: 13", "x", "Answer: 12.", "Answer: 12\nAnswer: 12"],  # wrong; no answer; right (official: wrong); right, 2 markers
         [CUT] * 3 + ["3+4=7"]]  # 3 truncated (no answer), one finished without an answer
SAMPLES = [[sample(t, truncated=t == CUT) for t in g] for g in TEXTS]


def scripted_answers():
    return preflight.score_answers(PROBLEMS, SAMPLES, TEXTS, CFG, Task())


def test_counts_of_scripted_answers():
    answers = scripted_answers()
    c = preflight.summarize(answers, CFG)
    assert c["answers"] == 12
    assert c["reasons"] == {"ok": 6, "no_answer": 5, "wrong": 1}
    assert c["format_errors"] == {"no_answer_line": 5, "several_candidates": 1, "truncated": 3}
    assert c["routes"] == {"decorated_value": 1, "several_markers": 1}
    assert c["modes"]["dapo"] == {"correct_frac": 0.5, "disagree": 0, "not_comparable": 0}
    assert c["modes"]["dapo-official"] == {"correct_frac": 5 / 12, "disagree": 1, "not_comparable": 0}  # "Answer: 12."
    assert c["modes"]["math"] == {"correct_frac": 0.5, "disagree": 0, "not_comparable": 0}
    assert c["groups"] == {"prompts": 3, "all_correct": 1 / 3, "all_wrong": 1 / 3, "mixed": 1 / 3,
                           "dropped_by_dynamic_sampling": 2 / 3}
    ln = c["lengths"]
    assert sorted(a["tokens"] for a in answers) == [2, 6, 11, 11, 11, 11, 11, 12, 22, 24, 24, 24]
    assert (ln["min"], ln["median"], ln["max"], ln["budget"], ln["buffer"]) == (2, 11.0, 24, 24, 4)
    assert [(b["bin"], b["answers"], b["accuracy"]) for b in ln["bins"]] == [
        ("[0, 5)", 1, 0.0), ("[5, 10)", 1, 0.0), ("[10, 15)", 6, 5 / 6), ("[15, 20]", 0, None),
        ("overlong buffer (20, 24], punished", 1, 1.0), ("truncated (hit 24)", 3, 0.0)]
    assert ln["punished_frac"] == pytest.approx(4 / 12)  # the 22-token answer (-0.5) and the 3 truncated ones (-1)
    assert ln["mean_overlong_penalty"] == pytest.approx(-3.5 / 12)


def test_sheet_lists_disagreements_then_unusual_then_longest_then_one_per_prompt():
    answers = scripted_answers()
    sheet = preflight.to_check(answers, show=40)
    listed = [(answers[i]["prompt_id"], answers[i]["response"], why) for i, why in sheet]
    assert listed == [
        ("p1", "Answer: 12.", ["modes disagree: dapo-official says wrong", "route decorated_value", "longest (12 tokens)"]),
        ("p1", "Answer: 12\nAnswer: 12", ["route several_markers", "longest (22 tokens)"]),  # rarest first: 1 each
        ("p1", "x", ["reason no_answer"]),  # 5 no_answer: after the routes
        ("p2", CUT, ["reason no_answer", "longest (24 tokens)"]),  # 3 identical answers: listed once
        ("p2", "3+4=7", ["reason no_answer"]),
        ("p0", "Answer: 42", ["plain sample"])]  # p0 had nothing to flag: one plain answer
    assert preflight.to_check(answers, show=2) == sheet[:2]
    md = preflight.render_sheet({"settings": {"verifier": "dapo", "group_size": 4}, "counts": preflight.summarize(answers, CFG),
                                 "sheet": sheet}, answers, {p.id: p.messages[0]["content"] for p in PROBLEMS})
    assert "### 1. modes disagree: dapo-official says wrong; route decorated_value; longest (12 tokens)" in md
    assert "- verdicts: dapo: right (ok, pred '12'); dapo-official: wrong (wrong, pred '12.'); math: right (ok, pred '12')" in md
    assert "; 3 identical answers in its group; format: no_answer_line, truncated" in md
    assert "Dynamic sampling drops 0.667 of generated groups: each kept group costs 3.0 generated." in md


# --- the command ------------------------------------------------------------------------------------------------


def test_preflight_on_the_tiny_default_is_repeatable(tmp_path, capsys):
    args = ["--engine", "hf", "--n", "6", "--group_size", "2", "--show", "5"]
    a = preflight.main(args + ["--out", str(tmp_path / "a")])
    printed = capsys.readouterr().out
    b = preflight.main(args + ["--out", str(tmp_path / "b")])
    rows, _, _ = TinyTask().read("tiny", train.Config(), held_out=False)
    assert a["prompt_ids"] == [p.id for p in preflight.select_prompts(rows, 6)]
    s = a["settings"]
    assert (s["prompts"], s["group_size"], s["max_response_len"], s["overlong_buffer"], s["verifier"]) == (6, 2, 48, 8, "dapo")
    assert s["dataset_hash"] == "f183e6f86b5264a0" and s["prompt_set_hash"] == preflight.set_hash(preflight.select_prompts(rows, 6))
    assert a["counts"] == b["counts"] and a["sheet"] == b["sheet"]  # seeded: the same answers
    assert a["counts"]["answers"] == 12 and len(a["sheet"]) == 5
    saved = json.loads((tmp_path / "a" / "preflight.json").read_text())
    assert saved["settings"]["prompt_set_hash"] == s["prompt_set_hash"]
    answers = [json.loads(line) for line in open(tmp_path / "a" / "answers.jsonl")]
    assert len(answers) == 12 and {x["prompt_id"] for x in answers} == set(a["prompt_ids"])
    md = (tmp_path / "a" / "sheet.md").read_text()
    for heading in ("## Verdicts (dapo mode)", "## Format errors", "## Verifier modes", "## Groups (what dynamic sampling keeps)",
                    "## Response length against the budget", "## Answers to check (5, most important first)"):
        assert heading in md
    assert md.count("- [ ] verdict right") == 5
    assert printed.startswith(f"6 prompts x G=2 from tiny:column-add-v1:train (data f183e6f86b5264a0, prompt set {s['prompt_set_hash']})")


@pytest.mark.parametrize("argv,message", [
    (["--n", "0"], "error: --n must be >= 1 prompt"),
    (["--show", "-1"], "error: --show must be >= 0"),
    (["--data", "nope.jsonl"], "error: dataset 'nope.jsonl' does not exist"),
    (["--preset", "paper"], "error: --preset paper names no data: pass --data"),
    # train.py's rules (cli.check_config), on the settings the pre-flight shares with a run
    (["--verifier", "loose"], "error: --verifier must be one of"),
    (["--overlong_buffer", "48"], "error: --overlong_buffer must be in (0, --max_response_len=48)"),
    (["--overlong_penalty", "maybe"], "error: argument --overlong_penalty: expected true or false"),
    (["--task_args", '{"train_size": 0}'], "error: --task_args: train_size must be an integer >= 1 problem"),
    (["--task", "task:Nope"], "error: --task 'task:Nope': module 'task' defines no 'Nope'"),
    (["--group_size", "1"], "error: --group_size 1: dynamic sampling keeps groups"),
    (["--top_p", "0"], "error: --top_p must be in (0, 1]"),
    (["--temperature", "0"], "error: --temperature must be > 0 for training"),
    (["--threads", "-1"], "error: --threads must be >= 0"),
    (["--engine_max_batch", "0"], "error: --engine_max_batch must be >= 1"),
])
def test_bad_input_is_one_line(argv, message, capsys, tmp_path):
    try:
        code = cli.run_cli(preflight.main, argv + ["--out", str(tmp_path)])
    except SystemExit as e:  # argparse's own errors exit from inside the parser (cli.ArgumentParser)
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(message), err
