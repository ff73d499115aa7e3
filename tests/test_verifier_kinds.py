"""Tests of verifier.py's dapo-verifier-2 rules: the seven kinds of wrong verdict it fixed, one table
of cases per kind (with variations) and one hypothesis property per "dapo"-mode kind. Each kind is a
numbered deviation of docs/verifier.md; the rest of the verifier is tested in
tests/test_verifier.py.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_verifier_kinds.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import verifier  # noqa: E402
from plumbing import math_verify_process  # noqa: E402
from verifier import REASONS, score  # noqa: E402

FEW = settings(max_examples=60, deadline=None)
# reasoning text with no marker, tag or LaTeX in it
reasoning = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 .,=+-()", min_size=0, max_size=80)


# --- dapo-verifier-2: the seven kinds of wrong verdict, one table each -------------------------
# Each row: (response, ground truth, correct, reason). The kinds and the rules are deviations 20,
# 15, 3, 13 and 14 ("dapo" mode) and 21 and 22 ("math" mode) of docs/verifier.md.

# Kind 1 (deviation 20): every "Answer:" line is a final answer, and all must state one value.
SEVERAL_ANSWER_LINES = [
    ("Answer: 17\nAnswer: 18\nAnswer: 19", "19", False, "multiple_answers"),  # a spray of guesses
    ("Answer: 17\nAnswer: 18\nAnswer: 19", "17", False, "multiple_answers"),  # whichever is right
    ("Answer: 19\nLet me double-check: 19 works.\nAnswer: 19", "19", True, "ok"),  # a repeat is fine
    ("Answer: 19\nAnswer: 019\nAnswer: **19**.", "19", True, "ok"),  # the same value, spelt apart
    ("Answer: 1,000\nAnswer: 1000", "1000", True, "ok"),
    # a corrected answer is several answers too, retraction words or not
    ("Answer: 17. Wait, that is wrong. ... Answer: 19", "19", False, "multiple_answers"),
    ("Answer: 17\nWait, that is wrong: 17 fails the check.\nAnswer: 19", "19", False, "multiple_answers"),
    ("Answer: 17 (incorrect, retracted)\nActually:\nAnswer: 19", "19", False, "multiple_answers"),
    ("Answer: 17 Answer: 19", "19", False, "multiple_answers"),  # one line, two markers
    ("**Answer:** 17\n\n**Answer:** 19", "19", False, "multiple_answers"),
    ("Answer\uff1a 17\nAnswer: 19", "19", False, "multiple_answers"),  # full-width colon
    ("Answer: \\boxed{17}\nAnswer: 19", "19", False, "multiple_answers"),
    ("Answer: 17 apples\nAnswer: 19", "19", False, "multiple_answers"),
    ("Answer: 17.5\nAnswer: 19", "19", False, "multiple_answers"),  # an earlier decimal
    ("Answer: 12 or 19\nAnswer: 19", "19", False, "multiple_answers"),  # an earlier hedge
    ("Answer: 17\\pi\nAnswer: 19", "19", False, "multiple_answers"),  # unreadable, but it states 17
    # what is not an earlier answer
    ("To answer: we need the sum of the roots.\nAnswer: 19", "19", True, "ok"),  # states no number
    ("<think>Answer: 17</think>\nAnswer: 19", "19", True, "ok"),  # inside the reasoning block
    ("Answer: $Answer (without quotes)\nAnswer: 19", "19", True, "ok"),  # the echoed instruction
    ("Answer: 19\n" * 17 + "Answer: 19", "19", False, "multiple_answers"),  # over 16 lines: spam
]

# Kind 2 (deviation 15): a subordinate clause after the value is an explanation, never a candidate.
EXPLANATION_AFTER_VALUE = [
    ("Answer: 56, since 7 x 8 = 56.", "56", True, "ok"),
    ("Answer: 56 (because 7 times 8 is 56)", "56", True, "ok"),
    ("Answer: 56, which is 7 \\times 8", "56", True, "ok"),
    ("Answer: 56 because 7 \\cdot 8 = 56", "56", True, "ok"),
    ("Answer: $56$, as $7 \\times 8 = 56$.", "56", True, "ok"),
    ("Answer: 56. This is because 7 x 8 = 56.", "56", True, "ok"),
    ("Answer: 56; i.e. 7 x 8 and not 57", "56", True, "ok"),
    ("Answer: 56 \\text{ since } 7 \\times 8 = 56", "56", True, "ok"),
    ("Answer: 56, by the product rule 7 x 8", "56", True, "ok"),
    ("Answer: x = 56, where x = 7 \\cdot 8", "56", True, "ok"),
    ("Answer: **56** \u2014 given 7 rows of 8", "56", True, "ok"),
    ("Answer: 56, so the product of 7 and 8 is 56", "56", True, "ok"),
    ("Answer: 56 [since 7 x 8 = 56]", "56", True, "ok"),
    ("Answer: 57, since 7 x 8 = 56.", "56", False, "wrong"),  # the clause's 56 is not a candidate
    ("Answer: 56, 57", "56", False, "multiple_answers"),
    ("Answer: 56 or 57", "56", False, "multiple_answers"),
    ("Answer: 56 (or 57)", "56", False, "multiple_answers"),
    ("Answer: 56, as well as 57", "56", False, "multiple_answers"),
    ("Answer: 56 or 57, since both satisfy it", "56", False, "multiple_answers"),
    ("Answer: 12 by 13", "12", False, "malformed"),  # "by" opens a clause only after punctuation
]

# Kind 3 (deviation 3): markdown and inline-code markup around the marker or the value.
MARKUP_AROUND_VALUE = [
    ("Answer: `$73$`", "73", True, "ok"),
    ("Answer: `73`", "73", True, "ok"),
    ("**Answer**: $`73`$", "73", True, "ok"),
    ("__Answer__: 73", "73", True, "ok"),
    ("*Answer*: _73_", "73", True, "ok"),
    ("Answer: ```73```", "73", True, "ok"),
    ("**Answer**: **`73`**.", "73", True, "ok"),
    ("Answer:\n```\n73\n```", "73", True, "ok"),
    ("Answer: <code>73</code>", "73", True, "ok"),
    ("Answer: <b>`73`</b>.", "73", True, "ok"),
    ("Answer: $\\underline{73}$", "73", True, "ok"),
    ("Answer: \\emph{73}", "73", True, "ok"),
    ("Answer: $\\bm{73}$", "73", True, "ok"),
    ("Answer: {\\bf 73}", "73", True, "ok"),
    ("Answer: \\textcolor{red}{73}", "73", True, "ok"),
    ("Answer: $\\displaystyle 73$", "73", True, "ok"),
    ("Answer: `72`", "73", False, "wrong"),
    ("Answer: \\textcolor{red}{73 or 74}", "73", False, "multiple_answers"),
    ("Answer: `73 or 74`", "73", False, "multiple_answers"),
    ("Answer: ___", "73", False, "placeholder"),
]

# Kind 4 (deviation 13): every LaTeX spelling of a box is judged like \boxed.
BOX_SPELLINGS = [
    ("so the answer is \\fbox{314}.", "314", True, "ok"),
    ("so the answer is \\boxed {314}.", "314", True, "ok"),
    ("so the answer is \\boxed{{314}}.", "314", True, "ok"),
    ("so the answer is \\framebox[2cm][c]{314}.", "314", True, "ok"),
    ("so the answer is \\colorbox{yellow}{314}.", "314", True, "ok"),
    ("so the answer is \\fcolorbox{red}{white}{314}.", "314", True, "ok"),
    ("so the answer is $\\Aboxed{x &= 314}$.", "314", True, "ok"),
    ("so the answer is $\\bbox[border:1px solid red]{314}$.", "314", True, "ok"),
    ("so the answer is \\doublebox{314}.", "314", True, "ok"),
    ("so the answer is $\\fbox{$314$}$", "314", True, "ok"),
    ("so the answer is \\fbox{$\\displaystyle 314$}", "314", True, "ok"),
    ("Answer: the final answer is \\fbox{314}", "314", True, "ok"),
    ("so the answer is \\fbox{313}.", "314", False, "wrong"),
    ("\\fbox{313} or \\boxed{314}", "314", False, "multiple_answers"),
    ("Answer: 314\n\\fbox{313}", "314", False, "multiple_answers"),  # a later box disagrees
    # no brace group: the argument runs to the end of the math or line, as MATH's own grader reads
    # it (dapo-verifier-3; tests/test_verifier_notation.py has the kind's table)
    ("so the answer is \\boxed 314", "314", True, "ok"),
    ("so the answer is \\colorbox{yellow} 314", "314", True, "ok"),
]

# Kind 5 (deviation 14): the answer line inside display or inline math.
ANSWER_IN_MATH = [
    ("The values are:\n\\[Answer: 512\\]", "512", True, "ok"),
    ("$$Answer: 512$$", "512", True, "ok"),
    ("\\(Answer: 512\\)", "512", True, "ok"),
    ("$\\text{Answer: } 512$", "512", True, "ok"),
    ("\\[\\textbf{Answer:}\\ 512\\]", "512", True, "ok"),
    ("\\begin{equation}Answer: 512\\end{equation}", "512", True, "ok"),
    ("\\[\n\\text{Answer: } 512.\n\\]", "512", True, "ok"),
    ("Answer:\n\\[\n\\boxed{512}\n\\]", "512", True, "ok"),
    ("Answer:\n$$\n512\n$$", "512", True, "ok"),
    ("Answer:\n\\begin{equation}\n512\n\\end{equation}", "512", True, "ok"),
    ("Answer: \\begin{align*} 512 \\end{align*}", "512", True, "ok"),
    ("\\begin{align*}\\text{Answer: } &512\\end{align*}", "512", True, "ok"),
    ("\\[Answer: 511\\]", "512", False, "wrong"),
    ("\\[Answer: 512 \\text{ or } 513\\]", "512", False, "multiple_answers"),
]

DAPO_KINDS = SEVERAL_ANSWER_LINES + EXPLANATION_AFTER_VALUE + MARKUP_AROUND_VALUE + BOX_SPELLINGS + ANSWER_IN_MATH


@pytest.mark.parametrize("response, truth, correct, reason", DAPO_KINDS)
def test_dapo_kinds_table(response, truth, correct, reason):
    s = score(response, truth)
    assert (s.correct, s.reason) == (correct, reason), s
    if correct:
        assert s.pred == truth


# Kind 6 (deviation 21): numbers compared exactly; a decimal against a value with no finite
# decimal expansion within a relative 5e-6.
TINY_VALUES = [
    ("\\boxed{\\frac{1}{3^{60}}}", "\\frac{1}{3^{61}}", False, "wrong"),
    ("\\boxed{0.0000008}", "0.0000007", False, "wrong"),
    ("\\boxed{-0.0000008}", "-0.0000007", False, "wrong"),
    ("\\boxed{2^{-100}}", "2^{-101}", False, "wrong"),
    ("\\boxed{10^{-20}}", "10^{-21}", False, "wrong"),
    ("\\boxed{\\frac{\\pi}{10^{20}}}", "\\frac{\\pi}{10^{21}}", False, "wrong"),
    ("\\boxed{1 + 10^{-40}}", "1", False, "wrong"),
    ("\\boxed{\\frac{x}{3^{60}}}", "\\frac{x}{3^{61}}", False, "wrong"),  # with a symbol too
    ("\\boxed{(0.0000008, 1)}", "(0.0000007, 1)", False, "wrong"),  # inside a tuple
    ("\\boxed{[10^{-9}, 1)}", "[10^{-10}, 1)", False, "wrong"),  # inside an interval
    ("\\boxed{12.0000001}", "12", False, "wrong"),  # a decimal is the number it spells
    ("\\boxed{3^{-61}}", "\\frac{1}{3^{61}}", True, "ok"),
    ("\\boxed{8 \\times 10^{-7}}", "0.0000008", True, "ok"),
    ("\\boxed{\\frac{1}{1250000}}", "0.0000008", True, "ok"),
    ("\\boxed{0.00000080}", "0.0000008", True, "ok"),
    ("\\boxed{\\sqrt{3+2\\sqrt{2}}}", "1+\\sqrt{2}", True, "ok"),
    # a decimal against 1/3, pi, sqrt 2: within 5e-6 relative
    ("\\boxed{0.333333}", "\\frac{1}{3}", True, "ok"),
    ("\\boxed{0.166667}", "\\frac{1}{6}", True, "ok"),
    ("\\boxed{3.14159}", "\\pi", True, "ok"),
    ("\\boxed{3.1416}", "\\pi", True, "ok"),  # 2.3e-6 off: a 5-digit value inside the tolerance
    ("\\boxed{0.33333}", "\\frac{1}{3}", False, "wrong"),
    ("\\boxed{3.14}", "\\pi", False, "wrong"),
    ("\\boxed{1.4142}", "\\sqrt{2}", False, "wrong"),
]

# Kind 7 (deviation 22): both signs listed are the set that \pm denotes.
BOTH_SIGNS = [
    ("\\boxed{-12, 12}", "\\pm 12", True, "ok"),
    ("\\boxed{12, -12}", "\\pm 12", True, "ok"),
    ("\\boxed{\\pm 12}", "\\pm 12", True, "ok"),
    ("\\boxed{\\{-12, 12\\}}", "\\pm 12", True, "ok"),
    ("Answer: 12 \\text{ or } -12", "\\pm 12", True, "ok"),
    ("Answer: -12 \\text{ and } 12", "\\pm 12", True, "ok"),
    ("\\boxed{\\pm 12}", "-12, 12", True, "ok"),
    ("\\boxed{1 + \\sqrt{19}, 1 - \\sqrt{19}}", "1 \\pm \\sqrt{19}", True, "ok"),
    ("\\boxed{12}", "\\pm 12", False, "wrong"),
    ("\\boxed{-12}", "\\pm 12", False, "wrong"),
    ("\\boxed{12, -12, 13}", "\\pm 12", False, "wrong"),  # an extra value never helps
    ("\\boxed{12, 13}", "\\pm 12", False, "wrong"),
    ("\\boxed{\\pm 13}", "\\pm 12", False, "wrong"),
    ("\\boxed{\\pm 12}", "12", False, "multiple_answers"),  # both signs where one value is asked
    ("\\boxed{12}, \\boxed{-12}", "\\pm 12", True, "ok"),  # boxes on the final line list the set
    ("Answer: \\boxed{12} \\text{ or } \\boxed{-12}", "\\pm 12", True, "ok"),
    ("\\boxed{12}, \\boxed{-12}, \\boxed{13}", "\\pm 12", False, "wrong"),
    ("\\boxed{12}, \\boxed{13}", "12", False, "multiple_answers"),  # one value asked: boxes must agree
]


@pytest.mark.parametrize("response, truth, correct, reason", TINY_VALUES + BOTH_SIGNS)
def test_math_kinds_table(response, truth, correct, reason):
    s = score(response, truth, mode="math")
    assert (s.correct, s.reason) == (correct, reason), s


def test_decimal_tolerance_is_relative_and_documented():
    assert math_verify_process.DECIMAL_REL_TOL == (5, 10**6)
    # relative: the same 5-digit error is fine at any scale only within 5e-6 of the value
    for exponent in (-30, -7, 0, 7, 30):
        truth = f"\\frac{{10^{{{exponent}}}}}{{3}}"
        assert score("\\boxed{" + f"3.333333 \\times 10^{{{exponent - 1}}}" + "}", truth, mode="math").correct
        assert not score("\\boxed{" + f"3.3333 \\times 10^{{{exponent - 1}}}" + "}", truth, mode="math").correct


# Properties of the dapo-verifier-2 rules: each kind as a law over random answers.

values = st.integers(min_value=0, max_value=10**6).map(str)
# prose with no number, "=" or marker in it, and arithmetic with no letters (so no clause word)
prose = st.text(alphabet="abcdefghijklmnopqrstuvwxyz .,", max_size=60)
arithmetic = st.text(alphabet="0123456789 =+-()x", max_size=40)
CLAUSE_OPENERS = [
    ", since", " because", ", which is", " (because", ", as", "; i.e.", ". This is because", ", by", ", where",
]
MARKUP = [
    "`{}`", "**{}**", "${}$", "\\({}\\)", "_{}_", "```{}```", "$`{}`$", "\\boxed{{{}}}", "\\fbox{{{}}}",
    "\\underline{{{}}}", "\\textcolor{{red}}{{{}}}", "{{\\bf {}}}", "\\emph{{{}}}",
]
BOXES = [
    "\\fbox{{{}}}", "\\boxed {{{}}}", "\\boxed{{{{{}}}}}", "\\framebox[3cm]{{{}}}", "\\colorbox{{yellow}}{{{}}}",
    "\\fcolorbox{{red}}{{white}}{{{}}}", "\\bbox[2px]{{{}}}", "\\doublebox{{{}}}", "\\ovalbox{{{}}}",
    "\\shadowbox{{{}}}",
]
MATH_WRAPPERS = ["\\[{}\\]", "$${}$$", "\\({}\\)", "\\begin{{equation}}{}\\end{{equation}}", "\\[\n{}\n\\]"]


@FEW
@given(values, values, reasoning, st.integers(min_value=1, max_value=5))
def test_property_repeating_the_answer_line_changes_nothing(truth, value, line, times):
    once = score(f"{line}\nAnswer: {value}", truth)
    assert score(f"{line}\n" + f"Answer: {value}\n" * times, truth) == once


@FEW
@given(values, values, values, prose)
def test_property_two_different_answer_lines_are_multiple_answers(truth, first, second, line):
    if first != second:
        for response in (f"{line}\nAnswer: {first}\nAnswer: {second}", f"Answer: {first}. {line} Answer: {second}"):
            s = score(response, truth)
            assert (s.correct, s.reason) == (False, "multiple_answers"), (response, s)


@FEW
@given(values, values, st.sampled_from(CLAUSE_OPENERS), st.lists(values, max_size=4), arithmetic)
def test_property_a_clause_after_the_value_is_never_read(truth, value, opener, numbers, words):
    """A clause adds no candidate: it never makes right what the value alone does not. One that gives a
    premise ("since", "because", "where") changes nothing; another ("which is", "i.e.", "by") that states
    another value as the result ("which is 7", "i.e. 3 + 4 = 7") makes the answer several answers (G5,
    dapo-verifier-5)."""
    plain = score(f"Answer: {value}", truth)
    clause = f"Answer: {value}{opener} {' '.join(numbers)} {words}"
    s = score(clause, truth)
    premise = opener in (", since", " because", " (because", ", as", ". This is because", ", where")
    assert s == plain or (not s.correct and s.reason == "multiple_answers" and not premise), (clause, s)


@FEW
@given(values, values, st.lists(st.sampled_from(MARKUP), min_size=1, max_size=3))
def test_property_markup_around_the_value_changes_nothing(truth, value, layers):
    wrapped = value
    for layer in layers:
        wrapped = layer.format(wrapped)
    s, plain = score(f"Answer: {wrapped}", truth), score(f"Answer: {value}", truth)
    assert (s.correct, s.reason, s.pred) == (plain.correct, plain.reason, plain.pred), wrapped


@FEW
@given(values, values, st.sampled_from(BOXES), reasoning)
def test_property_every_box_spelling_reads_like_boxed(truth, value, box, line):
    spelled = f"{line}\nso the answer is {box.format(value)}."
    boxed = f"{line}\nso the answer is \\boxed{{{value}}}."
    s, reference = score(spelled, truth), score(boxed, truth)
    assert (s.correct, s.reason, s.pred) == (reference.correct, reference.reason, reference.pred), spelled


@FEW
@given(values, values, st.sampled_from(MATH_WRAPPERS), st.sampled_from(["Answer: {}", "\\text{{Answer: }} {}"]))
def test_property_answer_line_inside_math_reads_like_plain(truth, value, wrapper, line):
    s, plain = score(wrapper.format(line.format(value)), truth), score(f"Answer: {value}", truth)
    assert (s.correct, s.reason, s.pred) == (plain.correct, plain.reason, plain.pred)


def test_every_kind_table_uses_known_reasons():
    tables = DAPO_KINDS + TINY_VALUES + BOTH_SIGNS
    assert {reason for *_, reason in tables} <= set(REASONS)
