"""Integer arithmetic for real tokenizers: the task a pretrained model learns on here (`--data arith`).

The tiny default task (tasks/tiny.py) is made for a character-level toy model: its problems carry no
instruction. This one is made for a real instruct model: each problem is a bare question, wrapped
in DAPO's own instruction (task.DAPO_PREFIX, "... The last line of your response should be of the
form Answer: $Answer ...") and scored by DAPO's rule (verifier.py "dapo", +1 / -1), exactly as
DAPO-Math-17k is. Only the problems are simpler, so that a 135M-parameter model on 2 CPU cores
has something to learn in minutes.

Problems are generated from a seed (the run's --seed for training, `heldout_seed` for the held-out
side) at the difficulty levels asked for:

    level  problems                                   example (bare)          answers
    1      one-digit addition and subtraction          What is 7 + 5?          0..18
    2      two-digit addition and subtraction          What is 42 - 17?        0..198
    3      two-digit times one-digit                   What is 23 * 7?         0..891
    4      three-digit addition and subtraction        What is 512 + 389?      0..1998
    5      two-digit times two-digit                   What is 47 * 36?        100..9801

Subtraction never goes below zero (a >= b). A problem is written bare ("What is 42 - 17?") or worded
("Maya has 42 stickers and gives 17 of them away. How many stickers does Maya have left?"), by
`style`. Which levels a model can learn on is a measurement, not a guess: bench/arith_levels.py
gives a model's accuracy and format-error rate per level and style (docs/results.md "SmolLM2 on
arithmetic").

The held-out split is fixed by a hash of the expression ("42-17"), not of the text: a held-out
problem is never generated for training, in either wording. Problem ids are a hash of the text, so
the same problem has the same id in every run (eval.py compare pairs problems by id).

Options (fields of the dataclass; `--task_args '{"levels": [1, 2], "style": "bare"}'`):
  levels           the levels problems are drawn from, uniformly
  style            "bare", "worded", or "both" (each problem's wording drawn 50/50)
  train_size       training problems generated (distinct; fewer when a level has fewer)
  heldout_size     held-out problems generated (at least the --eval_limit asked for)
  heldout_seed     seed of the held-out problems, fixed so that every run evaluates the same ones
  heldout_percent  share of expressions reserved for evaluation, in percent
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field

from task import Problem, Task

VERSION = "arith-v1"  # bump whenever generation or the split changes
LEVELS = {  # level: (description, operators, digits of a, digits of b)
    1: ("one-digit addition and subtraction", "+-", 1, 1),
    2: ("two-digit addition and subtraction", "+-", 2, 2),
    3: ("two-digit times one-digit", "*", 2, 1),
    4: ("three-digit addition and subtraction", "+-", 3, 3),
    5: ("two-digit times two-digit", "*", 2, 2),
}
STYLES = ("bare", "worded", "both")
_NAMES = [("Tom", "he"), ("Maya", "she"), ("Omar", "he"), ("Sara", "she"), ("Ben", "he"), ("Priya", "she"),
          ("Leo", "he"), ("Ana", "she")]
_ITEMS = ["apples", "marbles", "stickers", "pencils", "cards", "coins", "books", "shells"]
_WORDED = {  # operator: templates with {a}, {b}, {name}, {pron}, {items}
    "+": ["{name} has {a} {items}. {Pron} gets {b} more {items}. How many {items} does {name} have now?",
          "A shop sold {a} {items} in the morning and {b} {items} in the afternoon. How many {items} did it sell in all?"],
    "-": ["{name} has {a} {items} and gives {b} of them away. How many {items} does {name} have left?",
          "There are {a} {items} in a box. {name} takes {b} of them out. How many {items} are still in the box?"],
    "*": ["{name} buys {a} bags with {b} {items} in each bag. How many {items} does {name} buy?",
          "A hall has {a} rows of chairs with {b} chairs in each row. How many chairs are in the hall?"],
}


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def make_problem(rng: random.Random, level: int, worded: bool) -> dict:
    """One problem: {"expression", "problem", "answer", "solution", "level"}.

    expression: "a<op>b" (what the held-out split hashes); problem: the question's text; solution: a
    worked answer in the instruction's form ("42 - 17 = 25\\nAnswer: 25"), for few-shot examples.
    """
    _, ops, da, db = LEVELS[level]
    op = rng.choice(ops)
    a, b = _number(rng, da), _number(rng, db)
    if op == "-" and a < b:
        a, b = b, a
    value = a + b if op == "+" else a - b if op == "-" else a * b
    if worded:
        name, pron = rng.choice(_NAMES)
        text = rng.choice(_WORDED[op]).format(a=a, b=b, name=name, pron=pron, Pron=pron.capitalize(), items=rng.choice(_ITEMS))
    else:
        text = f"What is {a} {op} {b}?"
    return {"expression": f"{a}{op}{b}", "problem": text, "answer": str(value), "level": level,
            "solution": f"{a} {op} {b} = {value}\nAnswer: {value}"}


def is_held_out(expression: str, percent: int) -> bool:
    """True for expressions reserved for evaluation (stable across Python versions and machines)."""
    return _hash(expression) % 100 < percent


@dataclass
class Arithmetic(Task):
    """Integer arithmetic under the DAPO instruction and rule (module docstring; options are its fields)."""

    levels: list = field(default_factory=lambda: [1, 2, 3])
    style: str = "bare"
    train_size: int = 20000
    heldout_size: int = 256
    heldout_seed: int = 0
    heldout_percent: int = 10

    def __post_init__(self):
        bad = [lv for lv in self.levels if lv not in LEVELS]
        if not self.levels or bad:
            raise ValueError(f"arithmetic task: levels must be a non-empty list of {sorted(LEVELS)}, got {self.levels!r}")
        if self.style not in STYLES:
            raise ValueError(f"arithmetic task: style must be one of {STYLES}, got {self.style!r}")
        if not 0 < self.heldout_percent < 100 or self.train_size < 1 or self.heldout_size < 1:
            raise ValueError("arithmetic task: heldout_percent must be in (0, 100) and train_size, heldout_size >= 1")

    def rows(self, n: int, *, held_out: bool, seed: int) -> list[dict]:
        """Up to n distinct problems of one side of the split (make_problem's dicts plus "id").

        Stops early (fewer rows) once 5000 draws in a row are unusable: the levels hold fewer
        distinct problems on that side (level 1 has 155 expressions in all).
        """
        rng, rows, seen, misses = random.Random(seed), [], set(), 0
        while len(rows) < n and misses < 5000:
            worded = self.style == "worded" or (self.style == "both" and rng.random() < 0.5)
            p = make_problem(rng, rng.choice(self.levels), worded)
            misses += 1
            if p["problem"] in seen or is_held_out(p["expression"], self.heldout_percent) != held_out:
                continue
            seen.add(p["problem"])
            misses = 0
            rows.append({"id": f"{VERSION}-{_hash(p['problem']) % 16**12:012x}", **p})
        return rows

    def read(self, spec: str, cfg, *, held_out: bool, limit: int = 0) -> tuple[list[Problem], str, str]:
        """Generated problems (spec "arith"): the held-out side from `heldout_seed`, at least `limit` of
        them; the training side from the run's seed. Raises ValueError for any other spec."""
        if spec != "arith":
            raise ValueError(f"the arithmetic task generates its own problems: pass --data arith (and --eval_data arith), "
                             f"not {spec!r}")
        rows = (self.rows(max(limit, self.heldout_size), held_out=True, seed=self.heldout_seed) if held_out
                else self.rows(self.train_size, held_out=False, seed=cfg.seed))
        probs = [Problem(r["id"], [{"role": "user", "content": r["problem"]}], r["answer"]) for r in rows]
        name = f"arith:{VERSION}:levels={','.join(map(str, self.levels))}:{self.style}:{'test' if held_out else 'train'}"
        digest = hashlib.sha256(json.dumps([[p.id, p.messages, p.answer] for p in probs]).encode()).hexdigest()[:16]
        return probs, name, digest

    def examples(self, n: int, cfg) -> list[tuple[str, str]]:
        """n worked examples (problem text, response in the instruction's form) from the training side,
        drawn with a seed of their own: for few-shot prompts (--few_shot N)."""
        return [(r["problem"], r["solution"]) for r in self.rows(n, held_out=False, seed=cfg.seed + 7919)]
