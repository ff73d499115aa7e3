"""Held-out problems that were trained on: the training and held-out sets compared by problem text.

Held-out figures (heldout/*, probe/*, eval.py reports) are meant to be about problems the policy
never trained on. Nothing in a number shows it when they are not: the same file passed as --data
and --eval_data, a held-out file made of training problems under new ids, or two splits drawn
from one generator with two seeds (a held-out problem is then a training problem by chance: 14 of
256 in a fork of docs/forking.md's example before it split by a hash). Ids cannot tell a copy
apart, so problems are compared by their text (`problem_key`): the problem's own user messages,
the official instruction set aside where a row holds it, in Unicode NFKC form, case folded, with
runs of whitespace as one space.

  train.py   `check_held_out` at load, before the model: an overlap is refused with one line (the
             counts and the first ids of both sides), or, with --allow_heldout_overlap true,
             counted: heldout/trained_problems in summary.json and on every held-out line.
  eval.py    `trained_on`: --data against the training data of the model's run (read again from its
             final/dapo_run.json, with the run's task, options and seed); an overlap is said on
             stderr and counted in the report's settings (trained_problems).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import unicodedata
from pathlib import Path

from task import DAPO_PREFIX, DAPO_SUFFIX, dedupe_by_id, load_task, task_spec
from plumbing import checkpoints


def problem_key(problem) -> str:
    """The text a problem is compared by: its user messages (all its messages when none is a user's), each
    without the official instruction around it, NFKC-normalised, case folded, whitespace collapsed."""
    msgs = [m for m in problem.messages if m.get("role", "user") == "user"] or problem.messages
    parts = []
    for m in msgs:
        text = m["content"]
        text = text[len(DAPO_PREFIX):] if text.startswith(DAPO_PREFIX) else text
        text = text[: -len(DAPO_SUFFIX)] if text.endswith(DAPO_SUFFIX) else text
        parts.append(" ".join(unicodedata.normalize("NFKC", text).casefold().split()))
    return "\n".join(parts)


def shared(train_problems: list, held_problems: list) -> list[tuple[str, str]]:
    """(held-out id, training id) for each held-out problem whose text (`problem_key`) a training problem has,
    in held-out order. Rows that repeat an id are compared once (task.check_ids made them identical)."""
    seen: dict[str, str] = {}
    for p in dedupe_by_id(train_problems):
        seen.setdefault(problem_key(p), p.id)
    return [(p.id, seen[k]) for p in held_problems if (k := problem_key(p)) in seen]


def check_held_out(data, held_out, *, allow: bool) -> int:
    """Held-out problems (task.Dataset `held_out`, as evaluated) that are training problems of `data`, by text.

    Returns their count, also put in held_out.info["trained_problems"] (the held-out metrics carry it).
    Raises ValueError naming both sets, the counts and the first ids, unless allow (--allow_heldout_overlap).
    """
    pairs = shared(data.problems, held_out.problems)
    held_out.info["trained_problems"] = len(pairs)
    if not pairs:
        return 0
    first = ", ".join(f"held-out {h} = training {t}" for h, t in pairs[:3])
    what = (f"{len(pairs)} of {len(held_out)} held-out problems of {held_out.name} (--eval_data) are training problems of "
            f"{data.name} (--data), with the same text once case and spacing are set aside; first: {first}")
    if not allow:
        raise ValueError(f"{what}. Held-out figures would be about problems the policy trained on: pass held-out data "
                         "without them (split by a hash of the problem, as tasks/tiny.py and tasks/arith.py do), or "
                         "--allow_heldout_overlap true to train anyway, counted in summary.json (heldout/trained_problems) "
                         "and on every held-out line")
    print(f"[warning] {what} (--allow_heldout_overlap true): counted as heldout/trained_problems", file=sys.stderr, flush=True)
    return len(pairs)


def trained_on(model_dir: Path, data, settings) -> int | None:
    """How many problems of `data` (a task.Dataset to evaluate) the run that trained `model_dir` trained on:
    its --data read again with its own task, options, seed and rules (final/dapo_run.json). Said on stderr
    when any. None when there is no run to ask (a model not saved by train.py) or its data cannot be read here.

    settings: eval.ModelSettings (what `read` needs besides the run's own fields).
    """
    saved = Path(model_dir) / "dapo_run.json"
    meta = json.loads(saved.read_text()) if saved.is_file() else {}
    config = checkpoints.upgrade_config(meta.get("config") or {})
    if "run_id" not in meta or not config.get("data"):
        return None
    run_cfg = dataclasses.replace(settings, **{k: config[k] for k in ("seed", "skip_bad_rows", "verifier") if k in config})
    try:
        task = load_task(task_spec(config.get("task", ""), config["data"]), config.get("task_args", "{}"))
        problems, name, _ = task.read(config["data"], run_cfg, held_out=False)
    except (ValueError, OSError) as e:
        print(f"[eval] the training data of {model_dir}'s run ({config['data']}) cannot be read here, so whether --data "
              f"holds problems it trained on is not checked ({' '.join(str(e).split())[:200]})", file=sys.stderr)
        return None
    pairs = shared(problems, data.problems)
    if pairs:
        first = ", ".join(f"{h} (training {t})" for h, t in pairs[:3])
        print(f"[warning] {len(pairs)} of {len(data)} problems of {data.name} are problems the run of {model_dir} trained "
              f"on (its --data {name}, the same text once case and spacing are set aside); first: {first}. These figures "
              "are not held-out", file=sys.stderr, flush=True)
    return len(pairs)
