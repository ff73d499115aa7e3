"""Reading one integer out of an answer text, the "dapo" mode's values (rows G2-G4 of verifier.py's
grammar): numbers with their units, percent, degrees and scientific notation; sentence frames
before the value; working, glosses and closing phrases after it; numbers spelled in words; the
refusals (several values, hedges, words that change the value).

Each reader returns (canonical integer or None, reason, detail): reason "" when one integer was
read, else a reason code of verifier.REASONS. Linear-time regex and string work, no parser. The
numbered deviations cited are those of docs/verifier.md.
"""

from __future__ import annotations

import functools
import re

from plumbing.answer_markup import (
    MAX_ANSWER_CHARS, MODULUS, MODULUS_TEXT, PLACEHOLDER, SYMBOL, as_integer, before_clause, box_span, box_starts,
    canonical_int, collapse_thousands, peel,
)  # fmt: skip

# --- DAPO: the integer rule ("dapo" mode) -----------------------------------------------------

# Words and signs that join several candidates: "12 or 13", "12, 13", "1, ..., 100", "12-13".
_HEDGE_WORDS = "or|and|to|through|between|either|plus|minus|more|less|fewer|greater|than|least|most|not"
_HEDGE = re.compile(
    rf"[,;]|\b(?:{_HEDGE_WORDS})\b|\\(?:lor|vee|pm|mp|[lcv]?dots|sim|le|ge|leq|geq|neq)(?![A-Za-z])"
    r"|[\u00b1\u2213\u2026<>]|\.\.\.|[0-9]\s*[-\u2013\u2014]\s*[0-9]",
    re.IGNORECASE,
)
# Inline text wrappers become plain words: "13 \text{ ways}" -> "13  ways".
_INLINE_TEXT = re.compile(r"\\(?:text|mbox|mathrm|textbf)\{([^{}]*)\}")
# LaTeX and Unicode spaces left after the digit groups are joined: "$- 4$", "8\ \mathrm{cm}".
_LATEX_SPACE = re.compile(r"\\(?:[,:; !]|q?quad(?![A-Za-z])|thinspace(?![A-Za-z]))|[\u2009\u202f\u00a0]")
# Words that change, hedge or hide the value, so never a unit, a gloss or a closing phrase (deviations
# 9, 15): "13 or more", "13 pi", "6 squared", "81, approximately", "81, to the nearest integer",
# "12 (incorrect)". Number words are never units, and in a gloss they must spell the value.
_NUMBER_WORDS = {
    word: value
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen".split()
    )
} | {word: 10 * value for value, word in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_SCALE_WORDS = {"hundred": 10**2, "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_VALUE_WORDS = (
    r"pi|sqrt|mod|modulo|times|cdot|squared|cubed|factorial|choose|over|divided|power|root|half|twice|double"
    r"|triple|dozens?|hundreds|thousands|millions|billions|trillions|about|approx|approximately|around"
    r"|roughly|nearly|almost|circa|estimated?|ish|maybe|perhaps|possibly|probably|likely|up|under|above|below"
    r"|exceeding|rounded|rounding|nearest|wrong|incorrect|false|invalid|unsure|uncertain|guess(?:ed|ing)?"
    r"|tentative(?:ly)?|unverified|unchecked|doubtful|if|unless|except|but|otherwise|instead|else|assuming"
)
# "and", "to", "through" and "between" join values only when a second one follows, which a unit or a
# description after the value cannot hold (no digits, no number words): "34 ways to seat them".
# "more", "fewer" and "less" describe the value ("34 more stamps"); "than" after them relates it ("34
# more than x") and "or" hedges it ("34 or more"), both refused on their own.
_NOT_A_UNIT = "|".join(
    [_HEDGE_WORDS.replace("and|to|through|between|", "").replace("more|less|fewer|", ""), _VALUE_WORDS,
     *_NUMBER_WORDS, *_SCALE_WORDS]
)  # fmt: skip
_NOT_IN_PHRASE = "|".join([_HEDGE_WORDS.replace("and|", ""), _VALUE_WORDS])  # "81, and that is all" is fine
# One number and what may follow it (deviations 6, 9, 10, 15, 25): the sign, a space allowed ("- 4");
# the digits (groupings already joined) and a fraction; scientific notation with an exponent of at
# most four digits ("3.5 \times 10^{4}", "3.5\cdot10^4", "3.5e4"; "10^12" is 10^{12}, as math-verify
# reads it) or a scale word ("2.5 million"); percent or degrees ("45\degree", "45^{\circ}", "45°");
# units, up to four terms: words of two letters or more, any letters inside a text command
# ("\text{ m/s}", "\mathrm{cm}^3", though not an upright i, e or j), compounds of SI symbols ("km/h",
# "m/s"); a gloss in brackets before or after the units ("36 (thirty-six)"); a closing phrase after a
_UNIT_WORD = rf"(?!(?:{_NOT_A_UNIT})(?![A-Za-z]))[A-Za-z]{{2,}}"
_TEXT_WORD = rf"(?!(?:{_NOT_A_UNIT})(?![A-Za-z]))[A-Za-z]+"
_SI_LETTER = r"[msghlLNJWVAKC](?![A-Za-z])"
_UNIT_POWER = r"(?:\^\s*(?:\{\s*-?\s*[0-9]\s*\}|-?[0-9]))"  # "cm^3", "s^{-1}"
_UNIT_TERM = (
    rf"(?:\\(?:text|mathrm|mbox|textrm|textnormal|textup|rm)\s*\{{\s*(?![iej]\s*\}})"
    rf"{_TEXT_WORD}{_UNIT_POWER}?(?:(?:\s*[/.\-]\s*|\s+){_TEXT_WORD}{_UNIT_POWER}?)*\s*\.?\s*\}}"
    rf"|(?:{_UNIT_WORD}|{_SI_LETTER})\s*/\s*(?:{_UNIT_WORD}|{_SI_LETTER})|{_UNIT_WORD}){_UNIT_POWER}?"
)
# A variable named after a word of the description: "34 is the largest such $n$" (never right after
# the value, where "12 x" is a product).
_NAMED_VARIABLE = r"[A-Za-z](?:_\{?[A-Za-z0-9]{1,4}\}?)?(?![A-Za-z])"
_PHRASE_WORD = rf"(?!(?:{_NOT_IN_PHRASE})(?![A-Za-z]))[A-Za-z]+(?:['\-][A-Za-z]+)*"
_PHRASE = rf"{_PHRASE_WORD}(?:\s+{_PHRASE_WORD}){{0,11}}"
_GLOSS = rf"\s*[(\[]\s*{_PHRASE}\s*[)\]]"
_BASE_WORDS = "two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen"
_NUMBER_ANSWER = re.compile(
    rf"""(?:\\?\$\s*)?                                             # currency: "\$13"
    (?P<sign>[+-]?)\s*(?P<digits>[0-9]+)(?P<fraction>\.[0-9]+)?     # "- 4", "13.0", "3.5"
    (?:\s*_\s*(?:\{{\s*\(?\s*(?:\\(?:text|mathrm|rm)\s*\{{\s*)?(?P<base>[0-9]{{1,2}}|{_BASE_WORDS})\s*\}}?\s*\)?\s*\}}
                 |(?P<base_bare>[0-9]))                              # a base: "1044_5", "1044_{{(5)}}"
       |\s+(?:in\s+)?base[\s-]*(?P<base_word>[0-9]{{1,2}}|{_BASE_WORDS})(?![A-Za-z0-9]))?  # "1044 in base 5"
    (?:\s*(?:\\times|\\cdot|\\ast|\*|x|\u00d7|\u00b7)\s*10\s*\^\s*           # scientific notation
         (?:\{{\s*(?P<exp>[+-]?\s*[0-9]{{1,4}})\s*\}}|(?P<exp_bare>[0-9]{{1,4}}))
       |e(?P<exp_e>[+-]?[0-9]{{1,4}})                                  # "3.5e4"
       |\s+(?P<scale>hundred|thousand|million|billion|trillion)(?![A-Za-z]))?  # "2.5 million"
    (?:\s*(?:\\?%|\\(?:degree|textdegree)(?![A-Za-z])                   # percent, degrees
       |(?:\{{\}})?\^\s*\{{?\s*\\circ\s*\}}?|\u00b0))?
    (?P<gloss>{_GLOSS})?                                            # "17 (seventeen) ways"
    (?:\s*{MODULUS_TEXT})?                                        # "3 \pmod{7}" (G2)
    (?:\s*{_UNIT_TERM}(?:(?:\s*(?:/|\\cdot|\*)\s*|\s+)(?:{_UNIT_TERM}|{_NAMED_VARIABLE})){{0,7}})?  # units, words
    (?P<gloss_after>{_GLOSS})?                                      # "36 (thirty-six)"
    (?:\s*(?:[,;:\u2014\u2013]|\s-{{1,2}}\s|\.\s)\s*(?P<phrase>{_PHRASE})\s*[.!]?)?  # "81, in all.", "17. I hope so."
    """,
    re.VERBOSE | re.IGNORECASE,
)
_SCALE_EXPONENTS = {"hundred": 2, "thousand": 3, "million": 6, "billion": 9, "trillion": 12}  # short scale
# A sentence frame before the value (G3), "The largest $n$ is 34.", "There are 34 ways.", "The final
# answer is $17$" (the Minerva prompt's format): words, variables (with sub- and superscripts, no
# value of their own: "$a_{10}$", "$x^2$"), Greek letters and text commands, up to the value.
# A variable: a name (answer_markup.SYMBOL, G6's too), its coefficient glued to it ("2a"), a power ("x^2").
_VARIABLE = rf"[0-9]*{SYMBOL}(?:\s*\^\s*(?:\{{[A-Za-z0-9,+\-]{{1,8}}\}}|[A-Za-z0-9]))?"
_FRAME = re.compile(
    rf"""(?:(?>{_VARIABLE}(?:\s*(?:[-+*/]|\\cdot)\s*{_VARIABLE})+          # "a+b", "m + n", "2a - b"
         |{SYMBOL}(?:\s*\^\s*(?:\{{[A-Za-z0-9,+\-]{{1,8}}\}}|[A-Za-z0-9]))?  # "a_{{10}}", "I_{{\max}}", "x^2"
         |[A-Za-z]+(?:['\u2019\-][A-Za-z]+)*                               # a word, "it's", "two-digit"
         |\\(?:text|textbf|textit|mathrm|mbox|emph)\s*\{{[^{{}}$0-9]*\}})
       (?:\s*[,:]\s*|\s+|(?<=\}})))+
    (?=(?:\\?\$\s*)?(?:\\left)?\(?\s*[+-]?\s*[0-9])""",
    re.VERBOSE,
)
# Words that hedge a frame wherever they stand ("Probably the answer is 34", "The answer is at least
# 34"), and words that change the value right before it ("about 34", "twice 34", "the square root
# of 34", "not 34"). Elsewhere such words describe what is counted: "The number of integers not
# divisible by 3 is 34", "The sum over all pairs is 34".
_FRAME_HEDGE = re.compile(
    r"(?<![a-z])(?:maybe|perhaps|possibly|probably|likely|unlikely|approximately|approx|roughly|nearly|almost"
    r"|circa|estimated?|guess(?:ed)?|would|could|might|unsure|uncertain|tentative(?:ly)?|wrong|incorrect|false"
    r"|invalid|unless|if|or|either|neither|nor|than|at\s+(?:least|most)|(?:is|are|was|were)\s+not|isn't|aren't"
    r")(?![a-z])"
)
_FRAME_LAST_WORD = re.compile(
    r"(?<![a-z])(?:about|around|over|under|above|below|beyond|within|near|up\s+to|close\s+to|from|per|not"
    r"|no|twice|thrice|half|double|triple|times|squared|cubed|sqrt|root|plus|minus|least|most|and"
    r"|between|mod|modulo"
    # "of" and "by" are prepositions ("a profit of", "grows by"), an operation only after its noun or verb
    r"|(?:half|thirds?|quarters?|fourths?|fifths?|tenths?|fraction|percent(?:age)?|square|cube|root|sum|product"
    r"|difference|quotient|remainder|multiples?|factors?|divisors?|powers?|log(?:arithm)?|factorial|average|mean"
    r"|median|reciprocal|inverse|opposite|double|twice|triple|part|portion|rest|most|least|none)\s+of"
    r"|(?:divided|multiplied|divisible|scaled|dividing|multiplying|times|multiple)\s+by)[\s,:]*$"
)
# A signed number in parentheses is the number, "(-3)" (a substitution's typography); so is a number in
# parentheses before its base, "(1044)_5". "(3)" alone stays: an option or a list marker.
_BRACKETED_NUMBER = re.compile(r"^(?:\\left)?\(\s*([+-]\s*[0-9]+(?:\.[0-9]+)?)\s*(?:\\right)?\)(?=\s*$|\s*[^\s_^0-9(])"
                               r"|^\(\s*([0-9]+)\s*\)(?=\s*_)")
# A number standing among words on a side of an equation ("0 Thus m + n"), not a coefficient, index or
# operand of the side ("2x", "a_1", "3 \times 6").
_NUMBER_AMONG_WORDS = re.compile(
    r"(?<![0-9A-Za-z_^.\\])(?<![_^]\{)[0-9]+(?:\.[0-9]+)?(?:[*`$)\]}]|\\[)\]])*\s+(?![a-z]\b)[A-Za-z]{2,}"
)
_INNER_MARKDOWN = re.compile(r"(\*\*|__|`)([^*`_\n]{1,80}?)\1")
_NEGATIVE = re.compile(r"(?<![a-z])negative[\s,:]*$")  # "The answer is negative 34": the sign, -34
_TEXT_COMMAND = re.compile(r"\\[A-Za-z]+\s*\{([^{}]*)\}")
# A side of an equation or a congruence (deviation 26, G2).
_SIDES = re.compile(r"=|\\equiv(?![A-Za-z])|\u2261")
# Text around a box that states something of its own: a number, a hedge, a word that changes a value.
_STATES_SOMETHING = re.compile(rf"[0-9,;]|(?<![A-Za-z])(?:{_NOT_A_UNIT})(?![A-Za-z])", re.IGNORECASE)
MAX_NESTED_BOXES = 3
_FIRST_DIGIT = re.compile(r"[0-9]")
# Working after the value (G4): hedges and comparisons inside it leave it in place, to be refused.
_WORKING_HEDGE = re.compile(
    r"(?<![A-Za-z])(?:or|and|either|maybe|perhaps|possibly|probably|approximately|approx|about|around|roughly"
    r"|nearly|almost|not|least|most|than|also|alternatively|else|otherwise|instead|actually|wait|wrong|incorrect"
    r"|guess|if|unless|except)(?![A-Za-z])"
    r"|\\(?:approx|pm|mp|neq?|leq?|geq?|sim|lor|vee)(?![A-Za-z])|[<>?\u2248\u00b1\u2260]",
    re.IGNORECASE,
)
_WORKING_SEPARATOR = re.compile(r"\s*(?:[,;\u2014\u2013]|\s-{1,3}\s|\.\s)\s*")
_LEADING_WORDS = re.compile(r"(?:[A-Za-z]+(?:['\-.][A-Za-z]+)*\.?\s+)+")
# Words that lead into a value of its own in a bracket: "18 (total 19)", "18 (i.e. 19)".
_LEADING_CONNECTIVE = re.compile(
    r"(?:(?:then|also|plus|so|thus|hence|therefore|namely|total|totals|totaling|totalling|altogether|giving"
    r"|gives|making|makes|equals|equal\s+to|is|are|i\.e\.)\s+)+",
    re.IGNORECASE,
)
_INNER_MATH = re.compile(r"(?<!\\)\$|\\[()]")
# An integer longer than MAX_ANSWER_CHARS, alone or in one box (deviation 24); possessive, so a
# long text that is not one is refused in linear time.
_LONG_INTEGER = re.compile(r"[\s$*`]*+(?:\\boxed\{((?:[^{}]|\{,\})*+)\}|([+-]?[0-9][0-9,{}\\ ]*+))[\s$*`.]*+")
_ASCII_INTEGERS = re.compile(r"[0-9]+")
# The number an earlier "Answer:" line leads with, past markup: "17. Wait, that is wrong."
_LEADING_NUMBER = re.compile(r"(?:[^0-9A-Za-z\\+\-]|\\[A-Za-z]*)*([+-]?)([0-9]+)(\.[0-9]+)?(?![0-9])")



def integer_candidate(text: str) -> tuple[str | None, str, str]:
    """(canonical integer or None, reason, detail) for one candidate answer text.

    reason is "" when an integer was read, else a reason code. Linear-time regex and string work.
    """
    if len(text) <= MAX_ANSWER_CHARS and text.isascii():  # the common cases, read without the rules
        if text.isdigit():  # "Answer: 85"
            return canonical_int("", text), "", ""
        # "85.", "$85$", "**85**", "`85`": what peel would strip, and only that (the same result)
        core = text.strip()
        core = core[:-1] if core.endswith(".") and not core.endswith("..") else core
        core = core.strip("*`$ ")
        if core.startswith("\\boxed{") and core.endswith("}"):  # "$\boxed{85}$.": its one box
            core = core[len("\\boxed{") : -1].strip()
        sign = core[:1] if core[:1] in ("-", "+") else ""  # "-3"
        if core[len(sign) :].isdigit():
            return canonical_int(sign, core[len(sign) :]), "", ""
    if len(text) > MAX_ANSWER_CHARS and (long := _long_integer(text)) is not None:
        return long, "", ""  # deviation 24: an exact integer of any length
    head = text if len(text) <= MAX_ANSWER_CHARS else before_clause(text)
    if len(head) > MAX_ANSWER_CHARS:
        return None, "malformed", f"answer has {len(head)} characters, over the {MAX_ANSWER_CHARS} limit"
    unboxed = _unbox(head) if "box" in head else None
    if unboxed is None:
        return _read_statement(head)
    # G2, deviation 8: a box is a transparent wrapper, read with the words around it ("the final
    # answer is \boxed{13}", "\boxed{18} (3 boxes of 6)", "\boxed{12} or 13"); when those words
    # state nothing (no number, hedge or word that changes a value) the boxes alone are the value.
    text, boxes, outside = unboxed
    reading = _read_statement(text)
    if reading[1] in ("", "wrong", "multiple_answers") or _STATES_SOMETHING.search(outside):
        return reading
    return agree([integer_candidate(box) for box in boxes])


def _unbox(text: str) -> tuple[str, list[str], str] | None:
    """(text with every box replaced by its contents, the contents, the text outside the boxes), or
    None when text has no box. Nested boxes are opened too, up to MAX_NESTED_BOXES deep."""
    data = text.encode("utf-8", "replace")
    starts = box_starts(data, 0, len(data))
    if not starts:
        return None
    contents, outside = [], []
    for depth in range(MAX_NESTED_BOXES):
        pieces, at = [], 0
        for box in starts:
            if box.start() < at:
                continue  # inside the box before it: opened with it, on the next round
            content, box_end = box_span(data, box)
            pieces += [data[at : box.start()], content.encode("utf-8", "replace")]
            if depth == 0:
                contents.append(content)
                outside.append(data[at : box.start()])
            at = box_end
        pieces.append(data[at:])
        if depth == 0:
            outside.append(data[at:])
        data = b"".join(pieces)
        starts = box_starts(data, 0, len(data))
        if not starts:
            break
    return data.decode("utf-8", "replace"), contents, b" ".join(outside).decode("utf-8", "replace")


def _read_statement(text: str) -> tuple[str | None, str, str]:
    """(canonical integer or None, reason, detail) for an answer text without boxes: the value
    grammar of the module docstring (G2-G4) read left to right. A clause after the value is cut
    (deviation 15); markup, math and spacing are peeled; a sentence frame before the value is
    checked and dropped (G3); working after the value is checked and dropped (G4); then the value,
    or the sides of an equation or congruence (deviation 26), are read."""
    if "**" in text or "`" in text or "__" in text:  # G2: markdown inside a sentence, "The count is **17**."
        if text.count("**") % 2:  # the half of "**Answer:** 17" or "**Answer: 17** apples" left on the line
            text = text.replace("**", "", 1)
        text = _INNER_MARKDOWN.sub(r"\2", text)
    text = before_clause(peel(text))  # peeled first: the clause may sit inside the wrappers
    raw = peel(_LATEX_SPACE.sub(" ", collapse_thousands(peel(text))))
    if "$" in raw or "\\(" in raw:
        raw = peel(_INNER_MATH.sub("", raw))
    frame = _FRAME.match(raw) if raw[:1].isalpha() or raw[:1] == "\\" else None
    if frame is not None:  # G3: "The largest $n$ is 34.", "There are 34 ways."
        words = _TEXT_COMMAND.sub(r" \1 ", frame[0]).lower()
        hedge = _FRAME_HEDGE.search(words) or _FRAME_LAST_WORD.search(words)
        if hedge is not None:
            return None, "malformed", f"{hedge[0].strip()!r} before the value hedges or changes it"
        raw = peel(raw[frame.end() :])
        if _NEGATIVE.search(words) and raw[:1].isdigit():
            raw = "-" + raw
    if raw[:1] == "(" or raw[:5] == "\\left":  # G2: "(-3)", "\\left( -3 \\right)", "(1044)_5"
        raw = _BRACKETED_NUMBER.sub(lambda m: m[1] or m[2], raw, count=1)
    raw, restated = _cut_working(raw)
    t = peel(_INLINE_TEXT.sub(r"\1", raw))  # the plain words, for the checks below
    if not t:
        return None, "empty_answer", ""
    if PLACEHOLDER.fullmatch(t):
        return None, "placeholder", f"placeholder {t!r}"
    sides = _SIDES.split(raw)  # deviation 26: "x = 13", "17 = x", "x \equiv 3 \pmod 7": the number is the value
    readings = [_read_number(peel(side)) for side in sides]
    if len(sides) > 1 and any(
        reading is None and (_HEDGE.search(_INLINE_TEXT.sub(r"\1", side)) or _NUMBER_AMONG_WORDS.search(side))
        for side, reading in zip(sides, readings)
    ):  # deviation 16: "x = 12 or 13"; G5: "0 Thus m + n = 1" states 0 and 1
        return None, "multiple_answers", f"several candidates in {text.strip()!r}"
    readings = [reading for reading in readings if reading is not None]
    if readings:
        reading = agree(readings)
        spelled = spelled_numbers(frame[0]) if frame is not None else []
        others = [value for value in (*restated, *spelled) if value != reading[0]]
        if reading[1] or not others:
            return reading
        return None, "multiple_answers", f"{others[0]} stated beside the value {reading[0]}"  # G3, G4
    t = peel(_INLINE_TEXT.sub(r"\1", sides[-1]))
    if not t:
        return None, "empty_answer", ""
    if len(_ASCII_INTEGERS.findall(t)) >= 2 and _HEDGE.search(t):
        return None, "multiple_answers", f"several candidates in {text.strip()!r}"
    odd_digits = [ch for ch in t if ch.isdigit() and not ch.isascii()]
    detail = f"non-ASCII digits {''.join(odd_digits)!r}" if odd_digits else f"not a single integer: {t[:80]!r}"
    return None, "malformed", detail


def _cut_working(text: str) -> tuple[str, list[str]]:
    """(text without the working after its value, the values that working restates) (G4).

    Working is what follows the value in brackets, "18 (3 boxes of 6 eggs)", or after a comma,
    semicolon, dash or full stop, "18, 3 boxes of 6 eggs": text with numbers, in digits or in two
    or more number words ("three boxes of six"), that is no value of its own. It is never read, so
    it can add no candidate. Left in place, for the rules that refuse them: a bracket or item with
    at most one number word (a gloss or closing phrase, deviation 15), one that hedges ("18 (or
    19)", "18, maybe 19"), and a list item that is a value ("18, 19", "18, as well as 19", and after
    an equation another one, "x = 1, y = 2"). A bracket that restates a value ("18 (19)", "18 (= 3
    \\times 6 = 18)") is taken out and its value returned, to be compared with the value; a modulus
    in brackets ("3 (mod 7)") is taken out (G2).
    """
    first = _FIRST_DIGIT.search(text)
    if first is None or len(text) > MAX_ANSWER_CHARS:
        return text, []
    if "(" in text or "[" in text:  # a bracket inside a text command: "18 \text{ (3 boxes of 6)}"
        text = _INLINE_TEXT.sub(r"\1", text)
    restated: list[str] = []
    kept, at, depth, open_at = [], 0, 0, -1
    for i in range(first.end(), len(text)):  # brackets after the value, at the top level
        ch = text[i]
        if ch in "([{":
            if depth == 0 and ch != "{" and text[i - 1 : i].isspace():
                open_at = i
            depth += 1
        elif ch in ")]}" and depth > 0:
            depth -= 1
            if depth == 0 and open_at >= 0:
                inside = text[open_at + 1 : i]
                if MODULUS.fullmatch(inside) or _is_working(inside):
                    restated += [] if MODULUS.fullmatch(inside) else _values_stated(inside, False, False)
                    kept.append(text[at:open_at].rstrip())
                    at = i + 1
                open_at = -1
    if kept:
        text = " ".join([*kept, text[at:].strip()]).strip()
    separator = next((m for m in _WORKING_SEPARATOR.finditer(text, first.end()) if _depth(text, m.start()) == 0), None)
    if separator is not None:  # an item after a comma, dash or full stop, outside every bracket
        item = _WORKING_SEPARATOR.split(text[separator.end() :], 1)[0]
        equation = _SIDES.search(text, 0, separator.start()) is not None  # "x = 1, y = 2": a list
        if _is_working(item) and not _values_stated(item, True, equation):
            text = text[: separator.start()]
    return text, restated


def _is_working(text: str) -> bool:
    """True when text could be working (G4): numbers (digits, or two or more number words) and no
    hedge."""
    numbers = _FIRST_DIGIT.search(text) is not None or len(spelled_numbers(text)) >= 2
    return numbers and not _WORKING_HEDGE.search(text)


def _depth(text: str, end: int) -> int:
    """How many brackets are open at offset end of text."""
    depth = 0
    for ch in text[:end]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}" and depth > 0:
            depth -= 1
    return depth


def _values_stated(text: str, after_words: bool, assignments: bool) -> list[str]:
    """The values a bracket or list item states as a value of its own: itself ("19", "19 eggs",
    "total 19"), or a side of an equation whose other sides hold no letter ("= 19", "3 \\times 6 =
    18"); [] for a description or arithmetic ("3 boxes of 6 eggs", "6 \\times 3"). An equation of a
    variable ("at x = 2") is a description too, unless `assignments` (the value was itself stated as
    one: "x = 1, y = 2"). after_words (a list item): also a value after the words that open it
    ("18, as well as 19")."""
    text = collapse_thousands(_INNER_MATH.sub("", text).strip())
    sides = _SIDES.split(text)
    if len(sides) > 1:
        if not assignments and any(_LETTER.search(_LATEX_COMMAND.sub("", side)) for side in sides):
            return []
    else:
        opening = (_LEADING_WORDS if after_words else _LEADING_CONNECTIVE).match(text)
        sides = [text[opening.end() :] if opening else text]
    values = []
    for side in sides:
        reading = _read_number(peel(side))
        if reading is not None and reading[0] is not None:
            values.append(reading[0])
    return values


_LETTER = re.compile(r"[A-Za-z]")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")


def _read_number(text: str) -> tuple[str | None, str, str] | None:
    """The reading of a text that states one number (_NUMBER_ANSWER), else None: (canonical
    integer, "", "") for an integer; (its decimal, "wrong", ...) for another number ("13.5",
    "3.14 \\times 10^1"); multiple_answers when its gloss or phrase spells another number."""
    m = _NUMBER_ANSWER.fullmatch(text) or _NUMBER_ANSWER.fullmatch(_INLINE_TEXT.sub(r"\1", text))
    if m is None:
        return None
    base = m["base"] or m["base_bare"] or m["base_word"]
    if base is not None:  # G2: a value in a base is its digits, which the base must allow
        b = int(base) if base.isdigit() else _NUMBER_WORDS[base.lower()]
        wrong = [digit for digit in m["digits"] if int(digit) >= b]
        if not 2 <= b <= 36 or wrong or m["fraction"]:
            return None, "malformed", f"{m['digits']} is not an integer written in base {base}"
    value, integral = _number_value(m)
    for words in (m["gloss"], m["gloss_after"], m["phrase"]):
        if words and any(spelled != value for spelled in spelled_numbers(words)):
            return None, "multiple_answers", f"{words.strip()!r} spells a value other than {value}"
    return (value, "", "") if integral else (value, "wrong", "not an integer")


def _number_value(m: re.Match) -> tuple[str, bool]:
    """(canonical value, whether it is an integer) of a _NUMBER_ANSWER match, the exponent applied
    by moving the decimal point: exact string work at any size ("3.5 \\times 10^{4}" -> "35000")."""
    scale = _SCALE_EXPONENTS[m["scale"].lower()] if m["scale"] else 0
    exponent = scale or int((m["exp"] or m["exp_bare"] or m["exp_e"] or "0").replace(" ", ""))
    whole = m["digits"] + (m["fraction"] or "")[1:]
    point = len(m["digits"]) + exponent  # where the decimal point falls in `whole`
    if point >= len(whole):
        integer, rest = whole + "0" * (point - len(whole)), ""
    elif point <= 0:
        integer, rest = "0", "0" * -point + whole
    else:
        integer, rest = whole[:point], whole[point:]
    rest = rest.rstrip("0")
    if not rest:  # "13.0", "3.5 \times 10^4"
        return canonical_int(m["sign"], integer), True
    magnitude = (integer.lstrip("0") or "0") + "." + rest
    return ("-" if m["sign"] == "-" else "") + magnitude, False


# Which kind of number word may follow which inside one number ("one" and the other units: after
# nothing but "hundred" or a scale word; "thirty" takes a unit, "hundred" and scale words take more).
_FOLLOWS = {
    "ten": ("one", "unit", "hundred", "scale"),
    "hundred": ("one", "unit", "teen", "ten", "scale"),
    "scale": ("one", "unit", "teen", "ten"),
}


def spelled_numbers(words: str) -> list[str]:
    """The numbers a gloss or phrase spells in English words: "thirty-six" -> ["36"], "one hundred
    and five" -> ["105"], "twelve and thirteen" -> ["12", "13"]. A word continues a number only where
    English lets it ("thirty six", "two hundred", "hundred and five", "thousand twenty"); any other
    word, or a second units word, starts the next. A lone "one" is a pronoun ("the only one")."""
    numbers: list[str] = []
    sign, total, current, last, count = "", 0, 0, None, 0  # last: the kind of the number's last word

    def flush() -> None:
        if count and not (count == 1 and last == "one"):
            numbers.append(sign + str(total + current))

    for word in re.split(r"[^a-z]+", words.lower()):
        value = _NUMBER_WORDS.get(word)
        kind = "hundred" if word == "hundred" else "scale" if word in _SCALE_WORDS else None
        if value is not None:
            kind = "one" if word == "one" else "unit" if value < 10 else "teen" if value < 20 else "ten"
        if word == "and" and last in ("hundred", "scale"):
            continue  # "one hundred and five"
        if kind is None or last is not None and kind not in _FOLLOWS.get(last, ("hundred", "scale")):
            flush()  # this word ends the number before it (or there is none)
            if last is not None or kind is None:
                sign = "-" if word == "negative" else ""  # "negative" signs the number it opens
            total, current, last, count = 0, 0, None, 0
            if kind is None:
                continue
        if kind == "hundred":
            current = (current or 1) * 100
        elif kind == "scale":
            total, current = total + (current or 1) * _SCALE_WORDS[word], 0
        else:
            current += value
        last, count = kind, count + 1
    flush()
    return numbers


def _long_integer(text: str) -> str | None:
    """The canonical integer when a text longer than MAX_ANSWER_CHARS is one integer, digit groups
    allowed, alone or in one \\boxed{} (deviation 24); else None. Linear time at any length."""
    m = _LONG_INTEGER.fullmatch(text)
    return None if m is None else as_integer(collapse_thousands((m[1] or m[2]).strip()))


def agree(values: list[tuple[str | None, str, str]]) -> tuple[str | None, str, str]:
    """Combine the readings of several final statements: the first failure, or the one value they all give."""
    for value in values:
        if value[1]:
            return value
    distinct = sorted({value[0] for value in values})
    if len(distinct) > 1:
        return None, "multiple_answers", "contradicting final answers: " + ", ".join(distinct)
    return values[0]


@functools.lru_cache(maxsize=65536)
def integer_ground_truth(ground_truth: str) -> str:
    truth = as_integer(collapse_thousands(ground_truth.strip()))  # GSM8K writes "2,125"
    if truth is None:
        raise ValueError(
            f"mode='dapo' needs an integer ground truth (as in DAPO-Math-17k and AIME), got "
            f"{ground_truth!r}: use mode='math' for general answers or mode='dapo-official' for the "
            f"paper's exact string rule"
        )
    return truth


def section_value(text: str) -> str:
    """What a box or number of the final answer section states (deviation 23): its integer or
    decimal reading, else a description that equals no integer ("\\boxed{x}" beside "\\boxed{3}"
    is a second answer, not an unread one)."""
    pred, reason, _ = integer_candidate(text)
    if not reason or reason == "wrong":
        return pred
    return f"{reason} {text.strip()[:40]!r}"


def earlier_value(text: str) -> str | None:
    """What an earlier "Answer:" line states, to compare with the final value (deviation 20).

    Its integer reading when it has one; a description that equals no integer when it reads as
    several candidates or as a non-integer number; else the number it leads with ("17. Wait, that
    is wrong." states 17); None when it states no number at all ("To answer: we first ...").
    """
    pred, reason, _ = integer_candidate(text)
    if not reason or reason == "wrong":  # "wrong" here: a decimal such as "17.5", itself a value
        return pred
    if reason == "multiple_answers":
        return f"several values in {text.strip()[:40]!r}"
    lead = _LEADING_NUMBER.match(collapse_thousands(text[:MAX_ANSWER_CHARS]))
    if lead is None:
        return None
    integer = canonical_int(lead[1], lead[2])
    fraction = (lead[3] or "").rstrip("0")
    return integer if fraction in ("", ".") else integer + fraction
