"""Tests of verifier.py's final-answer grammar (dapo-verifier-4, rows G1-G7 of its module docstring):
hypothesis properties over the grammar itself (transparent wrappers composed in any order and depth
around random integers are read as the integer; the patterns a policy could use to hedge are
refused, whatever wraps them), then one table of cases per kind the grammar added, each with
refusals of its own. The structural refusal of expensive answers (G7) and the time limit are tested
in tests/test_verifier_guards.py.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_verifier_grammar.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import verifier  # noqa: E402
from verifier import REASONS, score  # noqa: E402

MANY = settings(max_examples=150, deadline=None)  # "dapo" calls take microseconds
REFUSED = ("multiple_answers", "malformed")

# --- properties: the transparent wrappers (G1-G4) ------------------------------------------------

# integers: small, negative, and long (up to 300 digits; an answer line holds 1,000 characters)
integers = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=10**40, max_value=10**300).map(lambda n: n if n % 2 else -n),
)
SEPARATORS = [",", "{,}", " {, }", "{, }", " {,} ", "\\,", "\\ ", "~", "\u2009", ",\\!"]  # G2: digit groups
MINUS = ["-", "\u2212", "- "]


@st.composite
def spelled(draw, n: int) -> str:
    """n as a model writes it: digits, maybe in groups of three, with a minus sign of some kind."""
    digits = str(abs(n))
    if abs(n) >= 1000 and draw(st.booleans()):
        head = len(digits) % 3 or 3
        groups = [digits[:head]] + [digits[i : i + 3] for i in range(head, len(digits), 3)]
        digits = draw(st.sampled_from(SEPARATORS)).join(groups)
    return (draw(st.sampled_from(MINUS)) if n < 0 else "") + digits


# Around the value: at most one of each, in this order (what LaTeX and English allow).
BEFORE = ["", "x = ", "n = ", "The answer is ", "The largest $n$ is ", "There are ", "\\text{The total is } ",
          "the value of $m+n$ is ", "$a_{10}$ equals ", "x \\equiv "]  # fmt: skip
UNITS = ["", " apples", " \\text{ cm}^2", "\\,\\mathrm{m/s}", " \\pmod{7}", " \\pmod 13", " (mod 9)", "\\%", "^\\circ",
         " ways to seat them"]  # fmt: skip
WORKING = ["", " (3 boxes of 6 eggs)", ", 3 boxes of 6 eggs", " (= 2 \\times 9)", " [6 x 3]", ", since 7 x 8 = 56",
           " \u2014 3 rows of 4", ". This is 2 \\cdot 7.", " (each counted once)"]  # fmt: skip
# Wrappers, nested in any order: LaTeX ones (inside or outside the math delimiters), then markdown
# and HTML outside all math; trailing punctuation, spacing and line breaks at any layer.
LATEX = ["\\boxed{{{}}}", "\\fbox{{{}}}", "\\textbf{{{}}}", "\\underline{{{}}}", "{{\\bf {}}}", "\\displaystyle {}",
         "{} \\\\", "{}\\quad", "\\qquad {}", "{}\\,", "{}.", "{} ;", "\\textcolor{{red}}{{{}}}"]  # fmt: skip
MATH = ["${}$", "\\({}\\)", "\\[{}\\]", "$${}$$", "\\begin{{equation}}{}\\end{{equation}}"]
MARKDOWN = ["**{}**", "`{}`", "<b>{}</b>", "_{}_"]
STATEMENTS = ["Answer: {}", "**Answer:** {}", "Final Answer: {}", "answer\uff1a {}", "So the result is \\boxed{{{}}}."]
END_OF_TURN = ["", "<|im_end|>", "</s>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>", "<|end|>",
               "<|im_end|>\n<|im_start|>user\nAnswer: 1", "\n<|eot_id|><|start_header_id|>user"]  # fmt: skip


@st.composite
def wrapped(draw, n: int) -> str:
    """A response that states n through random transparent wrappers."""
    text = draw(st.sampled_from(BEFORE)) + draw(spelled(n)) + draw(st.sampled_from(UNITS))
    text += draw(st.sampled_from(WORKING))
    for layer in draw(st.lists(st.sampled_from(LATEX), max_size=3, unique=True)):
        text = layer.format(text)
    if draw(st.booleans()):
        text = draw(st.sampled_from(MATH)).format(text)
        for layer in draw(st.lists(st.sampled_from(LATEX), max_size=2, unique=True)):
            text = layer.format(text)
    for layer in draw(st.lists(st.sampled_from(MARKDOWN), max_size=2)):
        text = layer.format(text)
    reasoning = draw(st.sampled_from(["", "We count the cases.\n\n", "<think>Answer: 5</think>\n"]))
    return reasoning + draw(st.sampled_from(STATEMENTS)).format(text) + draw(st.sampled_from(END_OF_TURN))


@MANY
@given(st.data(), integers)
def test_property_transparent_wrappers_in_any_order_read_the_value(data, n):
    response = data.draw(wrapped(n))
    s = score(response, str(n))
    assert (s.correct, s.pred) == (True, str(n)), (response, s)
    other = score(response, str(n + 1))
    assert (other.correct, other.reason) == (False, "wrong"), (response, other)


@MANY
@given(st.data(), integers, st.integers(min_value=2, max_value=10**6))
def test_property_the_modulus_and_the_working_are_never_the_value(data, n, m):
    assume(m != n)
    response = data.draw(st.sampled_from([
        "Answer: x \\equiv {n} \\pmod{{{m}}}", "Answer: $x \\equiv {n} \\pmod {m}$", "Answer: {n} \\bmod {m}",
        "Answer: {n} (mod {m})", "Answer: {n} ({m} boxes of 3 eggs)", "Answer: {n}, {m} rows of 2 seats",
        "Answer: {n} (= {m} \\times 3)", "\\boxed{{{n}}} ({m} pairs, counted once)",
    ])).format(n=n, m=m)  # fmt: skip
    assert score(response, str(n)).correct, response
    assert score(response, str(m)).reason == "wrong", response


# --- properties: the patterns that hedge are refused, whatever wraps them ------------------------


def _spell(n: int) -> str:
    """0 <= n < 1000 in English words."""
    ones = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
            "sixteen seventeen eighteen nineteen").split()  # fmt: skip
    tens = "twenty thirty forty fifty sixty seventy eighty ninety".split()
    words = [ones[n // 100], "hundred"] if n >= 100 else []
    n %= 100
    if n >= 20:
        words.append(tens[n // 10 - 2] + (f"-{ones[n % 10]}" if n % 10 else ""))
    elif n or not words:
        words.append(ones[n])
    return " ".join(words)


HACKS = [
    "Answer: {a}, {b}", "Answer: {a} or {b}", "Answer: {a} and {b}", "Answer: {a}; {b}", "Answer: {a} ({b})",
    "Answer: {a} (or {b})", "Answer: {a} (maybe {b})", "Answer: {a}, as well as {b}", "Answer: {a} \\text{{ or }} {b}",
    "Answer: x = {a}, y = {b}", "Answer: {a} = {b}", "Answer: {a}, {wb}", "Answer: {a} ({wb})", "Answer: {a} or {wb}",
    "Answer: \\boxed{{{a}}} or {b}", "Answer: \\boxed{{{a}}}, \\boxed{{{b}}}", "Answer: The answer is {a} or {b}.",
    "Answer: {a}\n{b}", "Answer: {a}\nAnswer: {b}", "\\boxed{{{a}}}\n\\boxed{{{b}}}", "Answer: {a}\n\n\\boxed{{{b}}}",
    "\\boxed{{{a}}}\n\nThe answer is {b}.", "\\boxed{{{a}}}. But actually the count is {b}.",
    "The answer would be \\boxed{{{a}}}; however, the actual count is {b}.",
    "Answer: {a}\nWait, the answer is actually {b}.",
    "Answer: The sum of {b} and 7 is {a}.", "Answer: {a} (total {b})",
]  # fmt: skip
values = st.integers(min_value=0, max_value=999)
WRAPS = st.lists(st.sampled_from(["**{}**", "${}$", "\\textbf{{{}}}"]), max_size=2)


@MANY
@given(values, values, st.sampled_from(HACKS), WRAPS, st.sampled_from(["", "<|im_end|>", "\\\\"]))
def test_property_several_values_are_refused_whatever_wraps_them(a, b, hack, layers, end):
    assume(a != b)
    assume(b != 1 or "{wb}" not in hack)  # a lone "one" is a pronoun ("81, the only one": deviation 15)

    def wrap(value: int) -> str:
        text = str(value)
        for layer in layers:
            text = layer.format(text)
        return text

    response = hack.format(a=wrap(a), b=wrap(b), wb=_spell(b)) + end
    for truth in (a, b):
        s = score(response, str(truth))
        assert not s.correct and s.reason in REFUSED, (response, truth, s)


@MANY
@given(values, st.lists(values, min_size=2, max_size=8, unique=True), st.sampled_from(["\\boxed{{{}}}", "{}", "- {}"]))
def test_property_a_column_of_guesses_is_refused(truth_index, guesses, row):
    column = "Answer: " + "\n".join(row.format(guess) for guess in guesses)
    for truth in guesses:
        s = score(column, str(truth))
        assert not s.correct and s.reason in REFUSED, (column, s)


FRAME_HEDGES = [
    "The answer is at least {n}.", "The answer is about {n}.", "Probably the answer is {n}.", "It is not {n}.",
    "The answer would be {n}.", "Maybe {n}.", "The count is approximately {n}.", "It is more than {n}.",
    "The answer is twice {n}.", "The answer is the square root of {n}.", "If $n$ is even, the count is {n}.",
    "The total is under {n}.",
]  # fmt: skip


@MANY
@given(integers, st.sampled_from(FRAME_HEDGES))
def test_property_a_frame_that_hedges_or_changes_the_value_is_refused(n, frame):
    s = score("Answer: " + frame.format(n=n), str(n))
    assert (s.correct, s.reason) == (False, "malformed"), (frame, s)


# --- case tables, one per kind. Each row: (response, ground truth, correct, reason) --------------

# G1: the response ends at its first end-of-turn token
END_TOKENS = [
    ("Answer: 12<|im_end|>", "12", True, "ok"),
    ("Answer: 12</s>", "12", True, "ok"),
    ("Answer: $12$<|eot_id|>", "12", True, "ok"),
    ("Answer: 12<|endoftext|><|endoftext|>", "12", True, "ok"),
    ("So the answer is \\boxed{12}.<end_of_turn>", "12", True, "ok"),
    ("Answer: 12<\uff5cend\u2581of\u2581sentence\uff5c>", "12", True, "ok"),  # DeepSeek's, full-width bars
    ("Answer: 12 <|END_OF_TURN_TOKEN|>", "12", True, "ok"),
    ("Answer: 12<|im_end|>\n<|im_start|>user\nAnswer: 13", "12", True, "ok"),  # a hallucinated next turn
    ("Answer: 12<|im_end|>\n<|im_start|>user\nAnswer: 13", "13", False, "wrong"),
    ("Answer: 12<|im_end|>", "13", False, "wrong"),
    ("<|im_end|>Answer: 12", "12", False, "no_answer"),  # nothing before the end of the turn
    ("Answer: 12 or 13<|eot_id|>", "12", False, "multiple_answers"),
    ("Answer: 1 <|x|> 2", "1", False, "multiple_answers"),  # a one-letter name is no special token
]

# G1: an "<answer>...</answer>" pair is a final statement (GRPO recipes' format)
ANSWER_TAGS = [
    ("<reasoning>2 x 9</reasoning>\n<answer>18</answer>", "18", True, "ok"),
    ("<answer> 18 </answer>", "18", True, "ok"),
    ("<answer>\n\\boxed{18}\n</answer><|im_end|>", "18", True, "ok"),
    ("<answer>Answer: 18</answer>", "18", True, "ok"),
    ("<answer>The answer is 18 eggs.</answer>", "18", True, "ok"),
    ("<answer>18</answer>", "19", False, "wrong"),
    ("<answer>18 or 19</answer>", "18", False, "multiple_answers"),
    ("<answer>18</answer>\n\\boxed{19}", "18", False, "multiple_answers"),  # a box after it must agree
    ("Answer: 18\n<answer>19</answer>", "18", False, "multiple_answers"),
]

# G3: a sentence frame whose only value is the answer
SENTENCES = [
    ("Final Answer: The largest $n$ is 34.", "34", True, "ok"),
    ("Answer: There are 34 ways to seat them.", "34", True, "ok"),
    ("Answer: The number of integers not divisible by $p$ is 34.", "34", True, "ok"),  # "not" describes the set
    ("Answer: The smallest possible value of $a+b$ is $34$.", "34", True, "ok"),
    ("Answer: $a_{10}$ equals 34", "34", True, "ok"),
    ("Answer: We need 34 coins.", "34", True, "ok"),
    ("Answer: The least positive integer $n$ is $\\boxed{34}$.", "34", True, "ok"),
    ("Answer: The final count is -34.", "-34", True, "ok"),
    ("Answer: The largest $n$ is 34.", "35", False, "wrong"),
    ("Answer: The answer is at least 34.", "34", False, "malformed"),
    ("Answer: The answer would be 34.", "34", False, "malformed"),
    ("Answer: The answer is not 34.", "34", False, "malformed"),
    ("Answer: It is twice 17.", "17", False, "malformed"),
    ("Answer: The number of ways to choose two is 34.", "34", False, "multiple_answers"),  # "two": a second value
    ("Answer: The sum of 12 and 22 is 34.", "34", False, "malformed"),  # the frame ends at "of": "of 12"
    ("Answer: It is 34 or 35.", "34", False, "multiple_answers"),
]

# G4: the value followed by its working, in brackets or after a comma: the first number is the value
WORKING_AFTER = [
    ("Answer: 18 (3 boxes of 6 eggs)", "18", True, "ok"),
    ("Answer: 18 (3 boxes of 6 eggs)", "3", False, "wrong"),
    ("Answer: 18, 3 boxes of 6 eggs", "18", True, "ok"),
    ("Answer: 18 eggs (3 boxes of 6)", "18", True, "ok"),
    ("Answer: $18$ $(= 3 \\times 6)$", "18", True, "ok"),
    ("Answer: 18 [6 x 3]", "18", True, "ok"),
    ("Answer: 18 \u2014 3 boxes of 6", "18", True, "ok"),
    ("Answer: \\boxed{18} (3 boxes of 6 eggs)", "18", True, "ok"),
    ("Answer: 18 (18 eggs)", "18", True, "ok"),  # the same value restated
    ("Answer: 18 (19)", "18", False, "multiple_answers"),  # a second value in brackets
    ("Answer: 18 (19 eggs)", "19", False, "multiple_answers"),
    ("Answer: 18 (or 19)", "18", False, "multiple_answers"),
    ("Answer: 18 (maybe 19)", "18", False, "malformed"),
    ("Answer: 18 (19 if the boxes hold 6)", "18", False, "malformed"),  # a value under a condition
    ("Answer: 18, 19", "18", False, "multiple_answers"),
    ("Answer: 18, and 19", "19", False, "multiple_answers"),
    ("Answer: 18, nineteen", "18", False, "multiple_answers"),
]

# G2: trailing line breaks, spacing commands and punctuation
TRAILING_SPACING = [
    ("Answer: $24$ \\\\", "24", True, "ok"),
    ("Answer: 24 \\\\", "24", True, "ok"),
    ("Answer: 24\\\\[2pt]", "24", True, "ok"),
    ("Answer: 24\\quad", "24", True, "ok"),
    ("Answer: $24 \\qquad$", "24", True, "ok"),
    ("Answer: 24 \\newline", "24", True, "ok"),
    ("Answer: 24\\hfill", "24", True, "ok"),
    ("Answer: \\qquad 24", "24", True, "ok"),
    ("Answer: 24;", "24", True, "ok"),
    ("\\boxed{24} \\\\", "24", True, "ok"),
    ("Answer: 24 \\\\", "25", False, "wrong"),
    ("Answer: 24 \\\\ 25", "24", False, "malformed"),  # a line break between two values
    ("Answer: 24!", "24", False, "malformed"),  # a factorial, not punctuation
    ("Answer: 185\\", "185", True, "ok"),  # a lone backslash left at the very end
    ("Answer: $185$\\", "185", True, "ok"),
    ("Answer: 18\\5", "185", False, "malformed"),  # a backslash inside the value is not spacing
]

# G2: "{,}" digit groups with stray spaces (the official rule reads these right)
SPACED_GROUPS = [
    ("Answer: 18 {, }936", "18936", True, "ok"),
    ("Answer: 18{, }936", "18936", True, "ok"),
    ("Answer: 18 {,} 936", "18936", True, "ok"),
    ("Answer: $1 {,} 000 {,} 000$", "1000000", True, "ok"),
    ("\\boxed{18 {, }936}", "18936", True, "ok"),
    ("Answer: 18 {, }936", "18", False, "wrong"),
    ("Answer: 18 {, }93", "1893", False, "multiple_answers"),  # not a group of three: a list
    ("Answer: 1{,}2{,}3", "123", False, "multiple_answers"),
]

# G2: a congruence states its residue; the modulus is never the answer
CONGRUENCES = [
    ("Answer: x \\equiv 3 \\pmod 7", "3", True, "ok"),
    ("Answer: $x \\equiv 3 \\pmod{7}$", "3", True, "ok"),
    ("Answer: $n \\equiv 3 \\ (\\mathrm{mod}\\ 7)$", "3", True, "ok"),
    ("Answer: 3 \\bmod 7", "3", True, "ok"),
    ("Answer: 3 \\mod 7", "3", True, "ok"),
    ("Answer: N \\equiv 3 (mod 1000)", "3", True, "ok"),
    ("Answer: x \u2261 3 (mod 7)", "3", True, "ok"),
    ("\\boxed{x \\equiv 3 \\pmod{7}}", "3", True, "ok"),
    ("Answer: x \\equiv 3 \\pmod 7", "7", False, "wrong"),
    ("Answer: 3 \\pmod{7}", "7", False, "wrong"),
    ("Answer: x \\equiv 3 \\pmod 7 or x \\equiv 4 \\pmod 7", "3", False, "multiple_answers"),
]

# G5: a final statement the text then takes back
TAKEN_BACK = [
    ("If all were valid the answer would be \\boxed{19}, but two are invalid, so the actual count is 17.", "19",
     False, "multiple_answers"),
    ("If all were valid the answer would be \\boxed{19}, but two are invalid, so the actual count is 17.", "17",
     False, "multiple_answers"),
    ("Naively we get \\boxed{19}. However, we overcounted: the correct total is 17.", "19", False, "multiple_answers"),
    ("Without the constraint the count would be \\boxed{19}. The real count is 17.", "19", False, "multiple_answers"),
    ("So the answer is \\boxed{19}.\n\nBut we must exclude 2 cases, giving 17.", "19", False, "multiple_answers"),
    ("Answer: 19\nWait, I double counted; the answer is actually 17.", "19", False, "multiple_answers"),
    # dapo-verifier-5: a value stated as the result after the final answer, whatever the words
    ("Answer: 19\nWait, let me double-check: there are 10 ways to pick the pair.", "19", False, "multiple_answers"),
    ("So the answer is \\boxed{19}. Check: 19 = 10 + 9.", "19", True, "ok"),  # "=" restates nothing
    ("So the answer is \\boxed{19}. But let me double check: the total is 19.", "19", True, "ok"),
    ("So the answer is \\boxed{19}.\n\nThe sum of the digits is 10.", "19", False, "multiple_answers"),
    ("So the answer is \\boxed{19}.\n\nThe digits add up: 1 + 9 = 10.", "19", False, "multiple_answers"),
    ("So the answer is \\boxed{19}.\n\nWe used each of the digits 1 and 9 once.", "19", True, "ok"),  # no result
]  # fmt: skip

# Deviation 37: boxes in an "Answer:" line are read with the words around them
BOXES_WITH_WORDS = [
    ("Answer: the final answer is \\boxed{13}", "13", True, "ok"),
    ("Answer: after simplifying we get \\boxed{13} as required by part", "13", True, "ok"),  # the words state nothing
    ("Answer: $\\boxed{13}$ apples", "13", True, "ok"),
    ("Answer: \\boxed{\\boxed{13}}", "13", True, "ok"),
    ("Answer: \\boxed{12} or 13", "12", False, "multiple_answers"),
    ("Answer: \\boxed{12}, thirteen", "12", False, "multiple_answers"),
    ("Answer: \\boxed{12} \\text{ or } \\boxed{13}", "13", False, "multiple_answers"),
]

DAPO_GRAMMAR = (
    END_TOKENS + ANSWER_TAGS + SENTENCES + WORKING_AFTER + TRAILING_SPACING + SPACED_GROUPS + CONGRUENCES + TAKEN_BACK
    + BOXES_WITH_WORDS
)  # fmt: skip


@pytest.mark.parametrize("response, truth, correct, reason", DAPO_GRAMMAR, ids=range(len(DAPO_GRAMMAR)))
def test_dapo_grammar_table(response, truth, correct, reason):
    s = score(response, truth)
    assert (s.correct, s.reason) == (correct, reason), s
    if correct:
        assert s.pred == truth


def test_official_rule_is_unchanged_on_these_inputs():
    """dapo-official stays verl's math_dapo rule: the end-of-turn token is compared as text, the
    spaced "{,}" group is read (spaces removed, "{,}" removed), and neither a congruence nor working
    after the value is understood."""
    official = [
        ("Answer: 12<|im_end|>", "12", False, "12<|im_end|>"),
        ("Answer: 18 {, }936", "18936", True, "18936"),
        ("Answer: $24$ \\\\", "24", True, "24"),  # its first $...$
        ("Answer: x \\equiv 3 \\pmod 7", "3", False, "x\\equiv3\\pmod7"),
        ("Answer: 18 (3 boxes of 6 eggs)", "18", False, "18(3boxesof6eggs)"),
    ]
    for response, truth, correct, pred in official:
        s = score(response, truth, mode="dapo-official")
        assert (s.correct, s.pred) == (correct, pred), (response, s)


# --- math mode (G6) ------------------------------------------------------------------------------

EMPTY_SET = [
    ("Answer: \\varnothing", "\\emptyset", True, "ok"),
    ("Answer: \\{\\}", "\\varnothing", True, "ok"),
    ("Answer: \\{ \\}", "\\emptyset", True, "ok"),
    ("Answer: $\\left\\{ \\right\\}$", "\\emptyset", True, "ok"),
    ("Answer: \u2205", "\\varnothing", True, "ok"),
    ("Answer: \\emptyset", "\\{0\\}", False, "wrong"),
    ("Answer: \\{0\\}", "\\varnothing", False, "wrong"),
    ("Answer: \\{\\emptyset\\}", "\\emptyset", False, "wrong"),
]
SET_DIFFERENCE = [
    ("Answer: \\mathbb{R} \\setminus \\{0\\}", "(-\\infty, 0) \\cup (0, \\infty)", True, "ok"),
    ("Answer: \\mathbb{R} \\backslash \\{0\\}", "\\mathbb{R} \\setminus \\{0\\}", True, "ok"),
    ("Answer: (-\\infty, 0) \\cup (0, \\infty)", "\\mathbb{R} \\backslash \\{0\\}", True, "ok"),
    ("Answer: \\mathbb{R} \\smallsetminus \\{0\\}", "\\mathbb{R} \\setminus \\{0\\}", True, "ok"),
    ("Answer: \\mathbb{R} - \\{0\\}", "(-\\infty, 0) \\cup (0, \\infty)", True, "ok"),  # a minus between sets
    ("Answer: \\mathbb{R} \\setminus \\{1\\}", "\\mathbb{R} \\backslash \\{0\\}", False, "wrong"),
    ("Answer: \\mathbb{R}", "\\mathbb{R} \\setminus \\{0\\}", False, "wrong"),
]
RELATIONS = [
    ("Answer: 0", "a + z = 0", False, "wrong"),  # math-verify 0.9.0 alone: equal
    ("Answer: 2", "x - 2 = 0", False, "wrong"),
    ("Answer: 4", "2x = 8", False, "wrong"),
    ("Answer: 0", "x^2 + y^2 = 0", False, "wrong"),
    ("Answer: 5", "x = 5", True, "ok"),  # an assignment of the asked variable
    ("Answer: 2x + 3", "y = 2x + 3", True, "ok"),
    ("Answer: 1", "a = 1", True, "ok"),
    ("Answer: x = 2", "x - 2 = 0", True, "ok"),  # relation against relation: math-verify decides
    ("Answer: a + z = 0", "a + z = 0", True, "ok"),
    ("Answer: x \\equiv 3 \\pmod 7", "3", True, "ok"),  # G2: the modulus dropped when the truth has none
    ("Answer: x \\equiv 3 \\pmod{7}", "x \\equiv 3 \\pmod 7", True, "ok"),  # one spelling of the modulus
    ("Answer: x \\equiv 3 \\pmod{8}", "x \\equiv 3 \\pmod 7", False, "wrong"),
    ("Answer: 3", "x \\equiv 3 \\pmod 7", False, "wrong"),  # a residue alone does not state the congruence
]


@pytest.mark.parametrize("response, truth, correct, reason", EMPTY_SET + SET_DIFFERENCE + RELATIONS)
def test_math_grammar_table(response, truth, correct, reason):
    s = score(response, truth, mode="math")
    assert (s.correct, s.reason) == (correct, reason), s


@settings(max_examples=40, deadline=None)
@given(st.integers(-50, 50), st.integers(-50, 50), st.integers(-50, 50), st.sampled_from("xyzabn"))
def test_property_a_bare_value_never_states_an_equation(a, b, c, letter):
    """Against an equation that assigns no single variable, a value alone is wrong whatever it is
    (decided before the parser: no worker is asked)."""
    truth = f"{a}{letter} + {b}w = {c}"
    for pred in (str(c), str(a), f"\\frac{{{c}}}{{{a or 1}}}"):
        s = score(f"Answer: {pred}", truth, mode="math")
        assert (s.correct, s.reason) == (False, "wrong"), (pred, truth, s)


def test_every_table_has_five_rows_and_known_reasons():
    tables = [END_TOKENS, ANSWER_TAGS, SENTENCES, WORKING_AFTER, TRAILING_SPACING, SPACED_GROUPS, CONGRUENCES,
              TAKEN_BACK, BOXES_WITH_WORDS, EMPTY_SET, SET_DIFFERENCE, RELATIONS]  # fmt: skip
    for table in tables:
        assert len(table) >= 5 and {reason for *_, reason in table} <= set(REASONS)
    assert verifier.VERSION.startswith("dapo-verifier-")  # the grammar of dapo-verifier-4; 5: tests/test_verifier_general.py
