"""Domains and solution sets in the "math" mode (row G6 of verifier.py's grammar), one spelling for
each: a chain of inequalities in one variable ("x > 1", "1 < x \\le 3", "x < 1 \\text{ or } x > 2"),
an inequation ("x \\neq 1", "x \\ne 1, x \\ne 2"), set-builder notation ("\\{x \\mid x \\neq 1\\}",
"\\{x \\in \\mathbb{R} : x > 1\\}"), "\\mathbb{R} \\setminus \\{1\\}" and "all real numbers except 1"
become the union of intervals they denote, "(-\\infty, 1) \\cup (1, \\infty)", when their endpoints
are numbers, so that two spellings of one set compare as strings and none reaches sympy's set
algebra, which took seconds on "\\mathbb{R} \\setminus \\{1, 2\\}" against its intervals.

`as_intervals(text)` takes a normalised answer and returns its intervals, or the text unchanged
when it is not such a set (or an endpoint is not a number).
"""

from __future__ import annotations

import re
from fractions import Fraction

from plumbing.answer_markup import SYMBOL

_RELATIONS = {
    "<": "<", "\\lt": "<", "\\le": "<=", "\\leq": "<=", "\\leqslant": "<=", ">": ">", "\\gt": ">", "\\ge": ">=",
    "\\geq": ">=", "\\geqslant": ">=", "\\neq": "!=", "\\ne": "!=", "\\not=": "!=", "\u2260": "!=",
}  # fmt: skip
_RELATION = r"(?:\\(?:lt|leqslant|leq|le|gt|geqslant|geq|ge|neq|ne|not=)(?![A-Za-z])|<|>|\u2260)"
# A number an endpoint may be: an integer, a decimal, a fraction, with a sign ("-\frac{3}{2}").
_NUMBER = r"-?\s*(?:[0-9]+(?:\.[0-9]+)?|\\frac\s*\{\s*-?[0-9]+\s*\}\s*\{\s*[0-9]+\s*\}|\\frac\s*[0-9][0-9])"
_CONDITION = re.compile(rf"\s*(?:(?P<a>{_NUMBER})\s*(?P<r1>{_RELATION})\s*)?(?P<x>{SYMBOL})\s*(?P<r2>{_RELATION})"
                        rf"\s*(?P<b>{_NUMBER})\s*|\s*(?P<c>{_NUMBER})\s*(?P<r3>{_RELATION})\s*(?P<y>{SYMBOL})\s*")  # fmt: skip
_OR = re.compile(r"\s*(?:\\text\s*\{\s*or\s*\}|\bor\b|\\lor(?![A-Za-z])|\\vee(?![A-Za-z])|\\cup(?![A-Za-z]))\s*")
_AND = re.compile(r"\s*(?:\\text\s*\{\s*and\s*\}|\band\b|\\land(?![A-Za-z])|\\wedge(?![A-Za-z])|,|;)\s*")
# "\{x \mid ...\}", "\{x \in \mathbb{R} : ...\}", "x \in \mathbb{R}, ..." (the condition after it)
_SET_BUILDER = re.compile(rf"\\\{{\s*{SYMBOL}\s*(?:\\in\s*\\mathbb\{{R\}}\s*)?(?:\\mid|\||:)\s*(?P<body>.*?)\s*\\\}}")
_IN_REALS = re.compile(rf"^\s*{SYMBOL}\s*\\in\s*\\mathbb\{{R\}}\s*(?:,|\\text\s*\{{\s*(?:and|with|such that)\s*\}})\s*")
_EXCEPT = re.compile(r"^\s*\\mathbb\{R\}\s*(?:\\setminus|\\text\s*\{\s*except\s*\}|except)\s*(?P<values>.*?)\s*$")
_INFINITY = Fraction(10) ** 400  # farther than any endpoint written out


def as_intervals(text: str) -> str:
    """The union of intervals text denotes (the module docstring), else text unchanged."""
    if not any(key in text for key in ("<", ">", "\\l", "\\g", "\\n", "\u2260", "\\setminus", "except")):
        return text  # the common case: no relation, nothing to rewrite
    body = text
    builder = _SET_BUILDER.fullmatch(body.strip())
    if builder is not None:
        body = builder["body"]
    body = _IN_REALS.sub("", body)
    excepted = _EXCEPT.match(body)
    if excepted is not None:
        values = _values(excepted["values"])
        return _union([_everything_but(values)]) if values else text
    pieces = []
    variable = None
    for alternative in _OR.split(body):
        conditions = []
        for part in _AND.split(alternative):
            condition = _CONDITION.fullmatch(part)
            if condition is None:
                return text
            name = (condition["x"] or condition["y"]).replace(" ", "")
            if variable not in (None, name):
                return text  # two variables: a region, not a set of numbers
            variable = name
            conditions.append(condition)
        piece = _intersect([_condition_set(condition) for condition in conditions])
        if piece is None:
            return text
        pieces.append(piece)
    return _union(pieces) if pieces else text


def _value(text: str) -> tuple[Fraction, str] | None:
    """(exact value, spelling) of an endpoint, else None."""
    spelled = re.sub(r"\s+", "", text)
    fraction = re.fullmatch(r"(-?)\\frac\{(-?[0-9]+)\}\{([0-9]+)\}|(-?)\\frac([0-9])([0-9])", spelled)
    if fraction is not None:
        sign = -1 if (fraction[1] or fraction[4]) else 1
        top, bottom = (fraction[2], fraction[3]) if fraction[2] is not None else (fraction[5], fraction[6])
        if int(bottom) == 0:
            return None
        return sign * Fraction(int(top), int(bottom)), spelled
    try:
        return Fraction(spelled), spelled
    except (ValueError, ZeroDivisionError):
        return None


def _values(text: str) -> list[tuple[Fraction, str]] | None:
    """The numbers of "\\{1, 2\\}", "1 and 2", "1": None when one is not a number."""
    inner = re.sub(r"^\\\{|\\\}$", "", text.strip()).strip()
    found = [_value(part) for part in re.split(r"\s*(?:,|\band\b|\\text\s*\{\s*and\s*\})\s*", inner) if part]
    return None if not found or None in found else found


# A set of numbers as sorted, disjoint intervals: (low, low spelling, low closed, high, ...).
def _condition_set(condition: re.Match) -> list[tuple] | None:
    if condition["c"] is not None:  # "1 < x": the variable on the right
        c = _value(condition["c"])
        return None if c is None else _half_line(_flip(_RELATIONS[condition["r3"]]), c)
    b = _value(condition["b"])
    if b is None:
        return None
    upper = _half_line(_RELATIONS[condition["r2"]], b)
    if condition["a"] is None:
        return upper
    a = _value(condition["a"])
    return None if a is None else _intersect([_half_line(_flip(_RELATIONS[condition["r1"]]), a), upper])


def _flip(relation: str) -> str:
    return {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}[relation]


def _half_line(relation: str, value: tuple[Fraction, str]) -> list[tuple]:
    """The set {x : x RELATION value}."""
    low, high = (-_INFINITY, "-\\infty", False), (_INFINITY, "\\infty", False)
    point = (value[0], value[1])
    if relation == "!=":
        return _everything_but([value])
    if relation in ("<", "<="):
        return [(*low, point[0], point[1], relation == "<=")]
    return [(point[0], point[1], relation == ">=", *high)]


def _everything_but(values: list[tuple[Fraction, str]]) -> list[tuple]:
    cuts = sorted(dict((v, s) for v, s in values).items())
    edges = [(-_INFINITY, "-\\infty"), *cuts, (_INFINITY, "\\infty")]
    return [(a, sa, False, b, sb, False) for (a, sa), (b, sb) in zip(edges, edges[1:])]


def _intersect(sets: list[list[tuple] | None]) -> list[tuple] | None:
    """The intersection of sets of intervals (each sorted and disjoint)."""
    if any(part is None for part in sets):
        return None
    result = sets[0]
    for other in sets[1:]:
        result = [both for a in result for b in other if (both := _both(a, b)) is not None]
    return result


def _both(a: tuple, b: tuple) -> tuple | None:
    """The intersection of two intervals, or None when they do not meet."""
    low = a[:3] if a[0] > b[0] else b[:3] if b[0] > a[0] else (a[0], a[1], a[2] and b[2])
    high = a[3:] if a[3] < b[3] else b[3:] if b[3] < a[3] else (a[3], a[4], a[5] and b[5])
    if low[0] < high[0] or low[0] == high[0] and low[2] and high[2]:
        return (*low, *high)
    return None


def _union(pieces: list[list[tuple]]) -> str:
    """The intervals of a union, merged and sorted, written out: "(-\\infty, 1) \\cup (1, \\infty)"."""
    intervals = sorted((i for piece in pieces for i in piece), key=lambda i: (i[0], not i[2]))
    merged: list[list] = []
    for interval in intervals:
        last = merged[-1] if merged else None
        if last is not None and (interval[0] < last[3] or interval[0] == last[3] and (interval[2] or last[5])):
            if interval[3] > last[3] or interval[3] == last[3] and interval[5]:
                last[3:] = interval[3:]
        else:
            merged.append(list(interval))
    if not merged:
        return "\\emptyset"
    if len(merged) == 1 and merged[0][0] == -_INFINITY and merged[0][3] == _INFINITY:
        return "(-\\infty, \\infty)"
    out = []
    for low, low_text, low_closed, high, high_text, high_closed in merged:
        if low == high:
            out.append(f"\\{{{low_text}\\}}")
        else:
            out.append(f"{'[' if low_closed else '('}{low_text}, {high_text}{']' if high_closed else ')'}")
    return " \\cup ".join(out)
