"""Throughput of verifier.py per mode, next to the official rule and math-verify, in one run.

    OMP_NUM_THREADS=1 python bench/bench_verifier.py                  # 10,000 responses per mode
    OMP_NUM_THREADS=1 python bench/bench_verifier.py --math-n 1000     # quicker: ~4 min -> ~25 s
    OMP_NUM_THREADS=1 python bench/bench_verifier.py --limits          # the structural limits' measurements

Responses are synthetic but realistic: real ground truths (and, where the file has them, problem
texts) from the repository's fixtures by default, tests/fixtures/dapo_math_17k_64.jsonl
(DAPO-Math-17k) for the integer modes and tests/fixtures/math500_answers.jsonl (MATH-500) for the
math mode; --integer-data and --math-data take any JSONL with an "answer" field (and an optional
"problem"). Reasoning of 300 to 8,000 characters, and endings in the proportions a base model
produces early in training (plain "Answer:", wrong values, bold, boxed, trailing period, no
answer, long trailing text). Everything runs on one core in this process (the math mode adds one
worker process).

Targets: "dapo" >= the official rule (verl's math_dapo.compute_score, the rule of the DAPO paper,
Yu et al. 2025, arXiv:2503.14476) and >= 50,000 responses/s on one core, so that scoring never
shows in a training step; "math" never above 2 s for one response (its default time limit), a
timeout and every call after it included: the guards block times inputs built to make the parser
take seconds (refused before parsing), a ground truth too expensive to evaluate (decided without a
parser), --timeouts real timeouts in a row (the structural refusal switched off for them: the
limit, then the kill, within the limit), each followed by easy calls, which fork a worker from the
warm fork server instead of waiting for one to start. --load N runs N busy-loop processes beside
the whole benchmark (2 saturates this project's 2 cores, as a training run does); --only-guards
times the guards block alone:

    OMP_NUM_THREADS=1 python bench/bench_verifier.py --only-guards --load 2
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import machine_line, title_line  # noqa: E402

import verifier  # noqa: E402
from plumbing import math_equivalence, math_workers, sympy_guard  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
INTEGER_DATA = FIXTURES / "dapo_math_17k_64.jsonl"
MATH_DATA = FIXTURES / "math500_answers.jsonl"
FILLER = (
    "Let me compute this step by step. ",
    "Substituting back, both sides agree. ",
    "We can factor the expression as $(x-1)(x+2)$. ",
    "By the AM-GM inequality, $a + b \\ge 2\\sqrt{ab}$. ",
    "So there are $\\binom{5}{2} = 10$ ways to choose them. ",
    "Wait, I should double-check the case $n = 0$. ",
    "\n\n",
)


def _reasoning(rng: random.Random, problem: str) -> str:
    target = rng.randint(300, 8000)
    parts, size = [problem[:300], "\n\n"], 0
    while size < target:
        parts.append(rng.choice(FILLER))
        size += len(parts[-1])
    return "".join(parts)


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL file that have an "answer" field, as {"answer", "problem"} strings.

    Raises:
        SystemExit: 2, after one "error: ..." line on stderr, when the file is missing, is not
            JSONL, or has no row with an "answer".
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        _fail(f"cannot read {path} ({error}); pass a readable JSONL file")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            _fail(f"{path} line {number} is not JSON ({error.msg}); pass a JSONL file")
        if isinstance(row, dict) and "answer" in row:
            rows.append({"answer": str(row["answer"]), "problem": str(row.get("problem", ""))})
    if not rows:
        _fail(f"{path} has no row with an 'answer' field; pass a JSONL file of problems")
    return rows


def _fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def integer_responses(rows: list[dict], n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    endings = [  # (weight, template); {v} the value written, {t} a long tail
        (40, "\nAnswer: {v}"),
        (20, "\nAnswer: {w}"),
        (5, "\nAnswer: {v}."),
        (5, "\n**Answer:** {v}"),
        (5, "\nAnswer: $\\boxed{{{v}}}$"),
        (10, "\nTherefore the answer is $\\boxed{{{v}}}$."),
        (5, ""),  # truncated: no answer
        (5, "\nAnswer: {v}\n{t}"),
        (5, "\nAnswer: \\boxed{{{v}}}"),
    ]
    weights, templates = zip(*endings)
    responses, truths = [], []
    for _ in range(n):
        row = rng.choice(rows)
        truth = row["answer"]
        template = rng.choices(templates, weights)[0]
        ending = template.format(v=truth, w=int(truth) + rng.choice([-2, -1, 1, 7]), t=_reasoning(rng, "")[:600])
        responses.append(_reasoning(rng, row["problem"]) + ending)
        truths.append(truth)
    return responses, truths


def math_responses(rows: list[dict], n: int, seed: int = 1) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    responses, truths = [], []
    for _ in range(n):
        row = rng.choice(rows)
        truth = row["answer"]
        value = truth
        kind = rng.random()
        if kind < 0.3:
            value = rng.choice(rows)["answer"]  # wrong (usually)
        elif kind < 0.45:
            value = truth.replace("\\frac", "\\dfrac")
            if "\\left" not in value:
                value = value.replace("(", "\\left(").replace(")", "\\right)")
        elif kind < 0.55:
            value = f"x = {truth}" if "=" not in truth else truth
        ending = rng.choice(["\nAnswer: {v}", "\nThe final answer is $\\boxed{{{v}}}$.", "\nAnswer: ${v}$."])
        responses.append(_reasoning(rng, row["problem"]) + ending.format(v=value))
        truths.append(truth)
    return responses, truths


def rate(fn, responses, truths) -> tuple[float, list, float, int]:
    """(responses per wall-clock second, results, slowest single call in seconds, its index), one pass."""
    results, slowest, where = [], 0.0, 0
    start = time.perf_counter()
    for i, (response, truth) in enumerate(zip(responses, truths)):
        t0 = time.perf_counter()
        results.append(fn(response, truth))
        if time.perf_counter() - t0 > slowest:
            slowest, where = time.perf_counter() - t0, i
    return len(responses) / (time.perf_counter() - start), results, slowest, where


def _nest(depth: int, wrap: str) -> str:
    text = "1"
    for _ in range(depth):
        text = wrap.replace("@", text)
    return text


# Inputs that math-verify's parser and sympy take seconds on, each under the 1,000-character answer
# cap: nested or long ones (refused before parsing since dapo-verifier-3), and short ones whose value
# is expensive to build or expand (refused since dapo-verifier-4, G7 of verifier.py; each ran into
# the 2 s limit before, measured with this script).
PARSER_BOMBS = (
    ("\\frac nested 90 deep", _nest(90, "\\frac{@}{2}")),
    ("\\frac nested 16 deep", _nest(16, "\\frac{@}{2}")),
    ("parentheses 30 deep", _nest(30, "(@)")),
    ("a 300-element tuple", "(" + ",".join(["1"] * 300) + ")"),
    ("60 intervals joined", "\\cup".join(["(1,2)"] * 60)),
    ("a tower 9^{9^{9^{9}}}", "9^{9^{9^{9}}}"),
    ("\\binom{10000000}{5000000}", "\\binom{10000000}{5000000}"),
    ("\\binom{10^{7}}{5 \\cdot 10^{6}}", "\\binom{10^{7}}{5 \\cdot 10^{6}}"),
    ("(10^{6})!", "(10^{6})!"),
    ("10^{10^{10}}", "10^{10^{10}}"),
    ("(x+y+z)^{50}", "(x+y+z)^{50}"),
    ("\\sum_{k=1}^{1000} k^{k}", "\\sum_{k=1}^{1000} k^{k}"),
)
# The structural refusal (G7) stops every input known to reach the time limit; the limit itself is
# the backstop for what it does not foresee. To time timeouts, this script switches the refusal off
# for those calls, so that the tower goes to the parser as it did before dapo-verifier-4.
TIMEOUT_BOMB = "9^{9^{9^{9}}}"  # structurally small; its value has ~10^369693099 digits
# After each timeout, easy calls that must not wait for a worker's start-up (each well under 1 s alone).
AFTER_TIMEOUT = (("Answer: \\frac{26}{2}", "13"), ("Answer: \\frac{\\sqrt{8}}{2}", "\\sqrt{2}"),
                 ("Answer: \\frac{1}{2}", "0.5"))  # fmt: skip
COSTLY_TRUTH = "3^{3^{3^{3}}}"  # a ground truth too expensive to evaluate (G7): guarded as an answer is


def guards(timeout_s: float, rounds: int) -> float:
    """Print the guards block (see the module docstring); return its slowest call, in seconds, the
    timeouts and the calls after them included (each must return within timeout_s: G7)."""
    slowest = 0.0
    for name, bomb in PARSER_BOMBS:
        t0 = time.perf_counter()
        s = verifier.score(f"Answer: {bomb}", "1", mode="math", timeout_s=timeout_s)
        elapsed = time.perf_counter() - t0
        slowest = max(slowest, elapsed)
        print(f"  {name:32} {elapsed * 1e3:9.3f} ms  {s.reason}")
    for label, response in (("costly ground truth, as written", f"Answer: {COSTLY_TRUTH}"), ("costly ground truth, 5", "Answer: 5")):
        t0 = time.perf_counter()
        s = verifier.score(response, COSTLY_TRUTH, mode="math", timeout_s=timeout_s)
        elapsed = time.perf_counter() - t0
        slowest = max(slowest, elapsed)
        print(f"  {label:32} {elapsed * 1e3:9.3f} ms  {s.reason}")
    server = math_workers._started_server()
    t0 = time.perf_counter()
    worker = server.fork()  # what a call after a timeout waits for: a fork of the warm server
    fork_s = time.perf_counter() - t0
    worker.kill()
    timed = []
    refusal = sympy_guard.cost_refusal
    for round_ in range(1, rounds + 1):
        sympy_guard.cost_refusal = lambda pred: None  # the refusal off: the tower reaches the parser
        try:
            t0 = time.perf_counter()
            s = verifier.score(f"Answer: {TIMEOUT_BOMB}", "1", mode="math", timeout_s=timeout_s)
            timed.append((f"timeout {round_} (refusal off)", time.perf_counter() - t0, s.reason))
        finally:
            sympy_guard.cost_refusal = refusal
        for response, truth in AFTER_TIMEOUT:
            t0 = time.perf_counter()
            s = verifier.score(response, truth, mode="math", timeout_s=timeout_s)
            timed.append((f"  then {response[8:30]}", time.perf_counter() - t0, s.reason))
    for label, elapsed, reason in timed:
        slowest = max(slowest, elapsed)
        print(f"  {label:32} {elapsed:9.3f} s   {reason}")
    print(f"  {'a fork of the warm server':32} {fork_s * 1e3:9.3f} ms  (what a call after a timeout waits for)")
    return slowest


def _busy_loops(count: int) -> list:
    """count processes that spin on a core each (the load of a training run beside the verifier)."""
    import subprocess

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def interleaved_rates(modes, responses, truths, repeats: int, chunk: int = 250) -> dict:
    """Per mode: (responses per wall-clock second, responses per CPU second, results, slowest call).

    The responses are timed in chunks of `chunk`, the modes back to back on each chunk, `repeats`
    times, and each chunk's fastest time per mode is kept: on cores other jobs also use, a chunk
    that was preempted in one repeat is rarely preempted in all, so the sums estimate the one-core
    cost, and both modes see the same conditions. CPU time (this process only) is summed the same
    way; it is the one-core figure when the machine is oversubscribed, as wall time then also
    counts the time other jobs held the core. The slowest call is the largest, over responses, of
    each response's fastest call in two more passes (timing every call costs a little, so it is
    kept out of the rates).
    """
    n = len(responses)
    starts = range(0, n, chunk)
    wall = {mode: [float("inf")] * len(starts) for mode in modes}
    cpu = {mode: [float("inf")] * len(starts) for mode in modes}
    results = {mode: [None] * n for mode in modes}
    for repeat in range(repeats):
        for k, first in enumerate(starts):
            for mode in modes if (repeat + k) % 2 == 0 else modes[::-1]:  # alternate who goes first
                rows = range(first, min(first + chunk, n))
                w0, c0 = time.perf_counter(), time.process_time()
                out = [verifier.score(responses[i], truths[i], mode=mode) for i in rows]
                w1, c1 = time.perf_counter(), time.process_time()
                wall[mode][k], cpu[mode][k] = min(wall[mode][k], w1 - w0), min(cpu[mode][k], c1 - c0)
                results[mode][first : first + len(out)] = out
    slowest = {}
    for mode in modes:
        fastest = [float("inf")] * n
        for _ in range(2):
            for i in range(n):
                t0 = time.perf_counter()
                verifier.score(responses[i], truths[i], mode=mode)
                fastest[i] = min(fastest[i], time.perf_counter() - t0)
        slowest[mode] = max(fastest)
    return {mode: (n / sum(wall[mode]), n / max(sum(cpu[mode]), 1e-9), results[mode], slowest[mode])
            for mode in modes}


# The measurements behind the structural limits of verifier.py (G7): inputs on each side of a limit,
# timed in one worker with the refusal off, against the ground truth 13 (--limits).
LIMIT_CASES = (
    ("MAX_VALUE_DIGITS", ["2^{300000}", "2^{1000000}", "10^{10^{6}}"]),
    ("MAX_FACTORIAL_ARGUMENT", ["10000!", "20000!", "100000!", "\\binom{20000}{10000}", "\\binom{100000}{50000}"]),
    ("MAX_EXPANSION_TERMS", ["(x+1)^{39}", "(x+1)^{80}", "(x+y+z)^{7}", "(x+y+z)^{10}", "(x+y+z)^{20}",
                             "(1+\\sqrt{2})^{100}", "(1+\\sqrt{2})^{1000}"]),
    ("MAX_SERIES_TERMS, MAX_SERIES_WORK", ["\\prod_{k=1}^{100} k", "\\sum_{k=1}^{100} k^{k}", "\\prod_{k=1}^{100} (x+k)",
                                          "\\sum_{k=1}^{100000} k", "\\sum_{k=1}^{1000} \\frac{1}{k^{3}}"]),
)
LIMIT_TIMEOUT_S = 10.0


def limits() -> None:
    """Print, per structural limit, each input's refusal (or none) and its parse-and-compare time."""
    verifier.score("Answer: \\frac{1}{2}", "0.5", mode="math")  # start the worker outside the timing
    for name, preds in LIMIT_CASES:
        print(f"{name}:")
        for pred in preds:
            refusal = sympy_guard.cost_refusal(math_equivalence.normalise_math(pred))
            t0 = time.perf_counter()
            reply = math_workers.ask({"truth": "13", "preds": [pred]}, LIMIT_TIMEOUT_S)
            elapsed = time.perf_counter() - t0
            print(f"  {pred:34} {elapsed:7.3f} s  {reply['status']:8} {'refused' if refusal else 'accepted'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="responses for the integer modes")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats for the integer modes (best kept)")
    parser.add_argument("--math-n", type=int, default=10_000, help="responses for the math mode and math-verify")
    parser.add_argument("--integer-data", type=Path, default=INTEGER_DATA,
                        help="JSONL with integer 'answer' (and optional 'problem') fields "
                        "(default: the repository's tests/fixtures/dapo_math_17k_64.jsonl)")
    parser.add_argument("--math-data", type=Path, default=MATH_DATA,
                        help="JSONL with LaTeX 'answer' (and optional 'problem') fields "
                        "(default: the repository's tests/fixtures/math500_answers.jsonl)")
    parser.add_argument("--timeouts", type=int, default=3, help="timeouts in a row in the guards block")
    parser.add_argument("--load", type=int, default=0,
                        help="busy-loop processes running beside the whole benchmark (0: none; 2 saturates 2 cores)")
    parser.add_argument("--only-guards", action="store_true", help="only the guards block (math mode's time limit)")
    parser.add_argument("--limits", action="store_true",
                        help="only time the inputs behind verifier.py's structural limits (G7), refusal off")
    args = parser.parse_args()
    if args.limits:
        print(title_line("bench_verifier --limits"))
        print(machine_line(f", usable cores {len(os.sched_getaffinity(0))}"))
        limits()
        return
    loads = _busy_loops(args.load)
    try:
        _run(args)
    finally:
        for proc in loads:
            proc.kill()


def _run(args: argparse.Namespace) -> None:
    integer_rows, math_rows = read_rows(args.integer_data), read_rows(args.math_data)

    versions = {name: importlib.metadata.version(name) for name in ("math-verify", "sympy")}
    time.sleep(2 if args.load else 0)  # the busy loops running, so that the load line reports them
    print(title_line("bench_verifier"))
    print(machine_line(f", usable cores {len(os.sched_getaffinity(0))}, busy-loop processes beside it {args.load}"))
    print(f"# python {platform.python_version()}, verifier {verifier.VERSION}, "
          + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if args.only_guards:
        verifier.score("Answer: \\frac{1}{2}", "0.5", mode="math")  # the workers' server, outside the timing
        print(f"\nguards (math mode, timeout {verifier.DEFAULT_TIMEOUT_S:g} s):")
        slowest = guards(verifier.DEFAULT_TIMEOUT_S, args.timeouts)
        verdict = "within" if slowest <= verifier.DEFAULT_TIMEOUT_S else "OVER"
        print(f"math mode, slowest call, timeouts and the calls after them included: {slowest:.3f} s ({verdict} the "
              f"{verifier.DEFAULT_TIMEOUT_S:g} s limit)")
        return

    responses, truths = integer_responses(integer_rows, args.n)
    mean_chars = sum(map(len, responses)) / len(responses)
    print(f"\ninteger answers: {len(responses)} responses ({args.integer_data.name}, {len(integer_rows)} rows), "
          f"mean {mean_chars:.0f} characters")
    print(f"{'rule':16} {'responses/s':>12} {'per CPU-s':>10} {'accuracy':>9} {'slowest call':>13}  "
          f"(chunks of 250, modes interleaved, fastest of {args.repeats} per chunk)")
    measured = interleaved_rates(("dapo", "dapo-official"), responses, truths, args.repeats)
    for mode, (per_s, per_cpu_s, results, slowest) in measured.items():
        accuracy = sum(s.correct for s in results) / len(results)
        print(f"{mode:16} {per_s:>12,.0f} {per_cpu_s:>10,.0f} {accuracy:>9.3f} {slowest * 1e3:>11.2f}ms")

    responses, truths = math_responses(math_rows, args.math_n)
    print(f"\ngeneral answers: {len(responses)} responses ({args.math_data.name}, {len(math_rows)} rows), "
          "one core, timeout 2 s")
    print(f"{'rule':16} {'responses/s':>12} {'accuracy':>9} {'slowest call':>13}  note")
    verifier.score("Answer: \\frac{1}{2}", "0.5", mode="math")  # start the workers' server outside the timing
    per_s, ours, slowest, where = rate(lambda r, t: verifier.score(r, t, mode="math"), responses, truths)
    reasons = {}
    for s in ours:
        reasons[s.reason] = reasons.get(s.reason, 0) + 1
    accuracy = sum(s.correct for s in ours) / len(ours)
    print(f"{'math':16} {per_s:>12,.0f} {accuracy:>9.3f} {slowest:>12.3f}s  reasons {reasons}")
    print(f"{'':16} slowest call: ground truth {truths[where][:40]!r}, prediction {(ours[where].pred or '')[:40]!r}")

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeouts print whole responses

    gold_cache = {}

    def math_verify_score(response: str, truth: str) -> bool:
        # The library's documented use: parse the whole response (LaTeX and plain-expression
        # extraction, its own SIGALRM timeouts, main thread only), verify against the parsed gold.
        if truth not in gold_cache:
            gold_cache[truth] = parse("\\boxed{" + truth + "}", parsing_timeout=2)
        return verify(gold_cache[truth], parse(response, parsing_timeout=2), timeout_seconds=2)

    per_s, theirs, slowest_theirs, _ = rate(math_verify_score, responses, truths)
    accuracy = sum(theirs) / len(theirs)
    agree = sum(s.correct == t for s, t in zip(ours, theirs)) / len(theirs)
    print(f"{'math-verify':16} {per_s:>12,.0f} {accuracy:>9.3f} {slowest_theirs:>12.3f}s  "
          f"verdicts agree with ours on {agree:.3f}")
    official = [verifier.score(r, t, mode="dapo-official").correct for r, t in zip(responses, truths)]
    print(f"{'dapo-official':16} {'':>12} {sum(official) / len(official):>9.3f} {'':>13}  (string rule on the same)")

    print(f"\nguards (math mode, timeout {verifier.DEFAULT_TIMEOUT_S:g} s):")
    slowest = max(slowest, guards(verifier.DEFAULT_TIMEOUT_S, args.timeouts))
    verdict = "within" if slowest <= verifier.DEFAULT_TIMEOUT_S else "OVER"
    print(f"math mode, slowest call, timeouts and the calls after them included: {slowest:.3f} s ({verdict} the "
          f"{verifier.DEFAULT_TIMEOUT_S:g} s limit)")


if __name__ == "__main__":
    main()
