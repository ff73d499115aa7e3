"""Answer extraction and checking: the reward of DAPO, made exact, fair and impossible to hijack.

RL optimises the holes in its reward, so every mistake here becomes something the policy learns.
`score(response, ground_truth, mode=...)` returns a `Score` (correct, reward +1/-1, the extracted
prediction, a reason code). It never raises on model text; it raises on a bad ground truth or an
unknown mode. Three modes:

- "dapo" (default; integer ground truths as in DAPO-Math-17k and AIME). The last "Answer:" line
  decides, as in the official rule, without its false negatives, and every value the response
  states as its final one must agree with it. Pure string work, linear time, no parser and no
  subprocess: this is the reward in the hot loop.
- "dapo-official": the official rule bit for bit, so a reproduction can score exactly as the paper
  did (DAPO, Yu et al. 2025, arXiv:2503.14476, whose reward is verl's
  `verl/utils/reward_score/math_dapo.py` `compute_score` with its default `strict_box_verify=False`):
  the last 300 characters of the response, the last match of `Answer\\s*:\\s*([^\\n]+)` in them
  (case-insensitive), the Minerva normalisation of lm-evaluation-harness `hendrycks_math`
  (`normalize_final_answer`) on it and on the ground truth, string equality, reward +1 or -1.
- "math": general answers (fractions, radicals, pi, intervals, tuples, equations, percent,
  degrees). Our code extracts and normalises (plumbing/math_equivalence.py); math-verify
  (huggingface/Math-Verify: LaTeX parser -> sympy, never `eval`) decides equivalence inside a worker
  process that is killed past `timeout_s` (plumbing/math_workers.py), with our rule for numbers.

The final-answer grammar of "dapo" and "math" (dapo-verifier-5). The rules are this table; the code
cites its rows (G1-G7), and docs/verifier.md records, case by case, how each part departs from the
official rule (the numbered deviations the code cites). In "math" mode a value is any LaTeX answer
and rows G3-G5 do not apply (its values contain words and letters); "dapo-official" follows none
of it.

  row | part of the response                  | read as                          | e.g.
  ----+---------------------------------------+----------------------------------+-----------------------------
  G1  | the response                          | after the last end of reasoning  | "<think>..</think>Answer: 12"
      |                                       | (</think> and its kin), up to    | "Answer: 12<|im_end|>",
      |                                       | the first token that ends the    | "12</s>", "12<|eot_id|>",
      |                                       | turn or starts another; harmony: | "<|channel|>final<|message|>
      |                                       | the final channel's message      | Answer: 12<|return|>"
  G1  | the final statement                   | the last "Answer:" or "####"     | "<answer>18</answer>",
      |                                       | line, else the last <answer>     | "#### 18", "The answer is 18."
      |                                       | tag, else the last box, else the |
      |                                       | last "the answer is"; all values |
      |                                       | of the final answer section agree|
  G2  | transparent wrappers, nested in any   | the value they wrap:             |
      | order:  markup                        |                                  | "**13**", "`13`", "<b>13</b>"
      |         math delimiters, environments |                                  | "$13$", "\\(13\\)", "\\[13\\]"
      |         boxes, text and style         |                                  | "\\boxed{13}", "\\text{13}"
      |         units, percent, degrees       |                                  | "13 apples", "13\\,\\text{cm}"
      |         trailing punctuation, LaTeX   |                                  | "13.", "13;", "$13$ \\\\",
      |         spacing and line breaks       |                                  | "13\\quad", "\\qquad 13"
      |         digit groups                  |                                  | "1,000", "18 {, }936"
      |         brackets around a signed one  |                                  | "(-3)", "\\left(-3\\right)"
      |         a base's subscript            | the digits, which the base allows| "1044_5", "(1044)_{5}": 1044
      |         a congruence's modulus        | the residue, never the modulus   | "x \\equiv 3 \\pmod 7": 3
      |         an equation's other side      | every numeric side must agree    | "x = 13", "13 = m + n"
  G3  | a sentence frame before the value     | the value, when the frame states | "The largest $n$ is 34.",
      |                                       | no other value (digits or words) | "Josh made a profit of $70",
      |                                       | and neither hedges nor changes it| "It grows by 34 each year."
  G4  | working after the value, in brackets  | never read: adds no candidate,   | "18 (3 boxes of 6 eggs)",
      | or after , ; - or a full stop         | but refused if it hedges or is a | "18, 3 boxes of 6 eggs",
      |                                       | value of its own ("18 (19)")     | "18 (= 6 \\times 3)"
      |   a clause or closing phrase          | never read (deviation 15)        | "56, since 7 x 8 = 56"
  --- | refused, reward -1:                   |                                  |
  G2-4| two different values                  | multiple_answers                 | "12, 13", "12 or 13",
      |                                       |                                  | "18 (19)", "18, nineteen",
      |                                       |                                  | a column of boxes (23)
      | a relation or a hedge                 | malformed                        | "12 or more", "at least 12",
      |                                       |                                  | "The answer is about 12"
      | a word or sign that changes the value | malformed                        | "half of 34", "twice 17",
      |                                       |                                  | "10^4", "2 \\times 6"
      | an option letter alone                | malformed                        | "(B)", "\\text{(C)}"
  G5  | a second value stated as the result:  | multiple_answers                 | "Answer: 19 ... so there are
      | from the final statement on, or after |                                  | only 17 valid pairs.";
      | an earlier "Answer:" line or box of   |                                  | "\\boxed{19}. Removing two
      | the final value up to the final one   |                                  | leaves 17 in total."
  G6  | math mode: empty set notations        | one set, not {0}                 | "\\varnothing" == "\\{ \\}"
      |   set difference, domains             | intervals                        | "x \\neq 1" == "(-\\infty, 1)
      |                                       |                                  | \\cup (1, \\infty)"
      |   a ground truth that is an equation  | a value without "=" is wrong     | "0" != "a + z = 0";
      |                                       | unless it assigns one variable:  | "5" == "I_{\\max} = 5",
      |                                       | then compared with its value     | "\\Phi (x,y)=x^2" == "x^2"
  G7  | math mode: an answer or a ground      | malformed before parsing (an     | "\\binom{10^7}{5 \\cdot 10^6}",
      | truth too expensive to evaluate       | answer); only its own spelling   | "9^{9^{9^{9}}}", "100000!"
      | a call's time limit                   | decided (a ground truth); past   |
      |                                       | the limit "timeout", never wrong |

A frame (G3) is words, variables (one definition of a name for G3 and G6: "$a_{10}$", "$I_{\\max}$",
"$\\vec{F}$"; "$m+n$", "$2a$": no value of their own), Greek letters and text commands up to the
value. It hedges with "maybe", "probably", "approximately", "would", "if", "or", "at least", "than",
"is not" and their kin anywhere in it, and changes the value when the words right before it are an
operation or a bound: "about", "over", "under", "twice", "half of", "a multiple of", "divided by",
"squared", "not", "plus", ...; "of" and "by" alone are prepositions ("a profit of", "grows by");
number words in it must spell the value. Working (G4) is text with digits that does not itself read
as a value; it is cut before the value is read, so it can hold numbers without adding candidates. A
bracket or item that is a value of its own ("18 (19)", "18, as well as 19", "x = 1, y = 2") stays a
second value, and one that hedges ("18 (or 19)", "18, maybe 19") is refused.

A value is stated as the result (G5, plumbing/result_statements.py) when it follows a verb of
result or a copula ("is", "are", "leaves", "gives", "comes to"; up to three fillers between: "is
actually", "are only", "would be"), a word of conclusion ("so", "hence") or a label ("Correction:
17"), opens its clause as the subject of such a verb ("only 17 are valid"), comes before "in total",
or ends an equation of numbers or one a word of conclusion opens ("10 + 7 = 17", "so m + n = 17");
not as an operand, negated ("not 17"), in a premise ("since there are 7 rows") or as a lone "one".
No word of contrast is needed: a response that states two different final values is never right.

Run `python verifier.py ROLLOUTS.jsonl` to hand-check saved rollouts (see `main`).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from plumbing import math_equivalence, math_workers
from plumbing.answer_markup import canonical_int
from plumbing.final_answer import ANCHOR_REACH, ANSWER_ONLY, anchors, extract_final
from plumbing.integer_answer import agree, earlier_value, integer_candidate, integer_ground_truth, section_value
from plumbing.result_statements import WORD_OR_EQUALS as _WORD_OR_EQUALS
from plumbing.result_statements import results_stated

__all__ = ["VERSION", "MODES", "REASONS", "EXCEPTION_REASONS", "Score", "score", "score_batch"]

# Changes whenever any rule changes: train and eval record it with every score.
VERSION = "dapo-verifier-5"
MODES = ("dapo", "dapo-official", "math")

# Every reason code, and what it means. A Score is correct only with reason "ok".
REASON_DOCS = {
    "ok": "one final answer, equal to the ground truth",
    "wrong": "one well-formed final answer, not equal to the ground truth",
    "no_answer": "no 'Answer:' line, box or 'the answer is' (or an unclosed <think> block, or a harmony response "
    "without a final channel)",
    "empty_answer": "an 'Answer:' marker with nothing after it",
    "placeholder": "a template placeholder instead of an answer ('...', '[answer]', '<final_answer>')",
    "echoed_prompt": "the only answer marker is the prompt's instruction echoed back",
    "multiple_answers": "several candidates ('12 or 13', a list, a range) or contradicting final answers",
    "malformed": "an answer that is not of the accepted form (dapo: a single ASCII integer), too long, or (math) "
    "nested or long past the parse limits",
    "parse_error": "math mode: the math parser could not read the answer or raised while comparing",
    "timeout": "math mode: parsing or comparing took, or would take (a ground truth too expensive to evaluate), "
    "longer than timeout_s; the worker was killed",
    "worker_error": "math mode: the worker process died or ran out of memory",
}
REASONS = tuple(REASON_DOCS)
# Counted as "verifier exceptions" in run metrics: the verifier, not the policy, failed to decide.
EXCEPTION_REASONS = frozenset({"parse_error", "timeout", "worker_error"})

DEFAULT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Score:
    """The verdict on one response."""

    correct: bool
    reward: float  # +1.0 if correct else -1.0 (the overlong term is added by the caller)
    pred: str | None  # extracted, normalised prediction; None when nothing was extracted
    reason: str  # one of REASONS
    detail: str = ""  # human-readable note for the CLI and logs (never used for the verdict)


@functools.lru_cache(maxsize=4096)  # a Score is immutable: the same verdict is built once (the hot loop's ~1 us)
def _verdict(correct: bool, pred: str | None, reason: str, detail: str = "") -> Score:
    return Score(correct, 1.0 if correct else -1.0, pred, reason, detail)


# --- DAPO: the grammar's rule ("dapo" mode), in the order of its rows ------------------------


# The common case of a DAPO rollout, decided without the machinery below: the response ends with the
# line "Answer: N" (N an integer) and holds nothing another rule reads (no "<", no other colon that
# could be a marker, no box near, no answer-only line right above). The verdict is exactly the full
# rule's (tests/test_verifier_general.py checks the two agree on random responses); anything else
# takes the full rule.
_FAST_END = re.compile(
    r"\n[ \t]*(?:\*\*)?[Aa]nswer(?:\*\*)?:(?:\*\*)?[ \t]*"
    r"(?:([+-]?)([0-9]{1,60})|\$([+-]?)([0-9]{1,60})\$|(\$)?\\boxed\{([+-]?)([0-9]{1,60})\}(?(5)\$))\.?\s*\Z"
)  # "Answer: 17", "Answer: $17$", "Answer: \boxed{17}", "Answer: $\boxed{17}$." (and bold, a full stop)
_FAST_BOX_END = re.compile(r"\\boxed\{([+-]?)([0-9]{1,60})\}\$?\.?\s*\Z")  # "... is $\\boxed{17}$."
_ANSWER_ONLY_TEXT = re.compile(ANSWER_ONLY.pattern.decode())
_DIGITS_TEXT = re.compile(r"[0-9]")


def _fast_dapo(response: str, truth: str) -> Score | None:
    """The verdict of the common cases (above), else None."""
    if not response.isascii():
        return None
    tail = max(0, len(response) - 80)
    end = _FAST_END.search(response, tail)
    box = None if end is not None else _FAST_BOX_END.search(response, tail)
    if end is None and box is None:
        return None
    if "<" in response and _TAG.search(response):
        return None  # a token or tag G1 reads
    if end is not None:
        line = end.start() + 1
        if _earlier_marker(response, line) or response.find("box", max(0, line - ANCHOR_REACH), line) >= 0:
            return None  # an earlier marker (deviation 20) or a box near (23, G5) may count: the full rule decides
        if _answer_only_above(response, line):
            return None  # the final answer section reaches above the line (deviation 23)
        sign, digits = (end[1], end[2]) if end[2] else (end[3], end[4]) if end[4] else (end[6], end[7])
    else:  # "Therefore the answer is $\\boxed{17}$.": no marker anywhere, the last box decides (deviation 7)
        at = box.start()
        if "#" in response or _earlier_marker(response, len(response)) or response.find("box", max(0, at - ANCHOR_REACH), at) >= 0:
            return None  # a marker, or another box that may count
        line = response.rfind("\n", 0, at) + 1
        if _ANSWER_ONLY_TEXT.fullmatch(response, line, at) and (_DIGITS_TEXT.search(response, line, at) or _answer_only_above(response, line)):
            return None  # the final answer section reaches before the box (deviation 23)
        sign, digits = box[1], box[2]
    pred = canonical_int(sign, digits)
    return _verdict(pred == truth, pred, "ok" if pred == truth else "wrong")


def _answer_only_above(response: str, line: int) -> bool:
    """True when the last non-empty line before offset line states an answer and nothing else (23)."""
    k = line - 1
    while k > 0 and response[k - 1] in " \t\r\n":
        k -= 1
    return k > 0 and _ANSWER_ONLY_TEXT.fullmatch(response, response.rfind("\n", 0, k) + 1, k) is not None


_TAG = re.compile(r"<(?:\||/|s>|eos>|pad>|end_of|start_of|think|answer|seed)")  # what G1 reads, all with a "<"


def _earlier_marker(response: str, line: int) -> bool:
    """True when an "Answer:" marker may stand before offset line: a colon after "answer" and at most
    8 spaces or markup bytes, as final_answer reads markers."""
    colon = response.find(":", 0, line)
    while colon >= 0:
        k = colon
        while k > 0 and colon - k < 8 and response[k - 1] in " \t*_}":
            k -= 1
        if response[k - 6 : k].lower() == "answer":
            return True
        colon = response.find(":", colon + 1, line)
    return False


def _score_dapo(response: str, ground_truth: str) -> Score:
    truth = integer_ground_truth(ground_truth)
    return _fast_dapo(response, truth) or _dapo_rule(response, truth)


def _dapo_rule(response: str, truth: str) -> Score:
    """The "dapo" verdict by the grammar's rows, in their order (truth: the canonical integer)."""
    final = extract_final(response)
    if final.reason:
        return _verdict(False, None, final.reason, final.detail)
    if len(final.candidates) == 1:  # the common case, kept cheap
        pred, reason, detail = integer_candidate(final.candidates[0])
    else:
        pred, reason, detail = agree([integer_candidate(c) for c in final.candidates])
    if reason:
        return _verdict(False, pred, reason, detail)
    if final.earlier:  # deviation 20: every "Answer:" line must state the final value
        others = [value for value in map(earlier_value, final.earlier) if value is not None and value != pred]
        if others:
            stated = ", ".join(dict.fromkeys([*others, pred]))
            return _verdict(False, None, "multiple_answers", f"'Answer:' lines disagree: {stated}")
    if final.section:  # deviation 23: every value of the final answer section must be the final one
        others = [value for value in map(section_value, final.section) if value != pred]
        if others:
            stated = ", ".join(dict.fromkeys([*others, pred]))
            detail = f"the final answer section states several values: {stated[:200]}"
            return _verdict(False, None, "multiple_answers", detail)
    data = final.data  # G5: from the final statement on, no other value stated as the result
    if final.earlier or _WORD_OR_EQUALS.search(data, final.final_at) or data.find(b"box", max(final.text_start, final.final_start - ANCHOR_REACH), final.final_start) >= 0:  # fmt: skip
        other = _other_result(final, pred)  # the common case ("Answer: 17" at the end) skips this
        if other is not None:
            return _verdict(False, None, "multiple_answers", other)
    return _verdict(pred == truth, pred, "ok" if pred == truth else "wrong")


def _other_result(final, pred: str) -> str | None:
    """Why the response states a final value other than pred (G5), else None: a value the text
    states as a result from the final statement on, or after an earlier explicit statement of pred
    (an "Answer:" line, a box) up to the final one (plumbing/result_statements.py)."""
    data = final.data
    for _, value in results_stated(data, final.final_at, len(data), pred):
        if value != pred:
            return f"the final answer {pred} and the text from it on, which states {value} as the result"
    if not final.earlier and data.find(b"box", max(final.text_start, final.final_start - ANCHOR_REACH), final.final_start) < 0:
        return None  # the common case: no earlier statement to compare (checked here, cheaply)
    for text, end in anchors(final):
        if end <= final.final_start and section_value(text) == pred:
            for _, value in results_stated(final.data, end, final.final_start, pred):
                if value != pred:
                    return f"{pred} stated, then {value} as the result, then {pred} again as the final answer"
    return None


# --- DAPO: the official rule, bit for bit ("dapo-official" mode) ------------------------------
# verl/utils/reward_score/math_dapo.py (compute_score -> is_correct_minerva), itself the Minerva
# normalisation of lm-evaluation-harness hendrycks_math. The tables are the rule's data, in its order.

_OFFICIAL_WINDOW = 300  # characters from the end; "the longest answer in MATH-500 has 159"
_OFFICIAL_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")  # note: re's (?i) is Unicode-aware
_OFFICIAL_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)  # fmt: skip
_OFFICIAL_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
    "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}",
    "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ",
    "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
_OFFICIAL_REWRITES = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$"),  # keep only the first $...$
        (r"(\\text\{)(.*?)(\})", "\\2"),
        (r"(\\textbf\{)(.*?)(\})", "\\2"),
        (r"(\\overline\{)(.*?)(\})", "\\2"),
        (r"(\\boxed\{)(.*)(\})", "\\2"),
        (r"(frac)([^{])(.)", "frac{\\2}{\\3}"),  # \fracab -> \frac{a}{b}
        (r"(sqrt)([^{])", "sqrt{\\2}"),  # \sqrta -> \sqrt{a}
    )
)


def _official_normalise(answer: str) -> str:
    answer = answer.split("=")[-1]
    for before, after in _OFFICIAL_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for removed in _OFFICIAL_REMOVED:
        answer = answer.replace(removed, "")
    for pattern, replacement in _OFFICIAL_REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():  # str.isdigit: also true for "１３" and "²"
        answer = answer.replace(",", "")
    return answer.strip()


_official_ground_truth = functools.lru_cache(maxsize=65536)(_official_normalise)


def _score_official(response: str, ground_truth: str) -> Score:
    matches = _OFFICIAL_ANSWER.findall(response[-_OFFICIAL_WINDOW:])
    if not matches:  # the official code compares "[INVALID]", which no real answer equals
        return _verdict(False, None, "no_answer", "no 'Answer:' in the last 300 characters")
    pred = _official_normalise(matches[-1])
    correct = pred == _official_ground_truth(ground_truth)
    return _verdict(correct, pred, "ok" if correct else "wrong")



# --- public API -------------------------------------------------------------------------------


def score(response: str, ground_truth: str, *, mode: str = "dapo", timeout_s: float = DEFAULT_TIMEOUT_S) -> Score:
    """Score one response against its ground truth.

    Args:
        response: the model's text (anything: never raises on it).
        ground_truth: the reference answer; "dapo" needs an integer string.
        mode: one of MODES.
        timeout_s: hard limit, in seconds, on a math-mode call, taking a worker and killing a hung
            one included (G7): past it the worker process is killed and the reason is "timeout"
            (a verifier exception, never "wrong"), returned TIMEOUT_MARGIN_S before the limit. A
            worker is an idle one or a fork of a warm fork server (milliseconds), so the call after
            any number of timeouts starts at once; only the server's own start is not counted (a
            few seconds: importing sympy and math-verify; the process's first call, which
            `prepare` moves ahead). Answers, and ground truths, too expensive to evaluate are
            decided before parsing (G7). The "dapo" modes are linear-time string work: no limit.

    Raises:
        ValueError: unknown mode, bad timeout, or a ground truth the mode cannot use.
        TypeError: response or ground_truth is not a str.
    """
    if mode not in MODES:
        raise ValueError(f"unknown verifier mode {mode!r}: choose one of {MODES}")
    if not isinstance(response, str) or not isinstance(ground_truth, str):
        raise TypeError(
            f"score() takes str response and ground_truth, got {type(response).__name__} and "
            f"{type(ground_truth).__name__}: decode token ids first and cast answers with str()"
        )
    if not ground_truth.strip():
        raise ValueError("empty ground truth: an empty answer would then score as correct; fix the dataset row")
    if mode == "dapo":
        return _score_dapo(response, ground_truth)
    if mode == "dapo-official":
        return _score_official(response, ground_truth)
    if mode == "math":
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        return _verdict(*math_equivalence.score_math(response, ground_truth, timeout_s))
    raise AssertionError(f"mode {mode!r} is in MODES but has no rule")


def score_batch(
    responses: list[str],
    ground_truths: list[str],
    *,
    mode: str = "dapo",
    workers: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Score]:
    """score() for many responses, results in input order.

    The math mode runs `workers` calls at once (default: CPU count), each in its own worker
    process; the "dapo" modes run inline, since a process hop costs more than the rule.
    """
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths: pass one per response")
    one = functools.partial(score, mode=mode, timeout_s=timeout_s)
    if mode != "math":
        return [one(r, g) for r, g in zip(responses, ground_truths)]
    # Threads only wait on pipes: the parsing runs in one worker process per thread.
    with ThreadPoolExecutor(max_workers=workers or len(os.sched_getaffinity(0))) as pool:
        return list(pool.map(one, responses, ground_truths))


def prepare(mode: str) -> None:
    """Start the math mode's workers in the background, ahead of the first call (G7): task.Task.load
    calls it under --verifier math, before the model loads. A no-op for the other modes; never
    raises (a worker that cannot start is reported by the call that needs it)."""
    if mode == "math":
        math_workers.prepare()


# --- plumbing: command line for hand-checking rollouts ----------------------------------------


class CliError(Exception):
    """Bad input to the command line (a missing or unreadable file, a line that is not JSON, a
    record without the needed fields): `main` prints it as one "error: ..." line and exits 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in the same one-line style as ours (argparse prints usage first)."""

    def error(self, message: str) -> None:
        self.exit(2, f"error: {message}; run with --help for usage\n")


def _positive(kind: type):
    """An argparse type: a finite number of `kind` above 0, else a one-line argparse error."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _field(record: dict, path: str, where: str):
    """record["a"]["b"] for path "a.b" (parquet rows such as reward_model.ground_truth).

    Raises:
        CliError: the record has no such field; `where` names the file and row.
    """
    value = record
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise CliError(
                f"{where} has no field {path!r} (its fields: {', '.join(sorted(record)) or 'none'}); "
                f"name the fields with --response-field and --answer-field"
            )
        value = value[key]
    return value


def _read_records(path: str, limit: int | None) -> list[dict]:
    """The first `limit` records of a JSONL (one JSON object per line) or .parquet file.

    Raises:
        CliError: the file cannot be read, a line is not a JSON object, or pyarrow is missing.
    """
    if not os.path.isfile(path):
        raise CliError(f"{path} does not exist or is not a file; pass the path of a rollouts .jsonl file")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise CliError(f"reading {path} needs pyarrow: pip install pyarrow, or pass a .jsonl file") from None
        try:
            return pq.read_table(path).slice(0, limit).to_pylist()
        except OSError as error:
            raise CliError(f"cannot read {path} ({error}); pass a readable .parquet file") from error
        except ValueError as error:  # pyarrow's ArrowInvalid: not a parquet file
            raise CliError(f"{path} is not a parquet file ({error}); pass a .parquet or .jsonl file") from error
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise CliError(
                        f"{path} line {number} is not JSON ({error.msg}); pass a JSONL file, one JSON object per line"
                    ) from error
                if not isinstance(record, dict):
                    raise CliError(
                        f"{path} line {number} is a JSON {type(record).__name__}, not an object; "
                        f"pass a JSONL file, one JSON object per line"
                    )
                records.append(record)
                if limit is not None and len(records) >= limit:
                    break
    except OSError as error:
        raise CliError(f"cannot read {path} ({error.strerror or error}); pass a readable .jsonl file") from error
    except UnicodeDecodeError as error:
        raise CliError(f"{path} is not UTF-8 text ({error.reason}); pass a JSONL file") from error
    return records


def main(argv: list[str] | None = None) -> None:
    """Hand-check saved rollouts: print prediction, verdict and reason per row, then the counts.

    Args:
        argv: the command-line arguments (default: sys.argv[1:]); see --help.

    Raises:
        SystemExit: 2 on bad input, after printing one line "error: <what is wrong and how to fix
            it>" to stderr. With the environment variable DAPO_DEBUG=1 the underlying exception is
            raised instead, with its full traceback.
    """
    try:
        _cli(argv)
    except CliError as error:
        if os.environ.get("DAPO_DEBUG") == "1":
            raise
        message = " ".join(str(error).split())  # one line, whatever the text in it
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


def _cli(argv: list[str] | None) -> None:
    parser = _Parser(
        description="Hand-check saved rollouts: prediction, verdict and reason per row.",
        epilog="Bad input prints one 'error:' line and exits 2; DAPO_DEBUG=1 shows the traceback instead.",
    )
    parser.add_argument("path", help="rollouts JSONL (fields response, ground_truth) or a dataset .jsonl/.parquet")
    parser.add_argument("--mode", default="dapo", choices=MODES)
    parser.add_argument("--limit", type=_positive(int), default=None, help="score only the first N rows")
    parser.add_argument("--response-field", default="response", help="field with the model text")
    parser.add_argument(
        "--answer-field", default=None, help="field with the ground truth (default: ground_truth, else answer)"
    )
    parser.add_argument("--timeout-s", type=_positive(float), default=DEFAULT_TIMEOUT_S)
    args = parser.parse_args(argv)

    records = _read_records(args.path, args.limit)
    if not records:
        raise CliError(f"{args.path} has no records; pass a JSONL file with one JSON object per line")
    answer_field = args.answer_field or ("ground_truth" if "ground_truth" in records[0] else "answer")
    responses = [str(_field(r, args.response_field, f"{args.path} row {i}")) for i, r in enumerate(records)]
    truths = [str(_field(r, answer_field, f"{args.path} row {i}")) for i, r in enumerate(records)]
    for i, truth in enumerate(truths):  # a ground truth the mode cannot use, named by its row
        try:
            score("", truth, mode=args.mode)  # an empty response: checks the ground truth, starts no worker
        except ValueError as error:
            raise CliError(f"{args.path} row {i}: {error}") from error
    try:
        scores = score_batch(responses, truths, mode=args.mode, timeout_s=args.timeout_s)
    except ValueError as error:  # a math-mode ground truth the parser rejects
        raise CliError(f"{args.path}: {error}") from error
    except RuntimeError as error:  # the math worker could not start (math-verify missing)
        raise CliError(str(error)) from error

    print(f"{'row':>5}  {'truth':>12}  {'prediction':>24}  {'verdict':7}  reason")
    for i, (truth, s) in enumerate(zip(truths, scores)):
        pred = "-" if s.pred is None else s.pred
        print(f"{i:>5}  {truth[:12]:>12}  {pred[:24]:>24}  {'correct' if s.correct else 'wrong':7}  {s.reason}"
              + (f"  ({s.detail})" if s.detail else ""))  # fmt: skip
    counts = collections.Counter(s.reason for s in scores)
    print(f"\n{args.path}: {len(scores)} rows, mode={args.mode}, verifier {VERSION}")
    print(f"accuracy {sum(s.correct for s in scores) / len(scores):.3f}")
    for reason in REASONS:
        if counts[reason]:
            print(f"  {reason:17} {counts[reason]:>6}  {REASON_DOCS[reason]}")


if __name__ == "__main__":
    main()
