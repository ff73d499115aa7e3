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
    # G5: the response's bytes (as read: G1), where the final statement starts, and where the text
    # it holds starts (an "Answer:" line's value, a box's contents; a tag's end): from there on,
    # every value stated as a result must be the final one
    # (plumbing/result_statements.py)
    data: bytes = b""
    text_start: int = 0  # where the text that counts starts (after the reasoning: G1)
    final_start: int = 0
    final_at: int = 0
    earlier_ends: tuple[int, ...] = ()  # where each earlier "Answer:" line ends (G5: see anchors)


# More "Answer:" lines than this before the final one is spam, not an answer (and would cost work).
MAX_ANSWER_LINES = 16
SECTION_REACH = 4096  # bytes the final answer section reaches on each side of its final statement
ANCHOR_REACH = 512  # bytes before the final statement in which a box of the same value is an anchor (G5)
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
ANSWER_ONLY = re.compile(
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
# The end of the model's turn (G1): only a token that ends the turn, or starts another one (a
# hallucinated next turn), ends the response; a chat template's other special tokens are text. The
# templates' spellings: "<|name|>" (ChatML "<|im_end|>", "<|im_start|>"; Llama 3 "<|eot_id|>",
# "<|eom_id|>", "<|start_header_id|>"; Llama 4 "<|eot|>", "<|header_start|>"; Phi-3 "<|end|>",
# "<|user|>"; Cohere "<|END_OF_TURN_TOKEN|>"; Granite "<|end_of_text|>", "<|start_of_role|>"; GLM
# "<|observation|>"; Kimi "<|im_user|>"; gpt-oss "<|return|>", "<|call|>"; GPT-2 and Qwen
# "<|endoftext|>"), Llama 2 and Mistral "</s>", "<s>", Gemma "<end_of_turn>",
# "<start_of_turn>", "<eos>", Idefics "<end_of_utterance>", DeepSeek "<｜end▁of▁sentence｜>",
# "<｜User｜>" (full-width bars U+FF5C, "▁" U+2581).
_TURN_TOKEN = re.compile(
    rb"<\|([A-Za-z][A-Za-z0-9_]{2,30})\|>|</s>|<s>|<eos>|<pad>|<(?:end|start)_of_turn>|<end_of_utterance>"
    rb"|<\xef\xbd\x9c([^<>\n]{1,60}?)\xef\xbd\x9c>"
)
_TURN_NAMES = frozenset(
    "im_end eot_id eot eom_id eom eos end return call endoftext end_of_text end_of_turn end_of_turn_token endofturn"
    " end_of_sentence end_of_solution end_of_response stop pad im_start start start_header_id header_start"
    " start_of_turn start_of_turn_token start_of_role begin_of_text bos im_user im_assistant im_system user"
    " assistant system human observation tool ipython begin_of_sentence".split()
)
# The end of a reasoning block (G1, deviation 12): only the text after the last one counts, and an
# opener after it with no end means the reasoning never finished. DeepSeek-R1, Qwen3 and most
# "<think>"; Seed "<seed:think>"; Kimi "◁think▷"; OpenThoughts and Bespoke
# "<|begin_of_thought|>". gpt-oss' harmony format has channels instead (_final_channel).
_REASONING_ENDS = (b"</think>", b"</seed:think>", b"<|end_of_thought|>")
_REASONING_OPENERS = (b"<think>", b"<seed:think>", b"<|begin_of_thought|>")
_KIMI_OPENER, _KIMI_END = "\u25c1think\u25b7".encode(), "\u25c1/think\u25b7".encode()
# gpt-oss' harmony format: messages "<|start|>assistant<|channel|>NAME ...<|message|>TEXT<|end|>", the
# answer in the one on the "final" channel, ended by "<|return|>" (or "<|end|>", "<|call|>").
_FINAL_CHANNEL = re.compile(rb"<\|channel\|>\s*final(?![A-Za-z0-9_])[^<]{0,200}?(?:<\|constrain\|>[^<]{0,100})?<\|message\|>")
_MESSAGE_END = re.compile(rb"<\|(?:return|end|call|start|channel)\|>")
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


def _response_text(data: bytes, ascii_text: bool) -> tuple[bytes, int] | Final:
    """(the bytes that count, where the final answer may start) of a response (G1): up to the first
    token that ends the turn, after the last end of a reasoning block; for a harmony response, its
    final channel's message. A Final with reason no_answer when the reasoning never finished.
    One scan of the special tokens (every spelling holds a "<"), one search for "think>"."""
    start, cut, thought = 0, -1, False
    for token in _TURN_TOKEN.finditer(data):
        name = token[1] or token[2]
        if name is None:
            cut = token.start()  # "</s>", "<eos>", "<end_of_turn>", ...
            break
        name = name.lower().replace("\u2581".encode(), b"_")
        if name == b"channel" or name == b"start" and data.find(b"<|channel|>", token.end(), token.end() + 64) >= 0:
            return _final_channel(data)  # harmony: "<|start|>assistant<|channel|>..." starts a message, not a turn
        thought = thought or name.endswith(b"_of_thought")
        if name.decode("utf-8", "replace") in _TURN_NAMES:
            cut = token.start()
            break
    if cut >= 0:
        data = data[:cut]
    if b"think>" in data or thought:
        for closing in _REASONING_ENDS:
            close = data.rfind(closing)
            if close >= 0:
                start = max(start, close + len(closing))
        for opening in _REASONING_OPENERS:
            if data.find(opening, start) >= 0:
                return Final(reason="no_answer", detail="an unclosed reasoning block (<think>): it never finished")
    if not ascii_text and _KIMI_OPENER[:3] in data:  # "◁think▷ ... ◁/think▷"
        close = data.rfind(_KIMI_END)
        start = max(start, close + len(_KIMI_END)) if close >= 0 else start
        if data.find(_KIMI_OPENER, start) >= 0:
            return Final(reason="no_answer", detail="an unclosed reasoning block (◁think▷): it never finished")
    return data, start


def _final_channel(data: bytes) -> tuple[bytes, int] | Final:
    """The last final-channel message of a harmony response (gpt-oss), up to its end (G1)."""
    final = None
    for final in _FINAL_CHANNEL.finditer(data):
        pass
    if final is None:
        return Final(reason="no_answer", detail="a harmony response with no final-channel message")
    end = _MESSAGE_END.search(data, final.end())
    return data[final.end() : end.start() if end else len(data)], 0


def extract_final(response: str) -> Final:
    """The final answer: the last "Answer:" (or "####") marker's value, plus any later box, and the
    values of earlier markers, which must agree; else the last "<answer>" tag; else the boxes on the
    line of the last box; else the last sentence "the answer is ..." (G1).

    Works on UTF-8 bytes: `bytes.lower()` folds ASCII letters only, so offsets stay aligned and
    look-alikes (Cyrillic "А", the Kelvin sign) never spell "answer" (deviation 18). Every search
    is a C-speed `find`/`rfind`: the last marker is found from the last colons (the answer is
    almost always in the last line; the hot loop needs >= 50k responses/s), and earlier markers
    from their colons too (`_markers`), a memchr scan of the text before the final one.
    """
    data = response.encode("utf-8", "replace")  # lone surrogates become "?": encoding never raises
    ascii_text = response.isascii()  # str.isascii: O(1)
    start = 0
    tags = b"<" in data
    if tags or not ascii_text:  # G1: every token and tag has a "<" (or is non-ASCII: "◁think▷")
        read = _response_text(data, ascii_text)
        if isinstance(read, Final):
            return read
        data, start = read
        tags = b"<" in data
    hashes = data.rfind(b"####", start) if b"#" in data else -1  # GSM8K's marker, "#### 18"
    if hashes >= 0 and not (_HASH_MARKER.match(data, hashes) and (hashes == start or data[hashes - 1] in b"\n .")):
        hashes = -1
    # The last marker, found from its colon: a C-speed rfind per colon, and colons are few (the
    # common case: the marker's own, in the last line); "answer" in any ASCII case before it.
    echoed, hi, wide = False, len(data), not ascii_text
    while hi > start:
        colon = data.rfind(b":", start, hi)
        wide_colon = data.rfind(_FULLWIDTH_COLON, start, hi) if wide else -1
        wide = wide_colon >= 0  # none before this one means none further back either
        if colon < 0 and wide_colon < 0:
            break
        hi = max(colon, wide_colon)
        if hi < hashes:
            break  # the "####" line comes last
        if hi == colon and data[colon - 1 : colon] not in _BEFORE_COLON:
            continue  # most colons follow a byte that can end neither "answer" nor a gap
        i = _answer_before(data, start, hi)
        if i < 0:
            continue  # "ratio 3:2", "Note:": not a marker
        j = hi + (1 if hi == colon else len(_FULLWIDTH_COLON))
        final = _after_marker(data, start, i, j, tags, ascii_text)
        if final is None:
            echoed = True  # deviation 11: the prompt's instruction, echoed back
            continue
        return final
    if hashes >= 0:
        return _after_marker(data, start, hashes, hashes + 4, tags, False) or _SPAM

    tag = _last_answer_tag(data, start) if tags else None
    if tag is not None:  # G1: "<answer>18</answer>", with the boxes after it as candidates (17)
        content, tag_start, tag_end = tag
        before, _ = _section_before(data, start, tag_start)
        later = box_starts(data, tag_end, len(data))
        after = _stated_after(data, tag_end)
        if before is None or after is None or 1 + len(later) + len(before) + len(after) > MAX_FINAL_BOXES:
            return _SPAM
        candidates = (content, *(box_contents(data, box) for box in later))
        return Final(candidates=candidates, section=(*before, *after), data=data, text_start=start, final_start=tag_start,
                     final_at=tag_end)  # fmt: skip
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
        return Final(candidates=(content,), section=(*before, *after), boxes_only=True, same_line=same_line,
                     data=data, text_start=start, final_start=last.start(),
                     final_at=_contents_at(data, content, last.start(), box_end))  # fmt: skip
    if echoed:
        return Final(reason="echoed_prompt", detail="the only 'Answer:' is the prompt's instruction")
    stated = _last_answer_sentence(data, start)
    if stated is not None:  # G1: "The answer is 18." (lm-evaluation-harness' gsm8k_cot format)
        return _after_marker(data, start, stated[0], stated[1], tags, False) or _SPAM
    return Final(reason="no_answer", detail="no 'Answer:' line, no \\boxed{} and no 'the answer is'")


def _after_marker(data: bytes, start: int, i: int, j: int, tags: bool, ascii_only: bool) -> Final | None:
    """The Final of a marker whose word starts at i and whose value follows from j (its colon's end),
    or None when the value is the prompt's instruction echoed back (deviation 11)."""
    # Like the official "\s*", the value may start on a later line; "**" closes "**Answer:**".
    j = _LEADING.match(data, j).end()
    line_end = data.find(b"\n", j)
    line_end = len(data) if line_end < 0 else line_end
    line = data[j:line_end].decode("utf-8", "replace")
    if _ECHO.match(line):
        return None
    # deviation 20: the values of earlier markers; one memchr when there is no other colon
    no_colon = data.find(b":", start, i) < 0 and ascii_only
    earlier = () if no_colon else _earlier_values(data, start, i)
    if earlier is None:
        return Final(reason="multiple_answers", detail=f"over {MAX_ANSWER_LINES} 'Answer:' lines")
    later = box_starts(data, line_end, len(data))
    tag = _last_answer_tag(data, line_end) if tags else None  # a tag after the line must agree, as a box (17)
    if len(later) > MAX_FINAL_BOXES:
        return Final(reason="multiple_answers", detail=f"over {MAX_FINAL_BOXES} boxes after the final answer")
    # deviation 23: the values the final answer section states around it must agree with it
    before, _ = _section_before(data, start, i)
    earlier_values = tuple(value for value, _ in earlier) if earlier else ()
    if not later and line_end == len(data) and not before and tag is None:  # the common case, kept cheap
        if before is None:
            return _SPAM
        ends = tuple(end for _, end in earlier) if earlier else ()
        return Final((line,), "", "", earlier_values, (), False, (), data, start, i, j, ends)  # positional: the hot path
    # deviation 17: and so must the boxes after the answer line
    spans = [box_span(data, box) for box in later]
    after = _stated_after(data, spans[-1][1] if spans else line_end)
    if before is None or after is None or 1 + len(spans) + len(before) + len(after) > MAX_FINAL_BOXES:
        return _SPAM
    section = (*before, *after)
    candidates = (line, *(content for content, _ in spans), *(tag[:1] if tag is not None else ()))
    return Final(candidates=candidates, earlier=earlier_values, section=section, data=data, text_start=start,
                 final_start=i, final_at=j, earlier_ends=tuple(end for _, end in earlier) if earlier else ())  # fmt: skip


# "#### 18": GSM8K's final-answer marker, at the start of a line or after a full stop, followed by a
# value, not a word ("#### Final Answer" is a markdown heading).
_HASH_MARKER = re.compile(rb"####[ \t]*(?=[^\sA-Za-z#])")  # a value ("#### 18", "#### $18$"), not a heading
# "The answer is 18.", "So the final answer is $18$": the statement of lm-evaluation-harness'
# gsm8k_cot and of many few-shot prompts, read only when the response has no marker, tag or box.
_IS_AFTER_ANSWER = re.compile(rb"\s+is(?![a-z])\s*:?")


def _last_answer_sentence(data: bytes, start: int) -> tuple[int, int] | None:
    """(start, end) of the last "the answer is" of data[start:] (its "answer" and what follows "is"),
    else None. Found from the end with rfind ("answer" or "Answer"; not all capitals)."""
    at = data.rfind(b"nswer", start + 1)
    while at > start:
        verb = _IS_AFTER_ANSWER.match(data, at + 5)
        if verb is not None and data[at - 1 : at] in (b"a", b"A") and not data[at - 2 : at - 1].isalpha():
            return at - 1, verb.end()
        at = data.rfind(b"nswer", start + 1, at)
    return None


def _contents_at(data: bytes, content: str, start: int, end: int) -> int:
    """Where a box's contents start in data[start:end] (its end when they are not found as such)."""
    at = data.rfind(content.encode("utf-8", "replace"), start, end)
    return at if at >= 0 else end


def anchors(final: Final) -> list[tuple[str, int]]:
    """(text, end offset) of the explicit statements before the final one that G5 compares: every
    earlier "Answer:" line, and the boxes within ANCHOR_REACH bytes before it. After one that states
    the final value, the text up to the final statement must state no other value as the result."""
    found = list(zip(final.earlier, final.earlier_ends)) if final.earlier else []
    if final.data.find(b"box", max(final.text_start, final.final_start - ANCHOR_REACH), final.final_start) >= 0:
        found += _box_anchors(final.data, final.text_start, final.final_start)
    return found


def _box_anchors(data: bytes, start: int, p: int) -> tuple[tuple[str, int], ...]:
    """(contents, end) of the boxes within ANCHOR_REACH bytes before offset p (G5 anchors)."""
    lo = max(start, p - ANCHOR_REACH)
    if data.find(b"box", lo, p) < 0:  # the common case
        return ()
    anchors = []
    for box in box_starts(data, lo, p):
        content, end = box_span(data, box)
        if end <= p:
            anchors.append((content, end))
    return tuple(anchors)


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
    nothing else (ANSWER_ONLY), and not into an earlier "Answer:" line (a final answer of its own,
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
    rfind, answer_only = data.rfind, ANSWER_ONLY.fullmatch  # the hot loop: bound once
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
        if line_end == end < len(data) or not ANSWER_ONLY.fullmatch(data, q, line_end):
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


def _earlier_values(data: bytes, start: int, final: int) -> tuple[tuple[str, int], ...] | None:
    """(value, end offset) of the "Answer:" markers in data[start:final], echoes left out (deviation 20);
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
        line, line_end = _value_line(data, colon_end, until)
        if not _ECHO.match(line):
            values.append((line, line_end))
    return tuple(values)
