"""Tests of verifier.py's guards: code in model text is never executed, and expressions built to
hang or explode the math parser come back in bounded time: refused before parsing when their
structure says they are expensive (G7 of verifier.py), else as verifier exceptions (timeout,
parse_error), with the worker processes that make this possible (killed on a timeout, replaced by
a fork of a warm fork server: no call after a timeout waits for a start-up). The verdict tables are in
tests/test_verifier.py, tests/test_verifier_kinds.py and tests/test_verifier_grammar.py.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_verifier_guards.py

The only wall-clock asserts are hang guards and time-limit checks, each with its margin stated where
it is asserted.
"""

from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import verifier  # noqa: E402
from plumbing import math_equivalence, math_workers, sympy_guard  # noqa: E402
from verifier import EXCEPTION_REASONS, MODES, REASONS, score  # noqa: E402


# --- code in model text: never executed ---------------------------------------------------------

INJECTIONS = [
    "__import__('os').system('touch {path}')",
    "(lambda: __import__('os').system('touch {path}'))()",
    "().__class__.__bases__[0].__subclasses__()[0]('touch {path}')",
    "eval(\"open('{path}', 'w')\")",
    "exec('import os; os.system(\"touch {path}\")')",
    "lambda x: open('{path}', 'w')",
    "os.system('touch {path}')",
]


@pytest.mark.parametrize("payload", INJECTIONS)
def test_code_in_answer_is_never_executed(payload, tmp_path):
    path = tmp_path / "pwned"
    code = payload.format(path=path)
    for response in (f"Answer: {code}", f"\\boxed{{{code}}}"):
        for mode in MODES:
            s = score(response, "13", mode=mode)
            assert not s.correct, (mode, s)
    assert not path.exists(), f"side effect: {path} was created"


def test_math_worker_parser_does_not_execute_code(tmp_path):
    """Past our own dunder filter too: the parser itself reads code as symbols, never runs it."""
    path = tmp_path / "pwned"
    preds = [p.format(path=path) for p in INJECTIONS]
    reply = math_workers.ask({"truth": "13", "preds": preds}, 5.0)
    assert reply["status"] in ("ok", "parse_error"), reply
    assert reply.get("verdicts", [False]) == [False] * len(reply.get("verdicts", [False]))
    assert not path.exists()


# --- expressions that hang or explode: bounded time, reported as verifier exceptions ------------

BOMBS = [
    "9^{9^{9^{9}}}",
    "100!!!!!!",
    "(" * 400 + "1" + ")" * 400,
    "{" * 400 + "1" + "}" * 400,
    "9" * 990,
    "10^{10^{10^{10}}} - 10^{10^{10^{10}}}",
]


def _ensure_server() -> None:
    """Have the math workers' fork server started, so that each timing below measures the time
    limit, not the server's start-up (which score() does not count: see its docstring)."""
    math_workers._started_server()


# Text built to make string rules slow (backtracking, quadratic rescans, one check per marker):
# 100-300 KB each, so a quadratic rule would take minutes on them. With each, the exact verdicts
# (correct, reason) of "dapo" and "dapo-official" for the ground truth 3.
STRING_BOMBS = [
    ("answer:" * 40_000, (False, "multiple_answers"), (False, "wrong")),  # over 16 markers: spam
    ("Answer: 1.5 or x\n" * 10_000 + "Answer: 3", (False, "multiple_answers"), (True, "ok")),
    ("Answer: 1" + ", since" * 40_000, (False, "wrong"), (False, "no_answer")),
    (":" * 200_000, (False, "no_answer"), (False, "no_answer")),
    ("Answer: " + "1 " * 100_000, (False, "malformed"), (False, "no_answer")),  # over 1000 characters
    ("box" * 100_000, (False, "no_answer"), (False, "no_answer")),
    ("\\fbox" * 50_000, (False, "multiple_answers"), (False, "no_answer")),  # over 16 boxes
    ("\\colorbox{" * 30_000, (False, "multiple_answers"), (False, "no_answer")),
    ("Answer: " + "`" * 100_000 + "3", (True, "ok"), (False, "no_answer")),
    ("Answer: " + "\\[" * 50_000 + "3", (False, "malformed"), (False, "no_answer")),
    ("Answer: 3" + " (because" * 30_000, (True, "ok"), (False, "no_answer")),
    ("\uff1a answer" * 30_000, (False, "multiple_answers"), (False, "no_answer")),
    # the final answer section and the notations of dapo-verifier-3
    ("\\boxed{3}\n" * 50_000, (False, "multiple_answers"), (False, "no_answer")),  # over 16 boxes
    ("\\boxed{3}" + "\n" * 200_000 + "\\boxed{3}", (True, "ok"), (False, "no_answer")),  # past the reach
    ("the answer is " * 20_000 + "\\boxed{3}", (True, "ok"), (False, "no_answer")),
    ("Answer: 3" + "\n3" * 100_000, (False, "multiple_answers"), (False, "no_answer")),  # a column: spam
    ("Answer: " + "1" * 300_000, (False, "wrong"), (False, "no_answer")),  # one long integer, read whole
    ("Answer: " + "1," * 100_000 + "1", (False, "malformed"), (False, "no_answer")),
    ("\\boxed " + "1 " * 100_000, (False, "malformed"), (False, "no_answer")),
    ("Answer: 3 (" + "thirty " * 30_000 + ")", (False, "malformed"), (False, "no_answer")),
    ("Answer: 3e9999", (False, "wrong"), (False, "wrong")),  # a 10,000-digit value, built exactly
]
# Hang guard for the string rules: 1 s per call. A call normally takes 10-100 microseconds and
# the largest bomb a few milliseconds, so the margin is over 100x even on a slow, busy machine.
STRING_HANG_GUARD_S = 1.0
# Hang guard for the math mode: the time limit plus 10 s. Killing a worker takes milliseconds; the
# 10 s only absorb a loaded machine. A limit that is not enforced shows as a hang of minutes.
MATH_HANG_MARGIN_S = 10.0


@pytest.mark.parametrize("bomb, dapo, official", STRING_BOMBS, ids=range(len(STRING_BOMBS)))
def test_string_bombs_are_linear(bomb, dapo, official):
    for mode, verdict in (("dapo", dapo), ("dapo-official", official)):
        start = time.monotonic()
        s = score(bomb, "3", mode=mode)
        elapsed = time.monotonic() - start
        assert (s.correct, s.reason) == verdict, (mode, s.detail)
        assert elapsed < STRING_HANG_GUARD_S, (mode, elapsed)


def test_bombs_return_within_time_limit():
    timeout_s = 1.0
    for bomb in BOMBS:
        for mode in MODES:
            if mode == "math":
                _ensure_server()
            start = time.monotonic()
            s = score(f"Answer: {bomb}", "13", mode=mode, timeout_s=timeout_s)
            elapsed = time.monotonic() - start
            assert not s.correct and s.reason in REASONS
            if mode == "math":  # the limit, then the kill; a fresh worker starts in the background
                assert elapsed < timeout_s + MATH_HANG_MARGIN_S, (bomb, elapsed, s)
            else:
                assert elapsed < STRING_HANG_GUARD_S, (bomb, mode, elapsed)


# The time limit is the backstop for what the structural refusal (G7) does not foresee. To reach it,
# the tests below switch that refusal off, so that "9^{9^{9^{9}}}" goes to the parser again (it is
# refused before parsing otherwise: test_expensive_answers_are_refused_before_parsing).
@pytest.fixture
def no_structural_refusal(monkeypatch):
    monkeypatch.setattr(sympy_guard, "cost_refusal", lambda pred: None)


def test_timeout_default_is_two_seconds_and_is_an_exception(no_structural_refusal):
    assert inspect.signature(score).parameters["timeout_s"].default == verifier.DEFAULT_TIMEOUT_S == 2.0
    _ensure_server()
    start = time.monotonic()
    s = score("Answer: 9^{9^{9^{9}}}", "13", mode="math")
    elapsed = time.monotonic() - start
    assert s.reason == "timeout" and s.reason in EXCEPTION_REASONS and not s.correct
    # Not before the limit (a property of the code, on any machine), and a hang guard after it.
    assert 2.0 - math_workers.TIMEOUT_MARGIN_S - 0.05 < elapsed < 2.0 + MATH_HANG_MARGIN_S


def test_timeout_works_in_a_thread(no_structural_refusal):
    results = []
    thread = threading.Thread(target=lambda: results.append(score("Answer: 9^{9^{9^{9}}}", "13", mode="math", timeout_s=1.0)))
    start = time.monotonic()
    thread.start()
    thread.join(timeout=30)  # hang guard: 30 s for a 1 s limit
    assert results and results[0].reason == "timeout"
    assert time.monotonic() - start < 30


def _score_in_child(response: str, timeout_s: float) -> tuple[str, float]:
    start = time.monotonic()
    s = score(response, "13", mode="math", timeout_s=timeout_s)
    return s.reason, time.monotonic() - start


def test_timeout_works_in_a_daemonic_worker_process(no_structural_refusal):
    # multiprocessing pool workers are daemonic and may not start multiprocessing children;
    # the verifier's subprocess workers are allowed there. The child's first call starts its own
    # fork server (not counted in its limit); the second forks a worker from it (counted, G7).
    with multiprocessing.get_context("fork").Pool(1) as pool:
        reason, _ = pool.apply(_score_in_child, ("Answer: 9^{9^{9^{9}}}", 1.0))
        ok_reason, _ = pool.apply(_score_in_child, ("Answer: \\frac{26}{2}", 30.0))  # a hang guard
    assert (reason, ok_reason) == ("timeout", "ok")


# Parse limits (deviation 29): (prediction, refused before parsing). Refused ones never reach a
# worker and come back as malformed in microseconds; the accepted ones at the limits go on to it.
def _nest(depth: int, wrap: str, leaf: str = "1") -> str:
    for _ in range(depth):
        leaf = wrap.replace("@", leaf)
    return leaf


PARSE_LIMITS = [
    (_nest(90, "\\frac{@}{2}"), True),  # 900 characters, under the length cap
    (_nest(9, "(@)"), True),
    (_nest(9, "[@]"), True),
    (_nest(5, "\\left(\\frac{@}{3}\\right)"), True),  # 10 deep: each level opens two
    ("(" + ",".join(["1"] * 80) + ")", True),  # 161 tokens
    ("+".join(["x"] * 81), True),
    (_nest(8, "(@)"), False),
    (_nest(7, "\\frac{@}{2}"), False),
    ("(" + ",".join(["1"] * 79) + ")", False),  # 159 tokens
    ("\\frac{\\sqrt{2+\\sqrt{3}}}{2}", False),
    ("\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", False),  # the MATH-500 answer with most tokens
]


def _check_refused_before_parsing(pred: str, refused: bool, why: str, monkeypatch) -> None:
    """pred is refused as malformed (detail holding `why`) without asking a worker, or reaches the
    worker (a stand-in that judges it wrong); string work only either way."""
    asked = []
    monkeypatch.setattr(math_workers, "ask", lambda request, timeout_s: asked.append(request) or
                        {"status": "ok", "verdicts": [False] * len(request["preds"])})  # fmt: skip
    start = time.monotonic()
    s = score(f"Answer: {pred}", "7", mode="math")
    assert time.monotonic() - start < STRING_HANG_GUARD_S  # string work only: a hang guard
    if refused:
        assert (s.reason, asked) == ("malformed", []) and why in s.detail, s
    else:
        assert s.reason == "wrong" and len(asked) == 1, s


@pytest.mark.parametrize("pred, refused", PARSE_LIMITS, ids=range(len(PARSE_LIMITS)))
def test_parse_limits_refuse_before_parsing(pred, refused, monkeypatch):
    _check_refused_before_parsing(pred, refused, "over the limits", monkeypatch)


def test_parse_limits_are_documented_constants():
    assert (sympy_guard.MAX_NESTING_DEPTH, sympy_guard.MAX_ANSWER_TOKENS) == (8, 160)


def test_after_any_number_of_timeouts_a_call_never_waits_for_a_start_up(monkeypatch, no_structural_refusal):
    """A timeout kills its worker; the next call takes an idle worker or forks a warm one from the
    fork server (milliseconds), never a worker that imports sympy: with the server up, nothing here
    may start one. Each easy call after a timeout is "ok", not a timeout (G7)."""
    _ensure_server()
    forks = []
    fork = math_workers._ForkServer.fork
    monkeypatch.setattr(math_workers._ForkServer, "fork", lambda server: forks.append(1) or fork(server))
    monkeypatch.setattr(math_workers, "_start_server", lambda: pytest.fail("a fork server started after a timeout"))
    for _ in range(3):
        assert score("Answer: 9^{9^{9^{9}}}", "13", mode="math", timeout_s=0.5).reason == "timeout"
        assert score("Answer: \\frac{26}{2}", "13", mode="math").reason == "ok"
    assert len(forks) >= 3  # each timed-out worker was replaced by a fork


def test_a_fork_server_that_cannot_start_raises_nothing_in_prepare(monkeypatch):
    """prepare() starts the server in a background thread; a failure there (an OSError from the OS, a
    server that does not answer) is left to the call that needs the server, which raises it."""
    monkeypatch.setattr(math_workers, "_server", None)
    monkeypatch.setattr(math_workers, "_server_starting", False)

    def cannot_start():
        raise OSError(14, "Bad address")

    monkeypatch.setattr(math_workers, "_ForkServer", cannot_start)
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    math_workers.prepare()
    for thread in threading.enumerate():
        if thread.name == math_workers._STARTER_THREAD:
            thread.join(10)
    assert errors == [] and math_workers._server is None and not math_workers._server_starting


def test_a_dead_worker_is_a_worker_error_and_a_dead_server_is_replaced():
    _ensure_server()
    worker = math_workers._server.fork()
    os.kill(worker.pid, signal.SIGKILL)
    math_workers._idle_workers.append(worker)
    reply = math_workers.ask({"truth": "1", "preds": ["1"]}, 5.0)
    assert reply["status"] == "worker_error", reply
    math_workers._server.proc.kill()  # the server itself: the next fork finds it gone and starts a new one
    math_workers._server.proc.wait()
    assert score("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", mode="math").correct


# Answers too expensive to evaluate (G7): (prediction, refused before parsing). Refused ones never
# reach a worker; each refused one ran into the 2 s time limit before (bench/bench_verifier.py).
COSTLY = [
    ("\\binom{10000000}{5000000}", True),
    ("\\dbinom{10^{7}}{5 \\cdot 10^{6}}", True),
    ("\\binom{100000}{50000}", True),
    ("9^{9^{9^{9}}}", True),  # a tower
    ("3^{3^{3^{3}}}", True),
    ("10^{10^{10}} - 10^{10^{10}}", True),
    ("100000!", True),
    ("(10^{6})!", True),
    ("100!!!!!!", True),
    ("2^{1000000}", True),
    ("(x+1)^{1000}", True),  # expanding a power of a sum
    ("(x+y+z)^{50}", True),
    ("(1+\\sqrt{2})^{1000}", True),
    ("\\sum_{k=1}^{10000000} k", True),
    ("\\sum_{k=1}^{1000} k^{k}", True),
    ("\\prod_{k=1}^{1000} (x+k)", True),
    ("\\binom{2000}{1000}", False),  # what real answers hold stays
    ("\\binom{10^{7}}{2}", False),
    ("10000!", False),
    ("2^{2^{2^{2^{2}}}}", False),  # 2^65536: 19,729 digits
    ("2^{2023} - 1", False),
    ("(x+1)^{20}", False),
    ("x^{10^{10}}", False),  # a symbol's power: nothing to compute
    ("\\sum_{k=1}^{n} k^{2}", False),
    ("\\sum_{k=1}^{100} \\frac{1}{k}", False),
    ("\\left(\\frac{3}{4}\\right)^{10}", False),
]


@pytest.mark.parametrize("pred, refused", COSTLY, ids=range(len(COSTLY)))
def test_expensive_answers_are_refused_before_parsing(pred, refused, monkeypatch):
    _check_refused_before_parsing(pred, refused, "too expensive", monkeypatch)


def test_every_math500_answer_passes_the_structural_refusal():
    """No real answer is refused: each MATH-500 ground truth, stated as a prediction, reaches the parser."""
    lines = (Path(__file__).parent / "fixtures" / "math500_answers.jsonl").read_text().splitlines()
    answers = [json.loads(line)["answer"] for line in lines if line.strip()]
    assert len(answers) == 500
    refused = [a for a in answers if sympy_guard.cost_refusal(math_equivalence.normalise_math(a)) is not None]
    assert refused == []


def test_structural_limits_are_documented_constants():
    limits = (sympy_guard.MAX_VALUE_DIGITS, sympy_guard.MAX_FACTORIAL_ARGUMENT, sympy_guard.MAX_EXPANSION_TERMS)
    assert limits == (100_000, 10_000, 40)
    assert (sympy_guard.MAX_SERIES_TERMS, sympy_guard.MAX_SERIES_WORK) == (100, 10**6)
    assert 0 < math_workers.TIMEOUT_MARGIN_S <= 0.3
