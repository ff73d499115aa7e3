"""Process checks shared by the tests of generator workers (tests/test_async.py, tests/test_generator_faults.py).

A process "left" is one still running that is not a zombie (a zombie has exited and only waits for
its parent to read its status). The check polls up to a deadline rather than sleeping a fixed time,
so a loaded machine gets the time it needs and an idle one does not wait.
"""

from __future__ import annotations

import time

import psutil


def left(procs: list[psutil.Process], seconds: float) -> list[int]:
    """PIDs of `procs` still running (not zombies) after up to `seconds`. A psutil.Process remembers its
    process's start time, so a PID the system has reused for a new process does not count."""
    deadline = time.time() + seconds
    while True:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except psutil.NoSuchProcess:  # exited between the two calls
                pass
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.05)
