"""A fork's task that answers wrongly, held-out problems that were trained on, prompts cut in silence.

Faults of a task's code and data, each met on the entry points' own paths:
1. A `score` that returns the wrong number of verdicts (one fewer, one more, none, not a list) is
   refused right after the call, on every path that scores (training, evaluation, the pre-flight
   sheet), with one line naming the task's score, the problem id and the counts (exit status 2);
   a `score` that raises keeps its traceback (cli.run_cli does not shorten it), the line above it
   naming the problem.
2. --task_args of the wrong type are refused with one line by train.py, eval.py and preflight.py,
   whether or not the task's module has `from __future__ import annotations` (the docs/forking.md
   example has none): one check (cli.check_options) on the annotations resolved to types.
3. Held-out problems with the text of training problems (the same file twice, copies under new
   ids, other case and spacing, the official instruction around one side only) are refused at load
   with one line, or with --allow_heldout_overlap true counted in summary.json and on every
   held-out line; eval.py --model RUN on the run's training data says so and counts it; the
   docs/forking.md example's two splits share no problem.
4. --prompt_truncation left cuts the start of the problem's own text, never the chat template's
   turns, a system turn or the official instruction; the cut prompts are counted and the first few
   named at load and in the run's summary; eval.py's refusal of a long prompt names flags eval.py has.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_task_faults.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import eval as ev
import preflight
import train
from evaluation import measure
from plumbing import cli, policy
from rollout import Sample
from task import DAPO_PREFIX, DAPO_SUFFIX, Dataset, Problem, Task
from tasks.tiny import TinyTask

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "docs" / "forking.md").read_text()
SMALL = ["--group_size", "4", "--prompts_per_step", "4", "--gen_prompts_per_round", "6", "--mini_batch_size", "8",
         "--probe_every", "0", "--run_id", "t"]


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:") or "Traceback" in line]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def tiny_tok():
    return policy.load_tokenizer("")


# --- 1. a score with the wrong number of verdicts ------------------------------------------------------


@dataclass
class Miscount(TinyTask):
    """The tiny task, its score broken in one way (`mode`)."""

    mode: str = "fewer"

    def score(self, responses, problem, cfg):
        scores = super().score(responses, problem, cfg)
        return {"fewer": scores[:-1], "more": scores + scores[:1], "none": [], "not-a-list": None,
                "floats": [1.0] * len(scores)}[self.mode]


class Raising(TinyTask):
    def score(self, responses, problem, cfg):
        raise ValueError("a bug of the fork's own score")


PROBLEM = Problem("p7", [{"role": "user", "content": "What is 1+2?"}], "3", bare=False)
TEXTS = ["1+2\nAnswer: 3", "Answer: 4", "Answer: 3", "no answer"]


@pytest.mark.parametrize("mode, got", [("fewer", "returned 3 verdict(s)"), ("more", "returned 5 verdict(s)"),
                                       ("none", "returned 0 verdict(s)"), ("not-a-list", "returned a NoneType, not a list")])
def test_a_score_with_the_wrong_number_of_verdicts_is_named_on_every_path(tiny_tok, mode, got):
    task, cfg = Miscount(mode=mode), train.Config()
    line = (f"Miscount.score {got} for the 4 responses to problem p7: it must return one verifier.Score per response, in "
            "the order of the responses")
    with pytest.raises(ValueError) as e:
        task.verdicts(TEXTS, PROBLEM, cfg)
    assert str(e.value) == line
    samples = [Sample(tiny_tok.encode(t, add_special_tokens=False), "stop") for t in TEXTS]
    for call in (lambda: train.score_group(PROBLEM, [5, 6], samples, cfg, task, tiny_tok),  # training and the probe
                 lambda: measure._score(PROBLEM, samples, tiny_tok, cfg, task),  # eval.py, held-out evaluation
                 lambda: preflight.score_answers([PROBLEM], [samples], [TEXTS], cfg, task)):  # the pre-flight sheet
        with pytest.raises(ValueError, match=re.escape(line)):
            call()


def test_a_verdict_that_is_not_a_score_is_named():
    with pytest.raises(ValueError, match=r"Miscount\.score returned a float for response 0 of problem p7: each verdict "
                                         r"must be a verifier\.Score"):
        Miscount(mode="floats").verdicts(TEXTS, PROBLEM, train.Config())


def test_a_training_run_whose_score_miscounts_stops_with_one_line(tmp_path, capsys):
    cfg = train.parse_config(["--run_dir", str(tmp_path / "r"), "--eval_data", "", *SMALL, "--steps", "1"])
    capsys.readouterr()
    assert cli.run_cli(lambda argv: train.train(cfg, task=Miscount(train_size=200, mode="fewer"))) == 2
    lines = _errors(capsys)
    assert len(lines) == 1 and re.fullmatch(r"error: Miscount\.score returned 3 verdict\(s\) for the 4 responses to "
                                            r"problem \S+: it must return .*", lines[0]), lines


def test_a_score_that_raises_keeps_its_traceback_under_a_line_naming_the_problem(tmp_path, capsys):
    with pytest.raises(ValueError, match="a bug of the fork's own score") as e:
        Raising().verdicts(TEXTS, PROBLEM, train.Config())
    assert capsys.readouterr().err == ("[task] Raising.score raised ValueError on problem p7 (scoring 4 responses); its "
                                       "traceback follows\n")
    assert e.value.keep_traceback
    cfg = train.parse_config(["--run_dir", str(tmp_path / "r"), "--eval_data", "", *SMALL, "--steps", "1"])
    with pytest.raises(ValueError, match="a bug of the fork's own score"):  # run_cli re-raises: Python prints it whole
        cli.run_cli(lambda argv: train.train(cfg, task=Raising(train_size=200)))
    assert re.search(r"\[task\] Raising\.score raised ValueError on problem \S+ \(scoring 4 responses\)",
                     capsys.readouterr().err)


# --- 2. --task_args of the wrong type, annotations written either way ------------------------------------

OPTIONS = '''
from dataclasses import dataclass, field

from task import Task


@dataclass
class Opts(Task):
    n: int = 1
    x: float = 0.5
    name: str = "a"
    flag: bool = False
    levels: list[int] = field(default_factory=list)
    maybe: int | None = None
    anything: object = None
'''


def _page_task() -> str:
    return re.findall(r"```python\n(.*?)```", PAGE[PAGE.index("## Add a task"):], re.S)[0]


@pytest.fixture(params=["plain", "future"])
def modules(request, tmp_path, monkeypatch) -> str:
    """The suffix of two importable modules, units_<s> (docs/forking.md's mytask.py) and opts_<s>, written without
    (plain) or with `from __future__ import annotations` (future)."""
    head = "from __future__ import annotations\n" if request.param == "future" else ""
    assert "__future__" not in _page_task()  # the page's example has none
    (tmp_path / f"units_{request.param}.py").write_text(head + _page_task())
    (tmp_path / f"opts_{request.param}.py").write_text(head + OPTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in (f"units_{request.param}", f"opts_{request.param}"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return request.param


@pytest.mark.parametrize("option, value, ok", [
    ("n", 2, True), ("n", True, False), ("n", 2.5, False), ("n", "2", False), ("x", 1, True), ("x", "1", False),
    ("name", 3, False), ("flag", 1, False), ("flag", True, True), ("levels", [1, 2], True), ("levels", [1, "2"], False),
    ("levels", 3, False), ("maybe", None, True), ("maybe", 3, True), ("maybe", "3", False), ("anything", {"a": 1}, True)])
def test_task_args_are_checked_against_the_options_types(modules, option, value, ok):
    from task import load_task

    spec, args = f"opts_{modules}:Opts", json.dumps({option: value})
    if ok:
        assert getattr(load_task(spec, args), option) == value
    else:
        with pytest.raises(ValueError, match=re.escape(f"--task_args: Opts's option {option!r} is ")):
            load_task(spec, args)


def test_train_eval_and_preflight_refuse_task_args_of_the_wrong_type(modules, tmp_path, capsys):
    task = ["--task", f"units_{modules}:UnitsDigit", "--task_args", '{"n_problems": "many"}', "--data", "units"]
    line = "error: --task_args: UnitsDigit's option 'n_problems' is int, got 'many'"
    for main, argv in ((train.main, [*task, "--eval_data", "units", "--run_dir", str(tmp_path / "r")]),
                       (ev.main, [*task, "--k", "1", "--limit", "2"]),
                       (preflight.main, [*task, "--n", "2", "--out", str(tmp_path / "pf")])):
        capsys.readouterr()
        assert cli.run_cli(main, argv) == 2
        assert _errors(capsys) == [line]
    assert not (tmp_path / "r").exists() and not (tmp_path / "pf").exists()  # refused before any work


# --- 3. held-out problems that were trained on ------------------------------------------------------------


def _set(name: str, rows: list[tuple[str, str]], bare: bool = False) -> Dataset:
    problems = [Problem(i, [{"role": "user", "content": text}], "5", bare) for i, text in rows]
    return Dataset(problems, [[1]] * len(problems), name, "h")


def test_held_out_problems_with_a_training_problems_text_are_refused_or_counted(capsys):
    from evaluation import overlap

    train_set = _set("train.jsonl", [("a", "What is 2+3?"), ("b", "What is 4+4?"), ("c", "What is 1+1?")])
    held = _set("test.jsonl", [("x", "  what IS 2+3?\n"), ("y", "What is 9+9?"), ("z", DAPO_PREFIX + "What is 1+1?"
                                                                                     + DAPO_SUFFIX)])
    with pytest.raises(ValueError) as e:
        overlap.check_held_out(train_set, held, allow=False)
    assert str(e.value).startswith(
        "2 of 3 held-out problems of test.jsonl (--eval_data) are training problems of train.jsonl (--data), with the same "
        "text once case and spacing are set aside; first: held-out x = training a, held-out z = training c. Held-out "
        "figures would be about problems the policy trained on: pass held-out data without them")
    assert "--allow_heldout_overlap true to train anyway" in str(e.value)
    capsys.readouterr()
    assert overlap.check_held_out(train_set, held, allow=True) == 2 and held.info["trained_problems"] == 2
    assert "(--allow_heldout_overlap true): counted as heldout/trained_problems" in capsys.readouterr().err
    apart = _set("other.jsonl", [("x", "What is 2+4?")])
    assert overlap.check_held_out(train_set, apart, allow=False) == 0 and apart.info["trained_problems"] == 0


def test_the_fork_example_splits_by_a_hash_of_the_problem(tmp_path, monkeypatch):
    (tmp_path / "units_page.py").write_text(_page_task())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "units_page", raising=False)
    from units_page import UnitsDigit

    # 800 problems a side (the held-out side holds about 1,000 sums): two seeds alone would share about 64
    task, cfg = UnitsDigit(n_problems=800), train.Config()
    texts = {side: [p.messages[0]["content"] for p in task.read("units", cfg, held_out=side)[0]] for side in (False, True)}
    assert len(set(texts[True])) == len(texts[True]) == 800 and not set(texts[True]) & set(texts[False])


ROWS = [{"id": f"q{i}", "problem": f"What is {i}+{i + 1}?", "answer": str(2 * i + 1)} for i in range(6)] + [
    {"id": "long1", "problem": "Add the two numbers that follow, " + "and think well, " * 3 + "What is 3+4?", "answer": "7"},
    {"id": "long2", "problem": "Here is a longer question for you: " + "truly, " * 6 + "What is 5+1?", "answer": "6"}]


@pytest.fixture(scope="module")
def overlapping_run(tmp_path_factory) -> tuple[Path, str, str]:
    """(run directory, data file, what the run printed): 1 step on a file passed as both --data and --eval_data,
    allowed and counted, its long prompts cut under --prompt_truncation left."""
    root = tmp_path_factory.mktemp("overlap")
    data = _jsonl(root / "d.jsonl", ROWS)
    run, out = root / "run", io.StringIO()
    with contextlib.redirect_stdout(out):
        train.main(["--run_dir", str(run), "--data", data, "--eval_data", data, "--eval_k", "1", "--instruction", "none",
                    *SMALL, "--steps", "1", "--allow_heldout_overlap", "true", "--prompt_truncation", "left",
                    "--max_prompt_len", "40"])
    return run, data, out.getvalue()


def test_the_same_file_as_training_and_held_out_data_is_refused_before_the_model_loads(tmp_path, capsys):
    data = _jsonl(tmp_path / "d.jsonl", ROWS)
    capsys.readouterr()
    assert cli.run_cli(train.main, ["--run_dir", str(tmp_path / "r"), "--data", data, "--eval_data", data, *SMALL,
                                    "--instruction", "none", "--steps", "1"]) == 2
    lines = _errors(capsys)
    assert len(lines) == 1 and lines[0].startswith(
        f"error: 8 of 8 held-out problems of {data} (--eval_data) are training problems of {data} (--data)"), lines
    assert not (tmp_path / "r").exists()  # refused before any work


def test_an_allowed_overlap_is_counted_in_the_summary_and_every_held_out_line(overlapping_run, capsys):
    run, data, printed = overlapping_run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["heldout/trained_problems"] == summary["heldout_after/trained_problems"] == 8
    for tag in ("before", "after"):
        assert re.search(rf"^\[held-out {tag}\] .* \(8 of these 8 problems were trained on\)$", printed, re.M), printed
    assert re.search(r"^held-out avg@1: before .* -> after .* \(8 problems, .*; 8 of them were trained on\)$", printed, re.M)
    # eval.py on the run's training data says so, and its report counts it
    capsys.readouterr()
    res = ev.main(["--model", str(run), "--data", data, "--k", "1", "--limit", "4", "--greedy", "false"])
    assert res["settings"]["trained_problems"] == 4
    assert (f"[warning] 4 of 4 problems of {data} are problems the run of {run / 'final'} trained on (its --data {data}, "
            "the same text once case and spacing are set aside); first: q0 (training q0)") in capsys.readouterr().err
    res = ev.main(["--model", str(run), "--data", "tiny", "--task", "tasks.tiny:TinyTask", "--k", "1", "--limit", "2",
                   "--greedy", "false"])
    assert res["settings"]["trained_problems"] == 0


# --- 4. --prompt_truncation left ------------------------------------------------------------------------------

SYSTEM_TEMPLATE = ("{{ 'SYSTEM: ADD NUMBERS.\\n' }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '\\n' }}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


@pytest.fixture
def chat_tok():
    """The tiny tokenizer under a chat template with a system turn of its own (as SmolLM2's adds one)."""
    tok = policy.load_tokenizer("")
    tok.chat_template = SYSTEM_TEMPLATE
    return tok


def _through(tok, text: str) -> str:
    return tok.decode(tok(text, add_special_tokens=False)["input_ids"])


def test_a_cut_takes_the_start_of_the_problem_and_keeps_the_template(chat_tok):
    problem = Problem("long", [{"role": "user", "content": "Add them all: " + "1+" * 40 + "1?"}], "41", bare=False)
    cfg = train.Config(instruction="none", max_prompt_len=40, prompt_truncation="left")
    ids = Task().build_prompt(problem, chat_tok, cfg)
    text = chat_tok.decode(ids)
    assert 38 <= len(ids) <= 40 and text.startswith("SYSTEM: ADD NUMBERS.\n<|user|>"), text
    assert text.endswith("1+1+1+1?\n<|assistant|>") and "Add them" not in text, text
    # a row holding the official instruction (DAPO-Math-17k's rows do) keeps it whole, both sides of the problem
    row = Problem("dapo", [{"role": "user", "content": DAPO_PREFIX + "Add: " + "2+" * 120 + "2?" + DAPO_SUFFIX}], "242")
    cfg = train.Config(max_prompt_len=320, prompt_truncation="left")
    text = chat_tok.decode(Task().build_prompt(row, chat_tok, cfg))
    assert text.startswith("SYSTEM: ADD NUMBERS.\n<|user|>" + _through(chat_tok, DAPO_PREFIX)), text
    assert text.endswith("2+2?" + _through(chat_tok, DAPO_SUFFIX) + "\n<|assistant|>"), text
    empty = chat_tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True, tokenize=False)
    structure = len(chat_tok(empty, add_special_tokens=False)["input_ids"])
    with pytest.raises(ValueError, match=r"the prompt of problem long has \d+ tokens and cannot be cut within "
                                         r"--max_prompt_len 10 by the start of its text: everything around the text "
                                         rf"\(chat template, instruction, examples\) takes {structure} tokens"):
        Task().build_prompt(problem, chat_tok, train.Config(instruction="none", max_prompt_len=10, prompt_truncation="left"))


def test_the_cut_prompts_are_counted_and_named_at_load(tmp_path, tiny_tok, capsys):
    path = _jsonl(tmp_path / "d.jsonl", ROWS)
    capsys.readouterr()
    data = Task().load(path, tiny_tok, train.Config(instruction="none", max_prompt_len=40, prompt_truncation="left"),
                       held_out=False)
    assert len(data) == 8 and data.info["prompts_cut"] == 2 and data.info["prompts_cut_first"] == ["long1", "long2"]
    assert re.fullmatch(
        rf"\[data\] 2 of 8 prompts of {re.escape(path)} exceed --max_prompt_len 40 tokens and lost the start of the "
        r"problem's text \(--prompt_truncation left; the chat template, instruction and examples stay\); first: problem "
        r"long1 \(\d+ tokens\), problem long2 \(\d+ tokens\)\n", capsys.readouterr().err)
    assert all(len(x) <= 40 for x in data.prompt_ids)


def test_the_run_summary_counts_the_cut_prompts(overlapping_run):
    run, _, _ = overlapping_run
    assert json.loads((run / "summary.json").read_text())["prompts_cut"] == {
        "data": {"count": 2, "first": ["long1", "long2"]}, "eval_data": {"count": 2, "first": ["long1", "long2"]}}


def test_eval_refuses_a_long_prompt_naming_its_own_flags(tmp_path, capsys):
    path = _jsonl(tmp_path / "d.jsonl", ROWS)
    argv = ["--data", path, "--max_prompt_len", "40", "--instruction", "none", "--k", "1", "--greedy", "false"]
    capsys.readouterr()
    assert cli.run_cli(ev.main, argv) == 2
    (line,) = _errors(capsys)
    assert "exceed --max_prompt_len 40 tokens" in line and "--prompt_truncation left" in line, line
    flags = set(re.findall(r"--(\w+)", line))
    assert flags <= {f.name for f in dataclasses.fields(ev.EvalConfig)}, flags  # each one eval.py has
    res = ev.main([*argv, "--prompt_truncation", "left"])
    assert res["settings"]["prompts_cut"] == 2 and res["settings"]["n_problems"] == 8


def test_a_real_chat_template_keeps_its_system_turn_and_markers(smollm2_dir):
    tok = policy.load_tokenizer(str(smollm2_dir))
    problem = Problem("long", [{"role": "user", "content": "Find the sum. " + "12 + " * 80 + "12?"}], "972")
    full = tok.decode(Task().build_prompt(problem, tok, train.Config()))
    cut = tok.decode(Task().build_prompt(problem, tok, train.Config(max_prompt_len=140, prompt_truncation="left")))
    head, tail = full.split(DAPO_PREFIX)[0] + DAPO_PREFIX, DAPO_SUFFIX + full.split(DAPO_SUFFIX)[1]
    assert head.startswith("<|im_start|>system\n") and tail.endswith("<|im_start|>assistant\n")
    assert cut.startswith(head) and cut.endswith("12 + 12?" + tail) and "Find the sum" not in cut, cut
