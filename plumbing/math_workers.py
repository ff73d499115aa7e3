"""The math mode's worker processes: math-verify (LaTeX parser -> sympy) runs in processes that are
killed past a call's time limit (row G7 of verifier.py's grammar). They are forked from a fork
server that imported and warmed math-verify once (plumbing/math_verify_process.py), so a worker
is ready in milliseconds: after any number of timeouts, a call takes an idle worker or forks a
fresh one, and never waits for one to import sympy (seconds, and more beside other work).

`ask(request, timeout_s)` sends one comparison and returns the worker's reply, or a "timeout" or
"worker_error" status, within timeout_s; `prepare()` starts the fork server in the background.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

PROGRAM = Path(__file__).with_name("math_verify_process.py")
# Starting the fork server (importing sympy and math-verify, the warm-up) on a loaded machine: once
# per process, and not counted in a call's time limit (see ask).
WORKER_START_TIMEOUT_S = 120.0
FORK_TIMEOUT_S = 30.0  # a fork takes milliseconds; this long without an answer, the server is replaced
# Seconds kept back from a call's time limit for what follows a timeout (waking up, the kill,
# returning), so that the call returns within the limit: 2-4 ms on an idle machine; at load 10 on 2
# cores (bench/bench_verifier.py --load 2 beside other jobs, 2026-12-03) up to 94 ms past a 50 ms
# margin and 269 ms past a 150 ms one, so 300 ms: a timeout then returns near 1.7 s of a 2 s limit.
TIMEOUT_MARGIN_S = 0.3
# Idle workers kept after their call (one per thread that scores at once is reused); more are killed.
MAX_IDLE_WORKERS = 32


def _read_line(sock: socket.socket, buffer: bytearray, deadline: float) -> bytes | None:
    """One line from sock (buffer holds what came after the last one), or None when the deadline
    passes; b"" at end of file (the other process died)."""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
            return None
        try:
            chunk = sock.recv(65536)
        except OSError:  # reset: the other process died with our request unread
            return b""
        if not chunk:
            return b""
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


class _ForkServer:
    """The fork server process and the control socket to it; forks workers for any thread."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, str(PROGRAM), str(theirs.fileno())], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL
        )
        theirs.close()
        self.sock, self.buffer, self.lock = ours, bytearray(), threading.Lock()
        self.sock.settimeout(FORK_TIMEOUT_S)  # a server that stops answering is a dead one (fork raises)
        ready = _read_line(self.sock, self.buffer, time.monotonic() + WORKER_START_TIMEOUT_S)
        message = json.loads(ready) if ready else {}
        if not message.get("ready"):
            self.stop()
            why = message.get("detail", "no answer in time" if ready is None else "it exited")
            raise RuntimeError(
                f"math-mode worker failed to start ({why}): math mode needs math-verify, "
                f"install it with pip install 'math-verify==0.9.0'"
            )

    def fork(self) -> _MathWorker:
        """A new worker, forked from the warm server: milliseconds.

        Raises:
            OSError: the server is gone (the caller starts a new one).
        """
        with self.lock:
            self.sock.sendall(b"fork\n")
            message, fds, _, _ = socket.recv_fds(self.sock, 4096, 1)
            if not message or not fds:
                raise OSError("the math worker fork server exited")
            return _MathWorker(socket.socket(fileno=fds[0]), json.loads(message)["pid"])

    def stop(self) -> None:
        self.sock.close()  # the server reads end of file and exits
        self.proc.kill()
        self.proc.wait()


class _MathWorker:
    """One forked worker and its socket; used by one thread at a time."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock, self.pid, self.buffer = sock, pid, bytearray()
        try:  # a handle on this very process: a kill never reaches another that took its pid
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # not Linux 5.3+: the pid (the server reaps only the dead)
            self.pidfd = None

    def ask(self, request: dict, timeout_s: float) -> dict | str:
        """The worker's reply, or "timeout" or "died" (the worker is then of no more use)."""
        try:
            self.sock.sendall(json.dumps(request).encode() + b"\n")
        except OSError:
            return "died"
        line = _read_line(self.sock, self.buffer, time.monotonic() + timeout_s)
        return "timeout" if line is None else "died" if not line else json.loads(line)

    def kill(self) -> None:
        """Kill the worker (a hung parser cannot be interrupted: the process is the unit we can stop)."""
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                os.close(self.pidfd)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass  # already gone
        self.sock.close()


_server: _ForkServer | None = None
_server_starting = False
_idle_workers: list[_MathWorker] = []
_lock = threading.Condition()
_STARTER_THREAD = "verifier-math-fork-server-start"


def _forget_workers_after_fork() -> None:
    # A forked child must not share the parent's sockets (two readers on one worker) nor its lock.
    global _server, _server_starting, _idle_workers, _lock
    _server, _server_starting, _idle_workers, _lock = None, False, [], threading.Condition()


os.register_at_fork(after_in_child=_forget_workers_after_fork)


@atexit.register
def _stop_workers() -> None:
    with _lock:
        while _idle_workers:
            _idle_workers.pop().kill()
        if _server is not None:
            _server.stop()


def _start_server() -> None:
    """Start the fork server (in the calling thread); raises what _ForkServer raises."""
    global _server, _server_starting
    try:
        server = _ForkServer()
    finally:
        with _lock:
            _server_starting = False
            _lock.notify_all()
    with _lock:
        _server = server
        _lock.notify_all()


def _started_server() -> _ForkServer:
    """The fork server, waited for or started here when there is none."""
    global _server_starting
    with _lock:
        while _server is None and _server_starting:
            _lock.wait()
        if _server is not None:
            return _server
        _server_starting = True
    _start_server()
    return _server


def prepare() -> None:
    """Start the fork server in the background, ahead of the first call (G7). A process's first
    "math" call would otherwise wait for its start (1.5-3.3 s on a loaded 2-core machine: importing
    sympy and math-verify), which the call's time limit does not count. task.Task.load calls this
    (through verifier.prepare) under --verifier math. Never raises: a server that cannot start is
    reported by the call that needs it."""
    global _server_starting
    with _lock:
        if _server is not None or _server_starting:
            return
        _server_starting = True

    def start() -> None:
        try:
            _start_server()
        except (OSError, RuntimeError):
            pass  # the next call starts its own and raises the clear error there

    threading.Thread(target=start, daemon=True, name=_STARTER_THREAD).start()


def _take_worker() -> tuple[_MathWorker, bool]:
    """(worker, whether the fork server had to start for it): an idle worker, else one forked now."""
    global _server
    with _lock:
        if _idle_workers:
            return _idle_workers.pop(), False
        started = _server is None
    server = _started_server()
    try:
        return server.fork(), started
    except OSError:  # the server died (killed, out of memory): a new one
        with _lock:
            if _server is server:
                _server = None
        return _started_server().fork(), True


def ask(request: dict, timeout_s: float) -> dict:
    """The worker's reply to request ({"truth", "preds"}), or a "timeout" or "worker_error" status,
    within timeout_s of the call: taking a worker (an idle one, or a fork: milliseconds) and killing
    one after a timeout included (G7). Only the fork server's own start (the process's first call,
    or after the server died) is not counted.

    Raises:
        RuntimeError: the fork server cannot start (math-verify missing or broken).
    """
    deadline = time.monotonic() + timeout_s
    worker, started = _take_worker()
    if started:
        deadline = time.monotonic() + timeout_s
    remaining = deadline - TIMEOUT_MARGIN_S - time.monotonic()
    if remaining <= 0:  # nothing asked: the worker is as good as before
        _give_back(worker)
        return {"status": "timeout", "detail": f"no time left of {timeout_s:.2f}s for the worker"}
    reply = worker.ask(request, remaining)
    if isinstance(reply, dict):
        _give_back(worker)
        return reply
    worker.kill()  # its replacement is forked by the next call that needs one: milliseconds
    if reply == "died":
        return {"status": "worker_error", "detail": "the worker process died (out of memory or killed)"}
    return {"status": "timeout", "detail": f"no verdict within {timeout_s:.2f}s"}


def _give_back(worker: _MathWorker) -> None:
    with _lock:
        if len(_idle_workers) < MAX_IDLE_WORKERS:
            _idle_workers.append(worker)
            return
    worker.kill()
