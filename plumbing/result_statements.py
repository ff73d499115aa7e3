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

from plumbing.integer_answer import integer_candidate, spelled_numbers

MAX_RESULTS = 16  # values read from one stretch of text (bounded work); more is spam anyway
_CONTEXT = 100  # bytes before a number that are looked at (its sentence, at most)
# A number in digits, with the digit groups the value grammar reads ("1,000", "1{,}000", "1\,000",
# "1\ 000"): found by its first digit (a fast scan), the byte before it checked apart.
_GROUP = rb"(?:[ \t]*\{[ \t]*,[ \t]*\}[ \t]*|,\\!|\\(?:[,:; !]|thinspace(?![A-Za-z]))[ \t]*|[, ~]|\xe2\x80[\x89\xaf]|\xc2\xa0)"
_DIGITS = re.compile(rb"[0-9]+(?:" + _GROUP + rb"[0-9]{3}(?![0-9]))*(?:\.[0-9]+)?(?![0-9A-Za-z]|\.[0-9])")
_NOT_BEFORE_DIGITS = frozenset(b"0123456789.,_^\\abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_NOT_DIGITS = re.compile(rb"[^0-9.]")
# A run of number words ("seventeen", "twenty-one", "one hundred and five"), in the lowered text.
_NUMBER_WORDS = re.compile(
    rb"(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen"
    rb"|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)"
    rb"(?:[ -](?:and )?(?:one|two|three|four|five|six|seven|eight|nine|hundred|thousand|million))*(?![a-z])"
)
WORDS_REACH = 256  # bytes of a stretch searched for numbers in words (bounded work; digits: all of it)
# The last byte before a number (markup stripped) that lets it be stated as a result: a word's end,
# a colon, an "=", a clause's punctuation.
_MAY_PRECEDE = frozenset(bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ:=.;!?")
# A word (a letter not inside a LaTeX command) or an "=": without one, a text states nothing as a result
_LETTER_OR_EQUALS = re.compile(rb"[A-Za-z=]")  # a cheaper first look
WORD_OR_EQUALS = re.compile(rb"(?:^|[^\\A-Za-z])[A-Za-z]|=")
# A number and the words after it, up to the end of its clause: read whole by the value grammar.
# The words after a number, up to the end of its clause or the next number or relation: read with it
# by the value grammar ("2.5 million", "12 \text{ thousand}"), never as another value.
_PHRASE_REST = re.compile(rb"[^,;!?\n=<>+*/0-9]{0,80}?(?=[,;!?\n=<>+*/0-9]|\.(?![0-9])|\s(?:but|and|or|not|so|since)\s|$)")
# What in the words after a number can change its value's reading (a scale word, a power of ten, a base).
_CHANGES_READING = re.compile(rb"(?i)hundred|thousand|million|billion|trillion|\\times|\\cdot|\^|_|e[+-]?[0-9]")
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
# A number as the subject of a verb of result: "17 are valid", "only 17 remain", "17 pairs are left".
_SUBJECT = re.compile(
    rb"(?i)[ \t]*(?:[A-Za-z]+(?:-[A-Za-z]+)?[ \t]+){0,3}?(?:are|is|were|was|remain|remains|remained|exist|exists|work"
    rb"|works|qualify|qualifies|survive|survives|left|total|in\s+total|in\s+all|altogether|overall)(?![A-Za-z])"
)
# After a number: what makes it an operand (an operator, "=", a fraction's bar) or not.
_CLOSERS = re.compile(rb"(?:[ \t$*`)}\]]|\\[)\]]|\\right[)\]])*")
_OPERATOR_AFTER = re.compile(
    rb"[+\-*/^=!]|\\(?:times|cdot|div|pm|mp|ast)(?![A-Za-z])|\xc3\x97|\xc2\xb7|\xe2\x88\x92"
    rb"|(?:x|times|plus|minus|divided|multiplied|over|choose)[ \t]+[0-9(]"
)
# Before a number: markup that wraps it ("$", "**", "\boxed{", "\("), stripped to reach the words.
_MARKUP_BYTES = b" \t\n$*`({[,~"
_MARKUP_COMMANDS = (
    b"\\(", b"\\[", b"\\left", b"\\boxed", b"\\fbox", b"\\textbf", b"\\mathbf", b"\\text", b"\\mathrm",
    b"\\displaystyle", b"\\bf", b"\\quad", b"\\qquad", b"\\,", b"\\;", b"\\!", b"\\",  # "\\" left of "\\(", "\\["
)  # fmt: skip
_OPERAND_BYTES = frozenset(b"+/^|<>")  # right before a number: an operand's
_BEFORE_PARENTHESIS = frozenset((b" ", b"$", b"\n", b"\t", b"*", b"\\", b""))  # "is (17)": a bracket that may wrap a value
_MARKUP_NAMES = frozenset(
    b"boxed fbox textbf mathbf text mathrm displaystyle bf left quad qquad emph underline textit mbox".split()
)
_OPERATOR_ENDS = (b"+", b"*", b"/", b"^", b"_", b"-", b"\xc3\x97", b"\xc2\xb7", b"\\times", b"\\cdot", b"\\div",
                  b"\\frac", b"\\dfrac", b"\\tfrac", b"\\sqrt", b"\\binom", b"\\pm", b"\\mp", b"}")  # fmt: skip
_LETTERS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ARITHMETIC_BYTES = frozenset(b"0123456789 \t.,+-*/^()[]{}")
_ARITHMETIC_COMMAND = re.compile(rb"\\(?:times|cdot|div|frac|dfrac|tfrac|left|right)$")


def results_stated(data: bytes, a: int, b: int, until_not: str | None = None) -> list[tuple[int, str]]:
    """(offset, value) of each value data[a:b] states as a result (the module docstring's rule): the
    numbers in digits first, then those in words (in the first WORDS_REACH bytes); at most
    MAX_RESULTS. Looks back before `a` only to read the words before a number. Digit groups and
    scale words are read as the value grammar reads them ("1{,}000", "2.5 million", "12 \\text{
    thousand}"). until_not: stop at the first value other than it (all a caller that compares needs)."""
    if a >= b or _LETTER_OR_EQUALS.search(data, a, b) is None or WORD_OR_EQUALS.search(data, a, b) is None:
        return []  # the common case: a bare value ("19", "$\\boxed{19}$."), no word or "=" to state another
    found: list[tuple[int, str]] = []
    for number in _DIGITS.finditer(data, a, b):
        at = number.start()
        prev = data[at - 1] if at else 32  # 32: a space
        if prev in _NOT_BEFORE_DIGITS or prev in _OPERAND_BYTES:
            continue  # inside a word, a command or a number ("x2", "a_1", "\\frac12", "1.5"), an operand ("+2")
        if prev == 123 and not data[max(0, at - 8) : at - 1].endswith(_MARKUP_COMMANDS):  # 123: "{" of "\\frac{1"
            continue
        if prev == 40 and data[at - 2 : at - 1] not in _BEFORE_PARENTHESIS:  # 40: "(" of "(x-1)(x+2)", "f(2)"
            continue
        if not _may_be_result(data, at, number.end()):
            continue  # the common case in mathematics, cheaply: after a digit, an operator, a command
        if _result(data, at, number.end(), None, found) or until_not is not None and found and found[-1][1] != until_not:
            return found
    lowered = data[a : min(b, a + WORDS_REACH)].lower()
    for words in _NUMBER_WORDS.finditer(lowered):
        at = a + words.start()
        if at > 0 and data[at - 1 : at].isalpha():
            continue  # inside a word: "someone", "often"
        values = spelled_numbers(words[0].decode())
        if len(values) == 1 and _result(data, at, a + words.end(), values[0], found, spelled=True):
            break  # values: [] for "one" alone, a pronoun
        if until_not is not None and found and found[-1][1] != until_not:
            break
    return found


def _may_be_result(data: bytes, at: int, end: int) -> bool:
    """A cheap first look at the bytes before the number data[at:end]: False when it cannot be
    stated as a result (after a digit, an operator, a bracket closed, a LaTeX command: "\\ge 2",
    "\\binom{5"), unless it opens a clause as a subject ("...\\n17 pairs are left")."""
    raw = data[max(0, at - 32) : at]
    before = raw.rstrip(_MARKUP_BYTES)
    if before.endswith(b"\\"):  # "\\(", "\\[": the backslash of a delimiter
        before = before[:-1].rstrip(_MARKUP_BYTES)
    last = before[-1:]
    if last.isalpha():
        letters = len(before) - len(before.rstrip(_LETTERS))
        if before[-letters - 1 : -letters] != b"\\":
            return True  # after a word
        if before[-letters:] in _MARKUP_NAMES:  # "\\textbf{17}", "\\boxed{17}": markup, look before it
            return _may_be_result(data, at - (len(raw) - len(before)) - letters - 1, end)
        return False  # after a command: "\\ge 2", "\\binom{5"
    elif last == b"=":  # "n = 0" is an assignment unless a word of result opens it ("so x = 17")
        left = before[:-1].rstrip()
        if left[-1:].isalpha() and not left[-2:-1].isalpha():
            return _concluded_equation(left)
        return True
    elif last in (b":", b".", b";", b"!", b"?"):
        return True
    if len(before) == len(raw) and last:
        return False  # the common case: right after a digit, an operator or a bracket
    stripped = raw[len(before) :]
    opens = not last or b"\n" in stripped or b"," in stripped
    return opens and _SUBJECT.match(data, end, end + 60) is not None


def _result(data: bytes, at: int, end: int, value: str | None, found: list, spelled: bool = False) -> bool:
    """Append (offset, value) to found when the number data[at:end] is stated as a result; True when
    found is full."""
    sign = "" if spelled else _sign_before(data, at)
    start = at - 1 if sign else at
    after = _CLOSERS.match(data, end, min(len(data), end + 40)).end()
    if _OPERATOR_AFTER.match(data, after):
        return False  # an operand: "17 + 2", "17 = x", "7 x 8"
    head = _strip_markup(data[max(0, start - _CONTEXT) : start])
    if not (_may_state(head) and _stated_as_result(head)):  # else a subject: "only 17 are valid"
        if not (_opens_clause(data, start, head) and _SUBJECT.match(data, after, after + 60) and _premise_free(head)):
            return False
    if value is None:
        value = _NOT_DIGITS.sub(b"", data[at:end]).decode()
        if scale := _SCALE.match(data, end):
            value, end = _scaled(value, _SCALE_DIGITS[scale[1].lower()]), scale.end()
    reading, reason = None, "-"
    rest = None if spelled else _PHRASE_REST.match(data, end)
    if rest is not None and _CHANGES_READING.search(rest[0]):  # read as the value grammar reads it: "12 \\text{ thousand}"
        reading, reason, _ = integer_candidate((data[start:end] + rest[0]).decode("utf-8", "replace"))
    found.append((start, reading if not reason and reading is not None else _canonical(sign + value)))
    return len(found) >= MAX_RESULTS


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


def _may_state(head: bytes) -> bool:
    """False when the bytes before a number (markup stripped) cannot state it as a result: they end
    in a digit, an operator or bracket, a LaTeX command ("\\ge 2", "\\pi 2").
    Cheap: most numbers in mathematics stop here."""
    last = head[-1:]
    if last in (b"=", b":"):
        return True
    if not last.isalpha():
        return False
    word = len(head) - len(head.rstrip(_LETTERS))
    return head[-word - 1 : -word] != b"\\"


def _stated_as_result(head: bytes) -> bool:
    """True when `head`, the bytes before a number less the markup that ends them, end in a statement
    of a result (the rule)."""
    if head.endswith(_OPERATOR_ENDS):
        return False  # an operand: "2 \\times 17", "\\frac{17", "\\frac{7}{17", "10 - 17"
    last = head[-1:]
    if not (last.isalpha() or last in (b"=", b":")):
        return False  # the common case in mathematics: after a digit, a bracket, a relation
    cut = max(head.rfind(b". "), head.rfind(b".\n"), head.rfind(b"? "), head.rfind(b"! "), head.rfind(b"\n\n"))
    sentence = head[cut + 1 :] if cut >= 0 else head
    words = [w.lower() for w in _WORDS_BEFORE.findall(sentence)]
    if _in_premise(words):
        return False
    if last == b"=":  # "10 + 7 = 17"; "so m + n = 17", "the answer is x = 17" (not "the case n = 0")
        return _arithmetic_side(sentence[:-1]) or _concluded_equation(sentence[:-1])
    tail = words[-8:]
    if tail and tail[-1] in _CONCLUSIONS:
        return True  # "so 17", "hence 17"
    for _ in range(3):
        if tail and tail[-1] in _FILLERS:
            tail.pop()
        elif tuple(tail[-2:]) in _FILLER_PAIRS:
            del tail[-2:]
    if not tail:
        return False
    word = tail[-1]
    if word in _COPULAS or word in _CONCLUSIONS:
        return True
    if word == b":":  # a label: "Correction: 17", "Total: 17" (not a ratio "3:2")
        return len(tail) > 1 and tail[-2].isalpha()
    return word == b"to" and len(tail) > 1 and tail[-2] in _BEFORE_TO


def _strip_markup(text: bytes) -> bytes:
    """text without the markup that ends it: spaces, "$", "**", brackets opened, "\\boxed{"."""
    while True:
        stripped = text.rstrip(_MARKUP_BYTES)
        if stripped.endswith(_MARKUP_COMMANDS):  # rarely: then find which
            for command in _MARKUP_COMMANDS:
                if stripped.endswith(command):
                    stripped = stripped[: -len(command)]
                    break
        if stripped == text:
            return text
        text = stripped


_CLAUSE_OPENERS = frozenset(b"only just but so thus hence therefore now then exactly however actually yet all".split())


def _opens_clause(data: bytes, start: int, head: bytes) -> bool:
    """True when the number at start opens its clause, as a subject does: after a line break or
    punctuation, or a word such as "only", "but", "so" ("but only 17 are valid"; not "7 and 8 is").
    head: the bytes before it less the markup that ends them."""
    if not head or head[-1:] in b".,;:!?":
        return True
    stripped = data[max(0, start - _CONTEXT) + len(head) : start]  # the markup stripped: a line break, a comma?
    if b"\n" in stripped or b"," in stripped:
        return True
    word = head[len(head.rstrip(_LETTERS)) :] if head[-1:].isalpha() else b""
    return word.lower() in _CLAUSE_OPENERS


def _premise_free(head: bytes) -> bool:
    """True when the number after head is not inside a clause that gives a premise ("since 17 are")."""
    cut = max(head.rfind(b". "), head.rfind(b".\n"), head.rfind(b"? "), head.rfind(b"! "), head.rfind(b"\n\n"))
    return not _in_premise([w.lower() for w in _WORDS_BEFORE.findall(head[cut + 1 :] if cut >= 0 else head)])


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



def _concluded_equation(left: bytes) -> bool:
    """True when the side of an equation before its "=" names what it computes ("m + n", "x") and a
    word of conclusion or a copula stands right before it: "so m + n = 17", "the answer is x = 17"
    (not "the case n = 0", "let x = 3")."""
    for word in reversed(_WORDS_BEFORE.findall(left[-60:])):
        if word in (b".", b"!", b"?", b";", b","):
            return False
        if word[:1] == b"\\" or not word.isalpha() or len(word) == 1:
            continue  # a command, an operator, a digit or a variable of the side
        return word.lower() in _CONCLUSIONS or word.lower() in _COPULAS
    return False
