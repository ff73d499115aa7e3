"""The math mode's worker processes: math-verify (LaTeX parser -> sympy) runs in subprocesses that
are killed past a call's time limit, with spares kept ready so that the call after a timeout does
not wait for one to start (row G7 of verifier.py's grammar); and, inside a worker, math-verify's
number comparison replaced by ours (deviation 21 of docs/verifier.md).

`ask(request, timeout_s)` sends one comparison and returns the worker's reply or a timeout or
worker_error status within timeout_s. This file is also the worker program (`python
plumbing/math_workers.py --math-worker`); it imports nothing of the project.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import resource
import select
import subprocess
import sys
import threading
import time

# Longest answer text we look at. The longest MATH-500 answer has 159 characters (verl's
# math_dapo.py comment); 1000 leaves room for matrices and keeps every step cheap.
MAX_ANSWER_CHARS = 1000
# Address-space cap of a math worker, so "9^9^9^9" ends in MemoryError, not in the host's OOM killer.
WORKER_MEMORY_BYTES = 3 * 1024**3
WORKER_START_TIMEOUT_S = 120.0  # importing sympy + math-verify on a loaded machine; not model time
# --- plumbing: the math worker processes ------------------------------------------------------
# A worker is `python verifier.py --math-worker`: a subprocess (not multiprocessing, so it also
# starts from daemonic pool workers) that reads one JSON request per line on stdin and answers on
# stdout. A call that runs past timeout_s gets the worker killed: that works from any thread and
# any process, where SIGALRM (math-verify's own timeout) works only in the main thread.


class _MathWorker:
    """One `verifier.py --math-worker` subprocess and the pipes to it; used by one thread at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--math-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self.buffer = b""
        ready = self._read_line(time.monotonic() + WORKER_START_TIMEOUT_S)
        if ready is None or not json.loads(ready).get("ready"):
            self.kill()
            why = json.loads(ready).get("detail", "") if ready else "no answer in time"
            raise RuntimeError(
                f"math-mode worker failed to start ({why}): math mode needs math-verify, "
                f"install it with pip install 'math-verify==0.9.0'"
            )

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the worker, or None when the deadline passes or the worker died."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # end of file: the worker died
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def ask(self, request: dict, timeout_s: float) -> dict | None:
        """The worker's reply, or None after a timeout or a crash (the worker is then dead)."""
        try:
            os.write(self.proc.stdin.fileno(), json.dumps(request).encode() + b"\n")
        except BrokenPipeError:
            return None
        line = self._read_line(time.monotonic() + timeout_s)
        return json.loads(line) if line is not None else None

    def kill(self, reap_later: bool = False) -> None:
        """Kill the worker process. reap_later: wait for it (10-20 ms while the OS frees its memory)
        and close the pipes in a background thread, so that a timed-out call returns at its limit."""
        self.proc.kill()
        if reap_later:
            threading.Thread(target=self._reap, daemon=True, name="verifier-math-worker-reap").start()
        else:
            self._reap()

    def _reap(self) -> None:
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


# Spare workers are kept started beyond those in use (deviation 29, G7): a timeout kills its worker,
# and the next call then takes a spare, ready, instead of waiting 2-4 s for a worker to start. Two,
# so that the call after a timeout finds one ready even when the timed-out call had taken the last
# idle one (its replacement is then still starting: 1.5-2.8 s seen on a loaded machine). Spares
# start in a background thread, one at a time, whenever a call takes a worker or a timeout kills one.
SPARE_WORKERS = 2
# Seconds kept back from a call's time limit for what follows a timeout (the kill, starting the
# replacement's thread, returning), so that the call returns within the limit: measured at 2-4 ms
# on an idle machine (bench/bench_verifier.py); 50 ms leaves room for a loaded one.
TIMEOUT_MARGIN_S = 0.05
_idle_workers: list[_MathWorker] = []
_starting = 0  # spares being started in background threads
_waiting = 0  # calls waiting for one of those spares
_STARTER_THREAD = "verifier-math-worker-start"  # the name of a thread starting a spare worker
_workers_lock = threading.Condition()


def _forget_workers_after_fork() -> None:
    # A forked child must not share the parent's pipes (two readers on one worker) nor its lock.
    global _idle_workers, _workers_lock, _starting, _waiting
    _idle_workers, _workers_lock, _starting, _waiting = [], threading.Condition(), 0, 0


os.register_at_fork(after_in_child=_forget_workers_after_fork)


@atexit.register
def _stop_workers() -> None:
    with _workers_lock:
        while _idle_workers:
            _idle_workers.pop().kill()


def _start_spare() -> threading.Thread:
    """Start a spare worker in a background thread (counted in _starting until it is ready)."""
    global _starting
    with _workers_lock:
        _starting += 1
    thread = threading.Thread(target=_start_idle_worker, daemon=True, name=_STARTER_THREAD)
    thread.start()
    return thread


def _start_idle_worker() -> None:
    """The spare's thread: start a worker and make it idle. The spare is only a head start: if it
    cannot start (an OSError from the OS, a worker that does not answer), nothing is raised in the
    thread; the next call starts its own worker and raises the clear error there."""
    global _starting
    worker = None
    try:
        worker = _MathWorker()
    except (OSError, RuntimeError):
        pass
    finally:
        with _workers_lock:
            _starting = max(0, _starting - 1)
            if worker is not None:
                _idle_workers.append(worker)
            _workers_lock.notify_all()
    if worker is not None:
        _top_up_spares()  # the next spare, if one is still missing


def _top_up_spares() -> None:
    """Start a spare in the background when fewer than SPARE_WORKERS are idle and none is starting
    (G7). One at a time: each start imports sympy and math-verify (seconds of CPU), and two at once
    would slow the calls that run beside them; a spare that is ready starts the next."""
    with _workers_lock:
        needed = _starting == 0 and len(_idle_workers) < SPARE_WORKERS
    if needed:
        _start_spare()


def _take_worker(deadline: float) -> tuple[_MathWorker | None, bool]:
    """(worker, started here) for one call. An idle worker; else a spare on its way, waited for
    until the call's deadline (None after it: the time limit counts the wait); else, when no worker
    is idle or starting (the process's first call, more calls at once than workers, or spares that
    failed to start), a worker started here, whose start-up the time limit does not count. Tops the
    spares up after taking one (after its own start, not beside it: two starts at once would slow it)."""
    global _waiting
    with _workers_lock:
        if not _idle_workers and _starting > _waiting:
            _waiting += 1
            _workers_lock.wait_for(lambda: bool(_idle_workers) or _starting == 0, max(0.0, deadline - time.monotonic()))
            _waiting -= 1
            if not _idle_workers and _starting > 0:
                return None, False  # the deadline came first
        worker = _idle_workers.pop() if _idle_workers else None
    started_here = worker is None
    if started_here:
        worker = _MathWorker()  # started outside the lock, so threads start theirs in parallel
    _top_up_spares()
    return worker, started_here


def prepare(mode: str) -> None:
    """Start the math mode's workers in the background, ahead of the first call (G7).

    A process's first "math" call would otherwise start its own worker, and that start (1.5-3.3 s
    on a loaded 2-core machine: importing sympy and math-verify) is outside the call's 2 s limit.
    task.Task.load calls this when a run or an evaluation uses --verifier math, before the model
    loads, so the workers are up by the first scoring. A no-op for the other modes; never raises
    (a worker that cannot start is reported by the call that needs it).
    """
    if mode == "math":
        _top_up_spares()


def ask(request: dict, timeout_s: float) -> dict:
    """The worker's reply to request, or a timeout or worker_error status, within timeout_s seconds
    of the call, waiting for a worker and killing one included (G7); only a worker started here
    (see _take_worker) is not counted."""
    deadline = time.monotonic() + timeout_s
    worker, started_here = _take_worker(deadline)
    if worker is None:
        return {"status": "timeout", "detail": f"no math worker free within {timeout_s:.2f}s (spares starting)"}
    if started_here:
        deadline = time.monotonic() + timeout_s
    remaining = deadline - TIMEOUT_MARGIN_S - time.monotonic()
    reply = worker.ask(request, remaining) if remaining > 0 else None
    if reply is None and remaining <= 0:  # nothing asked: the worker is as good as before
        with _workers_lock:
            _idle_workers.append(worker)
            _workers_lock.notify_all()
        return {"status": "timeout", "detail": f"no time left of {timeout_s:.2f}s for the worker"}
    if reply is None:
        crashed = worker.proc.poll() is not None
        worker.kill(reap_later=True)  # a hung parser cannot be interrupted; the process is the unit we can stop
        _top_up_spares()  # its replacement, started now for the calls after this one
        if crashed:
            return {"status": "worker_error", "detail": f"worker exited with code {worker.proc.returncode}"}
        return {"status": "timeout", "detail": f"no verdict within {timeout_s:.2f}s"}
    with _workers_lock:
        _idle_workers.append(worker)
        _workers_lock.notify_all()
    return reply


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


# One comparison per kind of expression the parser and sympy set up lazily (see _math_worker_main).
_WARM_UP = (
    ("\\frac{1}{2}", "0.5"), ("\\sqrt{5}", "2\\sqrt{5}"), ("3.14", "\\pi"), ("5r^5", "2"), ("p - q", "q - p"),
    ("y = 2x + 3", "2"), ("x \\in [-2, 7]", "[-2, 7]"), ("[1, 3)", "(1, 3]"), ("(2, 4)", "2"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"), ("\\{1, 2\\}", "1, 2"),
    ("1 \\pm \\sqrt{2}", "1 + \\sqrt{2}, 1 - \\sqrt{2}"), ("50\\%", "50"), ("30^\\circ", "30"),
    ("\\text{yes}", "\\text{no}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
)  # fmt: skip


def _math_worker_main() -> None:
    """The worker loop (runs in the subprocess). Only LaTeX extraction is enabled in math-verify:
    its plain-expression extractor calls sympy's parse_expr, which uses eval()."""
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints from libraries go to stderr, never into the protocol

    def send(message: dict) -> None:
        try:
            out.write(json.dumps(message).encode() + b"\n")
        except BrokenPipeError:
            sys.exit(0)  # the parent is gone (it exited, or killed us after a timeout): nobody to answer

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

    read_truth = functools.lru_cache(maxsize=4096)(read)
    # sympy and the LaTeX parser set parts of themselves up on first use, 0.1-0.5 s per kind of
    # expression: pay that here, before "ready", so a request's time limit measures its own work.
    try:
        for gold, pred in _WARM_UP:
            verify(read(gold), read(pred), timeout_seconds=None)
    except Exception as error:  # a broken install; the parent raises with this detail
        send({"ready": False, "detail": f"warm-up failed: {type(error).__name__}: {str(error)[:200]}"})
        return
    send({"ready": True})
    for line in sys.stdin.buffer:
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
    _math_worker_main()
