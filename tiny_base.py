"""Moved: the tiny base-policy builder is tasks/tiny_base.py, run as `python -m tasks.tiny_base` (same flags)."""

import sys

if __name__ == "__main__":
    print("error: the tiny base-policy builder moved to tasks/tiny_base.py: run `python -m tasks.tiny_base` "
          f"{' '.join(sys.argv[1:])}".rstrip(), file=sys.stderr)
    sys.exit(2)
