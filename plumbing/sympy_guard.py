"""What an answer asks sympy to compute (row G7 of verifier.py's grammar): the parse limits on
nesting and length, and a bound on the work of building and expanding its value, read from its
LaTeX tokens before any parser runs, so that an answer short to write but expensive to evaluate
("9^{9^{9^{9}}}", "\\binom{10^7}{5 \\cdot 10^6}") is refused in microseconds instead of running into
the time limit. Each limit carries its measurement (bench/bench_verifier.py --limits).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

# Structural limits on a math-mode prediction, checked before it reaches the parser (deviation 29).
# math-verify's LaTeX grammar (ANTLR, adaptive prediction) and sympy's simplification cost time that
# grows steeply with nesting: measured in a fresh worker on a 2-core x86-64 machine, 16 parentheses
# deep 1.3 s, 14 braces deep 7.6 s, \frac nested 16 deep 3.7 s and 20 deep 79 s; 8 deep at most 0.7 s,
# and 160 tokens at most 0.5 s (a 300-element tuple: 2.5 s). The MATH-500 answers nest 2 deep at most
# and have at most 32 tokens (a 3-vector of fractions), so 8 and 160 leave room for any real answer.
MAX_NESTING_DEPTH = 8
MAX_ANSWER_TOKENS = 160
LATEX_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[0-9]+(?:\.[0-9]+)?|\S")  # a command, a number, a character
def nesting_depth(text: str) -> int:
    """The deepest nesting of brackets of any kind in text ("\\left(", "\\{" and a command's "{" count)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return deepest


# --- math mode: what an answer asks sympy to compute (G7) --------------------------------------
# An answer short to write can be expensive to evaluate: sympy computes a product, power, factorial
# or binomial of integers exactly as soon as it is parsed, and expands powers of sums while
# comparing. cost_refusal bounds that work from the answer's structure, before any parsing, so such
# answers come back as malformed in microseconds instead of running into the time limit. Each limit
# with the parse-and-compare time of inputs on both sides of it, against the ground truth 13, from
# `bench/bench_verifier.py --limits` (2026-12-01, 2 x86-64 cores shared with other jobs, load 4-6):
MAX_VALUE_DIGITS = 100_000  # digits of an exact number built: 2^{300000} (90,309) 0.09 s, 10^{10^{6}} 0.9 s
# n in n!, k in \binom{n}{k}: 10000! 0.11 s, 100000! 0.6 s, \binom{10^5}{5 \cdot 10^4} 2.7 s
MAX_FACTORIAL_ARGUMENT = 10_000
# terms of a power of a sum: (x+1)^{39} 0.45 s, (x+y+z)^{10} (66 terms) 0.6 s, (x+y+z)^{20} (231) 2.0 s
MAX_EXPANSION_TERMS = 40
MAX_SERIES_TERMS = 100  # terms of a \sum or \prod with numeric bounds: \sum_{k=1}^{10^5} k 1.2 s
# count x count x digits of a term, the work of a series of exact numbers (each step re-sizes the running
# sum): \prod_{k=1}^{100} k 3e4 (0.2 s), \sum_{k=1}^{1000} 1/k^3 1.1e7 (1.6 s), \sum_{k=1}^{1000} k^k 3e9 (over 20 s)
MAX_SERIES_WORK = 10**6


class _TooCostly(Exception):
    """An answer whose evaluation would cost more than the limits above; the message says which part."""


class _Cost(NamedTuple):
    """A bound on one subexpression: size, an upper bound on the digits of its exact value (None when
    it holds a symbol); exact, its value when it is an integer below 10^18; terms, its additive
    terms; rational, whether it is a plain number (no radical, constant or symbol)."""

    size: float | None
    exact: int | None = None
    terms: int = 1
    rational: bool = True


_SYMBOL = _Cost(None, None, 1, False)
_BINOMIALS = {"\\binom", "\\dbinom", "\\tbinom"}
_FRACTIONS = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"}
_SERIES = {"\\sum", "\\prod"}
_TEXT_COMMANDS = {"\\text", "\\mathrm", "\\textbf", "\\mathbf", "\\operatorname", "\\mathbb", "\\textit", "\\mbox"}
_CLOSERS = {")", "]", "}", "\\}", "\\right", "\\rfloor", "\\rceil", "|"}
_STOPS = _CLOSERS | {",", ";", "=", "<", ">", "&", "\\\\", ":", "+", "-", "\\pm", "\\mp"}


def refusal(pred: str) -> str | None:
    """Why pred (a normalised math-mode prediction) is refused before parsing, or None: nested or
    long past the parse limits (deviation 29), or too expensive to evaluate (G7)."""
    depth, tokens = nesting_depth(pred), len(LATEX_TOKEN.findall(pred))
    if depth > MAX_NESTING_DEPTH or tokens > MAX_ANSWER_TOKENS:
        return (
            f"{depth} nested brackets and {tokens} tokens, over the limits {MAX_NESTING_DEPTH} and "
            f"{MAX_ANSWER_TOKENS}: the parser would take seconds on it"
        )
    costly = cost_refusal(pred)
    return None if costly is None else f"{costly}: too expensive to evaluate"


def cost_refusal(pred: str) -> str | None:
    """Why evaluating pred would cost more than the limits of G7, or None (the parser may have it)."""
    reader = _CostReader(LATEX_TOKEN.findall(pred))
    try:
        while reader.at < len(reader.tokens):
            before = reader.at
            reader.expression()
            if reader.at == before:
                reader.at += 1  # a relation, a comma or an unmatched closer between expressions
    except _TooCostly as error:
        return str(error)
    return None


class _CostReader:
    """A recursive-descent reading of LaTeX tokens that computes _Cost bounds and raises _TooCostly.
    It only bounds work: anything it does not know is a symbol, which costs nothing to hold."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.at, self.bound = tokens, 0, {}  # bound: series variables and their largest value

    def peek(self) -> str:
        return self.tokens[self.at] if self.at < len(self.tokens) else ""

    def expression(self) -> _Cost:
        """Terms joined by + and -: sizes add (a sum of fractions), terms count."""
        total, terms = self.term(), 1
        while self.peek() in ("+", "-", "\\pm", "\\mp"):
            self.at += 1
            other = self.term()
            terms += other.terms
            total = _Cost(_add(total.size, other.size), None, terms, total.rational and other.rational)
        return total

    def term(self) -> _Cost:
        """Factors, with or without \\cdot, \\times, * or /: sizes add."""
        product = self.factor()
        while (token := self.peek()) and token not in _STOPS:
            if token in ("\\cdot", "\\times", "*", "/", "\\div"):
                self.at += 1
            before = self.at
            other = self.factor()
            if self.at == before:
                break
            exact = product.exact * other.exact if None not in (product.exact, other.exact) else None
            product = _Cost(_add(product.size, other.size), _small(exact), 1, product.rational and other.rational)
        return product

    def factor(self) -> _Cost:
        """An atom with its signs, powers, factorials and subscripts."""
        if self.peek() in ("-", "+"):
            self.at += 1
        base = self.atom()
        while (token := self.peek()) in ("^", "!", "_", "'"):
            self.at += 1
            if token == "^":
                base = _power(base, self.script())
            elif token == "!":
                base = _factorial(base)
            elif token == "_":
                self.script()
        return base

    def script(self) -> _Cost:
        """A superscript or command argument: a brace group, or one token."""
        if self.peek() == "{":
            return self.group()
        return self.atom()

    def group(self) -> _Cost:
        """From an opening bracket to its closer: expressions, separated by commas (a tuple or set)."""
        self.at += 1
        parts = []
        while self.at < len(self.tokens) and self.peek() not in _CLOSERS:
            before = self.at
            parts.append(self.expression())
            if self.at == before:
                self.at += 1
        if self.peek() == "\\right":
            self.at += 1
        self.at += 1  # the closer (any: "[0, 1)" is an interval)
        if len(parts) == 1:
            return parts[0]
        return _Cost(max((part.size for part in parts if part.size is not None), default=None), rational=False)

    def atom(self) -> _Cost:
        token = self.peek()
        if not token:
            return _SYMBOL
        if token[0].isdigit():
            self.at += 1
            digits = token.replace(".", "")
            return _Cost(float(len(digits)), _small(int(token)) if "." not in token else None)
        if token in ("(", "[", "{", "\\{", "\\lfloor", "\\lceil", "|"):
            return self.group()
        if token == "\\left":
            self.at += 1
            return self.atom()
        self.at += 1
        if token in _FRACTIONS:
            numerator, denominator = self.script(), self.script()
            return _Cost(_add(numerator.size, denominator.size), None, 1, numerator.rational and denominator.rational)
        if token in _BINOMIALS:
            return _binomial(self.script(), self.script())
        if token == "\\sqrt":
            if self.peek() == "[":
                self.group()
            radicand = self.script()
            return _Cost(radicand.size, None, 1, False)
        if token in _SERIES:
            return self.series(token)
        if token in _TEXT_COMMANDS or token in ("\\begin", "\\end"):
            if self.peek() == "{":
                while self.at < len(self.tokens) and self.tokens[self.at] != "}":
                    self.at += 1
                self.at += 1
            return _SYMBOL
        if token in self.bound:  # a series variable: its largest value
            return self.bound[token]
        return _SYMBOL  # a letter, a constant, a function name (its argument is read as the next factor)

    def series(self, kind: str) -> _Cost:
        """\\sum_{k=a}^{b} body or \\prod: at most MAX_SERIES_TERMS terms with numeric bounds, the body
        read with k at its largest value, and at most MAX_SERIES_WORK to add or multiply them."""
        variable, low, high = None, _SYMBOL, _SYMBOL
        for _ in range(2):
            if self.peek() == "_" and self.at + 1 < len(self.tokens):
                self.at += 1
                if self.peek() == "{" and self.at + 2 < len(self.tokens) and self.tokens[self.at + 2] == "=":
                    variable = self.tokens[self.at + 1]
                    self.at += 3
                    low = self.expression()
                    self.at += 1  # "}"
                else:
                    self.script()
            elif self.peek() == "^":
                self.at += 1
                high = self.script()
        if high.size is None:
            return _Cost(None, None, 1, False)  # symbolic bounds: sympy keeps the sum as it is
        largest = high.exact if high.exact is not None else 10 ** min(high.size, 30)
        count = largest - (low.exact or 0) + 1
        if count > MAX_SERIES_TERMS:
            raise _TooCostly(f"a {kind[1:]} of {count} terms, over the limit {MAX_SERIES_TERMS}")
        if variable is not None:
            self.bound[variable] = _Cost(float(len(str(largest))), largest)
        body = self.term()
        self.bound.pop(variable, None)
        if kind == "\\prod" and body.terms > 1 and not body.rational:
            _power(body, _Cost(float(len(str(count))), count))  # a product of sums expands like a power
        if body.size is None:
            return _Cost(None, None, 1, False)
        if count * count * body.size > MAX_SERIES_WORK:
            raise _TooCostly(f"a {kind[1:]} of {count} terms of {body.size:.3g} digits, over the work limit")
        return _Cost(body.size * count, None, 1, body.rational)


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _small(value: int | None) -> int | None:
    return value if value is not None and abs(value) < 10**18 else None


def _largest(cost: _Cost) -> float:
    """An upper bound on |value| of a numeric cost: its exact value, else 10^size."""
    return abs(cost.exact) if cost.exact is not None else 10.0 ** min(cost.size, 300)


def _power(base: _Cost, exponent: _Cost) -> _Cost:
    """base^exponent: refused when the exact result would have over MAX_VALUE_DIGITS digits (a
    tower, "9^{9^{9}}"), or when expanding a power of a sum would give over MAX_EXPANSION_TERMS terms."""
    if exponent.size is None:
        return _Cost(None, None, 1, False)  # a symbolic exponent: nothing to compute
    e = _largest(exponent)
    if base.exact in (0, 1, -1):
        return base
    if base.terms > 1 and not base.rational:
        expanded = math.comb(int(e) + base.terms - 1, base.terms - 1) if e <= 10**6 else math.inf
        if expanded > MAX_EXPANSION_TERMS:
            raise _TooCostly(f"a power of a sum that expands to {expanded:.3g} terms, over {MAX_EXPANSION_TERMS}")
    if base.size is None:
        return _Cost(None, None, 1, False)
    size = math.log10(abs(base.exact)) * e + 1 if base.exact else base.size * e  # digits of base^e, at most
    if size > MAX_VALUE_DIGITS:
        raise _TooCostly(f"a power of about {size:.3g} digits, over the limit {MAX_VALUE_DIGITS}")
    exact = None
    if base.exact is not None and exponent.exact is not None and 0 <= exponent.exact and size < 18:
        exact = base.exact**exponent.exact
    return _Cost(size, exact, 1, base.rational and exponent.exact is not None)


def _factorial(argument: _Cost) -> _Cost:
    if argument.size is None:
        return _Cost(None, None, 1, False)
    n = _largest(argument)
    if n > MAX_FACTORIAL_ARGUMENT:
        raise _TooCostly(f"the factorial of {n:.3g}, over the limit {MAX_FACTORIAL_ARGUMENT}")
    return _Cost(n * math.log10(max(n, 2)), _small(math.factorial(int(n))) if n <= 20 else None)


def _binomial(n: _Cost, k: _Cost) -> _Cost:
    if n.size is None or k.size is None:
        return _Cost(None, None, 1, False)
    top, bottom = _largest(n), _largest(k)
    if n.exact is not None and k.exact is not None:
        bottom = min(bottom, max(0, n.exact - k.exact))
    if bottom > MAX_FACTORIAL_ARGUMENT:
        raise _TooCostly(f"a binomial coefficient with k = {bottom:.3g}, over the limit {MAX_FACTORIAL_ARGUMENT}")
    size = bottom * math.log10(max(top, 2))
    if size > MAX_VALUE_DIGITS:
        raise _TooCostly(f"a binomial coefficient of about {size:.3g} digits, over the limit {MAX_VALUE_DIGITS}")
    return _Cost(size)
