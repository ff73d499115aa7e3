"""Moved: the tiny base-policy builder is tasks/tiny_base.py, run as `python -m tasks.tiny_base` (same flags)."""

import sys

if __name__ == "__main__":
    args = "".join(f" {a}" for a in sys.argv[1:])
    print(f"error: the tiny base-policy builder moved to tasks/tiny_base.py: run `python -m tasks.tiny_base{args}`",
          file=sys.stderr)
    sys.exit(2)
