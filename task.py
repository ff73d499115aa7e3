"""The task: problems, their prompts, and the reward. What a fork subclasses for a new task.

DAPO trains against a rule-based checker: a problem with a known answer, a prompt that asks for a
final "Answer: N" line, and a verdict of +1 (right) or -1 (wrong) on each response (paper section
2.3, eq. 7). `Task` holds exactly those pieces, and everything else in the repository calls them
through it. A new task replaces four methods:

    Task.read(spec, cfg, held_out=...)   the problems of a dataset           (what to solve)
    Task.messages(problem, cfg)          the chat messages of one prompt     (how it is asked)
    Task.score(responses, problem, cfg)  a verdict and reward per response   (the one reward call)
    Task.check_answer(problem, cfg)      refuse a ground truth `score` cannot judge, at load time

train.py (rollouts, the probe set, held-out evaluation), eval.py and preflight.py use the same
`score`, so a number in a training log and a number in an evaluation report come from one rule;
each calls it through `Task.verdicts`, which checks what it returns (one verdict per response,
finite rewards) right after the call.
To train on another task, subclass Task (a dataclass: its fields are the task's options), override
these methods, and name it on the command line of every entry point:

    python train.py --task mytask:UnitsDigit --task_args '{"n_problems": 128}' --data units --eval_data units
    python eval.py --model runs/units            # the run's task, from its config
    python preflight.py --task mytask:UnitsDigit --data units

(`load_task`; docs/forking.md; tests/test_fork.py runs exactly that). tasks/tiny.py is the
repository's own example: the default run's task. The soft overlong punishment is not part of the
task: it is DAPO's reward shaping (dapo.overlong_penalty) and train.py adds it.

`cfg` is any object with the fields a method reads (train.Config has them all; eval.py builds its
own from the checkpoint): instruction, few_shot, max_prompt_len, prompt_truncation, verifier,
skip_bad_rows, seed.

How a bare problem becomes a prompt (`messages`): --instruction dapo (the official instruction
around it), none (the problem alone), or a template of your own holding "{problem}"; --few_shot
puts worked examples before it as earlier turns of the chat (N: the task's own `examples`; or a
.jsonl of {problem, response}). The format the instruction asks for is checked apart from the
answer: a verdict whose reason is in FORMAT_ERRORS has no single well-formed final answer, and
`exact_form` says whether the last line is exactly "Answer: <integer>".

The data formats read by this default task (DAPO math): a .parquet in the official DAPO layout
(`prompt` a list of chat messages, `reward_model.ground_truth`, `extra_info.index`), as in
DAPO-Math-17k and the official AIME 2024 file; a .jsonl with `problem`/`answer` (a bare problem,
wrapped in the official instruction) or `prompt`/`answer` (a full prompt, used as it is), and an
optional `id`. Tasks that generate their own problems register a data name in BUILTIN_TASKS
("tiny": tasks/tiny.py; "arith": tasks/arith.py), so `--data tiny` alone selects its task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import verifier
from plumbing import cli, prompts

# Data names that a task generates itself, and that task (module:Class); any other --data is read by Task.
BUILTIN_TASKS = {"tiny": "tasks.tiny:TinyTask", "arith": "tasks.arith:Arithmetic"}
DEFAULT_TASK = "task:Task"  # DAPO's math task: a parquet or JSONL of problems with integer answers

# The official DAPO instruction around a bare problem: the user prompt of every row of DAPO-Math-17k
# and of the official AIME 2024 evaluation file (tests/fixtures/aime2024_dapo_eval.parquet holds it verbatim).
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
# Verdicts without a single well-formed final answer (no "Answer:" line, several values, a
# placeholder, ...): the format failed, whatever the value. A verifier exception is the verifier's failure, not counted.
FORMAT_ERRORS = frozenset(verifier.REASONS) - {"ok", "wrong"} - verifier.EXCEPTION_REASONS
ANSWER_LINE = {"integer": re.compile(r"Answer: -?[0-9]+"), "any": re.compile(r"Answer: \S(?:.*\S)?")}


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

    # --- the four pieces a new task replaces -------------------------------------------------------

    def read(self, spec: str, cfg, *, held_out: bool, limit: int = 0) -> tuple[list[Problem], str, str]:
        """The problems of a dataset: (problems, name, content hash), every row validated up front.

        spec: a .parquet in the official DAPO layout, or a .jsonl (module docstring).
        held_out: the evaluation side (a task that generates its problems returns its held-out
            split, at least `limit` problems; a file is read the same way for both sides).

        Raises:
            FileNotFoundError: no such file.
            ValueError: an unknown format, bad rows (file, row and field named; --skip_bad_rows
                true drops them instead), or no usable row.
        """
        path = Path(spec)
        if spec in BUILTIN_TASKS and not path.is_file():
            raise ValueError(f"data {spec!r} is generated by the task {BUILTIN_TASKS[spec]}, not by {type(self).__name__}: "
                             "drop --task (or pass that one), or pass --data/--eval_data a .parquet or .jsonl path")
        if not path.is_file():
            raise FileNotFoundError(f"dataset {spec!r} does not exist: pass --data/--eval_data a .parquet or .jsonl path, "
                                    f"or one of the generated tasks {sorted(BUILTIN_TASKS)}")
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
        """The chat messages of a problem's prompt: the instruction around a bare problem (`instruct`);
        prompts that already hold the official one, and full prompts, as they are; after the
        --few_shot examples, if any (`shots`)."""
        msgs = [dict(m) for m in problem.messages]
        if problem.bare:
            msgs[-1]["content"] = self.instruct(msgs[-1]["content"], cfg)
        return self.shots(cfg) + msgs

    def instruct(self, text: str, cfg) -> str:
        """A bare problem under --instruction: dapo (DAPO_PREFIX + text + DAPO_SUFFIX, unless the text
        already starts with it), none (the text), or a template with "{problem}" (filled in)."""
        if cfg.instruction == "none" or text.startswith(DAPO_PREFIX[:40]):
            return text
        if cfg.instruction == "dapo":
            return DAPO_PREFIX + text + DAPO_SUFFIX
        return cfg.instruction.replace("{problem}", text)

    def shots(self, cfg) -> list[dict]:
        """The --few_shot examples as chat turns (user: the instructed problem, assistant: its worked
        response); [] without. "N": the task's `examples(N, cfg)`; a path: a .jsonl of {problem, response}.

        Raises FileNotFoundError / ValueError: no such file, or a row without both fields."""
        spec = getattr(cfg, "few_shot", "")
        if not spec:
            return []
        cache = self.__dict__.setdefault("_shots", {})
        key = (spec, cfg.instruction, cfg.seed)
        if key not in cache:
            pairs = self.examples(int(spec), cfg) if spec.isdigit() else _read_shots(Path(spec))
            cache[key] = [m for q, a in pairs for m in ({"role": "user", "content": self.instruct(q, cfg)},
                                                        {"role": "assistant", "content": a})]
        return [dict(m) for m in cache[key]]

    def examples(self, n: int, cfg) -> list[tuple[str, str]]:
        """n worked examples (problem, response in the instruction's form) for --few_shot N. A task
        with worked solutions overrides this (tasks/arith.py); here there are none.

        Raises ValueError."""
        raise ValueError(f"--few_shot {n}: this task has no worked examples of its own; pass a .jsonl of "
                         "{problem, response} rows instead")

    def exact_form(self, response: str, cfg) -> bool:
        """Whether the response ends with a line that is exactly the instruction's form, "Answer: N"
        (an integer; any answer under --verifier math), and nothing after it. The verifier reads more
        ("79 - 62 = Answer: 11", "**Answer:** 11"): this is the stricter share reported beside it."""
        lines = response.rstrip().split("\n")
        return bool(ANSWER_LINE["any" if cfg.verifier == "math" else "integer"].fullmatch(lines[-1]))

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

    def verdicts(self, responses: list[str], problem: Problem, cfg) -> list[verifier.Score]:
        """`score`, checked right after the call: what training, the probe, evaluation and the pre-flight call.

        One verdict per response (verifier.Score: correct, reward, pred, reason), each reward finite. A
        `score` that raises keeps its traceback, and the line above it names the problem (the exception
        is marked `keep_traceback`, so cli.run_cli shows it whole even when it is a ValueError).

        Raises ValueError: one line naming the task's score, the problem id and what was wrong.
        """
        name = f"{type(self).__name__}.score"
        try:
            scores = self.score(responses, problem, cfg)
        except Exception as e:  # a bug of the task's own code: its traceback is what the fork's author needs
            print(f"[task] {name} raised {type(e).__name__} on problem {problem.id} (scoring {len(responses)} responses); "
                  "its traceback follows", file=sys.stderr, flush=True)
            e.keep_traceback = True
            raise
        n = len(scores) if isinstance(scores, (list, tuple)) else None
        if n != len(responses):
            got = f"{n} verdict(s)" if n is not None else f"a {type(scores).__name__}, not a list"
            raise ValueError(f"{name} returned {got} for the {len(responses)} responses to problem {problem.id}: it must "
                             "return one verifier.Score per response, in the order of the responses")
        for i, sc in enumerate(scores):
            if not all(hasattr(sc, a) for a in ("correct", "reward", "pred", "reason")):
                raise ValueError(f"{name} returned a {type(sc).__name__} for response {i} of problem {problem.id}: each "
                                 "verdict must be a verifier.Score (correct, reward, pred, reason)")
            if not _finite(sc.reward):  # the verifier gives +-1: a forked task's score is the likely source
                raise ValueError(f"{name} gave reward {sc.reward} to response {i} of problem {problem.id} (rewards must "
                                 "be finite; the task's score is the likely source): make it return finite rewards")
        return list(scores)


    def build_prompt(self, problem: Problem, tokenizer, cfg) -> list[int]:
        """Prompt token ids of one problem (`prompt_ids`)."""
        return self.prompt_ids([problem], tokenizer, cfg)[0][0]

    def prompt_ids(self, problems: list[Problem], tokenizer, cfg) -> list[tuple[list[int], int]]:
        """For each problem, (its prompt's token ids, the prompt's length in tokens before any cut): `messages`,
        then the tokenizer's chat template (plain lines without one).

        One batch call for all of them: a dataset's 20,000 prompts are tokenised once per run, and one
        call per prompt through the tokenizer's Python wrappers cost about 3 times as long (measured
        on the tiny task). A prompt longer than cfg.max_prompt_len is cut only with --prompt_truncation
        left, and then in the problem's own text (`_cut`); otherwise it is returned whole and `load` decides.

        Raises ValueError: as `_cut`.
        """
        whole = prompts.encode_chats([self.messages(p, cfg) for p in problems], tokenizer)
        if cfg.prompt_truncation != "left":
            return [(ids, len(ids)) for ids in whole]
        return [(ids if len(ids) <= cfg.max_prompt_len else self._cut(p, ids, tokenizer, cfg), len(ids))
                for p, ids in zip(problems, whole)]

    def _cut(self, problem: Problem, ids: list[int], tokenizer, cfg) -> list[int]:
        """The prompt `ids` of `problem` (over cfg.max_prompt_len) within the budget, under --prompt_truncation left.

        The prompt loses the start of the problem's own text (its last user message, inside the official
        instruction when it holds one), as few tokens as bring it within the budget; the chat template's
        turn markers, a system turn, the instruction and the --few_shot examples stay. (The official
        scripts cut the whole prompt's token ids from the left, verl's `truncation="left"`: on a chat model
        the system turn and the turn markers went first.) The cut text is rendered again, so the ids are
        the tokenizer's own for a real text.

        Raises ValueError: a prompt whose structure alone (everything but the problem's text) is over the budget.
        """
        users = [i for i, m in enumerate(problem.messages) if m.get("role", "user") == "user"]
        at = users[-1] if users else len(problem.messages) - 1
        text = problem.messages[at]["content"]
        head = DAPO_PREFIX if text.startswith(DAPO_PREFIX) else ""
        tail = DAPO_SUFFIX if text.endswith(DAPO_SUFFIX) and len(text) >= len(head) + len(DAPO_SUFFIX) else ""
        body = tokenizer(text[len(head) : len(text) - len(tail)], add_special_tokens=False)["input_ids"]

        def with_text(own: str) -> list[int]:
            msgs = [dict(m) for m in problem.messages]
            msgs[at]["content"] = head + own + tail
            return prompts.encode_chats([self.messages(dataclasses.replace(problem, messages=msgs), cfg)], tokenizer)[0]

        keep = len(body) - (len(ids) - cfg.max_prompt_len)
        for _ in range(16):  # the seams between text and template may tokenise otherwise: cut again by what is over
            if keep < 1:
                break
            cut = with_text(tokenizer.decode(body[-keep:], skip_special_tokens=False).lstrip("\ufffd"))
            if len(cut) <= cfg.max_prompt_len:
                return cut
            keep -= len(cut) - cfg.max_prompt_len
        raise ValueError(f"the prompt of problem {problem.id} has {len(ids)} tokens and cannot be cut within "
                         f"--max_prompt_len {cfg.max_prompt_len} by the start of its text: everything around the text "
                         f"(chat template, instruction, examples) takes {len(with_text(''))} tokens. Raise "
                         "--max_prompt_len, or pass --prompt_truncation skip")

    def load(self, spec: str, tokenizer, cfg, *, held_out: bool, limit: int = 0, flag: str = "") -> Dataset:
        """Read a dataset and tokenise every prompt once (before any training or evaluation).

        flag: the command-line flag that named `spec` ("--data", "--eval_data"), put before `read`'s
        errors so that a wrong one is named.

        Held-out data is counted by problem id (deduplicated) and cut to its first `limit` problems.
        A prompt over --max_prompt_len tokens stops here under --prompt_truncation error (the
        default), is dropped and counted under skip, and is cut under left (`prompt_ids`: the start
        of the problem's text), counted, the first few named on one line and in info.

        Every id must name one problem (check_ids); prompts the tokenizer changes are counted and
        reported (round_trip).

        Raises:
            ValueError: as `read`; an id on different rows; a prompt too long under "error"; no prompt fits.
        """
        verifier.prepare(cfg.verifier)  # math mode: its checker processes start now, while the data and model load
        try:
            rows, name, data_hash = self.read(spec, cfg, held_out=held_out, limit=limit)
        except (ValueError, FileNotFoundError) as e:
            if not flag:
                raise
            raise (FileNotFoundError if isinstance(e, FileNotFoundError) else ValueError)(f"{flag} {spec!r}: {e}") from e
        check_ids(rows, name)
        problems = dedupe_by_id(rows)[: limit or None] if held_out else rows
        changed = prompts.round_trip(self, problems, tokenizer, cfg, name)
        repeats = Counter(Counter(p.id for p in rows).values())  # {rows per id: how many ids}
        info = {"dataset_rows": len(rows),
                "rows_per_problem": next(iter(repeats)) if len(repeats) == 1 else {str(c): n for c, n in sorted(repeats.items())}}
        kept, ids, too_long, cut = [], [], [], []
        for p, (x, n) in zip(problems, self.prompt_ids(problems, tokenizer, cfg)):
            if len(x) > cfg.max_prompt_len:
                too_long.append((p.id, len(x)))
                continue
            if n > len(x):  # --prompt_truncation left cut it
                cut.append((p.id, n))
            kept.append(p)
            ids.append(x)
        if too_long and cfg.prompt_truncation == "error":
            raise ValueError(f"{len(too_long)} prompt(s) of {name} exceed --max_prompt_len {cfg.max_prompt_len} tokens "
                             f"(first: problem {too_long[0][0]}, {too_long[0][1]} tokens). Raise --max_prompt_len, or pass "
                             "--prompt_truncation left (cut from the start of the problem's text) or skip")
        if too_long:
            print(f"[data] skipped {len(too_long)} prompt(s) longer than {cfg.max_prompt_len} tokens", file=sys.stderr)
        if cut:
            print(f"[data] {len(cut)} of {len(problems)} prompts of {name} exceed --max_prompt_len {cfg.max_prompt_len} "
                  "tokens and lost the start of the problem's text (--prompt_truncation left; the chat template, instruction "
                  "and examples stay); first: " + ", ".join(f"problem {i} ({n} tokens)" for i, n in cut[:3]), file=sys.stderr)
        if not kept:
            raise ValueError(f"no prompt of {name} fits --max_prompt_len {cfg.max_prompt_len}")
        return Dataset(kept, ids, name, data_hash, {**info, "prompts_skipped": len(too_long), "prompts_cut": len(cut),
                                                    "prompts_cut_first": [i for i, _ in cut[:5]],
                                                    "prompts_changed_by_tokenizer": changed})

    def template_hash(self, tokenizer, cfg) -> str:
        """Hash of everything that turns a problem into prompt text (recorded with every rollout)."""
        shots = json.dumps(self.shots(cfg)) if getattr(cfg, "few_shot", "") else ""
        return hashlib.sha256(f"{tokenizer.chat_template}|{cfg.instruction}|{DAPO_PREFIX}|{DAPO_SUFFIX}{shots}".encode()).hexdigest()[:16]


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def task_spec(task: str, data: str) -> str:
    """The task a run uses, as module:Class: --task when given, else the task that generates --data
    (BUILTIN_TASKS, e.g. "tiny"), else DEFAULT_TASK (DAPO math read from a file)."""
    return task or BUILTIN_TASKS.get(data, DEFAULT_TASK)


def load_task(spec: str, args: str | dict = "{}") -> Task:
    """The task named by `spec` ("module:Class"), built with the options `args` (a JSON object, or a dict).

    The module is imported by name, so it must be importable from the repository root (where the
    entry points run) or from PYTHONPATH; generator processes import it again by that name.

    Raises:
        ValueError: a spec without ':', no such module or class, a class that is not a subclass of
            Task, `args` that is not a JSON object or names an option the class does not have.
            Each message names the input and the fix.
    """
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--task {spec!r}: write it as module:Class, e.g. tasks.tiny:TinyTask (a task.Task subclass "
                         "in a module importable from the repository root or PYTHONPATH)")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module and not module.startswith(f"{e.name}."):
            raise  # the task's module exists but imports something missing: its own traceback says what
        raise ValueError(f"--task {spec!r}: no module {module!r} importable from here (the repository root or "
                         "PYTHONPATH); put the file there or add its folder to PYTHONPATH") from None
    cls = getattr(mod, name, None)
    if cls is None:
        raise ValueError(f"--task {spec!r}: module {module!r} defines no {name!r}; name a task.Task subclass defined there")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ValueError(f"--task {spec!r}: {name} is not a subclass of task.Task; subclass it and override read, "
                         "messages, score and check_answer (docs/forking.md)")
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    first = [(k, f.default if f.default is not dataclasses.MISSING else f.default_factory())  # its own first option
             for k, f in list(fields.items())[:1] if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    example = json.dumps(dict(first))
    try:
        kwargs = json.loads(args) if isinstance(args, str) else dict(args)
    except json.JSONDecodeError as e:
        raise ValueError(f"--task_args {args!r}: not JSON ({e.msg}); pass an object such as '{example}'") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"--task_args {args!r}: expected a JSON object of {name}'s options, e.g. '{example}'")
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        raise ValueError(f"--task_args: {name} has no option {unknown[0]!r}; its options are {list(fields) or 'none'}")
    cli.check_options(cls, kwargs, "--task_args")  # each value of the option's type, however the module annotates
    return cls(**kwargs)


def task_of(cfg, task: Task | None = None) -> tuple[Task, object]:
    """(the task, the config that names it) for a run's config (train.Config): the config's own task
    (--task, --task_args: `load_task`), or `task`, an object given from Python, recorded in a copy of
    the config as module:Class with its options, so that eval.py and a resume find it."""
    if task is None:
        return load_task(task_spec(cfg.task, cfg.data), cfg.task_args), cfg
    options = dataclasses.asdict(task) if dataclasses.is_dataclass(task) else {}
    return task, dataclasses.replace(cfg, task=f"{type(task).__module__}:{type(task).__qualname__}",
                                     task_args=json.dumps(options, sort_keys=True))


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


def _read_shots(path: Path) -> list[tuple[str, str]]:
    """(problem, response) pairs of a --few_shot .jsonl. Raises FileNotFoundError / ValueError naming the row."""
    if not path.is_file():
        raise FileNotFoundError(f"--few_shot {str(path)!r}: no such file; pass a number of worked examples of the task, "
                                "or a .jsonl of {problem, response} rows")
    pairs = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            row = json.loads(line)
            if not (isinstance(row, dict) and isinstance(row.get("problem"), str) and isinstance(row.get("response"), str)):
                raise ValueError(f"--few_shot {path} row {i}: expected a JSON object with string fields problem and response")
            pairs.append((row["problem"], row["response"]))
    return pairs


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
        show = lambda k: f"{k} ({prompts.excerpt(rows[k].messages[-1]['content'])!r}, answer {rows[k].answer!r})"  # noqa: E731
        raise ValueError(f"{len(clashes)} id(s) of {name} name different rows, which training would record under one id "
                         "and evaluation would reduce to the first; first: " + "; ".join(
                             f"id {pid!r}: rows {show(i)} and {show(j)}" for pid, (i, j) in list(clashes.items())[:3])
                         + ". Give each problem its own id (JSONL: the `id` field; parquet: extra_info.index)")
