"""The default task (TinyTask, `--data tiny`) and the tiny base policy that `python train.py` starts from, with no download.

Why this file exists: `python train.py` should learn visibly in minutes on 2 CPU cores from a
model that this repository builds or ships, with nothing downloaded. The smallest real instruct
models (SmolLM2-135M) rarely follow the "Answer:" format on their own and generate only tens of
tokens per second on such a machine, so the default is a task and a model made for the purpose:

  * Task (`TinyTask`, a task.Task subclass: the example a fork copies): add two numbers of 1 to 3 digits by columns, one line per column, then a final
    "Answer: N" line, the DAPO answer format, checked by verifier.py's "dapo" rule. Responses have
    variable length (2 to 4 lines), so the length budget, the overlong penalty and token-level
    weighting all have something to act on. The held-out split is fixed by a hash of the problem text: a held-out
    problem is never generated for training.
  * Tokenizer: one token per character plus a few special tokens, saved as an ordinary
    Hugging Face tokenizer with a chat template.
  * Model (tasks/tiny_base.py): a Qwen2-architecture decoder (1.23M parameters) warmed up by a short supervised run
    (`python -m tasks.tiny_base`) until it follows the format but is often wrong. The result is shipped
    in assets/tiny-base/ so that every run starts from the same weights; rebuilding it is one
    command and takes about a minute.
  * Paraphrases: `paraphrases` rewords a problem five ways with the same answer (other phrasings,
    operands in words, an irrelevant sentence, the operands swapped), for `eval.py --paraphrases tiny`.

The RL run then does the improving (README "Demo result").
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from task import Problem, Task


ASSET_DIR = Path(__file__).resolve().parents[1] / "assets" / "tiny-base"  # this file lives in tasks/
TASK_VERSION = "column-add-v1"  # bump whenever problem generation or the split changes
MIN_DIGITS, MAX_DIGITS = 1, 3  # digits per addend
SPECIAL = ["<|pad|>", "<|endoftext|>", "<|user|>", "<|assistant|>"]
CHARS = list("0123456789+-=?:.,()[]*/ \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ$")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


# --- the task ------------------------------------------------------------------------------------------


@dataclass
class TinyTask(Task):
    """Column addition in the "Answer: N" format, its problems generated from a seed (`--data tiny`).

    Its options are its fields (`--task_args '{"train_size": 2000}'`). It replaces `read` (the
    problems are generated, the held-out ones fixed by a hash of their text and never trained on)
    and `messages` (a problem is its own prompt: it carries its format, so no instruction is
    added); `score` and `check_answer` are the default task's, the DAPO rule (verifier.py, "dapo").
    """

    train_size: int = 20000  # training problems generated (--data tiny)
    heldout_size: int = 256  # held-out problems generated (--eval_data tiny; at least --eval_limit)
    heldout_seed: int = 0  # seed of the held-out problems, fixed so every run evaluates the same ones

    def __post_init__(self):
        for name in ("train_size", "heldout_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"--task_args: {name} must be an integer >= 1 problem, got {getattr(self, name)!r}")

    def read(self, spec: str, cfg, *, held_out: bool, limit: int = 0) -> tuple[list[Problem], str, str]:
        """The generated problems: (problems, name, content hash). spec must be "tiny"."""
        if spec != "tiny":
            raise ValueError(f"data {spec!r}: the tiny task generates its problems, so its data is 'tiny'; for a file, "
                             "pass --task task:Task (DAPO math) or a task of your own")
        n = max(limit, self.heldout_size) if held_out else self.train_size
        rows = make_split(n, held_out=held_out, seed=self.heldout_seed if held_out else cfg.seed)
        probs = [Problem(r["id"], [{"role": "user", "content": r["problem"]}], r["answer"], bare=False) for r in rows]
        content = json.dumps([[p.id, p.messages, p.answer] for p in probs]).encode()
        return probs, f"tiny:{TASK_VERSION}:{'test' if held_out else 'train'}", hashlib.sha256(content).hexdigest()[:16]

    def messages(self, problem: Problem, cfg) -> list[dict]:
        """The problem as its own prompt: it carries its format ("... Answer: N"), no instruction around it."""
        return [dict(m) for m in problem.messages]

    def load(self, spec: str, tokenizer, cfg, **kwargs):
        """Task.load, for the tiny character tokenizer only: its problems carry no instruction, so a model it
        was not made for would train without a reward signal and without a word (check_tokenizer raises)."""
        check_tokenizer(tokenizer)
        return super().load(spec, tokenizer, cfg, **kwargs)


# --- plumbing: the problems ------------------------------------------------------------------------



def is_held_out(problem: str, held_out_percent: int = 10) -> bool:
    """True for problems reserved for evaluation (stable across Python versions and machines)."""
    return int(hashlib.sha256(problem.encode()).hexdigest(), 16) % 100 < held_out_percent


def make_problem(rng: random.Random, min_digits: int = MIN_DIGITS, max_digits: int = MAX_DIGITS) -> dict:
    """One problem: {"problem", "answer", "solution"}; solution is the supervised target.

    Column addition written out, one line per column from the units up, carry shown as "+1":

        What is 347+85?   ->   7+5=12
                               4+8+1=13
                               3+0+1=4
                               Answer: 432

    Each number has min_digits..max_digits digits, so responses range from 2 to max_digits + 1
    lines: the length varies with the problem, and a longer answer has more places to go wrong.
    """
    a, b = (rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1) for d in
            (rng.randint(min_digits, max_digits), rng.randint(min_digits, max_digits)))
    return {"problem": f"What is {a}+{b}?", "answer": str(a + b), "solution": column_solution(a, b)}


def column_solution(a: int, b: int) -> str:
    """The worked answer to "What is a+b?" (make_problem's solution): one line per column, then "Answer: a+b"."""
    lines, carry, i = [], 0, 0
    while i < max(len(str(a)), len(str(b))):
        x, y = (a // 10**i) % 10, (b // 10**i) % 10
        lines.append(f"{x}+{y}{'+1' if carry else ''}={x + y + carry}")
        carry = (x + y + carry) // 10
        i += 1
    return "\n".join(lines) + f"\nAnswer: {a + b}"


def make_split(n: int, *, held_out: bool, seed: int, min_digits: int = MIN_DIGITS, max_digits: int = MAX_DIGITS) -> list[dict]:
    """Up to n distinct problems from one side of the fixed split, each with a stable id.

    Stops early (with fewer rows) once 5000 draws in a row are unusable, i.e. when the split holds
    fewer than n distinct problems. The rows are new dicts on every call; the draw itself is made once
    per process for the same arguments (a pure function of them: 20,000 problems take about a second,
    paid again by each run a process starts, as the tests do many times).
    """
    return [dict(r) for r in _drawn_split(n, held_out, seed, min_digits, max_digits)]


@functools.lru_cache(maxsize=8)
def _drawn_split(n: int, held_out: bool, seed: int, min_digits: int, max_digits: int) -> tuple[dict, ...]:
    rng, rows, seen, misses = random.Random(seed), [], set(), 0
    while len(rows) < n and misses < 5000:
        p = make_problem(rng, min_digits, max_digits)
        misses += 1
        if p["problem"] in seen or is_held_out(p["problem"]) != held_out:
            continue
        seen.add(p["problem"])
        misses = 0
        rows.append({"id": f"{TASK_VERSION}-{'test' if held_out else 'train'}-{len(rows)}", **p})
    return tuple(rows)


def check_tokenizer(tokenizer) -> None:
    """Raise ValueError unless `tokenizer` is the tiny task's character vocabulary (SPECIAL + CHARS).

    The tiny problems carry their own format and no instruction ("What is 347+85?"): a real model
    given them answers in prose, never in the column format, and gets no reward signal, without a
    word. So the task refuses any other model (tasks/arith.py is the task made for real tokenizers).
    """
    if set(tokenizer.get_vocab()) != set(SPECIAL + CHARS):
        raise ValueError(f"--data/--eval_data tiny is the toy task of the shipped character-level policy "
                         f"(assets/tiny-base): its problems carry no instruction, so this model's tokenizer "
                         f"({len(tokenizer.get_vocab())} tokens) gets no reward signal from them. Use a task made "
                         "for it: --preset smollm2-arith, --data arith (integer arithmetic under the DAPO "
                         "instruction), or a .parquet/.jsonl with --data and --eval_data")


# --- paraphrases: the same problems in other words ----------------------------------------------------
#
# An evaluation of the trained model on rewordings with the same answers (eval.py --paraphrases tiny):
# a rise in accuracy on "What is a+b?" that does not carry over to "Find the sum of a and b." is a
# rise in the training prompt's format, not in addition. Every character is one of CHARS (the
# tokenizer has no other, and would silently drop it); `paraphrases` checks that.

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
        "seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_ASIDES = ("The sky is blue and the grass is green.", "Read the question below with care.",
           "This is a question about numbers.", "Some people like tea and some like coffee.")
_PROBLEM = re.compile(r"What is ([0-9]+)\+([0-9]+)\?")


def in_words(n: int) -> str:
    """An integer 0..999 in English words: 347 -> "three hundred forty-seven".

    Raises:
        ValueError: n outside 0..999 (the tiny task's addends have at most 3 digits).
    """
    if not 0 <= n <= 999:
        raise ValueError(f"in_words covers 0..999, got {n}")
    hundreds, rest = divmod(n, 100)
    parts = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest or not parts:
        parts.append(_ONES[rest] if rest < 20 else _TENS[rest // 10] + (f"-{_ONES[rest % 10]}" if rest % 10 else ""))
    return " ".join(parts)


PARAPHRASE_STYLES = {  # style: rewording of "What is a+b?" with the same answer a+b; (a, b, problem) -> text
    "compute": lambda a, b, p: f"Compute {a}+{b}.",  # another phrasing
    "words": lambda a, b, p: f"What is {in_words(a)} plus {in_words(b)}?",  # operands in words
    "aside": lambda a, b, p: f"{_ASIDES[int(hashlib.sha256(p.encode()).hexdigest(), 16) % len(_ASIDES)]} {p}",  # irrelevant text
    "sum": lambda a, b, p: f"Find the sum of {a} and {b}.",
    "swap": lambda a, b, p: f"What is {b}+{a}?",  # the operands in the other order
}


def paraphrases(problem: str, k: int = len(PARAPHRASE_STYLES)) -> list[tuple[str, str]]:
    """The first k rewordings of a tiny problem ("What is a+b?"), all with the answer a+b.

    Returns [(style, text)] in PARAPHRASE_STYLES order: "compute", "words" (operands in words),
    "aside" (a number-free irrelevant sentence before the question, chosen by a hash of the
    problem), "sum", "swap". Deterministic: the same problem always gets the same texts.

    Raises:
        ValueError: not a tiny problem, k outside 1..len(PARAPHRASE_STYLES), or a character outside
            CHARS (the tiny tokenizer would drop it without a word).
    """
    m = _PROBLEM.fullmatch(problem)
    if not m:
        raise ValueError(f"not a tiny problem (expected 'What is a+b?'): {problem!r}")
    if not 1 <= k <= len(PARAPHRASE_STYLES):
        raise ValueError(f"k must be 1..{len(PARAPHRASE_STYLES)} (the styles {list(PARAPHRASE_STYLES)}), got {k}")
    a, b = int(m.group(1)), int(m.group(2))
    out = [(style, make(a, b, problem)) for style, make in list(PARAPHRASE_STYLES.items())[:k]]
    for style, text in out:
        bad = sorted(set(text) - set(CHARS))
        if bad:
            raise ValueError(f"paraphrase style {style!r} of {problem!r} uses characters outside tiny.CHARS: {bad}")
    return out


# --- plumbing: tokenizer and model ------------------------------------------------------------------


def build_tokenizer():
    """A character-level fast tokenizer: every character one token, decode is concatenation.

    Built from a BPE model with no merges. AutoTokenizer on a folder whose config.json says qwen2
    would rebuild it as Qwen's own byte-level BPE and silently mangle the text ("What is 23+58?"
    came back without its spaces), so it is saved and loaded as PreTrainedTokenizerFast.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    core.add_special_tokens(SPECIAL)
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|pad|>", eos_token="<|endoftext|>", padding_side="left"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="write the train and held-out splits as JSONL (problem/answer)")
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--train", type=int, default=20000)
    d.add_argument("--test", type=int, default=500)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, n, held in (("train", args.train, False), ("test", args.test, True)):
        with open(args.out / f"{name}.jsonl", "w") as f:
            for r in make_split(n, held_out=held, seed=0):
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
