"""Answer extraction and checking: the reward of DAPO, made exact, fair and impossible to hijack.

RL optimises the holes in its reward, so every mistake here becomes something the policy learns.
`score(response, ground_truth, mode=...)` returns a `Score` (correct, reward +1/-1, the extracted
prediction, a reason code). It never raises on model text; it raises on a bad ground truth or an
unknown mode. Three modes:

- "dapo" (default; integer ground truths as in DAPO-Math-17k and AIME). The last "Answer:" line
  decides, as in the official rule, without its false negatives, and every value the final answer
  section states must agree with it (deviation 23). Pure string work, linear time, no parser and
  no subprocess: this is the reward in the hot loop.
- "dapo-official": the official rule bit for bit, so a reproduction can score exactly as the paper
  did (DAPO, Yu et al. 2025, arXiv:2503.14476, whose reward is verl's
  `verl/utils/reward_score/math_dapo.py` `compute_score` with its default `strict_box_verify=False`):
  the last 300 characters of the response, the last match of `Answer\\s*:\\s*([^\\n]+)` in them
  (case-insensitive), the Minerva normalisation of lm-evaluation-harness `hendrycks_math`
  (`normalize_final_answer`) on it and on the ground truth, string equality, reward +1 or -1.
- "math": general answers (fractions, radicals, pi, intervals, tuples, equations, percent,
  degrees). Our code extracts and normalises; math-verify (huggingface/Math-Verify: LaTeX parser ->
  sympy, never `eval`) decides equivalence inside a persistent worker process that is killed past
  `timeout_s`, with our rule for comparing numbers (deviation 21).

The final-answer grammar of "dapo" and "math" (dapo-verifier-4). The rules are this table; the code
cites its rows (G1-G7), and the numbered deviations below record, case by case, how each part departs
from the official rule. In "math" mode a value is any LaTeX answer and rows G3-G5 do not apply (its
values contain words and letters); "dapo-official" follows none of it.

  row | part of the response                  | read as                          | e.g.
  ----+---------------------------------------+----------------------------------+-----------------------------
  G1  | the response                          | the text after the last          | "<think>..</think>Answer: 12"
      |                                       | "</think>", up to its first      | "Answer: 12<|im_end|>",
      |                                       | end-of-turn token (<|name|>,     | "12</s>", "12<|eot_id|>",
      |                                       | </s>, <eos>, <end_of_turn>)      | "12<|endoftext|>"
  G1  | the final statement                   | the last "Answer:" line, else    | deviations 7, 8, 13, 14, 20
      |                                       | the last <answer>..</answer>,    | and 23; "<answer>18</answer>"
      |                                       | else the last box; all values of |
      |                                       | the final answer section agree   |
  G2  | transparent wrappers, nested in any   | the value they wrap:             |
      | order:  markup                        |                                  | "**13**", "`13`", "<b>13</b>"
      |         math delimiters, environments |                                  | "$13$", "\\(13\\)", "\\[13\\]"
      |         boxes, text and style         |                                  | "\\boxed{13}", "\\text{13}"
      |         units, percent, degrees       |                                  | "13 apples", "13\\,\\text{cm}"
      |         trailing punctuation, LaTeX   |                                  | "13.", "13;", "$13$ \\\\",
      |         spacing and line breaks       |                                  | "13\\quad", "\\qquad 13"
      |         digit groups                  |                                  | "1,000", "18 {, }936"
      |         a congruence's modulus        | the residue, never the modulus   | "x \\equiv 3 \\pmod 7": 3
      |         an equation's other side      | every numeric side must agree    | "x = 13", "13 = m + n"
  G3  | a sentence frame before the value     | the value, when the frame states | "The largest $n$ is 34.",
      |                                       | no other value (digits or words) | "There are 34 ways."
      |                                       | and neither hedges nor changes it|
  G4  | working after the value, in brackets  | never read: adds no candidate,   | "18 (3 boxes of 6 eggs)",
      | or after , ; - or a full stop         | but refused if it hedges or is a | "18, 3 boxes of 6 eggs",
      |                                       | value of its own ("18 (19)")     | "18 (= 6 \\times 3)"
      |   a clause or closing phrase          | never read (deviation 15)        | "56, since 7 x 8 = 56"
  --- | refused, reward -1:                   |                                  |
  G2-4| two different values                  | multiple_answers                 | "12, 13", "12 or 13",
      |                                       |                                  | "18 (19)", "18, nineteen",
      |                                       |                                  | a column of boxes (23)
      | a relation or a hedge                 | malformed                        | "12 or more", "at least 12",
      |                                       |                                  | "The answer is about 12"
      | a word or sign that changes the value | malformed                        | "6 squared", "twice 17",
      |                                       |                                  | "10^4", "2 \\times 6"
      | an option letter alone                | malformed                        | "(B)", "\\text{(C)}"
  G5  | a final statement the text then takes | multiple_answers                 | "if all were valid it would
      | back: after it, a word of contrast    |                                  | be \\boxed{19}, but two are
      | (but, however, actually, wait), or a  |                                  | invalid, so the actual
      | box in a hypothetical sentence (would |                                  | count is 17."; "Answer: 19
      | if), then another value after a       |                                  | Wait, the answer is 17."
      | copula (after an "Answer:" line, one  |                                  |
      | said to be the answer: "the actual    |                                  |
      | count is", "the answer is")           |                                  |
  G6  | math mode: empty set notations        | one set, not {0}                 | "\\varnothing" == "\\{ \\}"
      |   set difference                      | read as \\setminus                | "\\mathbb{R} \\backslash \\{0\\}"
      |   a ground truth that is an equation  | a value without "=" is wrong     | "0" != "a + z = 0";
      |                                       | unless it assigns one variable   | "5" == "x = 5"
  G7  | math mode: an answer too expensive to | malformed, before parsing; the   | "\\binom{10^7}{5 \\cdot 10^6}",
      | evaluate (see MAX_VALUE_DIGITS ff.)   | time limit covers the whole call | "9^{9^{9^{9}}}", "100000!"

A frame (G3) is words, variables ("$a_{10}$", "$m+n$", "$2a$": no value of their own), Greek
letters and text commands up to the value. It hedges with "maybe", "probably", "approximately",
"would", "if", "or", "at least", "than", "is not" and their kin anywhere in it, and changes the value
when the word right before it is one of "about", "over", "under", "of", "by", "twice", "half",
"squared", "not", "plus", "minus", ...; number words in it must spell the value. Working (G4) is text
with digits that does not itself read as a value; it is cut before the value is read, so it can
hold numbers without adding candidates ("the stated value is the first number"). A bracket or item
that is a value of its own ("18 (19)", "18, 19 eggs", "18, as well as 19", "x = 1, y = 2") stays a
second value, and one that hedges ("18 (or 19)", "18, maybe 19") is refused. Boxes inside an
"Answer:" line are wrappers too (G2): the line is read with their contents in place, so "\\boxed{12}
or 13" is two values; when the words around the boxes state nothing (no digit, hedge or value
word), the boxes alone are the value, as before (deviation 8).

How the "dapo" mode departs from the official rule, with the case that motivated each change:

 1. The whole response is searched, not its last 300 characters.
    "Answer: 13" followed by 400 characters of double-checking: official says wrong.
 2. A trailing period (or CJK full stop) after the value is dropped. "Answer: 13." : official wrong.
 3. Markup around the marker or the value is dropped: markdown, inline code and HTML,
    "**Answer:** 13", "**Answer**: 13", "__Answer__: 13", "Answer: **13**", "Answer: `13`",
    "Answer: `$13$`", "**Answer**: $`13`$", "Answer: <code>13</code>"; LaTeX styling,
    "\\underline{13}", "\\emph{13}", "\\bm{13}", "{\\bf 13}", "\\textcolor{red}{13}",
    "\\displaystyle 13". Official compares "**13**" with "13" and misses "**Answer**:".
 4. Math delimiters and wrappers around the value are removed, in any nesting:
    "Answer: \\(13\\)", "Answer: $\\boxed{13}$.", "Answer: \\text{13}". Official: only some of these.
 5. Leading zeros are ignored and the integer value compared. "Answer: 013" (AIME style) for 13.
 6. Thousands separators are removed wherever they are valid groupings (one to three digits, then
    groups of exactly three, one kind of separator throughout): commas, LaTeX's "1\\,000",
    "1{,}000", "1,\\!000", "2\\ 500\\ 000", "2~500~000", spaces, thin and no-break spaces,
    "2 500 000" (official: only bare "1,000" with nothing else). "2 50 000", "25,00,000",
    "1,000 000" and "12 13" are not groupings: a list is never read as one number.
 7. A response with no "Answer:" line is judged on its last box (deviation 13 lists the spellings).
    "... so the answer is \\boxed{13}." : official wrong.
 8. A box inside the answer line is the value, read with the words around it (G2, G3).
    "Answer: the final answer is \\boxed{13}" : official compares "thefinalansweris13".
 9. Units and signs after the value are ignored: "13 apples", "13 \\text{cm}^2", "\\$13", "13\\%",
    degrees in every spelling ("13^\\circ", "13^{\\circ}", "13\\degree", "13\\textdegree", "13°"),
    compound and LaTeX units ("12 \\text{ m/s}", "8\\ \\mathrm{cm}^3", "30 \\mbox{ dollars}",
    "12\\,\\mathrm{m\\,s^{-1}}", "100 km/h"), units outside the value's math ("$12$ meters").
    A unit is a word of two letters or more, any letters inside a text command (but not an upright
    i, e or j), or a compound of SI symbols; never a word that changes, hedges or hides the value:
    "13 or more", "13 pi", "6 squared", "12 dozen", "12 x", "12 x/y", "12\\mathrm{i}" stay
    malformed, and a scale word is part of the value ("2.5 million" is 2500000, short scale).
    Official removes only a fixed list of units.
10. "13.0" equals 13 (a zero fraction); U+2212 "−3" is "-3", and a space may follow the sign
    ("$- 4$", "-\\,4"; an en dash is not a minus sign); a full-width colon "Answer：" is a marker
    (the Chinese DAPO-Math-17k prompts produce it).
11. The instruction echoed from the prompt is not an answer: "Answer: $Answer" and
    'after "Answer:".' are skipped. Official judges the echo when it comes last.
12. Only text after the last "</think>" counts, and a response whose last tag is an unclosed
    "<think>" has no final answer yet: an "Answer:" inside a reasoning block is not the final answer.
13. Every LaTeX spelling of a box is a box: "\\fbox{314}", "\\boxed {314}", "\\boxed{{314}}",
    "\\framebox[2cm][c]{314}", "\\colorbox{yellow}{314}", "\\fcolorbox{red}{white}{314}",
    "\\Aboxed{x &= 314}" (mathtools), "\\bbox[border:1px]{314}" (MathJax), "\\doublebox{314}",
    "\\ovalbox", "\\Ovalbox", "\\shadowbox" (fancybox). Official reads none of them (its boxed
    variant, `strict_box_verify=True`, looks for "\\boxed{" only). A box command with no brace group
    ("\\boxed 7", "\\fbox 7", "$\\boxed 314$.") boxes the rest of its math or line, as the MATH
    benchmark's own grader reads it (`last_boxed_only_string`, also in lm-evaluation-harness
    `minerva_math`); a box with nothing after it is malformed.
14. The answer line may sit inside display or inline math, the closing delimiter outside the
    value: "\\[Answer: 512\\]", "$$Answer: 512$$", "\\(Answer: 512\\)", "$\\text{Answer: } 512$",
    "\\textbf{Answer:} 512", "\\begin{equation}Answer: 512\\end{equation}", "Answer:\\n\\[\\n512\\n\\]",
    "\\begin{align*}\\text{Answer: } &512\\end{align*}". Official: wrong for most.
15. A subordinate clause after the value is an explanation, not more candidates, and is not read:
    "Answer: 56, since 7 x 8 = 56.", "Answer: 56 (because 7 times 8 is 56)", "Answer: 56, which is
    7 x 8", "Answer: 56. This is because ...", "Answer: 56 \\text{ since } ...". It opens with a
    word from a fixed list: since, because, as, which, where, given, using, i.e., e.g. after a space
    or punctuation; from, by, via, due to, obtained, computed, calculated, found, following,
    according, so, hence, thus, therefore only after punctuation ("12 by 13" stays unread); "as
    well as" and "such as" open none. Only the value before it counts, so a clause can never add a
    candidate; "56, 57", "56 or 57" and "56, as well as 57" stay several answers. Official: wrong
    for all (it keeps the text after the last "=": "56."). So is a gloss in brackets or a closing
    phrase of words alone after a comma, dash or full stop, "36 (thirty-six)", "81, altogether.",
    "17. I hope it is correct.", and a statement before the value, "The final answer is $17$" (the
    Minerva format). Number words in a gloss or phrase must spell the value ("36 (thirty-seven)" and
    "12, thirteen" are multiple_answers), and words that change or hedge it ("81, approximately",
    "81, to the nearest integer", "81, or so", "6 (squared)") leave the answer malformed.

And where it is stricter (each an exploit of a string-matching reward; all score "wrong"):

16. Several candidates in the final answer are wrong: "x = 12 or x = 13" (official: correct for 13,
    it keeps only the text after the last "="), "12, 13", "12-13", "1, 2, 3, ..., 100".
17. A box after the final "Answer:" line that disagrees with it is a contradiction.
18. Only ASCII letters spell "answer" and only ASCII digits are digits: Cyrillic "Аnswer",
    full-width "１３", superscripts and Arabic-Indic digits never count as 13.
19. The ground truth must be an integer (DAPO-Math-17k and AIME are); anything else raises.
20. Every "Answer:" line after the last "</think>" is a final answer, and they must all state the
    same value: "Answer: 17\\nAnswer: 18\\nAnswer: 19" is a spray of guesses (multiple_answers;
    official: correct for 19), "Answer: 19 ... Answer: 19" is fine. A corrected answer is several
    answers too: "Answer: 17. Wait, that is wrong. ... Answer: 19" scores multiple_answers. Reason:
    any exception keyed on retraction words ("wait", "wrong", "actually") is a string the policy
    learns to emit between guesses, and the prompt asks for one final "Answer:" line; a model that
    corrects itself can do so before writing it (or inside <think>). An earlier line's value is
    its reading by the rules above, else the number it starts with ("17. Wait, ..." states 17);
    a line that states no number ("To answer: we first ...") is not compared. Earlier boxes are
    compared only inside the final answer section (23): a box may hold an intermediate result.

Added in dapo-verifier-3 (each kind has its table of cases in tests/test_verifier_notation.py):

23. The final answer section: the final statement (the last "Answer:" line, else the last box) with
    every box and stated value that only answer-statement text separates from it, and every value
    must be the same. That text is line breaks, punctuation, markdown, math delimiters and LaTeX
    spacing, list markers ("1.", "(2)", "-"), and the words of a statement or a hedge (answer,
    final, the, is, are, so, thus, hence, therefore, or, and, also, maybe, perhaps, possibly,
    alternatively, either, it, could, might, be). Any other word is reasoning and ends the section,
    wherever the line breaks fall. So a column of boxed guesses, "\\boxed{3}\\n\\boxed{4}\\n...
    \\n\\boxed{19}" (official and dapo-verifier-2: correct for 19), boxes in one display or an
    aligned environment, a box above "Answer: 19", "The answer is 17." above "\\boxed{19}", and
    "Answer: 19\\n18\\n17" are multiple_answers, while a retraction in words, "\\boxed{12}. Wait,
    that double counts... **Final Answer** \\boxed{15}", leaves 15, on one line or many (its words
    are the reasoning a correction needs; a policy that pads guesses with them gains nothing, since
    only the last is read). A bare number above the section is not read (the end of a computation),
    one below it is. More than MAX_FINAL_BOXES values is spam; the section reaches SECTION_REACH
    bytes each way (bounded work), and not into an earlier "Answer:" line (20 compares those in
    dapo mode; math mode leaves them, as before).
24. Exact integers of any length: an answer of digits alone (valid groupings allowed, in one box or
    none) is compared whole, past MAX_ANSWER_CHARS ("Answer: " and the 1,202 digits of 525!);
    anything else keeps the limit.
25. Scientific notation, exact: "3.5 \\times 10^{4}", "3.5\\cdot10^4", "3.5e4", "35 \\times 10^3"
    are 35000 ("10^12" is 10^{12}, as math-verify reads it); a value that is not an integer is wrong
    ("3.14 \\times 10^1"); the exponent has at most four digits; "10^4" alone and "3.5 \\times 10"
    are arithmetic, malformed.
26. Either side of an equation states the value: "17 = x", "512 = 2^9", "x = 512 = 2^{9}"; every
    side that reads as a number must agree ("12 = 13", "16 = 4^2 = 17" are multiple_answers).

The "math" mode extracts the final answer with the same rules (1-18, 23, and G1-G2 of the grammar;
the last "Answer:" line decides, earlier ones are not compared as in 20), then: our normaliser
removes \\left/\\right, \\dfrac, spacing commands and thousands separators; alternatives ("or", "\\pm") and
lists count as several answers unless the ground truth is a set of values too (22), and an
ellipsis unless the ground truth has one; non-ASCII characters other than a few math symbols
(π ° ∞ × · ≤ ≥ −) are malformed; two identical strings or two plain integers are decided here;
everything else goes to math-verify's LaTeX parser and `verify` (percent and degrees compare as
plain numbers there: "50\\%" == 50, "30^\\circ" == 30). math-verify's plain-expression extractor is
never used: it calls sympy's parse_expr, i.e. eval(). Departures from math-verify 0.9.0:

21. Numbers are compared exactly, not by rounding. math-verify rounds to 6 decimal places when
    either side is a decimal and otherwise drops differences below about 1e-15, so
    "\\frac{1}{3^{60}}" == "\\frac{1}{3^{61}}" and "0.0000008" == "0.0000007" there; both are wrong
    here. Exact values (integers, fractions, powers, radicals, pi) compare exactly; a decimal is the
    exact number it spells, compared exactly with any value that has a finite decimal expansion
    ("0.5" == "\\frac12", "12.0000001" != 12); only a decimal against a value with none (1/3, pi,
    sqrt 2) uses a relative tolerance, |a - b| <= 5e-6 * max(|a|, |b|), which accepts every correct
    rounding to 6 significant digits ("0.333333" for 1/3, "3.14159" for pi) and rejects "0.33333"
    (1e-5 off) and "3.14".
22. Both signs listed are the set that "\\pm" denotes: "\\boxed{-12, 12}", "\\boxed{12, -12}",
    "12 \\text{ or } -12" for "\\pm 12", and "\\pm 12" for "-12, 12", are correct; "\\boxed{12}"
    alone is not (a set is compared as a whole, so an extra value never helps). When the ground
    truth is a set of values, several boxes on the final line list it: "\\boxed{12}, \\boxed{-12}",
    and so do the boxes of the final answer section (23), "\\boxed{12}\\n\\boxed{-12}".
27. A repeating decimal is the exact fraction it denotes: "0.\\overline{6}" == "\\frac{2}{3}",
    "0.1\\overline{6}" == "\\frac{1}{6}", "1.\\bar{3}", "0.\\dot{3}", "0.\\dot{1}4285\\dot{7}"
    (math-verify 0.9.0: "0.\\overline{6}" != "\\frac{2}{3}"); and "0.\\overline{6}" != "0.6".
28. The real line and its standard half-lines are intervals: "\\mathbb{R}", "\\R", "ℝ",
    "all real numbers" == "(-\\infty, \\infty)", "\\mathbb{R}_{\\geq 0}" == "[0, \\infty)",
    "\\mathbb{R}_{>0}" == "(0, \\infty)" ("\\mathbb{R}^+" is left alone: authors disagree on 0).
    A comma inside brackets belongs to one interval, point or set and is not a list of answers,
    so "(-\\infty, \\infty)" is compared with "\\mathbb{R}" (dapo-verifier-2: multiple_answers);
    "1, 2" is still a list.
29. Time: a prediction nested more than MAX_NESTING_DEPTH brackets deep or of more than
    MAX_ANSWER_TOKENS tokens is malformed before it reaches the parser, which would take seconds
    on it (a \\frac nested 90 deep ran into the time limit); see the two constants for the
    measurements. A timeout kills its worker, and spare workers are kept started ahead, so the
    next call takes one ready instead of waiting 2-4 s for a worker to start.

Added in dapo-verifier-4 (the grammar above; each kind has its table of cases and its properties in
tests/test_verifier_grammar.py):

30. End-of-turn tokens end the response (G1): "Answer: 12<|im_end|>" (dapo-verifier-3: malformed).
    Without an "Answer:" line, an "<answer>...</answer>" pair is the final statement, the format of
    many GRPO recipes (was no_answer, or its last box); after one, such a pair must agree with it.
31. A sentence frame around the one value (G3): "Final Answer: The largest $n$ is 34." (was malformed).
32. Working after the value (G4): "Answer: 18 (3 boxes of 6 eggs)" states 18, the first number
    (was malformed; the official rule compares "18(3boxesof6eggs)").
33. Trailing LaTeX line breaks and spacing (G2): "Answer: $24$ \\\\" (was malformed).
34. "{,}" groups with stray spaces (G2): "18 {, }936" is 18936, as the official rule reads it (was
    multiple_answers).
35. Congruences (G2): "x \\equiv 3 \\pmod 7", "3 \\bmod 7", "3 \\mod 7", "3 (mod 7)" state 3; the
    modulus is never the answer (was malformed). Math mode drops the modulus when the ground truth
    has none.
36. A box the text takes back (G5): "... would be \\boxed{19}, but two are invalid, so the actual
    count is 17." is multiple_answers (was correct for 19: a false positive). After an "Answer:"
    line, the format the prompt asks for, only a restatement said to be the answer takes it back
    ("Wait, the answer is actually 17", "the actual count is 17", "the correct total is 17"), so
    that a check written after it ("Wait, let me double-check: there are 10 ways ...") does not
    cost a right answer. "=" and ":" restate nothing: a check ("19 = 10 + 9") takes nothing back;
    the value must follow a copula or a verb of result within _RETRACTION_REACH bytes of the
    contrast word.
37. Boxes are read with the words around them (G2): "Answer: \\boxed{12} or 13" is multiple_answers
    (was correct for 12: the words beside a box were not read).
38. Math mode, sets and relations (G6): "\\varnothing", "\\emptyset", "\\{\\}", "\\{ \\}", "∅" are one
    set (math-verify 0.9.0: "\\varnothing" != "\\emptyset"); "\\backslash" and a minus sign between
    sets ("\\mathbb{R} - \\{0\\}") are "\\setminus"; a modulus has one spelling ("\\pmod{7}"); a value
    without "=" against a ground truth that is an equation is wrong unless the equation assigns one
    variable ("0" against "a + z = 0": math-verify says equal, comparing right-hand sides; the rule
    is written at _TOP_EQUALS).
39. Time (G7): an answer whose value would take sympy seconds to build or expand is refused before
    parsing (MAX_VALUE_DIGITS, MAX_FACTORIAL_ARGUMENT, MAX_EXPANSION_TERMS, MAX_SERIES_TERMS,
    MAX_SERIES_WORK, each with its measurement): binomials of ten-million-scale arguments, towers of
    exponents, huge factorials (they ran into the 2 s limit). The time limit covers the whole
    call: the wait for a free worker and the kill after a timeout included (TIMEOUT_MARGIN_S), and
    SPARE_WORKERS spares are kept, so the call after a timeout does not wait for a worker to start.
    The first worker of a process starts in `prepare` (task.Task.load calls it under --verifier
    math); a process that scores without it waits for that start (1.5-3.3 s) on its first call.

Run `python verifier.py ROLLOUTS.jsonl` to hand-check saved rollouts (see `main`).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import functools
import itertools
import json
import logging
import math
import os
import re
import resource
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["VERSION", "MODES", "REASONS", "EXCEPTION_REASONS", "Score", "score", "score_batch"]

# Changes whenever any rule changes: train and eval record it with every score.
VERSION = "dapo-verifier-4"
MODES = ("dapo", "dapo-official", "math")

# Every reason code, and what it means. A Score is correct only with reason "ok".
REASON_DOCS = {
    "ok": "one final answer, equal to the ground truth",
    "wrong": "one well-formed final answer, not equal to the ground truth",
    "no_answer": "no 'Answer:' line and no \\boxed{} (or an unclosed <think> block)",
    "empty_answer": "an 'Answer:' marker with nothing after it",
    "placeholder": "a template placeholder instead of an answer ('...', '[answer]', '<final_answer>')",
    "echoed_prompt": "the only answer marker is the prompt's instruction echoed back",
    "multiple_answers": "several candidates ('12 or 13', a list, a range) or contradicting final answers",
    "malformed": "an answer that is not of the accepted form (dapo: a single ASCII integer), too long, or (math) "
    "nested or long past the parse limits",
    "parse_error": "math mode: the math parser could not read the answer or raised while comparing",
    "timeout": "math mode: parsing or comparing took longer than timeout_s; the worker was killed",
    "worker_error": "math mode: the worker process died or ran out of memory",
}
REASONS = tuple(REASON_DOCS)
# Counted as "verifier exceptions" in run metrics: the verifier, not the policy, failed to decide.
EXCEPTION_REASONS = frozenset({"parse_error", "timeout", "worker_error"})

DEFAULT_TIMEOUT_S = 2.0
# Structural limits on a math-mode prediction, checked before it reaches the parser (deviation 29).
# math-verify's LaTeX grammar (ANTLR, adaptive prediction) and sympy's simplification cost time that
# grows steeply with nesting: measured in a fresh worker on a 2-core x86-64 machine, 16 parentheses
# deep 1.3 s, 14 braces deep 7.6 s, \frac nested 16 deep 3.7 s and 20 deep 79 s; 8 deep at most 0.7 s,
# and 160 tokens at most 0.5 s (a 300-element tuple: 2.5 s). The MATH-500 answers nest 2 deep at most
# and have at most 32 tokens (a 3-vector of fractions), so 8 and 160 leave room for any real answer.
MAX_NESTING_DEPTH = 8
MAX_ANSWER_TOKENS = 160
_LATEX_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[0-9]+(?:\.[0-9]+)?|\S")  # a command, a number, a character
# Longest answer text we look at. The longest MATH-500 answer has 159 characters (verl's
# math_dapo.py comment); 1000 leaves room for matrices and keeps every step cheap.
MAX_ANSWER_CHARS = 1000
# Address-space cap of a math worker, so "9^9^9^9" ends in MemoryError, not in the host's OOM killer.
WORKER_MEMORY_BYTES = 3 * 1024**3
WORKER_START_TIMEOUT_S = 120.0  # importing sympy + math-verify on a loaded machine; not model time


@dataclass(frozen=True)
class Score:
    """The verdict on one response."""

    correct: bool
    reward: float  # +1.0 if correct else -1.0 (the overlong term is added by the caller)
    pred: str | None  # extracted, normalised prediction; None when nothing was extracted
    reason: str  # one of REASONS
    detail: str = ""  # human-readable note for the CLI and logs (never used for the verdict)


@functools.lru_cache(maxsize=4096)  # a Score is immutable: the same verdict is built once (the hot loop's ~1 us)
def _verdict(correct: bool, pred: str | None, reason: str, detail: str = "") -> Score:
    return Score(correct, 1.0 if correct else -1.0, pred, reason, detail)


# --- extraction: find the final answer (used by "dapo" and "math") ----------------------------


class _Final(NamedTuple):  # a NamedTuple: built once per response in the hot loop, and cheap
    """The final-answer text of a response, or why there is none."""

    candidates: tuple[str, ...] = ()  # texts that must all agree: the final statement, then later boxes
    reason: str = ""  # "" when candidates were found, else a reason code
    detail: str = ""
    earlier: tuple[str, ...] = ()  # values of earlier "Answer:" markers (deviation 20)
    section: tuple[str, ...] = ()  # the other values of the final answer section (deviation 23)
    boxes_only: bool = False  # no "Answer:" marker: the final statement is the last box
    same_line: tuple[str, ...] = ()  # boxes-only: the boxes on the last box's line outside the section
    restated: tuple[str, ...] = ()  # values the text after the final statement restates it with (G5)


# Every LaTeX spelling of a framed or highlighted answer (deviation 13): the kernel's \fbox and
# \framebox[width][pos]{...}, xcolor's \colorbox{colour}{...} and \fcolorbox{frame}{back}{...},
# amsmath's \boxed, mathtools' \Aboxed, MathJax's \bbox[options]{...}, fancybox's four frames.
_BOX_NAMES = rb"boxed|fbox|framebox|fcolorbox|colorbox|bbox|Aboxed|doublebox|ovalbox|Ovalbox|shadowbox"
_BOX = re.compile(rb"\\(" + _BOX_NAMES + rb")(?![A-Za-z])")
_BOX_NAME_REACH = 7  # most bytes between the backslash and the "box" inside a name ("\fcolorbox")
_BOX_COLOUR_ARGS = {b"colorbox": 1, b"fcolorbox": 2}  # brace groups before the content
_BOX_OPTION = re.compile(rb"\s*\[[^\[\]{}\n]{0,100}\]")  # "[2cm]", "[rgb]", "[5px,border:2px solid]"
_BOX_COLOUR = re.compile(rb"\s*\{[^{}\n]{0,100}\}")  # "{yellow}", "{0.9,0.9,1}"
_BOX_OPEN = re.compile(rb"\s*\{")  # LaTeX allows "\boxed {13}"
_BRACE = re.compile(rb"[{}]")
# A box command with no brace group (deviation 13): its argument runs to the end of its line or
# math, as in lm-evaluation-harness' minerva_math last_boxed_only_string ("\boxed 7$" -> "7").
# Small brace groups and commands ride along ("\boxed 1{,}000", "\fbox 3\times10^4"); a closing
# delimiter, "\\", "\end{" or the next box ends it.
_BRACELESS_ARGUMENT = re.compile(
    rb"[ \t]*((?:[^\s\\${}]|\{[^{}\n]{0,100}\})(?:[^\n\\${}]|\{[^{}\n]{0,100}\}"
    rb"|\\(?![\])\\]|end\{|(?:" + _BOX_NAMES + rb")(?![A-Za-z]))(?:[A-Za-z]+|[^A-Za-z\n]))*)"
)
# A box holding only an integer, digit groups allowed, at any length (deviation 24).
_DIGITS_IN_BRACES = re.compile(rb"\{[ \t]*([+-]?[0-9](?:[0-9]|,[0-9]|\\,[0-9]|\{,\}[0-9]| [0-9])*)[ \t]*\}")
# More boxes than this in the final statement, or more "Answer:" lines than this before the final
# one, is spam, not an answer (and would cost work).
MAX_FINAL_BOXES = 16
MAX_ANSWER_LINES = 16
SECTION_REACH = 4096  # bytes the final answer section reaches on each side of its final statement
_SPAM = _Final(reason="multiple_answers", detail=f"over {MAX_FINAL_BOXES} values in the final answer section")
_FULLWIDTH_COLON = "\uff1a".encode()  # b"\xef\xbc\x9a"
# Between "answer" and its colon: "Answer :", "**Answer**:", "__Answer__:", "\textbf{Answer}:".
_MARKER_GAP = b" \t*_}"
_MAX_MARKER_GAP = 8
_BEFORE_COLON = frozenset(bytes([byte]) for byte in b"rR" + _MARKER_GAP)
# Before the value: spaces and line breaks, markdown "**" and "`", the "}" of "\text{Answer:}",
# "~", "&" (an aligned environment), LaTeX spaces, and a display opened on a line of its own, "Answer:\n\[\n512\n\]"
# (deviations 3, 14). An opener on the value's line stays, for _peel to match with its closer.
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


def _box_starts(data: bytes, start: int, end: int) -> list[re.Match]:
    """The box commands (any spelling, deviation 13) in data[start:end], at most MAX_FINAL_BOXES + 1
    of them (more is spam to every caller)."""
    if data.find(b"box", start, end) < 0:  # the common case, and cheaper than the regex
        return []
    return list(itertools.islice(_BOX.finditer(data, start, end), MAX_FINAL_BOXES + 1))


def _last_box(data: bytes, start: int, end: int | None = None) -> re.Match | None:
    """The last box command in data[start:end]: found from the end with C-speed rfind (the box is
    usually near the end), or by one regex scan when "box" keeps turning up in other words."""
    end = len(data) if end is None else end
    for _ in range(8):
        i = data.rfind(b"box", start, end)
        if i < 0:
            return None
        slash = data.rfind(b"\\", max(start, i - _BOX_NAME_REACH), i)
        if slash >= 0 and (m := _BOX.match(data, slash)) and m.end() > i:
            return m
        end = i + 2  # next: occurrences that start before i
    last = None
    for last in _BOX.finditer(data, start, end):
        pass
    return last


def _box_span(data: bytes, box: re.Match) -> tuple[str, int]:
    """(contents, end offset) of a box command: its brace group after the optional and colour
    arguments, braces matched by depth; else, with no brace group ("\\boxed 7"), the brace-less
    argument (deviation 13): the rest of its math or line.

    A box whose brace group does not close within MAX_ANSWER_CHARS bytes, unless it holds only
    digits (deviation 24), or with nothing after it, comes back as "{", an unbalanced text every
    normaliser reports as malformed: a long or broken box costs bounded work, not a hang.
    """
    open_at = box.end()
    colours = _BOX_COLOUR_ARGS.get(box[1], 0)
    if colours or data[open_at : open_at + 1] != b"{":  # the common "\boxed{" skips all this
        for _ in range(2):  # \framebox[width][position]{...}, \colorbox[model]{...}
            option = _BOX_OPTION.match(data, open_at)
            if option is None:
                break
            open_at = option.end()
        for _ in range(colours):
            colour = _BOX_COLOUR.match(data, open_at)
            if colour is None:
                return "{", open_at
            open_at = colour.end()
            option = _BOX_OPTION.match(data, open_at)  # \fcolorbox[model]{frame}[model]{back}{...}
            open_at = option.end() if option else open_at
        opening = _BOX_OPEN.match(data, open_at)
        if opening is None:
            argument = _BRACELESS_ARGUMENT.match(data, open_at)
            if argument is None:
                return "{", open_at
            return argument[1].decode("utf-8", "replace"), argument.end()
        open_at = opening.end() - 1
    close = data.find(b"}", open_at, open_at + MAX_ANSWER_CHARS + 2)
    if close >= 0 and data.find(b"{", open_at + 1, close) < 0:  # the common case: no brace inside
        return data[open_at + 1 : close].decode("utf-8", "replace"), close + 1
    depth = 0
    for brace in _BRACE.finditer(data, open_at, open_at + MAX_ANSWER_CHARS + 2):
        depth += 1 if brace.group() == b"{" else -1
        if depth == 0:
            return data[open_at + 1 : brace.start()].decode("utf-8", "replace"), brace.end()
    digits = _DIGITS_IN_BRACES.match(data, open_at)  # deviation 24: a long exact integer
    if digits is not None:
        return digits[1].decode(), digits.end()
    return "{", open_at


def _box_contents(data: bytes, box: re.Match) -> str:
    return _box_span(data, box)[0]


def _boxes_in(text: str) -> list[str]:
    """Contents of every box in one answer text (at most MAX_FINAL_BOXES + 1 of them)."""
    data = text.encode("utf-8", "replace")
    return [_box_contents(data, box) for box in _box_starts(data, 0, len(data))[: MAX_FINAL_BOXES + 1]]


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


def _extract_final(response: str) -> _Final:
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
            return _Final(reason="no_answer", detail="unclosed <think> block: reasoning never finished")
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
            return _Final(reason="multiple_answers", detail=f"over {MAX_ANSWER_LINES} 'Answer:' lines")
        later = _box_starts(data, line_end, len(data))
        tag = _last_answer_tag(data, line_end) if tags else None  # a tag after the line must agree, as a box (17)
        if len(later) > MAX_FINAL_BOXES:
            return _Final(reason="multiple_answers", detail=f"over {MAX_FINAL_BOXES} boxes after the final answer")
        # deviation 23: the values the final answer section states around it must agree with it
        before, _ = _section_before(data, start, i)
        if not later and line_end == len(data) and not before and tag is None:  # the common case, kept cheap
            return _Final(candidates=(line,), earlier=earlier) if before is not None else _SPAM
        # deviation 17: and so must the boxes after the answer line
        spans = [_box_span(data, box) for box in later]
        after = _stated_after(data, spans[-1][1] if spans else line_end)
        if before is None or after is None or 1 + len(spans) + len(before) + len(after) > MAX_FINAL_BOXES:
            return _SPAM
        section = (*before, *after)
        candidates = (line, *(content for content, _ in spans), *(tag[:1] if tag is not None else ()))
        restated = _restated_after(data, spans[-1][1] if spans else line_end, None)
        return _Final(candidates=candidates, earlier=earlier, section=section, restated=restated)

    tag = _last_answer_tag(data, start) if tags else None
    if tag is not None:  # G1: "<answer>18</answer>", with the boxes after it as candidates (17)
        content, tag_start, tag_end = tag
        before, _ = _section_before(data, start, tag_start)
        later = _box_starts(data, tag_end, len(data))
        after = _stated_after(data, tag_end)
        if before is None or after is None or 1 + len(later) + len(before) + len(after) > MAX_FINAL_BOXES:
            return _SPAM
        candidates = (content, *(_box_contents(data, box) for box in later))
        return _Final(candidates=candidates, section=(*before, *after), restated=_restated_after(data, tag_end, None))
    last = _last_box(data, start)
    if last is not None:  # deviation 7: no "Answer:" line, the last box decides
        content, box_end = _box_span(data, last)
        before, section_start = _section_before(data, start, last.start())
        after = _stated_after(data, box_end)
        if before is None or after is None or 1 + len(before) + len(after) > MAX_FINAL_BOXES:
            return _SPAM
        # the boxes of the last box's line outside the section, which list a set in math mode (22)
        line_start = max(start, data.rfind(b"\n", start, last.start()) + 1)
        same_line = tuple(_box_contents(data, box) for box in _box_starts(data, line_start, section_start))
        restated = _restated_after(data, box_end, (line_start, last.start()))
        return _Final(
            candidates=(content,), section=(*before, *after), boxes_only=True, same_line=same_line, restated=restated
        )
    if echoed:
        return _Final(reason="echoed_prompt", detail="the only 'Answer:' is the prompt's instruction")
    return _Final(reason="no_answer", detail="no 'Answer:' line and no \\boxed{}")


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
        box = _last_box(data, line_start, p) if data.find(b"box", line_start, p) >= 0 else None
        if box is None or _MARKER.search(data, line_start, box.start()):
            break
        content, box_end = _box_span(data, box)
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


# --- normalisation common to both modes ------------------------------------------------------

# Commands that only style their argument (deviation 3), and "{13}": "\boxed{{13}}" is a box LaTeX
# accepts (deviation 13).
_WRAPPERS = (
    "\\boxed{", "\\text{", "\\textbf{", "\\mathbf{", "\\mathrm{", "\\mbox{", "\\fbox{", "\\hbox{",
    "\\textit{", "\\textrm{", "\\textsf{", "\\texttt{", "\\textup{", "\\textsl{", "\\textnormal{", "\\emph{",
    "\\underline{", "\\mathit{", "\\mathsf{", "\\mathtt{", "\\mathnormal{", "\\bm{", "\\boldsymbol{", "\\pmb{", "{",
)  # fmt: skip
# Style switches and colour before the value: "{\bf 13}", "\displaystyle 13", "\color{red} 13",
# "\textcolor{red}{13}" (the last also needs its closing brace, checked in _peel).
_STYLING = re.compile(
    r"\\(?:displaystyle|textstyle|bf|it|rm|sf|tt|bfseries|boldmath|large|Large|LARGE|huge|Huge)(?![A-Za-z])\s*"
    r"|\\color\{[^{}]{0,40}\}\s*|\\textcolor\{[^{}]{0,40}\}(?=\{)"
)
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# HTML markup a chat model may emit around the value (deviation 3): "<code>13</code>", "<b>13</b>".
_HTML_PAIR = re.compile(r"<(code|b|strong|em|i|u|mark|kbd|samp|tt|answer)>(.*)</\1>", re.IGNORECASE | re.DOTALL)
_END_MATH = re.compile(r"\\end\{(?:equation|align|gather|displaymath|math)\*?\}")
_BEGIN_MATH = re.compile(r"\\begin\{((?:equation|align|gather|displaymath|math)\*?)\}")
_PLACEHOLDER = re.compile(
    r"[\[<({]?(?:your|the|final|_|\s)*(?:answer|final_answer|ans)(?:\s*here)?\s*[\]>)}]?"
    r"|[?._\-\u2026]+|\\[lc]?dots|n/?a|tbd|\.\.\.",
    re.IGNORECASE,
)


def _balanced(text: str) -> bool:
    """True when the braces of text nest properly (never closing more than were opened)."""
    depth = 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


# LaTeX spacing and line breaks at either end of a value (G2): "24 \\", "24\quad", "\qquad 24", "24\hfill",
# "24\newline", "24\hspace{1em}", "24~".
_SPACING_COMMAND = (
    r"\\(?:[,;:! ]|q?quad(?![A-Za-z])|hfill(?![A-Za-z])|newline(?![A-Za-z])|(?:small|med|big)skip(?![A-Za-z])"
    r"|noindent(?![A-Za-z])|[hv]space\*?\s*\{[^{}]{0,20}\})|~"
)
_EDGE_SPACING = re.compile(
    rf"^(?:\s|{_SPACING_COMMAND})+"
    rf"|(?:\s|\\\\(?:\[[^\[\]]{{0,20}}\])?|\\(?:text|mbox|mathrm)\s*\{{\s*[.,;:]?\s*\}}|{_SPACING_COMMAND}|\\(?=\s*$))+$"
)  # and "\text{.}" at the end, and a lone backslash left at the very end ("185\")


def _peel(text: str) -> str:
    """Remove what surrounds a value until nothing changes: whitespace, markdown "*", inline-code
    backticks and "_" emphasis, a trailing period, math delimiters (whole pairs, or the half of a
    pair whose other half is outside the value), and \\boxed{}/\\text{}-like wrappers that enclose
    the whole text.

    Each round shortens the text or stops, so it ends; the result is a fixed point, which makes
    every normaliser built on it idempotent.
    """
    while True:
        before = text
        if "\\" in text or "~" in text:  # G2: LaTeX spacing and line breaks at either end, "$24$ \\"
            text = _EDGE_SPACING.sub("", text)
        text = text.strip().strip("*").strip()  # deviation 3: **13**
        inner = text.strip("`_").strip()  # deviation 3: `13`, ```13```, _13_; "___" stays a placeholder
        if inner:
            text = inner
        if text.startswith("<") and (html := _HTML_PAIR.fullmatch(text)):
            text = html[2]
        if text.endswith("</answer>") and "<answer>" not in text:  # G1: "<answer>Answer: 18</answer>"
            text = text[: -len("</answer>")]
        # deviation 2: "13." and the CJK full stop; "..." is left whole (a placeholder, not "13.");
        # G2: a comma, semicolon or colon that ends the text ("13;")
        if text.endswith((".", "\u3002", ",", ";", ":")) and not text.endswith(".."):
            slashes = len(text) - 1 - len(text[:-1].rstrip("\\"))
            text = text[:-1] if slashes % 2 == 0 else text  # not the "," of "\,", a space
        for opening, closing in _DELIMITERS:
            if len(text) >= len(opening) + len(closing) and text.startswith(opening) and text.endswith(closing):
                text = text[len(opening) : -len(closing)]
                break
        text = _peel_half_delimiters(text)
        style = _STYLING.match(text)
        if style is not None and not style.group().startswith("\\textcolor"):
            text = text[style.end() :]
        elif style is not None and text.endswith("}") and _balanced(text[style.end() + 1 : -1]):
            text = text[style.end() :]  # "\textcolor{red}{13}" leaves "{13}", a wrapper below
        for wrapper in _WRAPPERS:
            # "\text{a} 13 \text{b}" starts and ends like a wrapper but is not one: check the braces.
            if text.startswith(wrapper) and text.endswith("}") and _balanced(text[len(wrapper) : -1]):
                text = text[len(wrapper) : -1]
                break
        if text == before:
            return text


def _peel_half_delimiters(text: str) -> str:
    """Drop a delimiter whose partner lies outside the value (deviation 14): the marker written
    inside display math, "\\[Answer: 512\\]", leaves "512\\]"; "$\\text{Answer: 512}$" leaves "512}$"."""
    for opening, closing in (("\\[", "\\]"), ("\\(", "\\)")):
        if text.endswith(closing) and opening not in text:
            text = text[: -len(closing)].rstrip()
        elif text.startswith(opening) and closing not in text:
            text = text[len(opening) :].lstrip()
    if "$" in text:  # dollars only at the ends, none inside: "512$", "$$512", "$13"
        core = text.strip("$")
        if "$" not in core and not core.endswith("\\"):
            text = core.strip()
    end = text.rfind("\\end{")
    if end >= 0 and _END_MATH.fullmatch(text, end):
        begin = _BEGIN_MATH.match(text)
        if begin is None and "\\begin{" not in text:  # "512\end{equation}": begun before the marker
            text = text[:end].rstrip()
        elif begin is not None and begin[1] == text[end + len("\\end{") : -1]:  # a whole environment
            text = text[begin.end() : end].strip()
    if text.endswith("}") and not _balanced(text) and _balanced(text[:-1]):
        text = text[:-1].rstrip()  # the "}" of a "\text{Answer: 512}" opened before the marker
    return text


def _collapse_thousands(text: str, pairs: bool = False) -> str:
    """Remove thousands separators that form valid groupings (deviation 6): "1,000", "1{,}000",
    "1,\\!000", "1\\,000", "2 500 000", "2\\,500\\,000" -> "1000", "2500000". A valid grouping has
    one to three digits, then groups of exactly three, all split by the same kind of separator: "1,2,3",
    "12,34", "12 13" and "1,000 000" are not groupings and stay as they are (lists, or malformed).
    pairs (math mode, deviation 28): a bracket that holds only "a,bbb" is a pair of endpoints or
    coordinates, not a number: "(12,102)" stays (the MATH-500 answer "(2,12) \\cup (12,102)")."""
    if "{" in text:  # "1{,}000", and with stray spaces "18 {, }936" (G2)
        text = _BRACED_COMMA.sub(",", text).replace("{,}", ",")
    text = text.replace("\u2212", "-")  # deviation 10: U+2212 minus sign
    if "," not in text and " " not in text and "\\" not in text and "~" not in text and text.isascii():
        return text  # no separator of any kind: the common case
    return _GROUPED.sub(_ungroup_unless_pair if pairs else _ungroup, text)


def _ungroup(grouped: re.Match) -> str:
    kinds = {_SPACE_RUN.sub("", sep) or " " for sep in _SEPARATOR.findall(grouped[0])}
    return _SEPARATOR.sub("", grouped[0]) if len(kinds) == 1 else grouped[0]  # mixed kinds: no grouping


def _ungroup_unless_pair(grouped: re.Match) -> str:
    text, start, end = grouped.string, grouped.start(), grouped.end()
    if text[start - 1 : start] in ("(", "[") and text[end : end + 1] in (")", "]") and grouped[0].count(",") == 1:
        return grouped[0]
    return _ungroup(grouped)


_BRACED_COMMA = re.compile(r"(?<=[0-9])[ \t]*\{[ \t]*,[ \t]*\}[ \t]*(?=[0-9])")
# Separators between digit groups: a comma, a space (also thin, narrow and no-break), LaTeX's "~",
# "\,", "\:", "\;", "\ ", "\!", "\thinspace", and ",\!" (MATH writes "1,\!000").
_SEPARATOR_TEXT = r"(?:,\\!|\\(?:[,:; !]|thinspace(?![A-Za-z])))[ \t]*|[, ~\u2009\u202f\u00a0]"
_SEPARATOR = re.compile(_SEPARATOR_TEXT)
_SPACE_RUN = re.compile(r"[\s~]+")
_GROUPED = re.compile(
    rf"(?<![0-9.,])[0-9]{{1,3}}(?:(?:{_SEPARATOR_TEXT})[0-9]{{3}})+(?![0-9]|(?:{_SEPARATOR_TEXT})[0-9])"
)


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
_NOT_A_UNIT = "|".join(
    [_HEDGE_WORDS.replace("and|to|through|between|", ""), _VALUE_WORDS, *_NUMBER_WORDS, *_SCALE_WORDS]
)
_NOT_IN_PHRASE = "|".join([_HEDGE_WORDS.replace("and|", ""), _VALUE_WORDS])  # "81, and that is all" is fine
# One number and what may follow it (deviations 6, 9, 10, 15, 25): the sign, a space allowed ("- 4");
# the digits (groupings already joined) and a fraction; scientific notation with an exponent of at
# most four digits ("3.5 \times 10^{4}", "3.5\cdot10^4", "3.5e4"; "10^12" is 10^{12}, as math-verify
# reads it) or a scale word ("2.5 million"); percent or degrees ("45\degree", "45^{\circ}", "45°");
# units, up to four terms: words of two letters or more, any letters inside a text command
# ("\text{ m/s}", "\mathrm{cm}^3", though not an upright i, e or j), compounds of SI symbols ("km/h",
# "m/s"); a gloss in brackets before or after the units ("36 (thirty-six)"); a closing phrase after a
# comma, dash or full stop ("81, altogether.", "17. I hope it is correct."), words only.
# A modulus after the value (G2): "\pmod{7}", "\pmod 7", "\bmod 7", "\mod 7", "(mod 7)", "\text{mod } 7";
# the residue before it is the value, the modulus never is.
_MODULUS_TEXT = (
    r"\(?\s*(?:\\(?:text|mathrm|textrm|operatorname|rm)\s*\{\s*mod(?:ulo)?\s*\}|\\[bp]?mod(?![A-Za-z])"
    r"|mod(?:ulo)?(?![A-Za-z]))\s*(?:\{(?P<modulus>[^{}]{1,20})\}|(?P<modulus_bare>[0-9A-Za-z]{1,20}"
    r"(?:\^\s*(?:\{[0-9]{1,4}\}|[0-9]))?))\s*\)?"
)
_MODULUS = re.compile(_MODULUS_TEXT)
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
_NUMBER_ANSWER = re.compile(
    rf"""(?:\\?\$\s*)?                                             # currency: "\$13"
    (?P<sign>[+-]?)\s*(?P<digits>[0-9]+)(?P<fraction>\.[0-9]+)?     # "- 4", "13.0", "3.5"
    (?:\s*(?:\\times|\\cdot|\\ast|\*|x|\u00d7|\u00b7)\s*10\s*\^\s*           # scientific notation
         (?:\{{\s*(?P<exp>[+-]?\s*[0-9]{{1,4}})\s*\}}|(?P<exp_bare>[0-9]{{1,4}}))
       |e(?P<exp_e>[+-]?[0-9]{{1,4}})                                  # "3.5e4"
       |\s+(?P<scale>hundred|thousand|million|billion|trillion)(?![A-Za-z]))?  # "2.5 million"
    (?:\s*(?:\\?%|\\(?:degree|textdegree)(?![A-Za-z])                   # percent, degrees
       |(?:\{{\}})?\^\s*\{{?\s*\\circ\s*\}}?|\u00b0))?
    (?P<gloss>{_GLOSS})?                                            # "17 (seventeen) ways"
    (?:\s*{_MODULUS_TEXT})?                                        # "3 \pmod{7}" (G2)
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
_GREEK = (
    "alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma"
    "|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega"
)
# A variable, its coefficient glued to it ("2a"), its sub- and superscripts ("a_{10}", "x^2").
_VARIABLE = r"[0-9]*[A-Za-z](?:\s*[_^]\s*(?:\{[A-Za-z0-9,+\-]{1,8}\}|[A-Za-z0-9]))*"
_FRAME = re.compile(
    rf"""(?:(?:{_VARIABLE}(?:\s*(?:[-+*/]|\\cdot)\s*{_VARIABLE})+          # "a+b", "m + n", "2a - b"
         |[A-Za-z](?:\s*[_^]\s*(?:\{{[A-Za-z0-9,+\-]{{1,8}}\}}|[A-Za-z0-9]))+   # "a_{{10}}", "x^2"
         |[A-Za-z]+(?:['\u2019\-][A-Za-z]+)*                               # a word, "it's", "two-digit"
         |\\(?:{_GREEK})(?![A-Za-z])
         |\\(?:text|textbf|textit|mathrm|mbox|emph)\s*\{{[^{{}}$0-9]*\}})
       (?:\s*[,:]\s*|\s+|(?<=\}})))+
    (?=(?:\\?\$\s*)?[+-]?\s*[0-9])""",
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
    r"(?<![a-z])(?:about|around|over|under|above|below|beyond|within|near|up\s+to|close\s+to|of|by|from|per|not"
    r"|no|twice|thrice|half|double|triple|times|squared|cubed|sqrt|root|plus|minus|negative|least|most|and"
    r"|between|with|mod|modulo)[\s,:]*$"
)
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
# A subordinate clause after the value (deviation 15): "56, since 7 x 8 = 56", "56 (because ...)",
# "56, which is 7 x 8", "56. This is because ...". The words of the first list open one after a
# space; those of the second only after punctuation ("12 by 13" is not "12").
_CLAUSE_STRONG = r"since|because|as(?!\s+well\b)|which|where|whereby|given|using|i\.\s?e\.?|e\.\s?g\.?"
_CLAUSE_WEAK = r"from|by|via|due\s+to|obtained|computed|calculated|found|following|according|so|hence|thus|therefore"
_CLAUSE = re.compile(
    rf"(?:[,;:(\[\u2014\u2013]|\\text\{{|\.\s|\s-{{1,3}}\s)\s{{0,3}}"
    rf"(?:(?:this|that|it)\s{{1,3}}(?:is|was|follows)\s{{1,3}})?(?:{_CLAUSE_STRONG}|{_CLAUSE_WEAK})(?![A-Za-z])"
    rf"|(?<!well)(?<!such)\s(?:{_CLAUSE_STRONG})(?![A-Za-z])",  # "as well as", "such as": not clauses
    re.IGNORECASE,
)
# The number an earlier "Answer:" line leads with, past markup: "17. Wait, that is wrong."
_LEADING_NUMBER = re.compile(r"(?:[^0-9A-Za-z\\+\-]|\\[A-Za-z]*)*([+-]?)([0-9]+)(\.[0-9]+)?(?![0-9])")


def _before_clause(text: str) -> str:
    """text up to a subordinate clause after the value (deviation 15); the clause is never read,
    so the numbers in it are not candidates. Searched in the first MAX_ANSWER_CHARS characters."""
    clause = _CLAUSE.search(text, 0, MAX_ANSWER_CHARS + 1)
    return text[: clause.start()] if clause else text


def _canonical_int(sign: str, digits: str) -> str:
    """"013" -> "13", "-0" -> "0". String work, never int(): a 10,000-digit answer cannot raise."""
    digits = digits.lstrip("0") or "0"
    return digits if sign != "-" or digits == "0" else "-" + digits


def _as_integer(text: str) -> str | None:
    """The canonical integer when text is exactly one ASCII integer, else None."""
    m = _PLAIN_INTEGER.fullmatch(text)
    return _canonical_int(m[1], m[2]) if m else None


_PLAIN_INTEGER = re.compile(r"([+-]?)([0-9]+)")


def _integer_candidate(text: str) -> tuple[str | None, str, str]:
    """(canonical integer or None, reason, detail) for one candidate answer text.

    reason is "" when an integer was read, else a reason code. Linear-time regex and string work.
    """
    if len(text) <= MAX_ANSWER_CHARS and text.isascii():  # the common cases, read without the rules
        if text.isdigit():  # "Answer: 85"
            return _canonical_int("", text), "", ""
        # "85.", "$85$", "**85**", "`85`": what _peel would strip, and only that (the same result)
        core = text.strip()
        core = core[:-1] if core.endswith(".") and not core.endswith("..") else core
        core = core.strip("*`$ ")
        if core.startswith("\\boxed{") and core.endswith("}"):  # "$\boxed{85}$.": its one box
            core = core[len("\\boxed{") : -1].strip()
        sign = core[:1] if core[:1] in ("-", "+") else ""  # "-3"
        if core[len(sign) :].isdigit():
            return _canonical_int(sign, core[len(sign) :]), "", ""
    if len(text) > MAX_ANSWER_CHARS and (long := _long_integer(text)) is not None:
        return long, "", ""  # deviation 24: an exact integer of any length
    head = text if len(text) <= MAX_ANSWER_CHARS else _before_clause(text)
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
    return _agree([_integer_candidate(box) for box in boxes])


def _unbox(text: str) -> tuple[str, list[str], str] | None:
    """(text with every box replaced by its contents, the contents, the text outside the boxes), or
    None when text has no box. Nested boxes are opened too, up to MAX_NESTED_BOXES deep."""
    data = text.encode("utf-8", "replace")
    starts = _box_starts(data, 0, len(data))
    if not starts:
        return None
    contents, outside = [], []
    for depth in range(MAX_NESTED_BOXES):
        pieces, at = [], 0
        for box in starts:
            if box.start() < at:
                continue  # inside the box before it: opened with it, on the next round
            content, box_end = _box_span(data, box)
            pieces += [data[at : box.start()], content.encode("utf-8", "replace")]
            if depth == 0:
                contents.append(content)
                outside.append(data[at : box.start()])
            at = box_end
        pieces.append(data[at:])
        if depth == 0:
            outside.append(data[at:])
        data = b"".join(pieces)
        starts = _box_starts(data, 0, len(data))
        if not starts:
            break
    return data.decode("utf-8", "replace"), contents, b" ".join(outside).decode("utf-8", "replace")


def _read_statement(text: str) -> tuple[str | None, str, str]:
    """(canonical integer or None, reason, detail) for an answer text without boxes: the value
    grammar of the module docstring (G2-G4) read left to right. A clause after the value is cut
    (deviation 15); markup, math and spacing are peeled; a sentence frame before the value is
    checked and dropped (G3); working after the value is checked and dropped (G4); then the value,
    or the sides of an equation or congruence (deviation 26), are read."""
    text = _before_clause(_peel(text))  # peeled first: the clause may sit inside the wrappers
    raw = _peel(_LATEX_SPACE.sub(" ", _collapse_thousands(_peel(text))))
    if "$" in raw or "\\(" in raw:
        raw = _peel(_INNER_MATH.sub("", raw))
    frame = _FRAME.match(raw) if raw[:1].isalpha() or raw[:1] == "\\" else None
    if frame is not None:  # G3: "The largest $n$ is 34.", "There are 34 ways."
        words = _TEXT_COMMAND.sub(r" \1 ", frame[0]).lower()
        hedge = _FRAME_HEDGE.search(words) or _FRAME_LAST_WORD.search(words)
        if hedge is not None:
            return None, "malformed", f"{hedge[0].strip()!r} before the value hedges or changes it"
        raw = _peel(raw[frame.end() :])
    raw, restated = _cut_working(raw)
    t = _peel(_INLINE_TEXT.sub(r"\1", raw))  # the plain words, for the checks below
    if not t:
        return None, "empty_answer", ""
    if _PLACEHOLDER.fullmatch(t):
        return None, "placeholder", f"placeholder {t!r}"
    sides = _SIDES.split(raw)  # deviation 26: "x = 13", "17 = x", "x \equiv 3 \pmod 7": the number is the value
    readings = [_read_number(_peel(side)) for side in sides]
    if len(sides) > 1 and any(
        reading is None and _HEDGE.search(_INLINE_TEXT.sub(r"\1", side)) for side, reading in zip(sides, readings)
    ):
        return None, "multiple_answers", f"several candidates in {text.strip()!r}"  # deviation 16: "x = 12 or 13"
    readings = [reading for reading in readings if reading is not None]
    if readings:
        reading = _agree(readings)
        spelled = _spelled_numbers(frame[0]) if frame is not None else []
        others = [value for value in (*restated, *spelled) if value != reading[0]]
        if reading[1] or not others:
            return reading
        return None, "multiple_answers", f"{others[0]} stated beside the value {reading[0]}"  # G3, G4
    t = _peel(_INLINE_TEXT.sub(r"\1", sides[-1]))
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
                if _MODULUS.fullmatch(inside) or _is_working(inside):
                    restated += [] if _MODULUS.fullmatch(inside) else _values_stated(inside, False, False)
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
    numbers = _FIRST_DIGIT.search(text) is not None or len(_spelled_numbers(text)) >= 2
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
    text = _collapse_thousands(_INNER_MATH.sub("", text).strip())
    sides = _SIDES.split(text)
    if len(sides) > 1:
        if not assignments and any(_LETTER.search(_LATEX_COMMAND.sub("", side)) for side in sides):
            return []
    else:
        opening = (_LEADING_WORDS if after_words else _LEADING_CONNECTIVE).match(text)
        sides = [text[opening.end() :] if opening else text]
    values = []
    for side in sides:
        reading = _read_number(_peel(side))
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
    value, integral = _number_value(m)
    for words in (m["gloss"], m["gloss_after"], m["phrase"]):
        if words and any(spelled != value for spelled in _spelled_numbers(words)):
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
        return _canonical_int(m["sign"], integer), True
    magnitude = (integer.lstrip("0") or "0") + "." + rest
    return ("-" if m["sign"] == "-" else "") + magnitude, False


# Which kind of number word may follow which inside one number ("one" and the other units: after
# nothing but "hundred" or a scale word; "thirty" takes a unit, "hundred" and scale words take more).
_FOLLOWS = {
    "ten": ("one", "unit", "hundred", "scale"),
    "hundred": ("one", "unit", "teen", "ten", "scale"),
    "scale": ("one", "unit", "teen", "ten"),
}


def _spelled_numbers(words: str) -> list[str]:
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
    return None if m is None else _as_integer(_collapse_thousands((m[1] or m[2]).strip()))


def _agree(values: list[tuple[str | None, str, str]]) -> tuple[str | None, str, str]:
    """Combine the readings of several final statements: the first failure, or the one value they all give."""
    for value in values:
        if value[1]:
            return value
    distinct = sorted({value[0] for value in values})
    if len(distinct) > 1:
        return None, "multiple_answers", "contradicting final answers: " + ", ".join(distinct)
    return values[0]


@functools.lru_cache(maxsize=65536)
def _integer_ground_truth(ground_truth: str) -> str:
    truth = _as_integer(_collapse_thousands(ground_truth.strip()))  # GSM8K writes "2,125"
    if truth is None:
        raise ValueError(
            f"mode='dapo' needs an integer ground truth (as in DAPO-Math-17k and AIME), got "
            f"{ground_truth!r}: use mode='math' for general answers or mode='dapo-official' for the "
            f"paper's exact string rule"
        )
    return truth


def _score_dapo(response: str, ground_truth: str) -> Score:
    truth = _integer_ground_truth(ground_truth)
    final = _extract_final(response)
    if final.reason:
        return _verdict(False, None, final.reason, final.detail)
    if len(final.candidates) == 1:  # the common case, kept cheap
        pred, reason, detail = _integer_candidate(final.candidates[0])
    else:
        pred, reason, detail = _agree([_integer_candidate(c) for c in final.candidates])
    if reason:
        return _verdict(False, pred, reason, detail)
    if final.earlier:  # deviation 20: every "Answer:" line must state the final value
        others = [value for value in map(_earlier_value, final.earlier) if value is not None and value != pred]
        if others:
            stated = ", ".join(dict.fromkeys([*others, pred]))
            return _verdict(False, None, "multiple_answers", f"'Answer:' lines disagree: {stated}")
    if final.section:  # deviation 23: every value of the final answer section must be the final one
        others = [value for value in map(_section_value, final.section) if value != pred]
        if others:
            stated = ", ".join(dict.fromkeys([*others, pred]))
            detail = f"the final answer section states several values: {stated[:200]}"
            return _verdict(False, None, "multiple_answers", detail)
    if final.restated:  # G5: the text after the final statement takes it back with another value
        others = [value for value in map(_section_value, final.restated) if value != pred]
        if others:
            detail = f"the text after the final answer {pred} takes it back: it states {others[0]}"
            return _verdict(False, None, "multiple_answers", detail)
    return _verdict(pred == truth, pred, "ok" if pred == truth else "wrong")


def _section_value(text: str) -> str:
    """What a box or number of the final answer section states (deviation 23): its integer or
    decimal reading, else a description that equals no integer ("\\boxed{x}" beside "\\boxed{3}"
    is a second answer, not an unread one)."""
    pred, reason, _ = _integer_candidate(text)
    if not reason or reason == "wrong":
        return pred
    return f"{reason} {text.strip()[:40]!r}"


def _earlier_value(text: str) -> str | None:
    """What an earlier "Answer:" line states, to compare with the final value (deviation 20).

    Its integer reading when it has one; a description that equals no integer when it reads as
    several candidates or as a non-integer number; else the number it leads with ("17. Wait, that
    is wrong." states 17); None when it states no number at all ("To answer: we first ...").
    """
    pred, reason, _ = _integer_candidate(text)
    if not reason or reason == "wrong":  # "wrong" here: a decimal such as "17.5", itself a value
        return pred
    if reason == "multiple_answers":
        return f"several values in {text.strip()[:40]!r}"
    lead = _LEADING_NUMBER.match(_collapse_thousands(text[:MAX_ANSWER_CHARS]))
    if lead is None:
        return None
    integer = _canonical_int(lead[1], lead[2])
    fraction = (lead[3] or "").rstrip("0")
    return integer if fraction in ("", ".") else integer + fraction


# --- DAPO: the official rule, bit for bit ("dapo-official" mode) ------------------------------
# verl/utils/reward_score/math_dapo.py (compute_score -> is_correct_minerva), itself the Minerva
# normalisation of lm-evaluation-harness hendrycks_math. The tables are the rule's data, in its order.

_OFFICIAL_WINDOW = 300  # characters from the end; "the longest answer in MATH-500 has 159"
_OFFICIAL_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")  # note: re's (?i) is Unicode-aware
_OFFICIAL_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)  # fmt: skip
_OFFICIAL_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
    "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}",
    "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ",
    "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
_OFFICIAL_REWRITES = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$"),  # keep only the first $...$
        (r"(\\text\{)(.*?)(\})", "\\2"),
        (r"(\\textbf\{)(.*?)(\})", "\\2"),
        (r"(\\overline\{)(.*?)(\})", "\\2"),
        (r"(\\boxed\{)(.*)(\})", "\\2"),
        (r"(frac)([^{])(.)", "frac{\\2}{\\3}"),  # \fracab -> \frac{a}{b}
        (r"(sqrt)([^{])", "sqrt{\\2}"),  # \sqrta -> \sqrt{a}
    )
)


def _official_normalise(answer: str) -> str:
    answer = answer.split("=")[-1]
    for before, after in _OFFICIAL_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for removed in _OFFICIAL_REMOVED:
        answer = answer.replace(removed, "")
    for pattern, replacement in _OFFICIAL_REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():  # str.isdigit: also true for "１３" and "²"
        answer = answer.replace(",", "")
    return answer.strip()


_official_ground_truth = functools.lru_cache(maxsize=65536)(_official_normalise)


def _score_official(response: str, ground_truth: str) -> Score:
    matches = _OFFICIAL_ANSWER.findall(response[-_OFFICIAL_WINDOW:])
    if not matches:  # the official code compares "[INVALID]", which no real answer equals
        return _verdict(False, None, "no_answer", "no 'Answer:' in the last 300 characters")
    pred = _official_normalise(matches[-1])
    correct = pred == _official_ground_truth(ground_truth)
    return _verdict(correct, pred, "ok" if correct else "wrong")


# --- math mode: our extraction and normalisation, math-verify's equivalence ------------------

_MATH_REWRITES = (
    ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\displaystyle", ""),
    ("\u03c0", "\\pi"), ("\u00b0", "^\\circ"), ("\u221e", "\\infty"), ("\u00d7", "\\times"),
    ("\u00b7", "\\cdot"), ("\u2264", "\\le"), ("\u2265", "\\ge"), ("\\$", ""), ("\u2205", "\\emptyset"),
    ("\u2216", "\\setminus"), ("\u2261", "\\equiv"),
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


def _normalise_math(text: str) -> str:
    """Our LaTeX clean-up before the parser (math-verify does its own after this). Idempotent:
    it repeats until nothing changes."""
    while True:
        before = text
        text = _collapse_thousands(_peel(text), pairs=True)  # before the rewrites, which remove "\\!", "\\,"
        for old, new in _MATH_REWRITES:
            text = text.replace(old, new)
        text = _LEFT_RIGHT.sub("", text)
        text = _SPACES.sub(" ", _LATEX_SPACING.sub(" ", text)).strip()
        if "\\" in text or "\u211d" in text or "real" in text.lower():
            text = _REPEATING.sub(_repeating_as_fraction, text)
            text = _HALF_LINE.sub(lambda m: _HALF_LINES[m[1]], _REALS.sub(r"\\mathbb{R}", text))
            text = _SET_DIFFERENCE.sub(r" \\setminus ", _EMPTY_SET.sub(r"\\emptyset", text))
            if "mod" in text:  # G2: one spelling of a modulus, "\pmod{7}": two congruences compare as strings
                text = _MODULUS.sub(lambda m: f" \\pmod{{{(m['modulus'] or m['modulus_bare']).strip()}}}", text)
                text = _SPACES.sub(" ", text.replace("\\equiv", " \\equiv ")).strip()
        if text == before:
            return text


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
def _math_ground_truth(ground_truth: str) -> str:
    truth = _normalise_math(ground_truth)
    if not truth or len(truth) > MAX_ANSWER_CHARS or not _balanced(truth):
        raise ValueError(
            f"mode='math' ground truth {ground_truth!r} is empty, longer than {MAX_ANSWER_CHARS} "
            f"characters or has unbalanced braces: fix the dataset row"
        )
    return truth


def _is_set_answer(truth: str) -> bool:
    """True when a (normalised) ground truth is several values: a list, "\\pm", "or" (deviation 22)."""
    return "," in truth or ";" in truth or _MATH_ALTERNATIVES.search(truth) is not None


def _math_candidate(text: str, truth: str) -> tuple[str | None, str, str]:
    """(normalised prediction, reason, detail) for one candidate; reason "" when it may go to the parser."""
    if not _CLAUSE.search(truth):  # deviation 15, unless the ground truth itself has such words
        text = _before_clause(text)
    if len(text) > MAX_ANSWER_CHARS:
        return None, "malformed", f"answer has {len(text)} characters, over the {MAX_ANSWER_CHARS} limit"
    pred = _normalise_math(text)
    if "mod" in pred and "mod" not in truth and "\\equiv" not in truth:  # G2: "x \equiv 3 \pmod 7" states 3
        pred = _SPACES.sub(" ", _MODULUS.sub(" ", pred).replace("\\equiv", "=")).strip()
    if not pred:
        return None, "empty_answer", ""
    if _PLACEHOLDER.fullmatch(pred):
        return None, "placeholder", f"placeholder {pred!r}"
    odd = [ch for ch in pred if not ch.isascii()]
    if odd:  # full-width digits, look-alike letters, zero-width characters (deviation 18)
        return None, "malformed", f"non-ASCII character U+{ord(odd[0]):04X} in the answer"
    if not _balanced(pred):
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
    depth, tokens = _nesting_depth(pred), len(_LATEX_TOKEN.findall(pred))
    if depth > MAX_NESTING_DEPTH or tokens > MAX_ANSWER_TOKENS:  # deviation 29: refused before parsing
        return None, "malformed", (
            f"{depth} nested brackets and {tokens} tokens, over the limits {MAX_NESTING_DEPTH} and "
            f"{MAX_ANSWER_TOKENS}: the parser would take seconds on it"
        )
    costly = _cost_refusal(pred)
    if costly is not None:  # G7: refused before parsing
        return None, "malformed", f"{costly}: too expensive to evaluate"
    return pred, "", ""


# A relation as the ground truth (G6): "a + z = 0", "x^2 + y^2 = 1". math-verify 0.9.0 reads an
# equation whose left side is only symbols as an assignment and compares right-hand sides, so a bare
# "0" equals "a + z = 0" there. Here a prediction without "=" is wrong against an equation, unless
# that equation assigns one variable ("x = 5", "y = 2x + 3", "f(x) = x^2", "x = 1, y = 2"): the
# variable asked for, whose value the prediction may state alone. A prediction that is an equation
# is compared by math-verify as before ("m + n = 85" against 85 states the asked sum).
_TOP_EQUALS = re.compile(r"(?<![<>!:\\])=(?!=)")
_ASSIGNED = re.compile(
    r"\s*(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?[A-Za-z0-9]+\}?)?'*(?:\s*\(\s*[A-Za-z](?:\s*,\s*[A-Za-z])*\s*\))?\s*"
)


def _is_relation(text: str) -> bool:
    """True when text (normalised) states an equation at its top level that is not an assignment of
    one variable (G6)."""
    if "=" not in text:
        return False
    for item in _top_level_split(text, ","):
        sides = _top_level_split(item, "=")
        if len(sides) > 1 and not (len(sides) == 2 and any(_ASSIGNED.fullmatch(side) for side in sides)):
            return True
    return False


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


def _nesting_depth(text: str) -> int:
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
# comparing. _cost_refusal bounds that work from the answer's structure, before any parsing, so such
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


def _cost_refusal(pred: str) -> str | None:
    """Why evaluating pred would cost more than the limits of G7, or None (the parser may have it)."""
    reader = _CostReader(_LATEX_TOKEN.findall(pred))
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


def _score_math(response: str, ground_truth: str, timeout_s: float) -> Score:
    deadline = time.monotonic() + timeout_s  # G7: the limit is on the whole call
    truth = _math_ground_truth(ground_truth)
    final = _extract_final(response)
    if final.reason:
        return _verdict(False, None, final.reason, final.detail)
    texts = []
    set_truth = _is_set_answer(truth)
    listed = (*final.same_line, *final.section, *final.candidates) if final.boxes_only else ()
    if set_truth and len(listed) > 1:
        texts.append(", ".join(listed))  # deviation 22: "\boxed{12}, \boxed{-12}" lists a set
    for candidate in () if texts else (*final.candidates, *final.section):  # deviation 23: all agree
        # "Answer: the value is \boxed{1/2}": the boxes are the answer (deviation 8 in math mode).
        boxes = _boxes_in(candidate)
        if len(boxes) > 1 and set_truth:
            texts.append(", ".join(boxes))  # "Answer: \boxed{12} and \boxed{-12}" lists a set
        else:
            texts.extend(boxes or [candidate])
    preds = []
    for text in texts:
        pred, reason, detail = _math_candidate(text, truth)
        if reason:
            return _verdict(False, pred, reason, detail)
        preds.append(pred)
    distinct = list(dict.fromkeys(preds))
    if _is_relation(truth):  # G6: a bare value does not state a relation
        bare = [pred for pred in distinct if len(_top_level_split(pred, "=")) == 1]
        if bare:
            return _verdict(False, bare[0], "wrong", f"the ground truth {truth[:60]!r} is a relation, not a value")
    verdicts: dict[str, bool] = {}
    for pred in distinct:  # decided without the parser: same string, or two plain integers
        if pred == truth:
            verdicts[pred] = True
        elif _as_integer(pred) is not None and _as_integer(truth) is not None:
            verdicts[pred] = _as_integer(pred) == _as_integer(truth)
    pending = [pred for pred in distinct if pred not in verdicts]
    if pending:
        reply = _ask_math_worker({"truth": truth, "preds": pending}, deadline - time.monotonic())
        if reply["status"] == "bad_ground_truth":
            raise ValueError(
                f"mode='math' ground truth {ground_truth!r} cannot be parsed by math-verify "
                f"({reply.get('detail', '')}): fix the dataset row"
            )
        if reply["status"] != "ok":
            return _verdict(False, distinct[0], reply["status"], reply.get("detail", ""))
        verdicts.update(zip(pending, reply["verdicts"]))
    if len(set(verdicts.values())) > 1:
        return _verdict(False, distinct[0], "multiple_answers", "final answers disagree: " + " | ".join(distinct))
    correct = all(verdicts.values())
    return _verdict(correct, distinct[0], "ok" if correct else "wrong")


# --- plumbing: the math worker processes ------------------------------------------------------
# A worker is `python verifier.py --math-worker`: a subprocess (not multiprocessing, so it also
# starts from daemonic pool workers) that reads one JSON request per line on stdin and answers on
# stdout. A call that runs past timeout_s gets the worker killed: that works from any thread and
# any process, where SIGALRM (math-verify's own timeout) works only in the main thread.


class _MathWorker:
    """One `verifier.py --math-worker` subprocess and the pipes to it; used by one thread at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--math-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self.buffer = b""
        ready = self._read_line(time.monotonic() + WORKER_START_TIMEOUT_S)
        if ready is None or not json.loads(ready).get("ready"):
            self.kill()
            why = json.loads(ready).get("detail", "") if ready else "no answer in time"
            raise RuntimeError(
                f"math-mode worker failed to start ({why}): math mode needs math-verify, "
                f"install it with pip install 'math-verify==0.9.0'"
            )

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the worker, or None when the deadline passes or the worker died."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # end of file: the worker died
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def ask(self, request: dict, timeout_s: float) -> dict | None:
        """The worker's reply, or None after a timeout or a crash (the worker is then dead)."""
        try:
            os.write(self.proc.stdin.fileno(), json.dumps(request).encode() + b"\n")
        except BrokenPipeError:
            return None
        line = self._read_line(time.monotonic() + timeout_s)
        return json.loads(line) if line is not None else None

    def kill(self, reap_later: bool = False) -> None:
        """Kill the worker process. reap_later: wait for it (10-20 ms while the OS frees its memory)
        and close the pipes in a background thread, so that a timed-out call returns at its limit."""
        self.proc.kill()
        if reap_later:
            threading.Thread(target=self._reap, daemon=True, name="verifier-math-worker-reap").start()
        else:
            self._reap()

    def _reap(self) -> None:
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


# Spare workers are kept started beyond those in use (deviation 29, G7): a timeout kills its worker,
# and the next call then takes a spare, ready, instead of waiting 2-4 s for a worker to start. Two,
# so that the call after a timeout finds one ready even when the timed-out call had taken the last
# idle one (its replacement is then still starting: 1.5-2.8 s seen on a loaded machine). Spares
# start in a background thread, one at a time, whenever a call takes a worker or a timeout kills one.
SPARE_WORKERS = 2
# Seconds kept back from a call's time limit for what follows a timeout (the kill, starting the
# replacement's thread, returning), so that the call returns within the limit: measured at 2-4 ms
# on an idle machine (bench/bench_verifier.py); 50 ms leaves room for a loaded one.
TIMEOUT_MARGIN_S = 0.05
_idle_workers: list[_MathWorker] = []
_starting = 0  # spares being started in background threads
_waiting = 0  # calls waiting for one of those spares
_STARTER_THREAD = "verifier-math-worker-start"  # the name of a thread starting a spare worker
_workers_lock = threading.Condition()


def _forget_workers_after_fork() -> None:
    # A forked child must not share the parent's pipes (two readers on one worker) nor its lock.
    global _idle_workers, _workers_lock, _starting, _waiting
    _idle_workers, _workers_lock, _starting, _waiting = [], threading.Condition(), 0, 0


os.register_at_fork(after_in_child=_forget_workers_after_fork)


@atexit.register
def _stop_workers() -> None:
    with _workers_lock:
        while _idle_workers:
            _idle_workers.pop().kill()


def _start_spare() -> threading.Thread:
    """Start a spare worker in a background thread (counted in _starting until it is ready)."""
    global _starting
    with _workers_lock:
        _starting += 1
    thread = threading.Thread(target=_start_idle_worker, daemon=True, name=_STARTER_THREAD)
    thread.start()
    return thread


def _start_idle_worker() -> None:
    """The spare's thread: start a worker and make it idle. The spare is only a head start: if it
    cannot start (an OSError from the OS, a worker that does not answer), nothing is raised in the
    thread; the next call starts its own worker and raises the clear error there."""
    global _starting
    worker = None
    try:
        worker = _MathWorker()
    except (OSError, RuntimeError):
        pass
    finally:
        with _workers_lock:
            _starting = max(0, _starting - 1)
            if worker is not None:
                _idle_workers.append(worker)
            _workers_lock.notify_all()
    if worker is not None:
        _top_up_spares()  # the next spare, if one is still missing


def _top_up_spares() -> None:
    """Start a spare in the background when fewer than SPARE_WORKERS are idle and none is starting
    (G7). One at a time: each start imports sympy and math-verify (seconds of CPU), and two at once
    would slow the calls that run beside them; a spare that is ready starts the next."""
    with _workers_lock:
        needed = _starting == 0 and len(_idle_workers) < SPARE_WORKERS
    if needed:
        _start_spare()


def _take_worker(deadline: float) -> tuple[_MathWorker | None, bool]:
    """(worker, started here) for one call. An idle worker; else a spare on its way, waited for
    until the call's deadline (None after it: the time limit counts the wait); else, when no worker
    is idle or starting (the process's first call, more calls at once than workers, or spares that
    failed to start), a worker started here, whose start-up the time limit does not count. Tops the
    spares up after taking one (after its own start, not beside it: two starts at once would slow it)."""
    global _waiting
    with _workers_lock:
        if not _idle_workers and _starting > _waiting:
            _waiting += 1
            _workers_lock.wait_for(lambda: bool(_idle_workers) or _starting == 0, max(0.0, deadline - time.monotonic()))
            _waiting -= 1
            if not _idle_workers and _starting > 0:
                return None, False  # the deadline came first
        worker = _idle_workers.pop() if _idle_workers else None
    started_here = worker is None
    if started_here:
        worker = _MathWorker()  # started outside the lock, so threads start theirs in parallel
    _top_up_spares()
    return worker, started_here


def prepare(mode: str) -> None:
    """Start the math mode's workers in the background, ahead of the first call (G7).

    A process's first "math" call would otherwise start its own worker, and that start (1.5-3.3 s
    on a loaded 2-core machine: importing sympy and math-verify) is outside the call's 2 s limit.
    task.Task.load calls this when a run or an evaluation uses --verifier math, before the model
    loads, so the workers are up by the first scoring. A no-op for the other modes; never raises
    (a worker that cannot start is reported by the call that needs it).
    """
    if mode == "math":
        _top_up_spares()


def _ask_math_worker(request: dict, timeout_s: float) -> dict:
    """The worker's reply to request, or a timeout or worker_error status, within timeout_s seconds
    of the call, waiting for a worker and killing one included (G7); only a worker started here
    (see _take_worker) is not counted."""
    deadline = time.monotonic() + timeout_s
    worker, started_here = _take_worker(deadline)
    if worker is None:
        return {"status": "timeout", "detail": f"no math worker free within {timeout_s:.2f}s (spares starting)"}
    if started_here:
        deadline = time.monotonic() + timeout_s
    remaining = deadline - TIMEOUT_MARGIN_S - time.monotonic()
    reply = worker.ask(request, remaining) if remaining > 0 else None
    if reply is None and remaining <= 0:  # nothing asked: the worker is as good as before
        with _workers_lock:
            _idle_workers.append(worker)
            _workers_lock.notify_all()
        return {"status": "timeout", "detail": f"no time left of {timeout_s:.2f}s for the worker"}
    if reply is None:
        crashed = worker.proc.poll() is not None
        worker.kill(reap_later=True)  # a hung parser cannot be interrupted; the process is the unit we can stop
        _top_up_spares()  # its replacement, started now for the calls after this one
        if crashed:
            return {"status": "worker_error", "detail": f"worker exited with code {worker.proc.returncode}"}
        return {"status": "timeout", "detail": f"no verdict within {timeout_s:.2f}s"}
    with _workers_lock:
        _idle_workers.append(worker)
        _workers_lock.notify_all()
    return reply


# Deviation 21, how the math mode compares numbers. Exact values (integers, fractions, powers,
# radicals, pi) are compared exactly; a decimal is the exact number it spells ("0.0000007" is
# 7/10^7), so it too is compared exactly with any value that has a finite decimal expansion. Only a
# decimal against a value that has none (1/3, pi, sqrt 2) is compared with a tolerance, relative so
# that tiny values never collapse: |a - b| <= DECIMAL_REL_TOL * max(|a|, |b|). 5e-6 accepts every
# correct rounding to 6 significant digits ("0.333333", "0.166667", "3.14159"), a shorter value only
# when it happens to be that close ("3.1416" for pi, 2.3e-6 off), and rejects "0.33333" for 1/3
# (1e-5 off), "1.4142" for sqrt 2 and "3.14".
DECIMAL_REL_TOL = (5, 10**6)  # 5e-6, as a fraction for exact arithmetic
EXACT_DIGITS = 30  # irrational exact forms must agree to this many significant digits
_EVAL_DIGITS = 60  # working precision of that check


def _install_number_rule(grader) -> None:
    """Make math-verify compare numbers by deviation 21 instead of its own rule.

    math_verify.grader.sympy_numeric_eq (math-verify 0.9.0) rounds both sides to 6 decimal places
    when one is a decimal, and otherwise tests `(a - b).evalf(chop=True) == 0`, which rounds away
    any difference below about 1e-15: 0.0000008 == 0.0000007 and 3^-60 == 3^-61 there. Every
    comparison in the grader (sets, tuples, intervals, matrices, equations) reaches numbers through
    that one function, so replacing it fixes them all.

    Raises:
        RuntimeError: the installed math-verify has no grader.sympy_numeric_eq (another version).
    """
    import sympy  # heavy (about a second): only the math worker, which alone compares expressions, imports it

    needed = ("sympy_numeric_eq", "is_atomic_or_pct_atomic", "safe_sympy_doit")
    missing = [name for name in needed if not hasattr(grader, name)]
    if missing:
        raise RuntimeError(f"math_verify.grader has no {', '.join(missing)}: install math-verify==0.9.0")
    original = grader.sympy_numeric_eq
    tolerance = sympy.Rational(*DECIMAL_REL_TOL)
    exact_tolerance = sympy.Rational(1, 10**EXACT_DIGITS)

    def exact(value):
        floats = value.atoms(sympy.Float)
        return value.xreplace({f: sympy.Rational(str(f)) for f in floats}), bool(floats)

    def finite_decimal(value) -> bool:
        denominator = value.q
        for prime in (2, 5):
            while denominator % prime == 0:
                denominator //= prime
        return denominator == 1

    def numeric_eq(a, b, float_rounding: int, numeric_precision: int) -> bool:
        matrices = (sympy.MatrixBase, sympy.MatrixExpr)
        if isinstance(a, matrices) and isinstance(b, matrices):
            return original(a, b, float_rounding, numeric_precision)  # element by element, through us
        if grader.is_atomic_or_pct_atomic(a, sympy.Integer) and grader.is_atomic_or_pct_atomic(b, sympy.Integer):
            return original(a, b, float_rounding, numeric_precision)  # exact already; "50%" == 50
        try:
            x, y = grader.safe_sympy_doit(a), grader.safe_sympy_doit(b)
            if not (isinstance(x, sympy.Expr) and isinstance(y, sympy.Expr) and x.is_number and y.is_number):
                # with symbols: exact, without the chop that zeroes tiny coefficients (x/3^60 vs x/3^61)
                return bool((a - b).evalf(n=numeric_precision) == 0)
            (x, x_decimal), (y, y_decimal) = exact(x), exact(y)
            if x.is_Rational and y.is_Rational:
                if not (x_decimal or y_decimal) or (finite_decimal(x) and finite_decimal(y)):
                    return bool(x == y)
                return bool(abs(x - y) <= tolerance * max(abs(x), abs(y)))
            limit = tolerance if x_decimal or y_decimal else exact_tolerance
            difference = abs((x - y).evalf(_EVAL_DIGITS))
            scale = max(abs(x.evalf(_EVAL_DIGITS)), abs(y.evalf(_EVAL_DIGITS)))
            return bool(difference <= limit * scale)
        except (TypeError, ValueError, ArithmeticError, NotImplementedError):
            # Not comparable as numbers (a boolean, a set, an unevaluable function): not shown equal
            # here, and math-verify goes on to its symbolic check, as after its own numeric check.
            return False

    grader.sympy_numeric_eq = numeric_eq


# One comparison per kind of expression the parser and sympy set up lazily (see _math_worker_main).
_WARM_UP = (
    ("\\frac{1}{2}", "0.5"), ("\\sqrt{5}", "2\\sqrt{5}"), ("3.14", "\\pi"), ("5r^5", "2"), ("p - q", "q - p"),
    ("y = 2x + 3", "2"), ("x \\in [-2, 7]", "[-2, 7]"), ("[1, 3)", "(1, 3]"), ("(2, 4)", "2"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"), ("\\{1, 2\\}", "1, 2"),
    ("1 \\pm \\sqrt{2}", "1 + \\sqrt{2}, 1 - \\sqrt{2}"), ("50\\%", "50"), ("30^\\circ", "30"),
    ("\\text{yes}", "\\text{no}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
)  # fmt: skip


def _math_worker_main() -> None:
    """The worker loop (runs in the subprocess). Only LaTeX extraction is enabled in math-verify:
    its plain-expression extractor calls sympy's parse_expr, which uses eval()."""
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints from libraries go to stderr, never into the protocol

    def send(message: dict) -> None:
        try:
            out.write(json.dumps(message).encode() + b"\n")
        except BrokenPipeError:
            sys.exit(0)  # the parent is gone (it exited, or killed us after a timeout): nobody to answer

    try:
        from math_verify import LatexExtractionConfig, grader, parse, verify

        _install_number_rule(grader)
    except (ImportError, RuntimeError) as error:
        send({"ready": False, "detail": str(error)})
        return
    # Our parent enforces the time limit, so math-verify runs with its own timeouts off; silence
    # its once-per-process warning about exactly that.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    config = [LatexExtractionConfig(boxed_match_priority=0)]

    def read(latex: str) -> list:
        return parse("\\boxed{" + latex + "}", extraction_config=config, parsing_timeout=None, raise_on_error=True)

    read_truth = functools.lru_cache(maxsize=4096)(read)
    # sympy and the LaTeX parser set parts of themselves up on first use, 0.1-0.5 s per kind of
    # expression: pay that here, before "ready", so a request's time limit measures its own work.
    try:
        for gold, pred in _WARM_UP:
            verify(read(gold), read(pred), timeout_seconds=None)
    except Exception as error:  # a broken install; the parent raises with this detail
        send({"ready": False, "detail": f"warm-up failed: {type(error).__name__}: {str(error)[:200]}"})
        return
    send({"ready": True})
    for line in sys.stdin.buffer:
        request = json.loads(line)
        try:
            gold = read_truth(request["truth"])
        except Exception as error:  # the dataset's fault, not the model's: the caller raises
            send({"status": "bad_ground_truth", "detail": f"{type(error).__name__}: {str(error)[:200]}"})
            continue
        if not gold:
            send({"status": "bad_ground_truth", "detail": "math-verify found no expression"})
            continue
        try:
            verdicts = []
            for pred in request["preds"]:
                target = read(pred)
                if not target:
                    raise ValueError(f"math-verify found no expression in {pred[:80]!r}")
                verdicts.append(verify(gold, target, timeout_seconds=None, raise_on_error=True))
            send({"status": "ok", "verdicts": verdicts})
        except MemoryError:
            send({"status": "worker_error", "detail": f"out of memory (cap {WORKER_MEMORY_BYTES} bytes)"})
        except Exception as error:  # any parser failure on model text is a verdict, reported with its type
            send({"status": "parse_error", "detail": f"{type(error).__name__}: {str(error)[:200]}"})


# --- public API -------------------------------------------------------------------------------


def score(response: str, ground_truth: str, *, mode: str = "dapo", timeout_s: float = DEFAULT_TIMEOUT_S) -> Score:
    """Score one response against its ground truth.

    Args:
        response: the model's text (anything: never raises on it).
        ground_truth: the reference answer; "dapo" needs an integer string.
        mode: one of MODES.
        timeout_s: hard limit, in seconds, on a math-mode call, the wait for a free worker and
            the kill of a hung one included (G7): past it the worker process is killed and the
            reason is "timeout", TIMEOUT_MARGIN_S before the limit so that the call returns within
            it. Not counted: starting a worker when none is idle or starting (a few seconds:
            importing sympy and math-verify and warming them up; the process's first call, or more
            calls at once than workers). SPARE_WORKERS spares are kept started ahead, so the call
            after a timeout takes one ready; a call that finds only spares still starting waits for
            one until its limit, then times out. Answers too expensive to evaluate are refused
            before parsing (G7). The "dapo" modes are linear-time string work and need no limit.

    Raises:
        ValueError: unknown mode, bad timeout, or a ground truth the mode cannot use.
        TypeError: response or ground_truth is not a str.
    """
    if mode not in MODES:
        raise ValueError(f"unknown verifier mode {mode!r}: choose one of {MODES}")
    if not isinstance(response, str) or not isinstance(ground_truth, str):
        raise TypeError(
            f"score() takes str response and ground_truth, got {type(response).__name__} and "
            f"{type(ground_truth).__name__}: decode token ids first and cast answers with str()"
        )
    if not ground_truth.strip():
        raise ValueError("empty ground truth: an empty answer would then score as correct; fix the dataset row")
    if mode == "dapo":
        return _score_dapo(response, ground_truth)
    if mode == "dapo-official":
        return _score_official(response, ground_truth)
    if mode == "math":
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        return _score_math(response, ground_truth, timeout_s)
    raise AssertionError(f"mode {mode!r} is in MODES but has no rule")


def score_batch(
    responses: list[str],
    ground_truths: list[str],
    *,
    mode: str = "dapo",
    workers: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Score]:
    """score() for many responses, results in input order.

    The math mode runs `workers` calls at once (default: CPU count), each in its own worker
    process; the "dapo" modes run inline, since a process hop costs more than the rule.
    """
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths: pass one per response")
    one = functools.partial(score, mode=mode, timeout_s=timeout_s)
    if mode != "math":
        return [one(r, g) for r, g in zip(responses, ground_truths)]
    # Threads only wait on pipes: the parsing runs in one worker process per thread.
    with ThreadPoolExecutor(max_workers=workers or len(os.sched_getaffinity(0))) as pool:
        return list(pool.map(one, responses, ground_truths))


# --- plumbing: command line for hand-checking rollouts ----------------------------------------


class CliError(Exception):
    """Bad input to the command line (a missing or unreadable file, a line that is not JSON, a
    record without the needed fields): `main` prints it as one "error: ..." line and exits 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in the same one-line style as ours (argparse prints usage first)."""

    def error(self, message: str) -> None:
        self.exit(2, f"error: {message}; run with --help for usage\n")


def _positive(kind: type):
    """An argparse type: a finite number of `kind` above 0, else a one-line argparse error."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _field(record: dict, path: str, where: str):
    """record["a"]["b"] for path "a.b" (parquet rows such as reward_model.ground_truth).

    Raises:
        CliError: the record has no such field; `where` names the file and row.
    """
    value = record
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise CliError(
                f"{where} has no field {path!r} (its fields: {', '.join(sorted(record)) or 'none'}); "
                f"name the fields with --response-field and --answer-field"
            )
        value = value[key]
    return value


def _read_records(path: str, limit: int | None) -> list[dict]:
    """The first `limit` records of a JSONL (one JSON object per line) or .parquet file.

    Raises:
        CliError: the file cannot be read, a line is not a JSON object, or pyarrow is missing.
    """
    if not os.path.isfile(path):
        raise CliError(f"{path} does not exist or is not a file; pass the path of a rollouts .jsonl file")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise CliError(f"reading {path} needs pyarrow: pip install pyarrow, or pass a .jsonl file") from None
        try:
            return pq.read_table(path).slice(0, limit).to_pylist()
        except OSError as error:
            raise CliError(f"cannot read {path} ({error}); pass a readable .parquet file") from error
        except ValueError as error:  # pyarrow's ArrowInvalid: not a parquet file
            raise CliError(f"{path} is not a parquet file ({error}); pass a .parquet or .jsonl file") from error
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise CliError(
                        f"{path} line {number} is not JSON ({error.msg}); pass a JSONL file, one JSON object per line"
                    ) from error
                if not isinstance(record, dict):
                    raise CliError(
                        f"{path} line {number} is a JSON {type(record).__name__}, not an object; "
                        f"pass a JSONL file, one JSON object per line"
                    )
                records.append(record)
                if limit is not None and len(records) >= limit:
                    break
    except OSError as error:
        raise CliError(f"cannot read {path} ({error.strerror or error}); pass a readable .jsonl file") from error
    except UnicodeDecodeError as error:
        raise CliError(f"{path} is not UTF-8 text ({error.reason}); pass a JSONL file") from error
    return records


def main(argv: list[str] | None = None) -> None:
    """Hand-check saved rollouts: print prediction, verdict and reason per row, then the counts.

    Args:
        argv: the command-line arguments (default: sys.argv[1:]); see --help.

    Raises:
        SystemExit: 2 on bad input, after printing one line "error: <what is wrong and how to fix
            it>" to stderr. With the environment variable DAPO_DEBUG=1 the underlying exception is
            raised instead, with its full traceback.
    """
    try:
        _cli(argv)
    except CliError as error:
        if os.environ.get("DAPO_DEBUG") == "1":
            raise
        message = " ".join(str(error).split())  # one line, whatever the text in it
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


def _cli(argv: list[str] | None) -> None:
    parser = _Parser(
        description="Hand-check saved rollouts: prediction, verdict and reason per row.",
        epilog="Bad input prints one 'error:' line and exits 2; DAPO_DEBUG=1 shows the traceback instead.",
    )
    parser.add_argument("path", help="rollouts JSONL (fields response, ground_truth) or a dataset .jsonl/.parquet")
    parser.add_argument("--mode", default="dapo", choices=MODES)
    parser.add_argument("--limit", type=_positive(int), default=None, help="score only the first N rows")
    parser.add_argument("--response-field", default="response", help="field with the model text")
    parser.add_argument(
        "--answer-field", default=None, help="field with the ground truth (default: ground_truth, else answer)"
    )
    parser.add_argument("--timeout-s", type=_positive(float), default=DEFAULT_TIMEOUT_S)
    args = parser.parse_args(argv)

    records = _read_records(args.path, args.limit)
    if not records:
        raise CliError(f"{args.path} has no records; pass a JSONL file with one JSON object per line")
    answer_field = args.answer_field or ("ground_truth" if "ground_truth" in records[0] else "answer")
    responses = [str(_field(r, args.response_field, f"{args.path} row {i}")) for i, r in enumerate(records)]
    truths = [str(_field(r, answer_field, f"{args.path} row {i}")) for i, r in enumerate(records)]
    for i, truth in enumerate(truths):  # a ground truth the mode cannot use, named by its row
        try:
            score("", truth, mode=args.mode)  # an empty response: checks the ground truth, starts no worker
        except ValueError as error:
            raise CliError(f"{args.path} row {i}: {error}") from error
    try:
        scores = score_batch(responses, truths, mode=args.mode, timeout_s=args.timeout_s)
    except ValueError as error:  # a math-mode ground truth the parser rejects
        raise CliError(f"{args.path}: {error}") from error
    except RuntimeError as error:  # the math worker could not start (math-verify missing)
        raise CliError(str(error)) from error

    print(f"{'row':>5}  {'truth':>12}  {'prediction':>24}  {'verdict':7}  reason")
    for i, (truth, s) in enumerate(zip(truths, scores)):
        pred = "-" if s.pred is None else s.pred
        print(f"{i:>5}  {truth[:12]:>12}  {pred[:24]:>24}  {'correct' if s.correct else 'wrong':7}  {s.reason}"
              + (f"  ({s.detail})" if s.detail else ""))  # fmt: skip
    counts = collections.Counter(s.reason for s in scores)
    print(f"\n{args.path}: {len(scores)} rows, mode={args.mode}, verifier {VERSION}")
    print(f"accuracy {sum(s.correct for s in scores) / len(scores):.3f}")
    for reason in REASONS:
        if counts[reason]:
            print(f"  {reason:17} {counts[reason]:>6}  {REASON_DOCS[reason]}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--math-worker"]:
        _math_worker_main()
    else:
        main()
