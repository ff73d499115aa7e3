"""Plumbing a learner may skip on first reading: command lines, processes and collectives, model loading and FSDP2,
checkpoints, run logging.
"""

from __future__ import annotations

import argparse
import os
import sys

DEBUG_ENV = "DAPO_DEBUG"  # set to 1 to see the full traceback of a bad-input error


# --- plumbing: command lines ------------------------------------------------------------------------


class RunStopped(RuntimeError):
    """The run cannot go on for a reason the user can act on (named in the message)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag ends in one line, `error: ... (see --help)`, and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def parse_bool(s: str) -> bool:
    """The one boolean flag style of every command line here: `--flag true|false` (also 1/0, yes/no, on/off)."""
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def run_cli(main, argv: list[str] | None = None) -> int:
    """Run an entry point; bad input (flags, data, paths, checkpoints) ends in one line and exit status 2.

    `main(argv)` raises ValueError or OSError (FileNotFoundError, ...) with a message that names the
    input and the fix, or RunStopped; that message is printed as `error: <message>` on stderr,
    without a traceback, and the exit status is 2. DAPO_DEBUG=1 re-raises instead, for the full
    traceback. A second Ctrl-C (the first one finishes the step in flight) exits with 130. Any
    other exception is a bug and keeps its traceback. Returns the exit status (0 on success).
    """
    try:
        main(argv)
    except (ValueError, OSError, RunStopped) as e:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0
