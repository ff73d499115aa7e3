"""Prompts as token ids: chat messages through the tokenizer's chat template in one batch call, and the check of
what the tokenizer's round trip changes in a dataset's text (task.Task.load uses both).

Plumbing a first reading skips: task.py says what a prompt is (`Task.messages`, `Task.prompt_ids`); this
file turns many of them into token ids at once (a dataset's 20,000 prompts are tokenised once per run)
and reports, without refusing, the prompts a tokenizer cannot write exactly.
"""

from __future__ import annotations

import sys


def encode_chats(conversations: list[list[dict]], tokenizer) -> list[list[int]]:
    """Token ids of each conversation's chat messages: the tokenizer's chat template with the generation prompt,
    else plain lines; one batch call (`encode`)."""
    if not conversations:
        return []
    if tokenizer.chat_template:
        texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)
    else:
        texts = ["\n".join(m["content"] for m in msgs) + "\n" for msgs in conversations]
    return encode(tokenizer, texts)


def round_trip(task, problems: list, tokenizer, cfg, name: str) -> int:
    """How many prompts the tokenizer changes (text -> tokens -> text), reported on one line of stderr.

    A tokenizer without an unknown token drops what it cannot write (the tiny tokenizer turns
    `What is 12x34?` with a multiplication sign into `What is 1234?`): the model is then trained
    and scored on another text than the data's. The line counts the prompts changed in the
    problem's own text and those changed only around it (the instruction of task.messages, e.g.
    the official one's quotes), names the first few with the change, and the characters the
    tokenizer cannot write. Reported, not refused: a tokenizer lacking a script changes every row
    of a dataset (the tiny one drops the LaTeX backslashes of every AIME problem), and refusing
    would forbid the run outright; a byte-level tokenizer changes nothing. The chat template's own
    text is the model's and is not checked.
    """
    contents = [[m["content"] for m in task.messages(p, cfg)] for p in problems]
    back = iter(_through(tokenizer, [c for cs in contents for c in cs]))
    changed = [i for i, cs in enumerate(contents) if [next(back) for _ in cs] != cs]
    if not changed:
        return 0
    own = [[m["content"] for m in problems[i].messages] for i in changed]
    back = iter(_through(tokenizer, [c for cs in own for c in cs]))
    first = {}  # problem index: (its first changed text of its own, what came back)
    for i, cs in zip(changed, own):
        pairs = [(c, next(back)) for c in cs]  # every text: the iterator stays in step
        first.update({i: pair for pair in pairs[::-1] if pair[0] != pair[1]})  # reversed: the first change wins
    shown = list(first)[:3] or changed[:1]
    named = "; ".join(f"problem {problems[i].id}: " + " becomes ".join(map(repr, _excerpt_pair(*first[i]))) if i in first
                      else f"problem {problems[i].id} (around its text)" for i in shown)
    lost = _lost(tokenizer, [c for i in changed[:64] for c in contents[i]])
    print(f"[data] {len(changed)} of {len(problems)} prompts of {name} change in the tokenizer's round trip, and the model "
          f"sees the changed text: {len(first)} in the problem's own text, {len(changed) - len(first)} only around it (the "
          f"instruction); first: {named}" + (f". Characters the tokenizer cannot write: {lost}" if lost else "")
          + ". A tokenizer that covers them changes nothing (a byte-level BPE covers every character)", file=sys.stderr)
    return len(changed)


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens added: what `tokenizer(text, add_special_tokens=False)` gives, in
    one call of a fast tokenizer's own batch encoder, each distinct text once (DAPO-Math-17k repeats its rows)."""
    distinct = list(dict.fromkeys(texts))
    if getattr(tokenizer, "is_fast", False):
        encoded = [e.ids for e in tokenizer.backend_tokenizer.encode_batch(distinct, add_special_tokens=False)]
    else:
        encoded = tokenizer(distinct, add_special_tokens=False)["input_ids"] if distinct else []
    if len(distinct) == len(texts):
        return encoded
    by_text = dict(zip(distinct, encoded))
    return [list(by_text[t]) for t in texts]


def _through(tokenizer, texts: list[str]) -> list[str]:
    """Each text encoded and decoded again, exactly (no clean-up of spaces), each distinct text once (DAPO-Math-17k
    repeats its rows); a fast tokenizer's own batch calls, which do what its transformers wrappers do in a sixth
    of the time."""
    distinct = list(dict.fromkeys(texts))
    if len(distinct) < len(texts):
        back = dict(zip(distinct, _through(tokenizer, distinct)))
        return [back[t] for t in texts]
    if getattr(tokenizer, "is_fast", False):
        fast = tokenizer.backend_tokenizer
        return fast.decode_batch([e.ids for e in fast.encode_batch(texts, add_special_tokens=False)],
                                 skip_special_tokens=False)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return tokenizer.batch_decode(ids, clean_up_tokenization_spaces=False)


def _lost(tokenizer, texts: list[str]) -> str:
    """The characters of `texts` that do not survive the tokenizer alone, as a list of reprs ('' when none)."""
    chars = sorted({ch for t in texts for ch in t})
    return ", ".join(repr(ch) for ch, after in zip(chars, _through(tokenizer, chars)) if ch != after)


def excerpt(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _excerpt_pair(text: str, after: str, reach: int = 30) -> tuple[str, str]:
    """The two texts around their first difference, at most `reach` characters either side of it."""
    i = next((k for k, (a, b) in enumerate(zip(text, after)) if a != b), min(len(text), len(after)))
    cut = lambda t: ("..." if i > reach else "") + t[max(i - reach, 0) : i + reach] + ("..." if len(t) > i + reach else "")  # noqa: E731
    return cut(text), cut(after)
