"""The program of the math mode's worker processes (`python plumbing/math_verify_process.py FD`): a
fork server that imports math-verify and sympy once, replaces math-verify's number comparison by
ours (deviation 21 of docs/verifier.md) and warms both up, then forks one worker per request of
its parent (plumbing/math_workers.py). A forked worker is warm and ready in milliseconds, which is
what lets the call after a timeout (its worker killed) start on a fresh one at once, also on a
loaded machine (row G7 of verifier.py's grammar); it answers one JSON request per line on a socket
of its own. Runs as a script: imports nothing of the project.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import resource
import signal
import socket
import sys

# Address-space cap of a worker, so "9^9^9^9" ends in MemoryError, not in the host's OOM killer.
WORKER_MEMORY_BYTES = 3 * 1024**3


# Deviation 21, how the math mode compares numbers. Exact values (integers, fractions, powers,
# radicals, pi) are compared exactly; a decimal is the exact number it spells ("0.0000007" is
# 7/10^7), so it too is compared exactly with any value that has a finite decimal expansion. Only a
# decimal against a value that has none (1/3, pi, sqrt 2) is compared with a tolerance, relative so
# that tiny values never collapse: |a - b| <= DECIMAL_REL_TOL * max(|a|, |b|). 5e-6 accepts every
# correct rounding to 6 significant digits ("0.333333", "0.166667", "3.14159"), a shorter value only
# when it happens to be that close ("3.1416" for pi, 2.3e-6 off), and rejects "0.33333" for 1/3
# (1e-5 off), "1.4142" for sqrt 2 and "3.14".
DECIMAL_REL_TOL = (5, 10**6)  # 5e-6, as a fraction for exact arithmetic
EXACT_DIGITS = 30  # irrational exact forms must agree to this many significant digits
_EVAL_DIGITS = 60  # working precision of that check


def _install_number_rule(grader) -> None:
    """Make math-verify compare numbers by deviation 21 instead of its own rule.

    math_verify.grader.sympy_numeric_eq (math-verify 0.9.0) rounds both sides to 6 decimal places
    when one is a decimal, and otherwise tests `(a - b).evalf(chop=True) == 0`, which rounds away
    any difference below about 1e-15: 0.0000008 == 0.0000007 and 3^-60 == 3^-61 there. Every
    comparison in the grader (sets, tuples, intervals, matrices, equations) reaches numbers through
    that one function, so replacing it fixes them all.

    Raises:
        RuntimeError: the installed math-verify has no grader.sympy_numeric_eq (another version).
    """
    import sympy  # heavy (about a second): only the math worker, which alone compares expressions, imports it

    needed = ("sympy_numeric_eq", "is_atomic_or_pct_atomic", "safe_sympy_doit")
    missing = [name for name in needed if not hasattr(grader, name)]
    if missing:
        raise RuntimeError(f"math_verify.grader has no {', '.join(missing)}: install math-verify==0.9.0")
    original = grader.sympy_numeric_eq
    tolerance = sympy.Rational(*DECIMAL_REL_TOL)
    exact_tolerance = sympy.Rational(1, 10**EXACT_DIGITS)

    def exact(value):
        floats = value.atoms(sympy.Float)
        return value.xreplace({f: sympy.Rational(str(f)) for f in floats}), bool(floats)

    def finite_decimal(value) -> bool:
        denominator = value.q
        for prime in (2, 5):
            while denominator % prime == 0:
                denominator //= prime
        return denominator == 1

    def numeric_eq(a, b, float_rounding: int, numeric_precision: int) -> bool:
        matrices = (sympy.MatrixBase, sympy.MatrixExpr)
        if isinstance(a, matrices) and isinstance(b, matrices):
            return original(a, b, float_rounding, numeric_precision)  # element by element, through us
        if grader.is_atomic_or_pct_atomic(a, sympy.Integer) and grader.is_atomic_or_pct_atomic(b, sympy.Integer):
            return original(a, b, float_rounding, numeric_precision)  # exact already; "50%" == 50
        try:
            x, y = grader.safe_sympy_doit(a), grader.safe_sympy_doit(b)
            if not (isinstance(x, sympy.Expr) and isinstance(y, sympy.Expr) and x.is_number and y.is_number):
                # with symbols: exact, without the chop that zeroes tiny coefficients (x/3^60 vs x/3^61)
                return bool((a - b).evalf(n=numeric_precision) == 0)
            (x, x_decimal), (y, y_decimal) = exact(x), exact(y)
            if x.is_Rational and y.is_Rational:
                if not (x_decimal or y_decimal) or (finite_decimal(x) and finite_decimal(y)):
                    return bool(x == y)
                return bool(abs(x - y) <= tolerance * max(abs(x), abs(y)))
            limit = tolerance if x_decimal or y_decimal else exact_tolerance
            difference = abs((x - y).evalf(_EVAL_DIGITS))
            scale = max(abs(x.evalf(_EVAL_DIGITS)), abs(y.evalf(_EVAL_DIGITS)))
            return bool(difference <= limit * scale)
        except (TypeError, ValueError, ArithmeticError, NotImplementedError):
            # Not comparable as numbers (a boolean, a set, an unevaluable function): not shown equal
            # here, and math-verify goes on to its symbolic check, as after its own numeric check.
            return False

    grader.sympy_numeric_eq = numeric_eq


# One comparison per kind of expression the parser and sympy set up lazily (see main).
_WARM_UP = (
    ("\\frac{1}{2}", "0.5"), ("\\sqrt{5}", "2\\sqrt{5}"), ("3.14", "\\pi"), ("5r^5", "2"), ("p - q", "q - p"),
    ("y = 2x + 3", "2"), ("x \\in [-2, 7]", "[-2, 7]"), ("[1, 3)", "(1, 3]"), ("(2, 4)", "2"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"), ("\\{1, 2\\}", "1, 2"),
    ("1 \\pm \\sqrt{2}", "1 + \\sqrt{2}, 1 - \\sqrt{2}"), ("50\\%", "50"), ("30^\\circ", "30"),
    ("\\text{yes}", "\\text{no}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
)  # fmt: skip


def main(control_fd: int) -> None:
    """The fork server (runs in the subprocess): set math-verify up, say "ready" on the control
    socket, then fork a worker for each request, sending back its pid and its end of a new socket
    pair. Only LaTeX extraction is enabled in math-verify: its plain-expression extractor calls
    sympy's parse_expr, which uses eval()."""
    control = socket.socket(fileno=control_fd)
    os.dup2(2, 1)  # stray prints from libraries go to stderr, never into a protocol

    def send(message: dict) -> None:
        control.sendall(json.dumps(message).encode() + b"\n")

    try:
        from math_verify import LatexExtractionConfig, grader, parse, verify

        _install_number_rule(grader)
    except (ImportError, RuntimeError) as error:
        send({"ready": False, "detail": str(error)})
        return
    # Our parent enforces the time limit, so math-verify runs with its own timeouts off; silence
    # its once-per-process warning about exactly that.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    config = [LatexExtractionConfig(boxed_match_priority=0)]

    def read(latex: str) -> list:
        return parse("\\boxed{" + latex + "}", extraction_config=config, parsing_timeout=None, raise_on_error=True)

    # sympy and the LaTeX parser set parts of themselves up on first use, 0.1-0.5 s per kind of
    # expression: pay that here, once, before "ready"; every worker forked after it starts warm.
    try:
        for gold, pred in _WARM_UP:
            verify(read(gold), read(pred), timeout_seconds=None)
    except Exception as error:  # a broken install; the parent raises with this detail
        send({"ready": False, "detail": f"warm-up failed: {type(error).__name__}: {str(error)[:200]}"})
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers, killed or not
    send({"ready": True})
    for _ in control.makefile("rb"):  # one line per worker asked for; end of file: the parent is gone
        parent_end, child_end = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            os.close(control_fd)  # the worker holds no end of the control socket (the server sees its parent go)
            parent_end.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
            try:
                _serve(child_end, read, verify)
            finally:
                os._exit(0)
        child_end.close()
        socket.send_fds(control, [json.dumps({"pid": pid}).encode() + b"\n"], [parent_end.fileno()])
        parent_end.close()


def _serve(sock: socket.socket, read, verify) -> None:
    """A forked worker's loop: one request {"truth", "preds"} per line, one reply per request."""
    read_truth = functools.lru_cache(maxsize=4096)(read)

    def send(message: dict) -> None:
        sock.sendall(json.dumps(message).encode() + b"\n")

    for line in sock.makefile("rb"):
        request = json.loads(line)
        try:
            gold = read_truth(request["truth"])
        except Exception as error:  # the dataset's fault, not the model's: the caller raises
            send({"status": "bad_ground_truth", "detail": f"{type(error).__name__}: {str(error)[:200]}"})
            continue
        if not gold:
            send({"status": "bad_ground_truth", "detail": "math-verify found no expression"})
            continue
        try:
            verdicts = []
            for pred in request["preds"]:
                target = read(pred)
                if not target:
                    raise ValueError(f"math-verify found no expression in {pred[:80]!r}")
                verdicts.append(verify(gold, target, timeout_seconds=None, raise_on_error=True))
            send({"status": "ok", "verdicts": verdicts})
        except MemoryError:
            send({"status": "worker_error", "detail": f"out of memory (cap {WORKER_MEMORY_BYTES} bytes)"})
        except Exception as error:  # any parser failure on model text is a verdict, reported with its type
            send({"status": "parse_error", "detail": f"{type(error).__name__}: {str(error)[:200]}"})


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone: nobody to answer
