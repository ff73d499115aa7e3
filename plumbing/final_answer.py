"""Where a response states its final answer (rows G1 and G5 of verifier.py's grammar, deviations 7,
11-14, 17, 20 and 23 of docs/verifier.md): the end of the turn and of the reasoning, the "Answer:"
markers, answer tags and boxes, the final answer section around the final statement, and what the
text after it states.

`extract_final(response)` returns a `Final`: the texts whose values must all agree, or why there is
none. Reading a value out of those texts is plumbing/integer_answer.py's job ("dapo") and
plumbing/math_equivalence.py's ("math"). Byte-level work with C-speed finds: the hot loop of
training scores every response here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from plumbing.answer_markup import MAX_ANSWER_CHARS, MAX_FINAL_BOXES, box_contents, box_span, box_starts, last_box

# --- extraction: find the final answer (used by "dapo" and "math") ----------------------------


class Final(NamedTuple):  # a NamedTuple: built once per response in the hot loop, and cheap
    """The final-answer text of a response, or why there is none."""

    candidates: tuple[str, ...] = ()  # texts that must all agree: the final statement, then later boxes
    reason: str = ""  # "" when candidates were found, else a reason code
    detail: str = ""
    earlier: tuple[str, ...] = ()  # values of earlier "Answer:" markers (deviation 20)
    section: tuple[str, ...] = ()  # the other values of the final answer section (deviation 23)
    boxes_only: bool = False  # no "Answer:" marker: the final statement is the last box
    same_line: tuple[str, ...] = ()  # boxes-only: the boxes on the last box's line outside the section
    restated: tuple[str, ...] = ()  # values the text after the final statement restates it with (G5)


# More "Answer:" lines than this before the final one is spam, not an answer (and would cost work).
MAX_ANSWER_LINES = 16
SECTION_REACH = 4096  # bytes the final answer section reaches on each side of its final statement
_SPAM = Final(reason="multiple_answers", detail=f"over {MAX_FINAL_BOXES} values in the final answer section")
_FULLWIDTH_COLON = "\uff1a".encode()  # b"\xef\xbc\x9a"
# Between "answer" and its colon: "Answer :", "**Answer**:", "__Answer__:", "\textbf{Answer}:".
_MARKER_GAP = b" \t*_}"
_MAX_MARKER_GAP = 8
_BEFORE_COLON = frozenset(bytes([byte]) for byte in b"rR" + _MARKER_GAP)
# Before the value: spaces and line breaks, markdown "**" and "`", the "}" of "\text{Answer:}",
# "~", "&" (an aligned environment), LaTeX spaces, and a display opened on a line of its own, "Answer:\n\[\n512\n\]"
# (deviations 3, 14). An opener on the value's line stays, for peel to match with its closer.
_LEADING = re.compile(  # written as "class* (command class*)*" so the common case is one class run
    rb"[ \t\r\n*`}~&]*(?:(?:\\(?:q?quad(?![A-Za-z])|[,;: !])"
    rb"|(?:\\[\[(]|\$\$|\\begin\{(?:equation|align|gather|displaymath|math)\*?\})(?=[ \t]*\r?\n))"
    rb"[ \t\r\n*`}~&]*)*"
)
# The final answer section (deviation 23): text that states an answer and nothing else. Whitespace,
# punctuation and markdown, math delimiters and LaTeX spacing, text and environment wrappers, plain
# numbers, and the words of a statement or a hedge. Any other word ("Wait, that double counts"),
# an "=", any other command or non-ASCII character is reasoning, and ends the section. Possessive
# (`*+`, `++`): each byte is looked at once, whatever the text.
_SECTION_WORDS = (
    rb"answers?|final(?:ly)?|the|is|are|so|thus|hence|therefore|or|and|also|maybe|perhaps|possibly"
    rb"|alternatively|either|it|could|might|be"
)
_ANSWER_ONLY = re.compile(
    rb"(?:[\s.,;:!?()\[\]{}*_#>`~&|\"'+-]++|\$|\\[\[\]()\\,;:! ]"
    rb"|\\(?:q?quad|displaystyle|hline|item|newline|noindent)(?![A-Za-z])"
    rb"|\\(?:text|textbf|mathbf|mathrm|textit|emph|mbox|textrm|underline)\s*+\{"
    rb"|\\(?:begin|end)\{[A-Za-z]*+\*?\}|[0-9]++|(?i:" + _SECTION_WORDS + rb")(?![A-Za-z]))*+"
)
# A value stated in the section without a box ("The answer is 12." before "\boxed{13}"), and the
# list marker that is not one ("1. \boxed{19}", "(2) \boxed{19}").
_STATED_NUMBER = re.compile(
    rb"(?<![0-9A-Za-z.^_\\])[+-]?[0-9]+(?:(?:,|\\,|\{,\}| )[0-9]{3}(?![0-9]))*(?:\.[0-9]+)?(?![0-9A-Za-z])"
)
_LIST_MARKER = re.compile(rb"[ \t>*#-]*(?:\(?[0-9]{1,3}[.)]|\([0-9]{1,3}\))[ \t]+(?=\S)")
_DIGIT = re.compile(rb"[0-9]")
_MARKER = re.compile(rb"(?i:answer)[ \t*_}]{0,8}(?::|\xef\xbc\x9a)")  # "Answer:", "**Answer**:", "Answer："
# The end of the model's turn (grammar row G1): a chat template's end-of-turn or start-of-turn token
# written as text. ChatML and most templates spell them "<|name|>" ("<|im_end|>", "<|eot_id|>",
# "<|endoftext|>", "<|end|>", "<|END_OF_TURN_TOKEN|>"); Llama 2 and Mistral "</s>", Gemma
# "<end_of_turn>" and "<eos>", DeepSeek "<｜end▁of▁sentence｜>" (full-width bars, U+FF5C).
_END_OF_TURN = re.compile(
    rb"<\|[A-Za-z][A-Za-z0-9_]{2,30}\|>|</s>|<eos>|<(?:end|start)_of_turn>|<\xef\xbd\x9c[^<>\n]{1,60}?\xef\xbd\x9c>"
)
# A final statement the text then takes back (G5): after the statement, a word of contrast or
# correction, then a value stated with a copula or a verb of result ("but two are invalid, so the
# actual count is 17"). A box in a hypothetical sentence ("if all were valid the answer would be
# \boxed{19}") needs no contrast word. "=" and ":" are not copulas here: a check after the answer
# ("since 19 = 10 + 9") restates nothing.
# Searched with bytes.find on the lowered text (a regex alternation costs 10-50 microseconds on a
# 600-byte tail, a tenth of the whole verdict's budget); "actual" also finds "actually".
_CONTRAST_WORDS = (
    b"but", b"however", b"actual", b"instead", b"wait", b"correction", b"mistake", b"oops", b"rather", b"in fact",
    b"wrong", b"incorrect",
)  # fmt: skip
_HYPOTHETICAL = re.compile(rb"(?i)(?<![A-Za-z])(?:would|if|were|suppose|supposing|assuming|naively|had)(?![A-Za-z])")
# digits first, so that the scan is fast; the byte before is checked apart (_NOT_BEFORE_A_NUMBER)
_RESTATED_NUMBER = re.compile(rb"[0-9]+(?:,[0-9]{3})*(?:\.[0-9]+)?(?![0-9A-Za-z^_]|\.[0-9]|,[0-9])")
_NOT_BEFORE_A_NUMBER = b"0123456789.^_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# A value restated with a copula or a verb of result, up to three fillers between: "the actual count
# is 17", "it is actually $\boxed{17}$", "we get 17". Checked on the words before a number.
_COPULAS = frozenset(
    b"is are was were be been equals equal gives give get gets got obtain obtains obtained yields yield yielding"
    b" makes make making becomes become totals total giving leaves leaving".split()
)
_TWO_WORD_COPULAS = frozenset({(b"equal", b"to"), (b"total", b"of"), (b"to", b"get")})
_FILLERS = frozenset(
    b"actually just only exactly really then now still therefore thus so indeed the a an answer of".split()
)
_WRAPPER_TOKEN = re.compile(rb"(?:[$`*({]|\\\(|\\(?:boxed|fbox|textbf|mathbf|text))+")
_COPULA_REACH = 64  # bytes before a number that _said_with_copula looks at
_LETTERS = tuple(bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
# After an "Answer:" line a restatement must say it restates the answer: "the answer is actually 17",
# "the actual count is 17", "the correct total is 17", "it is really 17".
_RESTATES_ANSWER = (b"answer", b"actual", b"correct", b"true", b"real", b"right", b"final")
_RETRACTION_REACH = 400  # bytes to the contrast word, and from it (or a hypothetical box) to the value
# The echoed instruction: 'of the form Answer: $Answer (without quotes)' and 'after "Answer:".'
_ECHO = re.compile(r'\\?\$Answer\b|"\s*[.\u3002]?\s*$')
def _markers(data: bytes, start: int, end: int, limit: int) -> list[tuple[int, int]]:
    """(start of "answer", end of its colon) for the "Answer:" markers in data[start:end], in order;
    more than `limit` of them stops the search (the caller then has spam, not an answer).

    Found from the colons, a memchr scan much cheaper than lowering the text: a colon, at most
    _MAX_MARKER_GAP bytes of spaces or markup, then "answer" in any ASCII case.
    """
    found = []
    colon = start - 1
    while len(found) <= limit and (colon := data.find(b":", colon + 1, end)) >= 0:
        # most colons follow a byte that can end neither "answer" nor a gap: skip the call
        if data[colon - 1 : colon] in _BEFORE_COLON and (begin := _answer_before(data, start, colon)) >= 0:
            found.append((begin, colon + 1))
    if not data.isascii() and data.find(b"\x9a", start, end) >= 0:  # the full-width colon's last byte
        colon = start - 1
        while len(found) <= limit and (colon := data.find(_FULLWIDTH_COLON, colon + 1, end)) >= 0:
            if (begin := _answer_before(data, start, colon)) >= 0:
                found.append((begin, colon + len(_FULLWIDTH_COLON)))
        found.sort()
    return found


def _answer_before(data: bytes, start: int, colon: int) -> int:
    """Where "answer" starts when it ends just before `colon` (past a short gap), else -1."""
    k = colon
    while k > start and colon - k < _MAX_MARKER_GAP and data[k - 1] in _MARKER_GAP:
        k -= 1
    if k - 6 >= start and data[k - 6 : k].lower() == b"answer":  # 6 == len("answer")
        return k - 6
    return -1


def _value_line(data: bytes, colon_end: int, end: int) -> tuple[str, int]:
    """The value after a marker: from past the leading markup to the end of its line or `end`."""
    j = _LEADING.match(data, colon_end).end()
    line_end = data.find(b"\n", j, end)
    line_end = end if line_end < 0 else line_end
    return data[j:line_end].decode("utf-8", "replace"), line_end


def extract_final(response: str) -> Final:
    """The final answer: the last "Answer:" marker's value (plus any later box, and the values of
    earlier markers, which must agree), else the boxes on the line of the last box.

    Works on UTF-8 bytes: `bytes.lower()` folds ASCII letters only, so offsets stay aligned and
    look-alikes (Cyrillic "А", the Kelvin sign) never spell "answer" (deviation 18). Every search
    is a C-speed `find`/`rfind`: the last marker is found from the last colons (the answer is
    almost always in the last line; the hot loop needs >= 50k responses/s), and earlier markers
    from their colons too (`_markers`), a memchr scan of the text before the final one.
    """
    data = response.encode("utf-8", "replace")  # lone surrogates become "?": encoding never raises
    start = 0
    # deviation 12: only text after the last reasoning block counts. `b"<" in data` is a memchr,
    # much faster than the multi-byte search it saves on the many responses without any tag.
    tags = b"<" in data
    tag = data.rfind(b"think>") if tags else -1
    while tag >= 0:
        if data[tag - 2 : tag] == b"</":
            start = tag + len(b"think>")
            break
        if data[tag - 1 : tag] == b"<":
            return Final(reason="no_answer", detail="unclosed <think> block: reasoning never finished")
        tag = data.rfind(b"think>", 0, tag)
    # G1: the turn ends at its first end-of-turn token; what follows is no part of the response
    if tags and (end_of_turn := _END_OF_TURN.search(data, start)) is not None:
        data = data[: end_of_turn.start()]

    # The last marker, found from its colon: a C-speed rfind per colon, and colons are few (the
    # common case: the marker's own, in the last line); "answer" in any ASCII case before it.
    echoed, hi, wide = False, len(data), not response.isascii()  # str.isascii: O(1)
    while hi > start:
        colon = data.rfind(b":", start, hi)
        wide_colon = data.rfind(_FULLWIDTH_COLON, start, hi) if wide else -1
        wide = wide_colon >= 0  # none before this one means none further back either
        if colon < 0 and wide_colon < 0:
            break
        hi = max(colon, wide_colon)
        if hi == colon and data[colon - 1 : colon] not in _BEFORE_COLON:
            continue  # most colons follow a byte that can end neither "answer" nor a gap
        i = _answer_before(data, start, hi)
        if i < 0:
            continue  # "ratio 3:2", "Note:": not a marker
        j = hi + (1 if hi == colon else len(_FULLWIDTH_COLON))
        # Like the official "\s*", the value may start on a later line; "**" closes "**Answer:**".
        j = _LEADING.match(data, j).end()
        line_end = data.find(b"\n", j)
        line_end = len(data) if line_end < 0 else line_end
        line = data[j:line_end].decode("utf-8", "replace")
        if _ECHO.match(line):
            echoed = True  # deviation 11: the prompt's instruction, echoed back
            continue
        # deviation 20: the values of earlier markers; one memchr when there is no other colon
        no_colon = data.find(b":", start, i) < 0 and response.isascii()
        earlier = () if no_colon else _earlier_values(data, start, i)
        if earlier is None:
            return Final(reason="multiple_answers", detail=f"over {MAX_ANSWER_LINES} 'Answer:' lines")
        later = box_starts(data, line_end, len(data))
        tag = _last_answer_tag(data, line_end) if tags else None  # a tag after the line must agree, as a box (17)
        if len(later) > MAX_FINAL_BOXES:
            return Final(reason="multiple_answers", detail=f"over {MAX_FINAL_BOXES} boxes after the final answer")
        # deviation 23: the values the final answer section states around it must agree with it
        before, _ = _section_before(data, start, i)
        if not later and line_end == len(data) and not before and tag is None:  # the common case, kept cheap
            return Final(candidates=(line,), earlier=earlier) if before is not None else _SPAM
        # deviation 17: and so must the boxes after the answer line
        spans = [box_span(data, box) for box in later]
        after = _stated_after(data, spans[-1][1] if spans else line_end)
        if before is None or after is None or 1 + len(spans) + len(before) + len(after) > MAX_FINAL_BOXES:
            return _SPAM
        section = (*before, *after)
        candidates = (line, *(content for content, _ in spans), *(tag[:1] if tag is not None else ()))
        restated = _restated_after(data, spans[-1][1] if spans else line_end, None)
        return Final(candidates=candidates, earlier=earlier, section=section, restated=restated)

    tag = _last_answer_tag(data, start) if tags else None
    if tag is not None:  # G1: "<answer>18</answer>", with the boxes after it as candidates (17)
        content, tag_start, tag_end = tag
        before, _ = _section_before(data, start, tag_start)
        later = box_starts(data, tag_end, len(data))
        after = _stated_after(data, tag_end)
        if before is None or after is None or 1 + len(later) + len(before) + len(after) > MAX_FINAL_BOXES:
            return _SPAM
        candidates = (content, *(box_contents(data, box) for box in later))
        return Final(candidates=candidates, section=(*before, *after), restated=_restated_after(data, tag_end, None))
    last = last_box(data, start)
    if last is not None:  # deviation 7: no "Answer:" line, the last box decides
        content, box_end = box_span(data, last)
        before, section_start = _section_before(data, start, last.start())
        after = _stated_after(data, box_end)
        if before is None or after is None or 1 + len(before) + len(after) > MAX_FINAL_BOXES:
            return _SPAM
        # the boxes of the last box's line outside the section, which list a set in math mode (22)
        line_start = max(start, data.rfind(b"\n", start, last.start()) + 1)
        same_line = tuple(box_contents(data, box) for box in box_starts(data, line_start, section_start))
        restated = _restated_after(data, box_end, (line_start, last.start()))
        return Final(
            candidates=(content,), section=(*before, *after), boxes_only=True, same_line=same_line, restated=restated
        )
    if echoed:
        return Final(reason="echoed_prompt", detail="the only 'Answer:' is the prompt's instruction")
    return Final(reason="no_answer", detail="no 'Answer:' line and no \\boxed{}")


def _last_answer_tag(data: bytes, start: int) -> tuple[str, int, int] | None:
    """(contents, start, end) of the last "<answer>...</answer>" pair in data[start:] (G1: the
    format of many GRPO recipes, TRL's and maxtext's examples among them), else None."""
    close = data.rfind(b"</answer>", start)
    if close < 0:
        return None
    opening = data.rfind(b"<answer>", start, close)
    if opening < 0 or close - opening > MAX_ANSWER_CHARS:
        return None
    return data[opening + len(b"<answer>") : close].decode("utf-8", "replace"), opening, close + len(b"</answer>")


def _section_before(data: bytes, start: int, p: int) -> tuple[list[str] | None, int]:
    """The values the final answer section states before offset p (deviation 23), and where the
    section starts. None for the values: over MAX_FINAL_BOXES boxes, spam.

    Walks back a line at a time (each byte looked at once) while the text states an answer and
    nothing else (_ANSWER_ONLY), and not into an earlier "Answer:" line (a final answer of its own,
    compared in dapo mode by deviation 20). A box joins the section when only such text lies between
    it and p, and so does every number in that text; above the section's first statement, only a
    number on a line that says "answer" does ("The answer is 12." above "\\boxed{13}"; a bare "12"
    there may be the end of a computation). Reasoning ends the section, and the common case, an
    "Answer:" line under a paragraph of reasoning, costs one match of that paragraph's last line.
    """
    values: list[str] = []
    pending: list[tuple[list[str], bool]] = []  # numbers not yet between two statements, "answer" said
    boxes = 0
    limit = max(start, p - SECTION_REACH)  # bounded work: the section ends here at the latest
    rfind, answer_only = data.rfind, _ANSWER_ONLY.fullmatch  # the hot loop: bound once
    while p > limit:
        line_start = rfind(b"\n", limit, p) + 1 or limit  # rfind gives -1 when limit is 0 too
        cut = line_start == limit > start and data[limit - 1] != 10  # 10 == "\n": a line cut by the reach
        if line_start == p or not cut and answer_only(data, line_start, p):  # empty: the common case
            if line_start < p:
                if _MARKER.search(data, line_start, p):
                    break  # an earlier "Answer:" line: a statement of its own (deviation 20), not read here
                if numbers := _stated_numbers(data, line_start, p):
                    pending.append((numbers, b"answer" in data[line_start:p].lower()))
            p = line_start - 1 if line_start > limit else limit
            continue
        box = last_box(data, line_start, p) if data.find(b"box", line_start, p) >= 0 else None
        if box is None or _MARKER.search(data, line_start, box.start()):
            break
        content, box_end = box_span(data, box)
        if box_end > p or not answer_only(data, box_end, p):
            break  # reasoning after the box ("\boxed{12}. Wait, that double counts"), or it encloses p
        boxes += 1
        if boxes > MAX_FINAL_BOXES:
            return None, p
        for numbers, _ in pending:  # now between two statements: every one counts
            values[:0] = numbers
        pending = []
        values[:0] = [content, *_stated_numbers(data, box_end, p)]
        p = box.start()
    for numbers, says_answer in pending:
        if says_answer:
            values[:0] = numbers
    return values, p


def _restated_after(data: bytes, q: int, box_line: tuple[int, int] | None) -> tuple[str, ...]:
    """The values the text after the final statement (from offset q) restates it with, when it takes
    the statement back (G5): after a word of contrast or correction ("but", "actually", "wait")
    within _RETRACTION_REACH bytes, each value stated with a copula or a verb of result within
    _RETRACTION_REACH bytes of it ("the actual count is 17", "we get 17"). box_line: (start of its
    line, start of the box) for a final box, None after an "Answer:" line. A box in a hypothetical
    sentence ("if all were valid it would be \\boxed{19}") needs no contrast word; after an "Answer:" line,
    only a value said to be the answer counts ("the actual count is 17", not "there are 10 ways").
    Empty when the text takes nothing back; bounded work (MAX_FINAL_BOXES values)."""
    end = min(len(data), q + 2 * _RETRACTION_REACH)
    if q >= end or _DIGIT.search(data, q, end) is None:  # the common case: nothing, or no number, after it
        return ()
    answer_word = box_line is None
    if answer_word and not _says_answer(data[q:end].lower()):
        return ()  # after an "Answer:" line, the common case: a check that says no value is the answer
    hypothetical = False
    if box_line is not None:  # the box's sentence, from its line's start or last full stop
        line_start, box_start = box_line
        full_stop = max(data.rfind(b". ", line_start, box_start), data.rfind(b"? ", line_start, box_start))
        hypothetical = _HYPOTHETICAL.search(data, max(line_start, full_stop + 2), box_start) is not None
    if not hypothetical:
        after = _after_contrast(data[q : q + _RETRACTION_REACH].lower())
        if after < 0:
            return ()  # nothing is taken back
        q += after
    end = min(end, q + _RETRACTION_REACH)
    restated = []  # the numbers first (few, found by one cheap scan), then what precedes each
    for number in _RESTATED_NUMBER.finditer(data, q, end):
        at = number.start()
        if data[at - 1] in _NOT_BEFORE_A_NUMBER:
            continue  # inside a word or a number: "x2", "a_1", "1.5"
        before = data[max(q, at - _COPULA_REACH) : at]
        if not before.rstrip(b" \t\n$`*({").endswith(_LETTERS):
            continue  # the common case, cheaply: after a symbol ("= 10", "\binom{5}") nothing is restated
        if _said_with_copula(before) and (not answer_word or _says_answer(before.lower())):
            sign = data[at - 1 : at] if data[at - 1 : at] in (b"-", b"+") else b""
            restated.append((sign + number[0]).decode())
            if len(restated) >= MAX_FINAL_BOXES:
                break
    return tuple(restated)


def _says_answer(low: bytes) -> bool:
    """True when the lowered text says a value is the answer (_RESTATES_ANSWER, G5)."""
    for word in _RESTATES_ANSWER:
        if word in low:
            return True
    return False


def _said_with_copula(text: bytes) -> bool:
    """True when text, the bytes before a number, ends in a copula or a verb of result, then at most
    three fillers and markup (G5): "the actual count is", "is actually $\\boxed{", "we get"."""
    words = text.lower().split()[-6:]
    while words and _WRAPPER_TOKEN.fullmatch(words[-1]):
        words.pop()
    for _ in range(3):
        if words and words[-1] in _FILLERS:
            words.pop()
    return bool(words) and (words[-1] in _COPULAS or tuple(words[-2:]) in _TWO_WORD_COPULAS)


def _after_contrast(low: bytes) -> int:
    """Where the first word of contrast or correction in the lowered text ends (G5), else -1."""
    first = -1
    for word in _CONTRAST_WORDS:
        i = low.find(word)
        while i >= 0 and (
            low[i - 1 : i].isalpha() or word != b"actual" and low[i + len(word) : i + len(word) + 1].isalpha()
        ):
            i = low.find(word, i + 1)  # inside a longer word: "butter", "await"
        if i >= 0 and (first < 0 or i + len(word) < first):
            first = i + len(word)
    return first


def _stated_after(data: bytes, q: int) -> list[str] | None:
    """The numbers stated in the answer-only lines right after the final statement (deviation 23):
    "Answer: 19\\n18\\n17" states three values. None when there are more than MAX_FINAL_BOXES."""
    values: list[str] = []
    end = min(len(data), q + SECTION_REACH)
    if _DIGIT.search(data, q, end) is None:  # the common case: no number after it, none stated
        return values
    while q < end:
        line_end = data.find(b"\n", q, end)
        line_end = end if line_end < 0 else line_end
        if line_end == end < len(data) or not _ANSWER_ONLY.fullmatch(data, q, line_end):
            break  # a line cut by the reach, or reasoning
        values += _stated_numbers(data, q, line_end)
        if len(values) > MAX_FINAL_BOXES:
            return None
        q = line_end + 1
    return values


def _stated_numbers(data: bytes, a: int, b: int) -> list[str]:
    """The numbers in answer-only text data[a:b], less a list marker that opens its line."""
    if _DIGIT.search(data, a, b) is None:  # the common case
        return []
    if (a == 0 or data[a - 1] == 10) and (marker := _LIST_MARKER.match(data, a)):  # 10 == "\n"
        a = min(marker.end(), b)  # matched without the end bound: what follows the marker decides
    return [number.decode() for number in _STATED_NUMBER.findall(data, a, b)]


def _earlier_values(data: bytes, start: int, final: int) -> tuple[str, ...] | None:
    """The values of the "Answer:" markers in data[start:final], echoes left out (deviation 20);
    None when there are more than MAX_ANSWER_LINES of them, a spray that is not read (bounded work).
    Each runs to the end of its line or to the next marker: "Answer: 17 ... Answer: 19"."""
    markers = _markers(data, start, final, MAX_ANSWER_LINES)
    if not markers:  # the common case
        return ()
    if len(markers) > MAX_ANSWER_LINES:
        return None
    values = []
    for index, (_, colon_end) in enumerate(markers):
        until = markers[index + 1][0] if index + 1 < len(markers) else final
        line, _ = _value_line(data, colon_end, until)
        if not _ECHO.match(line):
            values.append(line)
    return tuple(values)
