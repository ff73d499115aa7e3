"""The lines every benchmark prints first: which script ran when, and on what machine and load.

Imported by the bench_*.py scripts (run as `python bench/NAME.py`, so this folder is on sys.path).
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

# Scratch runs of the benchmarks go under the repository's runs/ folder (ignored by git).
SCRATCH_ROOT = Path(__file__).resolve().parents[1] / "runs" / "bench"


def title_line(script: str) -> str:
    """'# SCRIPT  YYYY-MM-DD HH:MM' (local time)."""
    return f"# {script}  {datetime.datetime.now():%Y-%m-%d %H:%M}"


def machine_line(extra: str = "") -> str:
    """'# machine: ARCH N cores (shared), load avg 1m 5m 15m, OMP_NUM_THREADS=...' plus `extra`.

    The cores are shared with other jobs, so the load average is printed beside every timing.
    """
    load = os.getloadavg()
    return (f"# machine: {platform.machine()} {os.cpu_count()} cores (shared), load avg {load[0]:.2f} {load[1]:.2f} "
            f"{load[2]:.2f}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}{extra}")
