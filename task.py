"""The task: problems, their prompts, and the reward. The one file a fork edits (or subclasses) for a new task.

DAPO trains against a rule-based checker: a problem with a known answer, a prompt that asks for a
final "Answer: N" line, and a verdict of +1 (right) or -1 (wrong) on each response (paper section
2.3, eq. 7). `Task` holds exactly those three pieces, and everything else in the repository calls
them through it:

    Task.read(spec, cfg, held_out=...)   the problems of a dataset           (what to solve)
    Task.messages(problem, cfg)          the chat messages of one prompt     (how it is asked)
    Task.score(responses, problem, cfg)  a verdict and reward per response   (the one reward call)

train.py (rollouts, the probe set, held-out evaluation) and eval.py use the same `score`, so a
number in a training log and a number in an evaluation report come from one rule. To train on
another task, subclass Task, override these three methods, and pass `train.train(cfg, task=MyTask())`
(docs/forking.md; tests/test_fork.py does exactly that). The soft overlong punishment is not
part of the task: it is DAPO's reward shaping (dapo.overlong_penalty) and train.py adds it.

`cfg` is any object with the fields a method reads (train.Config has them all; eval.py builds its
own from the checkpoint): instruction, max_prompt_len, prompt_truncation, verifier, skip_bad_rows,
seed, tiny_train_size, tiny_heldout_size, tiny_heldout_seed.

The data formats read by the default task: "tiny" (tasks/tiny.py, the built-in toy task); a .parquet in
the official DAPO layout (`prompt` a list of chat messages, `reward_model.ground_truth`,
`extra_info.index`), as in DAPO-Math-17k and the official AIME 2024 file; a .jsonl with
`problem`/`answer` (a bare problem, wrapped in the official instruction) or `prompt`/`answer` (a
full prompt, used as it is), and an optional `id`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import verifier
from tasks import tiny

# The official DAPO instruction around a bare problem: the user prompt of every row of DAPO-Math-17k
# and of the official AIME 2024 evaluation file (tests/fixtures/aime2024_dapo_eval.parquet holds it verbatim).
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


@dataclass
class Problem:
    """One problem: an id, the chat messages that state it, and its ground-truth answer."""

    id: str
    messages: list  # chat messages; the last user message holds the problem
    answer: str
    bare: bool = True  # the text is a bare problem that still needs the instruction


@dataclass
class Dataset:
    """Problems with their prompts, tokenised once, and where they came from."""

    problems: list[Problem]
    prompt_ids: list[list[int]]  # one list of token ids per problem
    name: str  # dataset path or name (recorded with every rollout)
    hash: str  # content hash: the dataset's revision (recorded with every rollout)
    info: dict = field(default_factory=dict)  # rows read, rows per problem, prompts skipped

    def __len__(self) -> int:
        return len(self.problems)

    def head(self, n: int) -> Dataset:
        """The first n problems (all when n <= 0)."""
        n = n if n > 0 else len(self)
        return Dataset(self.problems[:n], self.prompt_ids[:n], self.name, self.hash, dict(self.info))


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes, first 16 hex digits."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def dedupe_by_id(problems: list[Problem]) -> list[Problem]:
    """The official AIME file repeats each problem 32 times: count problems by id, not rows."""
    seen, out = set(), []
    for p in problems:
        if p.id not in seen:
            seen.add(p.id)
            out.append(p)
    return out


class PromptStream:
    """Endless, seeded, epoch-shuffled stream of problem indices; `position` is resumable."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.position = n, seed, 0

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, self.n)
            order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            out.append(int(order[i]))
            self.position += 1
        return out


class Task:
    """DAPO's math task: integer answers, the official instruction, the verifier's answer rule."""

    # --- the three pieces a new task replaces -------------------------------------------------------

    def read(self, spec: str, cfg, *, held_out: bool, limit: int = 0) -> tuple[list[Problem], str, str]:
        """The problems of a dataset: (problems, name, content hash), every row validated up front.

        spec: "tiny" (tasks/tiny.py), a .parquet in the official DAPO layout, or a .jsonl (module docstring).
        held_out: the evaluation side ("tiny": the fixed held-out split, at least `limit` problems).

        Raises:
            FileNotFoundError: no such file.
            ValueError: an unknown format, bad rows (file, row and field named; --skip_bad_rows
                true drops them instead), or no usable row.
        """
        if spec == "tiny":
            n = max(limit, cfg.tiny_heldout_size) if held_out else cfg.tiny_train_size
            rows = tiny.make_split(n, held_out=held_out, seed=cfg.tiny_heldout_seed if held_out else cfg.seed)
            # The tiny task's problems carry their own format (tasks/tiny.py): no instruction is added.
            probs = [Problem(r["id"], [{"role": "user", "content": r["problem"]}], r["answer"], bare=False) for r in rows]
            return probs, f"tiny:{tiny.TASK_VERSION}:{'test' if held_out else 'train'}", hashlib.sha256(
                json.dumps([[p.id, p.messages, p.answer] for p in probs]).encode()).hexdigest()[:16]
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"dataset {spec!r} does not exist: pass --data/--eval_data a .parquet or .jsonl path, "
                                    "or 'tiny'")
        if path.suffix == ".parquet":
            problems, bad = _read_parquet(path)
        elif path.suffix == ".jsonl":
            problems, bad = _read_jsonl(path)
        else:
            raise ValueError(f"dataset {spec!r}: expected a .parquet (DAPO layout) or .jsonl file")
        ok = []
        for p in problems:
            try:  # the scorer's own check, so a row that passes here cannot fail at scoring time
                self.check_answer(p, cfg)
                ok.append(p)
            except ValueError as e:
                bad.append(f"{path} problem {p.id}: ground truth {p.answer!r} cannot be scored ({e})")
        if bad and not cfg.skip_bad_rows:
            raise ValueError(f"{len(bad)} bad row(s) in {path}; first: {bad[0]}. Fix the data, or pass --skip_bad_rows "
                             "true to drop them (they are counted in the log)")
        if bad:
            print(f"[data] skipped {len(bad)} bad row(s) of {path}; first: {bad[0]}", file=sys.stderr)
        if not ok:
            raise ValueError(f"dataset {spec!r} has no usable rows")
        return ok, str(path), file_hash(path)

    def messages(self, problem: Problem, cfg) -> list[dict]:
        """The chat messages of a problem's prompt: the official DAPO instruction around a bare
        problem (--instruction dapo); prompts that already hold it, and full prompts, as they are."""
        msgs = [dict(m) for m in problem.messages]
        if cfg.instruction == "dapo" and problem.bare and not msgs[-1]["content"].startswith(DAPO_PREFIX[:40]):
            msgs[-1]["content"] = DAPO_PREFIX + msgs[-1]["content"] + DAPO_SUFFIX
        return msgs

    def score(self, responses: list[str], problem: Problem, cfg) -> list[verifier.Score]:
        """The verdict on each response to one problem: correct, reward +1/-1, the extracted answer
        and a reason code (verifier.py, mode --verifier; paper section 2.3, eq. 7). Never raises on
        model text."""
        return verifier.score_batch(responses, [problem.answer] * len(responses), mode=cfg.verifier)

    def check_answer(self, problem: Problem, cfg) -> None:
        """Raise ValueError if `score` could not judge against this ground truth. The integer rule
        ("dapo") needs an integer ground truth, as in DAPO-Math-17k and AIME."""
        if cfg.verifier == "dapo":
            verifier.score("", problem.answer, mode="dapo")

    # --- built on the pieces above --------------------------------------------------------------

    def build_prompt(self, problem: Problem, tokenizer, cfg) -> list[int]:
        """Prompt token ids: `messages`, then the tokenizer's chat template (plain lines without one).

        A prompt longer than cfg.max_prompt_len is cut from the left (as the official scripts do)
        only with --prompt_truncation left; otherwise it is returned whole and `load` decides.
        """
        msgs = self.messages(problem, cfg)
        if tokenizer.chat_template:
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        else:
            text = "\n".join(m["content"] for m in msgs) + "\n"
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[-cfg.max_prompt_len:] if cfg.prompt_truncation == "left" else ids

    def load(self, spec: str, tokenizer, cfg, *, held_out: bool, limit: int = 0) -> Dataset:
        """Read a dataset and tokenise every prompt once (before any training or evaluation).

        Held-out data is counted by problem id (deduplicated) and cut to its first `limit` problems.
        A prompt over --max_prompt_len tokens stops here under --prompt_truncation error (the
        default), is dropped and counted under skip, and was already cut under left.

        Every id must name one problem (check_ids); prompts the tokenizer changes are counted and
        reported (round_trip).

        Raises:
            ValueError: as `read`; an id on different rows; a prompt too long under "error"; no prompt fits.
        """
        rows, name, data_hash = self.read(spec, cfg, held_out=held_out, limit=limit)
        check_ids(rows, name)
        problems = dedupe_by_id(rows)[: limit or None] if held_out else rows
        changed = round_trip(self, problems, tokenizer, cfg, name)
        repeats = Counter(Counter(p.id for p in rows).values())  # {rows per id: how many ids}
        info = {"dataset_rows": len(rows),
                "rows_per_problem": next(iter(repeats)) if len(repeats) == 1 else {str(c): n for c, n in sorted(repeats.items())}}
        kept, ids, too_long = [], [], []
        for p in problems:
            x = self.build_prompt(p, tokenizer, cfg)
            if len(x) > cfg.max_prompt_len:
                too_long.append((p.id, len(x)))
                continue
            kept.append(p)
            ids.append(x)
        if too_long and cfg.prompt_truncation == "error":
            raise ValueError(f"{len(too_long)} prompt(s) of {name} exceed --max_prompt_len {cfg.max_prompt_len} tokens "
                             f"(first: problem {too_long[0][0]}, {too_long[0][1]} tokens). Raise --max_prompt_len, or pass "
                             "--prompt_truncation left (cut from the left, as the official scripts) or skip")
        if too_long:
            print(f"[data] skipped {len(too_long)} prompt(s) longer than {cfg.max_prompt_len} tokens", file=sys.stderr)
        if not kept:
            raise ValueError(f"no prompt of {name} fits --max_prompt_len {cfg.max_prompt_len}")
        return Dataset(kept, ids, name, data_hash, {**info, "prompts_skipped": len(too_long),
                                                    "prompts_changed_by_tokenizer": changed})

    def template_hash(self, tokenizer, cfg) -> str:
        """Hash of everything that turns a problem into prompt text (recorded with every rollout)."""
        return hashlib.sha256(f"{tokenizer.chat_template}|{cfg.instruction}|{DAPO_PREFIX}|{DAPO_SUFFIX}".encode()).hexdigest()[:16]


def _read_parquet(path: Path) -> tuple[list[Problem], list[str]]:
    """Rows of a parquet in the official DAPO layout; (problems, descriptions of bad rows)."""
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for unreadable files
        raise ValueError(f"{path}: not a readable parquet file ({e})") from e
    problems, bad = [], []
    for i, row in enumerate(rows):
        msgs = row.get("prompt")
        gt = (row.get("reward_model") or {}).get("ground_truth")
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and m["content"].strip() for m in msgs):
            bad.append(f"{path} row {i}: field 'prompt' must be a non-empty list of {{role, content}} messages")
            continue
        if not isinstance(gt, str) or not gt.strip():
            bad.append(f"{path} row {i}: field 'reward_model.ground_truth' must be a non-empty string, got {gt!r}")
            continue
        idx = (row.get("extra_info") or {}).get("index", i)
        problems.append(Problem(str(idx), [{"role": m.get("role") or "user", "content": m["content"]} for m in msgs],
                                gt.strip()))
    return problems, bad


def _read_jsonl(path: Path) -> tuple[list[Problem], list[str]]:
    """Rows of a JSONL with problem (or prompt) and answer; (problems, descriptions of bad rows)."""
    problems, bad = [], []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append(f"{path} row {i}: not valid JSON ({e.msg})")
                continue
            if not isinstance(row, dict):
                bad.append(f"{path} row {i}: expected a JSON object with problem/answer fields")
                continue
            text = row.get("prompt") if isinstance(row.get("prompt"), str) else row.get("problem")
            gt = row.get("answer", row.get("ground_truth"))
            if not isinstance(text, str) or not text.strip():
                bad.append(f"{path} row {i}: field 'problem' (or 'prompt') must be a non-empty string")
                continue
            if not isinstance(gt, str) or not gt.strip():
                bad.append(f"{path} row {i}: field 'answer' must be a non-empty string, got {gt!r}")
                continue
            bare = not isinstance(row.get("prompt"), str)  # a full prompt is used as it is
            problems.append(Problem(str(row.get("id", i)), [{"role": "user", "content": text}], gt.strip(), bare))
    return problems, bad


# --- checks of the problems as read ----------------------------------------------------------------


def check_ids(rows: list[Problem], name: str) -> None:
    """Refuse one id on rows that differ in problem or answer (training would record both under it, evaluation
    would keep the first). Identical repeated rows are fine: the official AIME file holds each problem 32 times.

    Raises ValueError naming the first few ids and both rows of each (positions among the rows read).
    """
    first: dict[str, tuple[int, tuple]] = {}
    clashes: dict[str, tuple[int, int]] = {}
    for i, p in enumerate(rows):
        key = (tuple((m.get("role"), m["content"]) for m in p.messages), p.answer, p.bare)
        j, seen = first.setdefault(p.id, (i, key))
        if seen != key and p.id not in clashes:
            clashes[p.id] = (j, i)
    if clashes:
        show = lambda k: f"{k} ({_excerpt(rows[k].messages[-1]['content'])!r}, answer {rows[k].answer!r})"  # noqa: E731
        raise ValueError(f"{len(clashes)} id(s) of {name} name different rows, which training would record under one id "
                         "and evaluation would reduce to the first; first: " + "; ".join(
                             f"id {pid!r}: rows {show(i)} and {show(j)}" for pid, (i, j) in list(clashes.items())[:3])
                         + ". Give each problem its own id (JSONL: the `id` field; parquet: extra_info.index)")


def round_trip(task: Task, problems: list[Problem], tokenizer, cfg, name: str) -> int:
    """How many prompts the tokenizer changes (text -> tokens -> text), reported on one line of stderr.

    A tokenizer without an unknown token drops what it cannot write (the tiny tokenizer turns
    `What is 12x34?` with a multiplication sign into `What is 1234?`): the model is then trained
    and scored on another text than the data's. The line counts the prompts changed in the
    problem's own text and those changed only around it (the instruction of task.messages, e.g.
    the official one's quotes), names the first few with the change, and the characters the
    tokenizer cannot write. Reported, not refused: a tokenizer lacking a script changes every row
    of a dataset (the tiny one drops the LaTeX backslashes of every AIME problem), and refusing
    would forbid the run outright; a byte-level tokenizer changes nothing. The chat template's own
    text is the model's and is not checked.
    """
    contents = [[m["content"] for m in task.messages(p, cfg)] for p in problems]
    back = iter(_through(tokenizer, [c for cs in contents for c in cs]))
    changed = [i for i, cs in enumerate(contents) if [next(back) for _ in cs] != cs]
    if not changed:
        return 0
    own = [[m["content"] for m in problems[i].messages] for i in changed]
    back = iter(_through(tokenizer, [c for cs in own for c in cs]))
    first = {}  # problem index: (its first changed text of its own, what came back)
    for i, cs in zip(changed, own):
        pairs = [(c, next(back)) for c in cs]  # every text: the iterator stays in step
        first.update({i: pair for pair in pairs[::-1] if pair[0] != pair[1]})  # reversed: the first change wins
    shown = list(first)[:3] or changed[:1]
    named = "; ".join(f"problem {problems[i].id}: " + " becomes ".join(map(repr, _excerpt_pair(*first[i]))) if i in first
                      else f"problem {problems[i].id} (around its text)" for i in shown)
    lost = _lost(tokenizer, [c for i in changed[:64] for c in contents[i]])
    print(f"[data] {len(changed)} of {len(problems)} prompts of {name} change in the tokenizer's round trip, and the model "
          f"sees the changed text: {len(first)} in the problem's own text, {len(changed) - len(first)} only around it (the "
          f"instruction); first: {named}" + (f". Characters the tokenizer cannot write: {lost}" if lost else "")
          + ". A tokenizer that covers them changes nothing (a byte-level BPE covers every character)", file=sys.stderr)
    return len(changed)


def _through(tokenizer, texts: list[str]) -> list[str]:
    """Each text encoded and decoded again, exactly (no clean-up of spaces), each distinct text once (DAPO-Math-17k
    repeats its rows); a fast tokenizer's own batch calls, which do what its transformers wrappers do in a sixth
    of the time."""
    distinct = list(dict.fromkeys(texts))
    if len(distinct) < len(texts):
        back = dict(zip(distinct, _through(tokenizer, distinct)))
        return [back[t] for t in texts]
    if getattr(tokenizer, "is_fast", False):
        fast = tokenizer.backend_tokenizer
        return fast.decode_batch([e.ids for e in fast.encode_batch(texts, add_special_tokens=False)],
                                 skip_special_tokens=False)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return tokenizer.batch_decode(ids, clean_up_tokenization_spaces=False)


def _lost(tokenizer, texts: list[str]) -> str:
    """The characters of `texts` that do not survive the tokenizer alone, as a list of reprs ('' when none)."""
    chars = sorted({ch for t in texts for ch in t})
    return ", ".join(repr(ch) for ch, after in zip(chars, _through(tokenizer, chars)) if ch != after)


def _excerpt(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _excerpt_pair(text: str, after: str, reach: int = 30) -> tuple[str, str]:
    """The two texts around their first difference, at most `reach` characters either side of it."""
    i = next((k for k, (a, b) in enumerate(zip(text, after)) if a != b), min(len(text), len(after)))
    cut = lambda t: ("..." if i > reach else "") + t[max(i - reach, 0) : i + reach] + ("..." if len(t) > i + reach else "")  # noqa: E731
    return cut(text), cut(after)
