"""Which values a text states as a result (row G5 of verifier.py's grammar): "the count is 17", "so
there are only 17 valid pairs", "that leaves seventeen in total", "10 + 7 = 17". The "dapo" rule
refuses a final answer when, from its final statement on, the text states another value so, or
does so between an earlier statement of the same value and the final one: a response that states
two different final values is never scored right, whatever words of contrast it uses or not.

A value is a number in digits or in English words. It is stated as a result when

  * it follows a verb of result or a copula ("is", "are", "equals", "gives", "leaves", "get",
    "comes to", "there are"), or a word of conclusion ("so", "thus", "hence", "therefore"), with
    markup ("$", "\\boxed{", "**"), a colon or comma and at most three fillers between ("is
    actually", "are only", "is about", "would be": a hedged or conditional value is still a value);
  * or it is followed, within a few words, by "in total", "in all", "altogether" or "overall";
  * or it ends an equation whose other side is arithmetic on numbers ("10 + 7 = 17"; "m + n = 17"
    names what it computes, so "= 17" there is an assignment, not a result).

It is not one when it is an operand ("17 + 2", "2 \\times 17", "\\frac{17}{2}"), negated ("not 17",
"rather than 17"), inside a clause that gives a premise ("since there are 7 rows"), or a lone
"one" (a pronoun). Linear in the text: one scan for numbers, then a bounded look around each.
"""

from __future__ import annotations

import re

from plumbing.answer_markup import collapse_thousands
from plumbing.integer_answer import integer_candidate, spelled_numbers

MAX_RESULTS = 16  # values read from one stretch of text (bounded work); more is spam anyway
_CONTEXT = 120  # bytes before a number that are looked at (its sentence, at most)
# A number in digits (digit groups, a decimal part, a sign read apart), or a run of number words.
_NUMBER = re.compile(
    rb"(?<![0-9A-Za-z.,_^\\])[0-9]+(?:,[0-9]{3})*(?:\.[0-9]+)?(?![0-9A-Za-z]|\.[0-9]|,[0-9]{3})"
    rb"|(?i:(?<![A-Za-z])(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen"
    rb"|fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)"
    rb"(?:[ -](?:and )?(?:one|two|three|four|five|six|seven|eight|nine|hundred|thousand|million))*(?![A-Za-z]))"
)
# A word (a letter not inside a LaTeX command) or an "=": without one, a text states nothing as a result
_WORD_OR_EQUALS = re.compile(rb"(?:^|[^\\A-Za-z])[A-Za-z]|=")
# A number and the words after it, up to the end of its clause: read whole by the value grammar.
_PHRASE = re.compile(rb"-?[^,;!?\n]{0,80}?(?=[,;!?\n]|\.(?![0-9])|\s(?:but|and|or|not|so|since)\s|$)")
_SCALE = re.compile(rb"[ \t]+(hundred|thousand|million|billion|trillion)(?![A-Za-z])", re.IGNORECASE)
_SCALE_DIGITS = {b"hundred": 2, b"thousand": 3, b"million": 6, b"billion": 9, b"trillion": 12}  # short scale
_WORDS_BEFORE = re.compile(rb"[A-Za-z]+(?:'[a-z]+)?|[0-9]+|[=+\-*/^<>]|\\[A-Za-z]+|[.!?;,:]|\n\s*\n")
_COPULAS = frozenset(
    b"is are was were be been being equals equal equalled gives give gave giving get gets got getting obtain obtains"
    b" obtained yields yield yielded yielding makes make made making becomes become became totals total totalled"
    b" totaling totalling leaves leave leaving remains remain remained remaining count counts counted".split()
)
# "comes to 17", "adds up to 17", "amounts to 17", "equal to 17", "increases to 17"
_BEFORE_TO = frozenset(
    b"equal equals comes come came amounts amount sums sum up rises rose increases increased drops dropped falls fell"
    b" decreases decreased reduces reduced goes went grows grew".split()
)
_CONCLUSIONS = frozenset(b"so thus hence therefore consequently".split())
_FILLERS = frozenset(
    b"actually just only exactly really then now still indeed the a an answer of precisely simply clearly also"
    b" instead therefore thus so about approximately roughly nearly around maybe perhaps probably possibly likely"
    b" certainly definitely".split()
)
_FILLER_PAIRS = ((b"in", b"fact"), (b"in", b"total"), (b"in", b"all"), (b"of", b"course"))
_PREMISES = frozenset(b"since because given where whereas as".split())
_OPENERS = frozenset(b"so thus hence therefore but however which then giving leaving yet".split())
_TOTALS = re.compile(rb"(?i)^[^.,;:!?\n]{0,40}?(?<![A-Za-z])(?:in\s+total|in\s+all|altogether|overall)(?![A-Za-z])")
# After a number: what makes it an operand (an operator, "=", a fraction's bar) or not.
_CLOSERS = re.compile(rb"(?:[ \t$*`)}\]]|\\[)\]]|\\right[)\]])*")
_OPERATOR_AFTER = re.compile(
    rb"[+\-*/^=!]|\\(?:times|cdot|div|pm|mp|ast)(?![A-Za-z])|\xc3\x97|\xc2\xb7|\xe2\x88\x92"
    rb"|(?:x|times|plus|minus|divided|multiplied|over|choose)[ \t]+[0-9(]"
)
_OPENERS_BEFORE = re.compile(
    rb"(?:[ \t\n$*`({\[,~]|\\[(\[]|\\left[(\[]|\\(?:boxed|fbox|textbf|mathbf|text|mathrm|displaystyle|bf)\s*\{?)*$"
)
_OPERATOR_BEFORE = re.compile(
    rb"(?:[+*/^_-]|\xc3\x97|\xc2\xb7|\\(?:times|cdot|div|frac|dfrac|tfrac|sqrt|binom|pm|mp)\s*\{?|\}\s*\{)$"
)
_FRACTION_BEFORE = re.compile(rb"(?:\\[dt]?frac|\\sqrt|\\binom|\})\s*\{\s*$")
_ARITHMETIC_BYTES = frozenset(b"0123456789 \t.,+-*/^()[]{}")
_ARITHMETIC_COMMAND = re.compile(rb"\\(?:times|cdot|div|frac|dfrac|tfrac|left|right)$")


def results_stated(data: bytes, a: int, b: int) -> list[tuple[int, str]]:
    """(offset, value) of each value data[a:b] states as a result (the module docstring's rule), in
    order; at most MAX_RESULTS. Looks back before `a` only to read the words before a number.
    Digit groups are read as the value grammar reads them ("1{,}000", "1\\,000"), and so are scale
    words ("2.5 million"); offsets are those of that reading, in order."""
    if a >= b or _WORD_OR_EQUALS.search(data, a, b) is None:
        return []  # the common case: a bare value ("19", "$\\boxed{19}$."), no word or "=" to state another
    lo = max(0, a - _CONTEXT)
    prefix = collapse_thousands(data[lo:a].decode("utf-8", "replace")).encode("utf-8", "replace")
    text = prefix + collapse_thousands(data[a:b].decode("utf-8", "replace")).encode("utf-8", "replace")
    found: list[tuple[int, str]] = []
    for number in _NUMBER.finditer(text, len(prefix)):
        at, end = number.start(), number.end()
        digits = number[0]
        if digits[:1].isalpha():
            values = spelled_numbers(digits.decode())
            if len(values) != 1:
                continue  # "one" alone: a pronoun
            value = values[0]
        else:
            value = digits.replace(b",", b"").decode()
            if scale := _SCALE.match(text, end):
                value, end = _scaled(value, _SCALE_DIGITS[scale[1].lower()]), scale.end()
        sign = _sign_before(text, at)
        if sign:
            at -= 1
        after = _CLOSERS.match(text, end, min(len(text), end + 40)).end()
        if _OPERATOR_AFTER.match(text, after):
            continue  # an operand: "17 + 2", "17 = x", "7 x 8"
        before = text[max(0, at - _CONTEXT) : at]
        if not _stated_as_result(before) and not _TOTALS.match(text, end, min(len(text), end + 60)):
            continue
        phrase = _PHRASE.match(text, at)  # the value as the value grammar reads it: "12 \\text{ thousand}"
        reading, reason, _ = integer_candidate(phrase[0].decode("utf-8", "replace")) if phrase else (None, "-", "")
        found.append((lo + at, reading if not reason and reading is not None else _canonical(sign + value)))
        if len(found) >= MAX_RESULTS:
            break
    return found


def _scaled(value: str, digits: int) -> str:
    """value times 10^digits, exactly: "2.5", 6 -> "2500000"."""
    whole, _, fraction = value.partition(".")
    fraction = fraction.ljust(digits, "0")
    return whole + fraction[:digits] + ("." + fraction[digits:] if fraction[digits:] else "")


def _sign_before(data: bytes, at: int) -> str:
    """"-" when the number at `at` carries a minus sign ("is -17", "$-17$"), not a subtraction."""
    if at == 0 or data[at - 1 : at] != b"-":
        return ""
    prior = data[max(0, at - 40) : at - 1].rstrip()
    return "" if prior[-1:].isalnum() or prior[-1:] in (b")", b"}", b"]") else "-"


def _canonical(value: str) -> str:
    """"017" -> "17", "-0" -> "0", "17.50" -> "17.5", "17.0" -> "17": the form integer_answer compares."""
    sign = "-" if value.startswith("-") else ""
    whole, _, fraction = value.lstrip("-").partition(".")
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    text = whole + ("." + fraction if fraction else "")
    return text if not sign or text == "0" else sign + text


def _stated_as_result(before: bytes) -> bool:
    """True when `before`, the bytes before a number, end in a statement of a result (the rule)."""
    cut = max(before.rfind(b". "), before.rfind(b".\n"), before.rfind(b"? "), before.rfind(b"! "), before.rfind(b"\n\n"))
    sentence = before[cut + 1 :] if cut >= 0 else before
    if _FRACTION_BEFORE.search(sentence):
        return False  # an operand: "\frac{17", "\frac{7}{17"
    trail = _OPENERS_BEFORE.search(sentence)
    head = sentence[: trail.start()] if trail else sentence
    if _OPERATOR_BEFORE.search(head):
        return False  # an operand: "2 \times 17", "10 - 17"
    words = [w.lower() for w in _WORDS_BEFORE.findall(head)]
    if _in_premise(words):
        return False
    if head.endswith(b"="):
        return _arithmetic_side(head[:-1])
    tail = words[-8:]
    for _ in range(3):
        if tail and tail[-1] in _FILLERS:
            tail.pop()
        elif tuple(tail[-2:]) in _FILLER_PAIRS:
            del tail[-2:]
    if not tail:
        return False
    last = tail[-1]
    if last in _COPULAS or last in _CONCLUSIONS:
        return True
    if last == b":":  # a label: "Correction: 17", "Total: 17" (not a ratio "3:2")
        return len(tail) > 1 and tail[-2].isalpha()
    return last == b"to" and len(tail) > 1 and tail[-2] in _BEFORE_TO


def _in_premise(words: list[bytes]) -> bool:
    """True when the last clause opener among the words before a number gives a premise ("since")."""
    for word in reversed(words):
        if word in _PREMISES:
            return True
        if word in _OPENERS or word in (b";", b".", b"!", b"?", b","):
            return False
    return False


def _arithmetic_side(left: bytes) -> bool:
    """True when the side of an equation before its "=" is arithmetic on numbers ("10 + 7"), not an
    expression with a variable ("m + n", "2x", "f(2)")."""
    left = left.rstrip()
    at = len(left)
    while at > 0:
        if left[at - 1] in _ARITHMETIC_BYTES:
            at -= 1
        elif command := _ARITHMETIC_COMMAND.search(left, 0, at):
            at = command.start()
        else:
            break
    side = left[at:].strip()
    if not side or side[:1] in b"+-*/^" or not any(48 <= byte <= 57 for byte in side):  # 48-57: digits
        return False  # nothing, or an operator first: a variable stands before it ("m + 7 = 17")
    return at == 0 or not (left[at - 1 : at].isalpha() and left[at : at + 1] in b"([{")  # "f(2) = 5"
