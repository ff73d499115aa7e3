"""The "math" mode's equivalence: our normalisation of LaTeX answers (fractions, radicals, sets,
intervals, the real line, repeating decimals), the rules that refuse a candidate before any parser
(lists, alternatives, ellipses, relations against values: row G6 of verifier.py's grammar), and
the call to math-verify in a worker process (plumbing/math_workers.py), guarded by
plumbing/sympy_guard.py (G7).

`score_math(response, ground_truth, timeout_s)` returns (correct, pred, reason, detail);
verifier.score wraps it in a Score. The numbered deviations cited are those of docs/verifier.md.
"""

from __future__ import annotations

import functools
import math
import re
import time

from plumbing import math_workers, sympy_guard
from plumbing.answer_markup import (
    ASSIGNED, CLAUSE, MAX_ANSWER_CHARS, MODULUS, PLACEHOLDER, as_integer, balanced, before_clause, boxes_in,
    collapse_thousands, peel, symbol_key,
)  # fmt: skip
from plumbing.final_answer import extract_final
from plumbing.math_domains import as_intervals

# --- math mode: our extraction and normalisation, math-verify's equivalence ------------------

_MATH_REWRITES = (
    ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\displaystyle", ""),
    ("\u03c0", "\\pi"), ("\u00b0", "^\\circ"), ("\u221e", "\\infty"), ("\u00d7", "\\times"),
    ("\u00b7", "\\cdot"), ("\u2264", "\\le"), ("\u2265", "\\ge"), ("\\$", ""), ("\u2205", "\\emptyset"),
    ("\u2216", "\\setminus"), ("\u2261", "\\equiv"), ("\u2260", "\\neq"),
)  # fmt: skip
# The empty set in its notations (G6), all written "\emptyset": "\varnothing", "\{\}", "\{ \}",
# "\left\{ \right\}" (\left and \right are gone by then), "\O", "\text{empty set}"; and the set
# difference "\backslash" (G6), written "\setminus" as math-verify reads it.
_EMPTY_SET = re.compile(
    r"\\(?:varnothing|emptyset|O)(?![A-Za-z])|\\\{\s*\\\}|\\text\{\s*(?:the\s+)?empty\s+set\s*\}"
)
_SET_DIFFERENCE = re.compile(  # and a minus sign between a set and a set written out: "\mathbb{R} - \{0\}"
    r"\\(?:backslash|smallsetminus)(?![A-Za-z])|(?:(?<=[)\]])|(?<=\\\})|(?<=\\mathbb\{[A-Z]\}))\s*-\s*(?=\\\{)"
)
# Alternatives and both signs; accepted only when the ground truth is a set of values too
# (deviation 22): a list, "\\pm 12", "1 or 2". An ellipsis only when the ground truth has one.
_MATH_ALTERNATIVES = re.compile(r"\bor\b|\beither\b|\\(?:lor|vee|pm|mp)(?![A-Za-z])|[\u00b1\u2213]")
_MATH_ELLIPSIS = re.compile(r"\\[lcv]?dots(?![A-Za-z])|\u2026|\.\.\.")
# LaTeX spacing commands, but not a row break "\\\\" followed by a space or comma.
_LATEX_SPACING = re.compile(r"(?<!\\)\\[,;: !]")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")  # but not \leftarrow
_SPACES = re.compile(r"\s+")
_NAME_BEFORE_ARGUMENTS = re.compile(r"(?<=[A-Za-z}])\s+\((?=[^()]*\))")  # "\Phi (x,y)": one spelling of a call


# A repeating decimal (deviation 27): "0.\overline{6}", "0.1\overline{6}", "1.\bar{3}", "0.\dot{3}",
# and the dot notation's first and last digit of the repetend, "0.\dot{1}4285\dot{7}".
_REPEATING = re.compile(
    r"(?<![0-9.])([0-9]*)\.([0-9]*)(?:\\(?:overline|bar)\s*(?:\{\s*([0-9]+)\s*\}|([0-9]))"
    r"|\\dot\s*(?:\{([0-9])\}|([0-9]))(?:([0-9]*)\\dot\s*(?:\{([0-9])\}|([0-9])))?)"
)
# The real line and its standard half-lines (deviation 28): "\mathbb{R}", "\R", "x \in \mathbf{R}",
# "\Bbb R", U+211D, "all real numbers"; "\mathbb{R}_{\geq 0}" is [0, \infty), "\mathbb{R}_{>0}" is
# (0, \infty). "\mathbb{R}^+" and "\mathbb{R}_+" are left alone: authors disagree on whether they hold 0.
_REALS = re.compile(  # a bold R followed by more math ("\mathbf{R}\mathbf{v}") is a matrix: left alone
    r"(?:\\mathbb\s*(?:\{\s*R\s*\}|R(?![A-Za-z]))|\\(?:mathbf|Bbb)\s*(?:\{\s*R\s*\}|R(?![A-Za-z]))|\\R(?![A-Za-z])"
    r"|\u211d)(?![\\{(A-Za-z0-9])"
    r"|(?i:\\text\{\s*(?:the\s+set\s+of\s+)?all\s+real(?:\s+numbers|s)\s*\})"
    r"|(?<![A-Za-z\\])(?i:(?:the\s+set\s+of\s+)?all\s+real(?:\s+numbers|s))(?![A-Za-z])"
)
_HALF_LINE = re.compile(r"\\mathbb\{R\}\s*[_^]\s*\{\s*(\\geq?|\\geqslant|>|\\leq?|\\leqslant|<)\s*0\s*\}")
_HALF_LINES = {
    "\\ge": "[0, \\infty)", "\\geq": "[0, \\infty)", "\\geqslant": "[0, \\infty)", ">": "(0, \\infty)",
    "\\le": "(-\\infty, 0]", "\\leq": "(-\\infty, 0]", "\\leqslant": "(-\\infty, 0]", "<": "(-\\infty, 0)",
}  # fmt: skip


def normalise_math(text: str) -> str:
    """Our LaTeX clean-up before the parser (math-verify does its own after this). Idempotent:
    it repeats until nothing changes."""
    while True:
        before = text
        text = collapse_thousands(peel(text), pairs=True)  # before the rewrites, which remove "\\!", "\\,"
        for old, new in _MATH_REWRITES:
            text = text.replace(old, new)
        text = _LEFT_RIGHT.sub("", text)
        text = _SPACES.sub(" ", _LATEX_SPACING.sub(" ", text)).strip()
        if "\\" in text or "\u211d" in text or "real" in text.lower():
            text = _REPEATING.sub(_repeating_as_fraction, text)
            text = _HALF_LINE.sub(lambda m: _HALF_LINES[m[1]], _REALS.sub(r"\\mathbb{R}", text))
            text = _SET_DIFFERENCE.sub(r" \\setminus ", _EMPTY_SET.sub(r"\\emptyset", text))
            if "mod" in text:  # G2: one spelling of a modulus, "\pmod{7}": two congruences compare as strings
                text = MODULUS.sub(lambda m: f" \\pmod{{{(m['modulus'] or m['modulus_bare']).strip()}}}", text)
                text = _SPACES.sub(" ", text.replace("\\equiv", " \\equiv ")).strip()
        if text == before:
            return as_intervals(_NAME_BEFORE_ARGUMENTS.sub("(", text))  # G6: domains as intervals; "f (x)" is "f(x)"


def _repeating_as_fraction(m: re.Match) -> str:
    """The exact fraction of a repeating decimal I.F(R) (deviation 27): (IFR - IF) / (10^|F| (10^|R| - 1)),
    so "0.1\\overline{6}" -> "\\frac{1}{6}". Left as written past MAX_ANSWER_CHARS digits."""
    integer, fixed = m[1], m[2]
    repeat = m[3] or m[4] or ((m[5] or m[6]) + (m[7] or "") + (m[8] or m[9] or "") if m[8] or m[9] else m[5] or m[6])
    if len(integer) + len(fixed) + len(repeat) > MAX_ANSWER_CHARS:
        return m[0]
    numerator = int(integer + fixed + repeat) - int(integer + fixed or "0")
    denominator = 10 ** len(fixed) * (10 ** len(repeat) - 1)
    common = math.gcd(numerator, denominator)
    numerator, denominator = numerator // common, denominator // common
    return str(numerator) if denominator == 1 else f"\\frac{{{numerator}}}{{{denominator}}}"


@functools.lru_cache(maxsize=65536)
def math_ground_truth(ground_truth: str) -> str:
    truth = normalise_math(ground_truth)
    if not truth or len(truth) > MAX_ANSWER_CHARS or not balanced(truth):
        raise ValueError(
            f"mode='math' ground truth {ground_truth!r} is empty, longer than {MAX_ANSWER_CHARS} "
            f"characters or has unbalanced braces: fix the dataset row"
        )
    return truth


@functools.lru_cache(maxsize=65536)
def _truth_refusal(truth: str) -> str | None:
    """Why a (normalised) ground truth is too expensive to evaluate, as an answer would be (G7)."""
    return sympy_guard.refusal(truth)


def _is_set_answer(truth: str) -> bool:
    """True when a (normalised) ground truth is several values: a list, "\\pm", "or" (deviation 22)."""
    return "," in truth or ";" in truth or _MATH_ALTERNATIVES.search(truth) is not None


def _math_candidate(text: str, truth: str) -> tuple[str | None, str, str]:
    """(normalised prediction, reason, detail) for one candidate; reason "" when it may go to the parser."""
    if not CLAUSE.search(truth):  # deviation 15, unless the ground truth itself has such words
        text = before_clause(text)
    if len(text) > MAX_ANSWER_CHARS:
        return None, "malformed", f"answer has {len(text)} characters, over the {MAX_ANSWER_CHARS} limit"
    pred = normalise_math(text)
    if "mod" in pred and "mod" not in truth and "\\equiv" not in truth:  # G2: "x \equiv 3 \pmod 7" states 3
        pred = _SPACES.sub(" ", MODULUS.sub(" ", pred).replace("\\equiv", "=")).strip()
    if not pred:
        return None, "empty_answer", ""
    if PLACEHOLDER.fullmatch(pred):
        return None, "placeholder", f"placeholder {pred!r}"
    odd = [ch for ch in pred if not ch.isascii()]
    if odd:  # full-width digits, look-alike letters, zero-width characters (deviation 18)
        return None, "malformed", f"non-ASCII character U+{ord(odd[0]):04X} in the answer"
    if not balanced(pred):
        return None, "malformed", "unbalanced braces"
    if "__" in pred:  # dunder names are code, never math; the parser would not run it anyway
        return None, "malformed", "looks like code"
    truth_is_set = _is_set_answer(truth)
    alternative = _MATH_ALTERNATIVES.search(pred)
    if alternative and not truth_is_set:
        return None, "multiple_answers", f"alternatives joined by {alternative.group()!r}"
    ellipsis = _MATH_ELLIPSIS.search(pred)
    if ellipsis and not _MATH_ELLIPSIS.search(truth):
        return None, "multiple_answers", f"an ellipsis {ellipsis.group()!r} where the answer has none"
    if not truth_is_set and _top_level_comma(pred):  # deviation 28: "(-\\infty, \\infty)" is one value
        return None, "multiple_answers", "a list where one value is expected"
    if identity_key(pred) == identity_key(truth):
        return pred, "", ""  # the ground truth as written: right, however expensive to evaluate (G7)
    refusal = sympy_guard.refusal(pred)
    if refusal is not None:  # deviation 29, G7: refused before parsing
        return None, "malformed", refusal
    return pred, "", ""


_ONE_TOKEN_SCRIPT = re.compile(r"([_^])\{\s*([A-Za-z0-9]|\\[A-Za-z]+)\s*\}")


def identity_key(text: str) -> str:
    """text (normalised) without what LaTeX does not print: spaces, braces around a one-token script
    ("3^{3^{3}}" and "3^{3^3}" are one text)."""
    while True:
        key = _ONE_TOKEN_SCRIPT.sub(r"\1\2", text.replace(" ", ""))
        if key == text:
            return key
        text = key


# A relation as the ground truth (G6): "a + z = 0", "x^2 + y^2 = 1". math-verify 0.9.0 reads an
# equation whose left side is only symbols as an assignment and compares right-hand sides, so a bare
# "0" equals "a + z = 0" there. Here a prediction without "=" is wrong against an equation, unless
# that equation assigns one variable: one side is a name (answer_markup.ASSIGNED, one definition of
# it for every spelling: "x", "I", "V_{0}", "I_{\max }", "\Phi (x,y)", "f(2)"), the variable asked
# for. Against such an assignment a value is compared with its other side, and so is the other side
# of a prediction that assigns the same name ("I_{max} = 5" for "I_{\max} = 5"): the name never goes
# to the parser, which reads "I" as the imaginary unit and "\Phi (x,y)" as a product. A prediction
# that is an equation of anything else is compared whole by math-verify ("m + n = 85" against 85).
_TOP_EQUALS = re.compile(r"(?<![<>!:\\])=(?!=)")


def _is_relation(text: str) -> bool:
    """True when text (normalised) states an equation at its top level that is not an assignment of
    one variable (G6)."""
    if "=" not in text:
        return False
    for item in _top_level_split(text, ","):
        sides = _top_level_split(item, "=")
        if len(sides) > 1 and not (len(sides) == 2 and any(ASSIGNED.fullmatch(side) for side in sides)):
            return True
    return False


def _assignment(text: str) -> tuple[str, str] | None:
    """(the name's key, the value) when text (normalised) is one equation that assigns one variable
    ("I_{\\max} = \\frac{V}{R}" -> ("I_max", "\\frac{V}{R}"), "5 = x" -> ("x", "5")), else None."""
    if "=" not in text or _top_level_comma(text):
        return None
    sides = _top_level_split(text, "=")
    if len(sides) != 2:
        return None
    for name, value in (sides, sides[::-1]):
        if ASSIGNED.fullmatch(name) and value.strip() and not ASSIGNED.fullmatch(value):
            return symbol_key(name), value.strip()
    if ASSIGNED.fullmatch(sides[0]) and sides[1].strip():  # "y = x": the left side names it
        return symbol_key(sides[0]), sides[1].strip()
    return None


# A number written in a base (G2): "1044_5", "1044_{5}", "(1044)_5", "1044_{(5)}", "\text{1A}_{16}".
_IN_BASE = re.compile(r"\(?(?:\\text\{)?([0-9][0-9A-Za-z]*)\}?\)?\s*_\s*\{?\s*\(?\s*([0-9]{1,2})\s*\)?\s*\}?")


def _against_base(pred: str, truth: str) -> tuple[str, str]:
    """(prediction, ground truth) to compare (G2): a number in a base is its digits, so "1044_5" and
    "1044" are one answer when one side names the base and the other does not; two bases must agree."""
    in_pred, in_truth = _base_reading(pred), _base_reading(truth)
    if in_pred is None and in_truth is None:
        return pred, truth
    if in_pred is not None and in_truth is not None:  # compared as written, digits and base: "1044_6" != "1044_5"
        return (f"{in_pred[1].lstrip('0')}_{{{int(in_pred[2])}}}", f"{in_truth[1].lstrip('0')}_{{{int(in_truth[2])}}}")
    digits = (in_pred or in_truth)[1]
    other = truth if in_pred is not None else pred
    if not other.isalnum():
        return pred, truth
    return (digits, truth) if in_pred is not None else (pred, digits)


def _base_reading(text: str) -> re.Match | None:
    """The _IN_BASE match of text when each of its digits is a digit of its base (2 to 36), else None."""
    m = _IN_BASE.fullmatch(text) if "_" in text else None
    if m is None or not 2 <= int(m[2]) <= 36:
        return None
    return m if all(int(digit, 36) < int(m[2]) for digit in m[1]) else None


def _against_assignment(pred: str, truth: str) -> tuple[str, str]:
    """(prediction, ground truth) to compare (G6): their values when the ground truth assigns one
    variable and the prediction is a value or assigns the same name; else both whole."""
    assigned = _assignment(truth)
    if assigned is None:
        return pred, truth
    if len(_top_level_split(pred, "=")) == 1:
        return pred, assigned[1]
    own = _assignment(pred)
    if own is not None and own[0] == assigned[0]:
        return own[1], assigned[1]
    return pred, truth


def _top_level_split(text: str, separator: str) -> list[str]:
    """text split at each `separator` outside every bracket ("=" not inside "<=", ">=", "!=")."""
    parts, depth, at = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == separator and depth == 0 and (separator != "=" or _TOP_EQUALS.match(text, i)):
            parts.append(text[at:i])
            at = i + 1
    return [*parts, text[at:]]


def _top_level_comma(text: str) -> bool:
    """True when a comma of text separates items of a list: one outside every bracket ("1, 2"), not
    one inside an interval, point or set ("(-\\infty, \\infty)", "[0, 1)", "\\{1, 2\\}")."""
    if "," not in text:
        return False
    depth = 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            return True
    return False


def score_math(response: str, ground_truth: str, timeout_s: float) -> tuple[bool, str | None, str, str]:
    """(correct, prediction, reason, detail) of one response in math mode (verifier.score's rule)."""
    deadline = time.monotonic() + timeout_s  # G7: the limit is on the whole call
    truth = math_ground_truth(ground_truth)
    final = extract_final(response)
    if final.reason:
        return False, None, final.reason, final.detail
    texts = []
    set_truth = _is_set_answer(truth)
    listed = (*final.same_line, *final.section, *final.candidates) if final.boxes_only else ()
    if set_truth and len(listed) > 1:
        texts.append(", ".join(listed))  # deviation 22: "\boxed{12}, \boxed{-12}" lists a set
    for candidate in () if texts else (*final.candidates, *final.section):  # deviation 23: all agree
        # "Answer: the value is \boxed{1/2}": the boxes are the answer (deviation 8 in math mode).
        boxes = boxes_in(candidate)
        if len(boxes) > 1 and set_truth:
            texts.append(", ".join(boxes))  # "Answer: \boxed{12} and \boxed{-12}" lists a set
        else:
            texts.extend(boxes or [candidate])
    preds = []
    for text in texts:
        pred, reason, detail = _math_candidate(text, truth)
        if reason:
            return False, pred, reason, detail
        preds.append(pred)
    distinct = list(dict.fromkeys(preds))
    if _is_relation(truth):  # G6: a bare value does not state a relation
        bare = [pred for pred in distinct if len(_top_level_split(pred, "=")) == 1]
        if bare:
            return False, bare[0], "wrong", f"the ground truth {truth[:60]!r} is a relation, not a value"
    pairs = {pred: _against_base(*_against_assignment(pred, truth)) for pred in distinct}  # G6, G2
    verdicts: dict[str, bool] = {}
    for pred, (left, right) in pairs.items():  # decided without the parser: same string, or two plain integers
        if identity_key(left) == identity_key(right):
            verdicts[pred] = True
        elif _base_reading(left) is not None and _base_reading(right) is not None:
            verdicts[pred] = False  # two numbers in bases, not written alike
        elif as_integer(left) is not None and as_integer(right) is not None:
            verdicts[pred] = as_integer(left) == as_integer(right)
    by_truth: dict[str, list[str]] = {}
    for pred, (left, right) in pairs.items():
        if pred not in verdicts:
            by_truth.setdefault(right, []).append(pred)
    costly = next((refusal for target in by_truth if (refusal := _truth_refusal(target)) is not None), None)
    if costly is not None:  # G7: guarded as an answer is; a verifier exception, never a wrong answer
        detail = f"not evaluated: the ground truth is too expensive to evaluate ({costly[:120]}); only an answer written as it is is decided"
        return False, distinct[0], "timeout", detail
    for target, pending in by_truth.items():
        reply = math_workers.ask({"truth": target, "preds": [pairs[p][0] for p in pending]}, deadline - time.monotonic())
        if reply["status"] == "bad_ground_truth":
            raise ValueError(
                f"mode='math' ground truth {ground_truth!r} cannot be parsed by math-verify "
                f"({reply.get('detail', '')}): fix the dataset row"
            )
        if reply["status"] != "ok":
            return False, distinct[0], reply["status"], reply.get("detail", "")
        verdicts.update(zip(pending, reply["verdicts"]))
    if len(set(verdicts.values())) > 1:
        return False, distinct[0], "multiple_answers", "final answers disagree: " + " | ".join(distinct)
    correct = all(verdicts.values())
    return correct, distinct[0], "ok" if correct else "wrong", ""
