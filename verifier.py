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
import collections
import functools
import json
import math
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from plumbing import math_equivalence, math_workers
from plumbing.final_answer import extract_final
from plumbing.integer_answer import agree, earlier_value, integer_candidate, integer_ground_truth, section_value
from plumbing.result_statements import results_stated

__all__ = ["VERSION", "MODES", "REASONS", "EXCEPTION_REASONS", "Score", "score", "score_batch"]

# Changes whenever any rule changes: train and eval record it with every score.
VERSION = "dapo-verifier-5"
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



def _score_dapo(response: str, ground_truth: str) -> Score:
    truth = integer_ground_truth(ground_truth)
    final = extract_final(response)
    if final.reason:
        return _verdict(False, None, final.reason, final.detail)
    if len(final.candidates) == 1:  # the common case, kept cheap
        pred, reason, detail = integer_candidate(final.candidates[0])
    else:
        pred, reason, detail = agree([integer_candidate(c) for c in final.candidates])
    if reason:
        return _verdict(False, pred, reason, detail)
    if final.earlier:  # deviation 20: every "Answer:" line must state the final value
        others = [value for value in map(earlier_value, final.earlier) if value is not None and value != pred]
        if others:
            stated = ", ".join(dict.fromkeys([*others, pred]))
            return _verdict(False, None, "multiple_answers", f"'Answer:' lines disagree: {stated}")
    if final.section:  # deviation 23: every value of the final answer section must be the final one
        others = [value for value in map(section_value, final.section) if value != pred]
        if others:
            stated = ", ".join(dict.fromkeys([*others, pred]))
            detail = f"the final answer section states several values: {stated[:200]}"
            return _verdict(False, None, "multiple_answers", detail)
    other = _other_result(final, pred)
    if other is not None:  # G5: from the final statement on, another value stated as the result
        return _verdict(False, None, "multiple_answers", other)
    return _verdict(pred == truth, pred, "ok" if pred == truth else "wrong")



def _other_result(final, pred: str) -> str | None:
    """Why the response states a final value other than pred (G5), else None: a value the text
    states as a result from the final statement on, or after an earlier explicit statement of pred
    (an "Answer:" line, a box) up to the final one (plumbing/result_statements.py)."""
    for _, value in results_stated(final.data, final.final_at, len(final.data), pred):
        if value != pred:
            return f"the final answer {pred} and the text from it on, which states {value} as the result"
    for text, end in final.anchors:
        if end <= final.final_start and section_value(text) == pred:
            for _, value in results_stated(final.data, end, final.final_start, pred):
                if value != pred:
                    return f"{pred} stated, then {value} as the result, then {pred} again as the final answer"
    return None


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
        return _verdict(*math_equivalence.score_math(response, ground_truth, timeout_s))
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


def prepare(mode: str) -> None:
    """Start the math mode's workers in the background, ahead of the first call (G7): task.Task.load
    calls it under --verifier math, before the model loads. A no-op for the other modes; never
    raises (a worker that cannot start is reported by the call that needs it)."""
    if mode == "math":
        math_workers.prepare()


if __name__ == "__main__":
    main()
