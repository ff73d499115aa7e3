"""Tests of verifier.py's dapo-verifier-5: no false positive by construction (G5), and the grammar's
rows made general (G1 end-of-turn tokens and harmony's final channel, G3 sentence frames, G6 one
definition of a variable's name, G7 the ground truth's own guard, numbers in a base, parenthesised
negatives, domains). Hypothesis properties over the compositions each row allows, then one table per
kind with its refusals. All "dapo" calls are string work; the "math" rows here are decided before
any parser (string identity, plain integers, a relation against a value), so no worker is asked.
The worker pool after timeouts is tested in tests/test_verifier_guards.py.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_verifier_general.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import verifier  # noqa: E402
from plumbing import math_workers  # noqa: E402
from verifier import EXCEPTION_REASONS, REASONS, score  # noqa: E402

MANY = settings(max_examples=200, deadline=None)
values = st.integers(min_value=0, max_value=10**6)


def _words(n: int) -> str:
    """0 <= n < 100 in English words."""
    ones = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
            "sixteen seventeen eighteen nineteen").split()  # fmt: skip
    tens = "twenty thirty forty fifty sixty seventy eighty ninety".split()
    return ones[n] if n < 20 else tens[n // 10 - 2] + (f"-{ones[n % 10]}" if n % 10 else "")


# --- G5: a response that states two different final values is never scored right ----------------

# The final statement, in every form the grammar reads ({v}: the value, already wrapped).
FINALS = [
    "Answer: {v}", "**Answer:** {v}", "Final Answer: The final answer is {v}. I hope it is correct.",
    "So the answer is \\boxed{{{v}}}.", "\\boxed{{{v}}}", "<answer>{v}</answer>", "#### {v}", "Answer: {v} apples",
    "Answer: $x = {v}$", "Answer: {v} (3 boxes of 6)", "Answer: The count is {v}.", "The answer is {v}.",
    "Answer: \\[{v}\\]", "<think>Answer: 3</think>Answer: {v}",
]  # fmt: skip
ENDS = ["", "<|im_end|>", "</s>", "<|eot_id|>\n<|start_header_id|>user"]  # after the whole response
# A second value stated as the result ({w}), with a word of contrast and without one.
CORRECTIONS = [
    "I need to correct this: two of those pairs repeat, so there are only {w} valid pairs.",
    "Removing the two pairs with an odd product leaves {w} valid pairs in total.",
    "Wait, the answer is actually {w}.", "But actually the count is {w}.",
    "However, two are invalid, so the actual count is {w}.", "On reflection the total comes to {w}.",
    "So the real count is {w}.", "That gives {w} in all.", "Hence {w}.", "Correction: {w}.",
    "The correct total is therefore {w}.", "Only {w} of them are valid.", "Counting again, we get {w}.",
    "Thus m + n = {w}.", "In fact, {w} pairs remain.", "It would be {w} if the repeats counted.",
    "The number of valid pairs is {w}, not {v}.", "Maybe it is {w}.",
]  # fmt: skip
WRAPS = ["{}", "${}$", "**{}**", "\\boxed{{{}}}", "\\textbf{{{}}}", "\\({}\\)", "$\\mathbf{{{}}}$"]
JOINS = [" ", "\n", "\n\n", " -- ", "\n\nLet me double-check.\n"]


@MANY
@given(values, values, st.sampled_from(FINALS), st.sampled_from(CORRECTIONS), st.sampled_from(WRAPS),
       st.sampled_from(WRAPS), st.sampled_from(JOINS), st.booleans(), st.sampled_from(ENDS))  # fmt: skip
def test_property_a_correction_after_the_final_answer_is_refused(v, w, final, correction, wrap_v, wrap_w, join, words,
                                                                 end):  # fmt: skip
    assume(v != w)
    # a box in the correction is the final statement when no marker or tag comes before it: the
    # response then ends in its corrected answer (the next property)
    assume("boxed" not in wrap_w or any(marker in final for marker in ("Answer", "####", "<answer>")))
    assume(final != "The answer is {v}." or "answer is" not in correction)  # the same: the correction is the final
    spelled = _words(w) if words and w < 100 and "{w} pairs" not in correction and w != 1 else None
    response = final.format(v=wrap_v.format(v)) + join + correction.format(w=spelled or wrap_w.format(w), v=v) + end
    for truth in (v, w):
        s = score(response, str(truth))
        # on the answer line itself, text that is no value of the grammar may also leave it malformed
        assert not s.correct and s.reason in ("multiple_answers", "malformed"), (response, truth, s)


# Explicit earlier statements of the value: a correction between one and the final statement that
# restates the value ("the value repeated") is refused too.
EARLIER = ["The count is \\boxed{{{v}}}.", "Answer: {v}", "So the answer is $\\boxed{{{v}}}$."]


@MANY
@given(values, values, st.sampled_from(EARLIER), st.sampled_from(CORRECTIONS), st.sampled_from(FINALS[:6]),
       st.sampled_from(WRAPS))  # fmt: skip
def test_property_a_correction_before_the_final_answer_that_repeats_the_value_is_refused(
    v, w, earlier, correction, final, wrap_w
):
    assume(v != w)
    response = "\n".join([earlier.format(v=v), correction.format(w=wrap_w.format(w), v=v), final.format(v=v)])
    s = score(response, str(v))
    assert (s.correct, s.reason) == (False, "multiple_answers"), (response, s)


# What may follow a final answer without taking it back: no value stated as a result, or the same.
NEUTRAL = [
    "I hope it is correct.", "Check: {a} + {b} = {v}.", "So the count is {v}.", "This matches the {v} found above.",
    "We used each of the digits once.", "Let me double-check the case $n = 0$.", "That is the answer.",
    "Since there are {a} rows of {b}, this is consistent.", "(Each pair is counted once.)",
]  # fmt: skip


@MANY
@given(values, st.integers(0, 999), st.integers(0, 999), st.sampled_from(FINALS), st.sampled_from(NEUTRAL),
       st.sampled_from(WRAPS[:3]), st.sampled_from(["\n", "\n\n", "\n\nLet me double-check.\n"]))  # fmt: skip
def test_property_text_that_states_no_other_result_keeps_the_answer(v, a, b, final, after, wrap, join):
    assume(a + b == v or "{a} + {b}" not in after)
    response = final.format(v=wrap.format(v)) + join + after.format(a=a, b=b, v=v)
    assert score(response, str(v)).correct, response


@MANY
@given(values, values, st.sampled_from(["\\boxed{{{v}}}. Wait, that double counts. The count is {w}.\nAnswer: {w}",
                                         "Answer: {v}\nWait, I double counted: the answer is {w}.\nAnswer: {w}",
                                         "If all were valid it would be \\boxed{{{v}}}; two are not.\nAnswer: {w}"]))
def test_property_a_correction_that_ends_in_its_own_final_answer_is_read(v, w, response):
    """A response may correct itself before its final statement when that statement states the
    corrected value and nothing earlier of the same value is an explicit answer after it."""
    assume(v != w)
    text = response.format(v=v, w=w)
    s = score(text, str(w))
    if text.startswith("Answer:"):  # an earlier Answer: line with another value: several answers (20)
        assert (s.correct, s.reason) == (False, "multiple_answers"), (text, s)
    else:
        assert s.correct, (text, s)
        assert not score(text, str(v)).correct


TAKEN_BACK = [
    ("Answer: 19\nThe count of pairs is 19. I need to correct this: two of those pairs repeat, so there are only "
     "17 valid pairs.", "19", False, "multiple_answers"),
    ("We count the pairs, so the count is $\\boxed{19}$. Removing the two pairs with an odd product leaves 17 valid "
     "pairs in total.", "19", False, "multiple_answers"),
    ("Answer: 19, which leaves 17 valid pairs", "19", False, "multiple_answers"),
    ("Answer: 19 (only seventeen are valid)", "19", False, "multiple_answers"),
    ("\\boxed{19}\n\nHmm, 20 - 3 = 17.", "19", False, "multiple_answers"),  # a computed result
    ("\\boxed{19}\n\nThus $a_1 = 17$.", "19", False, "multiple_answers"),
    ("Answer: 19\nSo 2.5 million more.", "19", False, "multiple_answers"),
    ("Answer: 19\nCheck: 10 + 9 = 19.", "19", True, "ok"),
    ("Answer: 56, since there are 7 rows of 8", "56", True, "ok"),  # a premise, not a result
    ("Answer: 56 (7 times 8 is 56)", "56", True, "ok"),
    ("The count is \\boxed{19}.\nAnswer: 19", "19", True, "ok"),
    ("Answer: 1,000\nSo the total is 1{,}000.", "1000", True, "ok"),  # the same value, respelled
    ("Answer: 2500000\nThat is 2.5 million.", "2500000", True, "ok"),
]  # fmt: skip


# The common case's shortcut (verifier._fast_dapo) gives the full rule's verdict whenever it decides.
PIECES = ["We count the pairs. ", "So the total is 12.\n", "Note: the case n = 0.\n", "\\boxed{12}\n", "The answer is 12.\n",
          "<think>Answer: 3</think>", "so\n", "\n\n", "2 + 3 = 5, ", "Answer: 7\n", "**Final Answer**\n", "#### 9\n",
          "It is 12 or 13.\n", "x", "\u00e9t\u00e9 ", "17\n"]  # fmt: skip
ENDINGS = ["Answer: {v}", "**Answer:** {v}", "Answer: {v}.", "answer: {v}\n", "Answer:{v}", "Answer: -{v}", "Answer: 0{v}",
           "Answer: {v} apples", "Answer: ${v}$", "Answer: \\boxed{{{v}}}", "Answer: $\\boxed{{{v}}}$.", "Answer: \\boxed{{{v}}}$",
           "So the answer is $\\boxed{{{v}}}$.", "\\boxed{{{v}}}", "The answer is 12. \\boxed{{{v}}}", "so \\boxed{{{v}}}",
           "We get \\boxed{{{v}}}$.", "Answer: {v}\n\\boxed{{{v}}}"]  # fmt: skip


@MANY
@given(st.lists(st.sampled_from(PIECES), max_size=6), st.sampled_from(ENDINGS), values, values)
def test_property_the_common_case_shortcut_agrees_with_the_full_rule(pieces, ending, v, truth):
    response = "".join(pieces) + "\n" + ending.format(v=v)
    for t in (str(truth), str(v)):
        canonical = verifier.integer_ground_truth(t)
        fast = verifier._fast_dapo(response, canonical)
        assert fast is None or fast == verifier._dapo_rule(response, canonical), (response, fast)


# --- G1: only tokens that end a turn end the response; harmony's final channel ------------------

HARMONY = ("<|channel|>analysis<|message|>We add 20 and 1. Answer: 20<|end|><|start|>assistant<|channel|>final"
           "<|message|>The sum is 21.\nAnswer: {v}<|return|>")  # fmt: skip
END_OF_TURN = [
    (HARMONY.format(v=21), "21", True, "ok"),
    (HARMONY.format(v=21), "20", False, "wrong"),  # the analysis channel never counts
    ("<|channel|>analysis<|message|>Answer: 21<|end|>", "21", False, "no_answer"),  # no final channel yet
    ("<|channel|>final <|constrain|>text<|message|>\\boxed{21}<|end|>", "21", True, "ok"),
    ("<|start|>assistant<|channel|>final<|message|>Answer: 21<|end|><|start|>user<|message|>Answer: 5", "21", True,
     "ok"),
    ("Answer: 21<|eom_id|>", "21", True, "ok"), ("Answer: 21<|eot|>", "21", True, "ok"),
    ("Answer: 21<|end_of_text|>", "21", True, "ok"), ("Answer: 21<end_of_utterance>", "21", True, "ok"),
    ("Answer: 21<|user|>Answer: 5", "21", True, "ok"), ("Answer: 21<｜User｜>Answer: 5", "21", True, "ok"),
    ("<|begin_of_thought|>Answer: 3<|end_of_thought|>\n\n<|begin_of_solution|>\n\\boxed{21}\n<|end_of_solution|>",
     "21", True, "ok"),
    ("<|begin_of_thought|>so far 3", "3", False, "no_answer"),
    ("<seed:think>Answer: 3</seed:think>Answer: 21", "21", True, "ok"),
    ("\u25c1think\u25b7Answer: 3\u25c1/think\u25b7Answer: 21", "21", True, "ok"),
    ("Answer: 21<|box_start|>", "21", False, "malformed"),  # not a turn's end: text, and no value
    ("#### 21", "21", True, "ok"), ("Natalia sold 48/2 = 24 clips.\n#### 72", "72", True, "ok"),
    ("#### Final Answer\n\\boxed{21}", "21", True, "ok"),  # a markdown heading is no marker
    ("So the final answer is 21.", "21", True, "ok"), ("The answer is 21 or 22.", "21", False, "multiple_answers"),
]  # fmt: skip


@MANY
@given(values, st.sampled_from(FINALS[:8]), st.sampled_from(["", " <|constrain|>json"]), st.integers(0, 999))
def test_property_a_harmony_response_reads_its_final_channel(v, final, constrain, other):
    body = final.format(v=v)
    analysis = f"<|channel|>analysis<|message|>Maybe {other}. Answer: {other}<|end|>"
    response = f"{analysis}<|start|>assistant<|channel|>final{constrain}<|message|>{body}<|return|>"
    plain = score(body, str(v))
    s = score(response, str(v))
    assert (s.correct, s.reason) == (plain.correct, plain.reason), (response, s, plain)


# --- G3: frames that state their value, against frames that hedge or change it -----------------

STATE = [
    "Josh made a profit of {n}.", "The population grows by {n} each year.", "Kim needs {n} more stamps.",
    "She ends up with {n} marbles.", "The team won by {n} points.", "It increased by {n}.", "A total of {n} people came.",
    "The perimeter of the garden is {n} meters.", "He is left with {n} dollars.", "The answer is negative {n}.",
    "The value of $I_{{\\max}}$ is {n}.", "$V_{{0}}$ equals {n}.", "The largest $a_{{n+1}}$ is {n}.",
    "The area of $\\triangle ABC$ is {n}.", "There are {n} ways to seat them.", "Tom has {n} fewer cards now.",
]  # fmt: skip
CHANGE = [
    "It is half of {n}.", "The answer is a third of {n}.", "It is more than {n}.", "It is {n} or more.",
    "It is less than {n}.", "The answer is at least {n}.", "It is divisible by {n}.", "It is a multiple of {n}.",
    "The answer is {n} divided by 2.", "It is the square root of {n}.", "The result is twice {n}.",
    "The answer is about {n}.", "It is up to {n}.", "The count is {n} more than before.",
    "It is nearly {n}.", "The answer is {n} or fewer.", "It is over {n}.",
]  # fmt: skip


@MANY
@given(values, st.sampled_from(STATE), st.sampled_from(["Answer: {}", "Answer: **{}**", "<answer>{}</answer>"]))
def test_property_a_frame_that_states_its_value_is_read(n, frame, marker):
    sign = "-" if "negative" in frame else ""
    response = marker.format(frame.format(n=n))
    s = score(response, sign + str(n) if n else "0")
    assert s.correct, (response, s)


@MANY
@given(values, st.sampled_from(CHANGE), st.sampled_from(["Answer: {}", "Answer: **{}**", "<answer>{}</answer>"]))
def test_property_a_frame_that_hedges_or_changes_its_value_is_refused(n, frame, marker):
    response = marker.format(frame.format(n=n))
    s = score(response, str(n))
    assert not s.correct and s.reason in ("malformed", "multiple_answers"), (response, s)


SENTENCES = [
    ("Answer: Josh made a profit of $70,000.", "70000", True, "ok"),
    ("Answer: The population grows by 34 each year.", "34", True, "ok"),
    ("Answer: Kim needs 34 more stamps.", "34", True, "ok"),
    ("Answer: The temperature is negative 5 degrees.", "-5", True, "ok"),
    ("Answer: Each friend gets 34 candies.", "34", True, "ok"),
    ("Answer: half of 34", "34", False, "malformed"),
    ("Answer: 34 or more", "34", False, "malformed"),
    ("Answer: more than 34", "34", False, "malformed"),
    ("Answer: The answer is 34 more than $x$.", "34", False, "malformed"),
    ("Answer: It is 5 times 34.", "34", False, "malformed"),
]  # fmt: skip


# --- G6: a ground truth that is an equation; one definition of a variable's name -----------------

NAMES = ["x", "I", "V_0", "V_{0}", "I_{\\max }", "I_{\\max}", "x_{\\text{min}}", "a_{n+1}", "\\theta", "\\alpha_1",
         "f(x)", "\\Phi (x,y)", "f'(2)", "P(A)", "\\vec{F}", "\\mathbf{v}", "AB", "\\angle ABC", "x^*", "E_k"]  # fmt: skip
RESPELL = {"I_{\\max }": "I_{max}", "I_{\\max}": "I_\\max", "V_{0}": "V_0", "\\Phi (x,y)": "\\Phi(x,y)",
           "x_{\\text{min}}": "x_{min}"}  # fmt: skip


@MANY
@given(st.sampled_from(NAMES), st.integers(-10**6, 10**6), st.sampled_from(["{} = {}", "{}={}", "{} =  {}"]))
def test_property_an_assignment_of_one_variable_states_its_value(name, n, spacing):
    """Against "NAME = n", the value alone and the same name assigned it (respelled) are right, another
    value is wrong: decided without the parser, whatever the name's spelling."""
    truth = spacing.format(name, n)
    for pred in (str(n), spacing.format(RESPELL.get(name, name), n), f"${name} = {n}$"):
        s = score(f"Answer: {pred}", truth, mode="math")
        assert (s.correct, s.reason) == (True, "ok"), (pred, truth, s)
    s = score(f"Answer: {n + 1}", truth, mode="math")
    assert (s.correct, s.reason) == (False, "wrong"), (truth, s)


@MANY
@given(st.sampled_from(NAMES), st.sampled_from(NAMES), st.integers(-50, 50))
def test_property_a_relation_of_two_names_is_never_a_value(first, second, n):
    assume(first != second)
    truth = f"{first} + {second} = {n}"
    s = score(f"Answer: {n}", truth, mode="math")
    assert (s.correct, s.reason) == (False, "wrong"), (truth, s)


EQUATIONS = [
    ("Answer: \\frac{V}{R}", "I_{\\max }=\\frac{V}{R}", True, "ok"),
    ("Answer: I_{max} = \\frac{V}{R}", "I_{\\max }=\\frac{V}{R}", True, "ok"),
    ("Answer: 5", "I=5", True, "ok"),  # math-verify alone reads "I" as the imaginary unit
    ("Answer: x^2+y^2", "\\Phi (x,y)=x^2+y^2", True, "ok"),
    ("Answer: \\Phi(x,y)=x^2+y^2", "\\Phi (x,y)=x^2+y^2", True, "ok"),
    ("Answer: 12", "V_{0}=12", True, "ok"),
    ("Answer: 13", "V_{0}=12", False, "wrong"),
    ("Answer: 12", "V_0 + V_1 = 12", False, "wrong"),  # a relation, not a value
    ("Answer: 2", "2x = 4", False, "wrong"),
]  # fmt: skip


# --- G7: the ground truth guarded as an answer is ------------------------------------------------

TOWER = "3^{3^{3^{3}}}"
TRUTH_GUARD = [
    (f"Answer: {TOWER}", TOWER, True, "ok"),  # the ground truth as written: right, without evaluating it
    ("Answer: 3^{3^{3^3}}", TOWER, True, "ok"),  # braces LaTeX does not print
    ("Answer: $3^{ 3^{3^{3}} }$", TOWER, True, "ok"),
    ("Answer: 5", TOWER, False, "timeout"),  # undecidable in time: a verifier exception, never "wrong"
    ("Answer: 3^{27}", TOWER, False, "timeout"),
    ("Answer: 9^{9^{9^{9}}}", "13", False, "malformed"),  # the answer's own guard, as before
]  # fmt: skip


def test_a_costly_ground_truth_never_reaches_a_worker_and_its_timeout_is_an_exception(monkeypatch):
    monkeypatch.setattr(math_workers, "ask", lambda request, timeout_s: pytest.fail(f"a worker was asked: {request}"))
    for response, truth, correct, reason in TRUTH_GUARD:
        s = score(response, truth, mode="math")
        assert (s.correct, s.reason) == (correct, reason), (response, s)
        assert reason != "timeout" or (s.reason in EXCEPTION_REASONS and "too expensive" in s.detail)


# --- the three kinds: a number in a base, a parenthesised negative, a domain ----------------------

BASES = [
    ("Answer: \\boxed{1044_5}", "1044", True, "ok"), ("Answer: $1044_{5}$", "1044", True, "ok"),
    ("Answer: (1044)_5", "1044", True, "ok"), ("Answer: 1044_{(5)}", "1044", True, "ok"),
    ("Answer: 1044 in base 5", "1044", True, "ok"), ("Answer: 101_{\\text{two}}", "101", True, "ok"),
    ("Answer: The answer is $2012_3$.", "2012", True, "ok"),
    ("Answer: 1049_5", "1049", False, "malformed"),  # 9 is no digit in base 5
    ("Answer: 1044_5", "149", False, "wrong"),  # the digits are the answer, not their value
    ("Answer: 12_5 or 13_5", "12", False, "multiple_answers"),
]  # fmt: skip
NEGATIVES = [
    ("Answer: $(-3)$", "-3", True, "ok"), ("Answer: ( -3 )", "-3", True, "ok"),
    ("Answer: \\left(-3\\right)", "-3", True, "ok"), ("Answer: (\u22123)", "-3", True, "ok"),
    ("Answer: \\boxed{(-3)}", "-3", True, "ok"), ("Answer: The answer is $(-12)$.", "-12", True, "ok"),
    ("Answer: (+3)", "3", True, "ok"), ("Answer: $(-3)$", "3", False, "wrong"),
    ("Answer: $(-3)^2$", "-3", False, "malformed"), ("Answer: (-3) + 1", "-3", False, "malformed"),
]  # fmt: skip
MATH_KINDS = [
    ("Answer: x \\neq 1", "(-\\infty, 1) \\cup (1, \\infty)", True, "ok"),
    ("Answer: x \\ne 1", "(-\\infty,1)\\cup(1,\\infty)", True, "ok"),
    ("Answer: x \u2260 -3", "(-\\infty, -3) \\cup (-3, \\infty)", True, "ok"),
    ("Answer: x \\neq 1, x \\neq 2", "(-\\infty, 1) \\cup (1, 2) \\cup (2, \\infty)", True, "ok"),
    ("Answer: \\{x \\mid x \\neq \\frac{1}{2}\\}", "(-\\infty, \\frac{1}{2}) \\cup (\\frac{1}{2}, \\infty)", True, "ok"),
    ("Answer: all real numbers except 1", "(-\\infty, 1) \\cup (1, \\infty)", True, "ok"),
    ("Answer: \\mathbb{R} \\setminus \\{1, 2\\}", "x \\neq 1 \\text{ and } x \\neq 2", True, "ok"),
    ("Answer: x > 1", "(1, \\infty)", True, "ok"), ("Answer: -2 \\le x < 7", "[-2, 7)", True, "ok"),
    ("Answer: x < 1 \\text{ or } x > 2", "(-\\infty, 1) \\cup (2, \\infty)", True, "ok"),
    ("Answer: x \\neq 2", "(-\\infty, 1) \\cup (1, \\infty)", False, "wrong"),
    ("Answer: x \\neq 1", "(-\\infty, 1)", False, "wrong"),
    ("Answer: x \\geq 1", "(1, \\infty)", False, "wrong"),
    ("Answer: 1044_{5}", "1044_5", True, "ok"), ("Answer: 1044", "1044_5", True, "ok"),
    ("Answer: 1044_5", "1044", True, "ok"), ("Answer: 1044_6", "1044_5", False, "wrong"),
    ("Answer: 1049_5", "1049", False, "wrong"),  # no number in base 5: compared as written
]  # fmt: skip

DAPO_TABLES = [TAKEN_BACK, END_OF_TURN, SENTENCES, BASES, NEGATIVES]
MATH_TABLES = [EQUATIONS, MATH_KINDS]


@pytest.mark.parametrize("response, truth, correct, reason", [row for t in DAPO_TABLES for row in t])
def test_dapo_general_table(response, truth, correct, reason):
    s = score(response, truth)
    assert (s.correct, s.reason) == (correct, reason), s
    if correct:
        assert s.pred == str(int(truth))


@pytest.mark.parametrize("response, truth, correct, reason", [row for t in MATH_TABLES for row in t])
def test_math_general_table_decided_without_the_parser(response, truth, correct, reason, monkeypatch):
    asked = []
    monkeypatch.setattr(math_workers, "ask", lambda request, timeout_s: asked.append(request) or
                        {"status": "ok", "verdicts": [False] * len(request["preds"])})  # fmt: skip
    s = score(response, truth, mode="math")
    assert (s.correct, s.reason) == (correct, reason), (s, asked)


def test_official_rule_is_unchanged_on_these_inputs():
    """dapo-official stays verl's math_dapo rule: it reads none of this (the end-of-turn token and the
    base subscript are compared as text, the correction after the answer line is never seen)."""
    official = [
        ("Answer: 21<|return|>", "21", False, "21<|return|>"),
        ("Answer: \\boxed{1044_5}", "1044", False, "1044_5"),
        ("Answer: $(-3)$", "-3", False, "(-3)"),
        ("Answer: 19\nI need to correct this: only 17 valid pairs.", "19", True, "19"),
        ("Answer: Josh made a profit of $70,000.", "70000", False, "Joshmadeprofitof70,000."),
    ]
    for response, truth, correct, pred in official:
        s = score(response, truth, mode="dapo-official")
        assert (s.correct, s.pred) == (correct, pred), (response, s)


def test_every_table_has_five_rows_and_the_version_is_bumped():
    for table in [*DAPO_TABLES, *MATH_TABLES, TRUTH_GUARD]:
        assert len(table) >= 5 and {reason for *_, reason in table} <= set(REASONS)
    assert verifier.VERSION == "dapo-verifier-5"
