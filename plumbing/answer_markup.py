"""The markup around an answer value (row G2 of verifier.py's grammar): boxes in every spelling,
math delimiters, wrappers, LaTeX spacing and digit groups peeled off, the clause after a value, a
congruence's modulus; string work shared by the "dapo" and "math" modes.

Nothing here decides a verdict: plumbing/final_answer.py finds the final statement of a response,
plumbing/integer_answer.py ("dapo") and plumbing/math_equivalence.py ("math") read its value with
these helpers. The numbered deviations cited are those of docs/verifier.md.
"""

from __future__ import annotations

import itertools
import re

# Longest answer text we look at. The longest MATH-500 answer has 159 characters (verl's
# math_dapo.py comment); 1000 leaves room for matrices and keeps every step cheap.
MAX_ANSWER_CHARS = 1000
# More boxes than this in the final statement is spam, not an answer (and would cost work).
MAX_FINAL_BOXES = 16

# One definition of the name of a variable, shared by the sentence frames of "dapo" (G3: "The value
# of $I_{\max}$ is 34") and the equations that assign one variable in "math" (G6: "I_{\max} =
# \frac{V}{R}"): a letter, a Greek letter, or a styled or accented one ("\mathbf{v}", "\vec{F}",
# "\hat{x}", "\text{speed}"); a segment, angle or triangle ("AB", "\angle ABC", "m\angle A",
# "\triangle ABC"); then a subscript
# of any content ("V_0", "V_{0}", "I_{\max }", "x_{\text{min}}", "a_{n+1}") and primes ("f'", "x^*",
# "y^{\prime}"). A power ("x^2") is not part of a name.
GREEK = (
    "alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma"
    "|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega|ell|hbar"
)
SYMBOL = (
    r"(?:(?:m\s*)?\\angle\s*[A-Z]{1,3}(?![A-Za-z])|\\triangle\s*[A-Z]{3}(?![A-Za-z])|[A-Z]{2,3}(?![A-Za-z])"
    rf"|(?:[A-Za-z]|\\(?:{GREEK})|\\(?:mathbf|mathrm|mathit|mathcal|mathbb|mathsf|boldsymbol|bm|vec|hat|bar|overline"
    r"|tilde|dot|ddot|widehat|widetilde|overrightarrow|operatorname|text)\s*\{\s*[A-Za-z\\][^{}]{0,19}\})(?![A-Za-z])"
    r"(?:\s*_\s*(?:\{(?:[^{}]|\{[^{}]{0,20}\}){1,30}\}|[A-Za-z0-9]|\\[A-Za-z]+))?"
    r"(?:'{1,3}|\^\s*(?:\{\s*(?:\\prime|\*)\s*\}|\\prime|\*))?)"
)
# The side of an equation that names what it assigns: a symbol, with its arguments if a function's
# ("f(x)", "\Phi (x,y)", "P(X > 2)", "f(2)").
ASSIGNED = re.compile(rf"\s*{SYMBOL}(?:\s*\((?:[^()]|\([^()]*\)){{0,60}}\))?\s*")
_SYMBOL_STYLE = re.compile(r"\\(?:mathrm|text|operatorname|mathit|rm)\s*\{([^{}]*)\}|\\left|\\right|[{}\s\\]")


def symbol_key(side: str) -> str:
    """One spelling of the name an ASSIGNED side gives: "I_{\\max }", "I_\\max", "I_{\\text{max}}" ->
    "I_max"; "\\Phi (x,y)" -> "Phi(x,y)"."""
    return _SYMBOL_STYLE.sub(lambda m: m[1] or "", side)

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
def box_starts(data: bytes, start: int, end: int) -> list[re.Match]:
    """The box commands (any spelling, deviation 13) in data[start:end], at most MAX_FINAL_BOXES + 1
    of them (more is spam to every caller)."""
    if data.find(b"box", start, end) < 0:  # the common case, and cheaper than the regex
        return []
    return list(itertools.islice(_BOX.finditer(data, start, end), MAX_FINAL_BOXES + 1))


def last_box(data: bytes, start: int, end: int | None = None) -> re.Match | None:
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


def box_span(data: bytes, box: re.Match) -> tuple[str, int]:
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


def box_contents(data: bytes, box: re.Match) -> str:
    return box_span(data, box)[0]


def boxes_in(text: str) -> list[str]:
    """Contents of every box in one answer text (at most MAX_FINAL_BOXES + 1 of them)."""
    data = text.encode("utf-8", "replace")
    return [box_contents(data, box) for box in box_starts(data, 0, len(data))[: MAX_FINAL_BOXES + 1]]

# --- normalisation common to both modes ------------------------------------------------------

# Commands that only style their argument (deviation 3), and "{13}": "\boxed{{13}}" is a box LaTeX
# accepts (deviation 13).
_WRAPPERS = (
    "\\boxed{", "\\text{", "\\textbf{", "\\mathbf{", "\\mathrm{", "\\mbox{", "\\fbox{", "\\hbox{",
    "\\textit{", "\\textrm{", "\\textsf{", "\\texttt{", "\\textup{", "\\textsl{", "\\textnormal{", "\\emph{",
    "\\underline{", "\\mathit{", "\\mathsf{", "\\mathtt{", "\\mathnormal{", "\\bm{", "\\boldsymbol{", "\\pmb{", "{",
)  # fmt: skip
# Style switches and colour before the value: "{\bf 13}", "\displaystyle 13", "\color{red} 13",
# "\textcolor{red}{13}" (the last also needs its closing brace, checked in peel).
_STYLING = re.compile(
    r"\\(?:displaystyle|textstyle|bf|it|rm|sf|tt|bfseries|boldmath|large|Large|LARGE|huge|Huge)(?![A-Za-z])\s*"
    r"|\\color\{[^{}]{0,40}\}\s*|\\textcolor\{[^{}]{0,40}\}(?=\{)"
)
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# HTML markup a chat model may emit around the value (deviation 3): "<code>13</code>", "<b>13</b>".
_HTML_PAIR = re.compile(r"<(code|b|strong|em|i|u|mark|kbd|samp|tt|answer)>(.*)</\1>", re.IGNORECASE | re.DOTALL)
_END_MATH = re.compile(r"\\end\{(?:equation|align|gather|displaymath|math)\*?\}")
_BEGIN_MATH = re.compile(r"\\begin\{((?:equation|align|gather|displaymath|math)\*?)\}")
PLACEHOLDER = re.compile(
    r"[\[<({]?(?:your|the|final|_|\s)*(?:answer|final_answer|ans)(?:\s*here)?\s*[\]>)}]?"
    r"|[?._\-\u2026]+|\\[lc]?dots|n/?a|tbd|\.\.\.",
    re.IGNORECASE,
)


def balanced(text: str) -> bool:
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


def peel(text: str) -> str:
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
        elif style is not None and text.endswith("}") and balanced(text[style.end() + 1 : -1]):
            text = text[style.end() :]  # "\textcolor{red}{13}" leaves "{13}", a wrapper below
        for wrapper in _WRAPPERS:
            # "\text{a} 13 \text{b}" starts and ends like a wrapper but is not one: check the braces.
            if text.startswith(wrapper) and text.endswith("}") and balanced(text[len(wrapper) : -1]):
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
    if text.endswith("}") and not balanced(text) and balanced(text[:-1]):
        text = text[:-1].rstrip()  # the "}" of a "\text{Answer: 512}" opened before the marker
    return text


def collapse_thousands(text: str, pairs: bool = False) -> str:
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

# comma, dash or full stop ("81, altogether.", "17. I hope it is correct."), words only.
# A modulus after the value (G2): "\pmod{7}", "\pmod 7", "\bmod 7", "\mod 7", "(mod 7)", "\text{mod } 7";
# the residue before it is the value, the modulus never is.
MODULUS_TEXT = (
    r"\(?\s*(?:\\(?:text|mathrm|textrm|operatorname|rm)\s*\{\s*mod(?:ulo)?\s*\}|\\[bp]?mod(?![A-Za-z])"
    r"|mod(?:ulo)?(?![A-Za-z]))\s*(?:\{(?P<modulus>[^{}]{1,20})\}|(?P<modulus_bare>[0-9A-Za-z]{1,20}"
    r"(?:\^\s*(?:\{[0-9]{1,4}\}|[0-9]))?))\s*\)?"
)
MODULUS = re.compile(MODULUS_TEXT)
# A subordinate clause after the value (deviation 15): "56, since 7 x 8 = 56", "56 (because ...)",
# "56, which is 7 x 8", "56. This is because ...". The words of the first list open one after a
# space; those of the second only after punctuation ("12 by 13" is not "12").
_CLAUSE_STRONG = r"since|because|as(?!\s+well\b)|which|where|whereby|given|using|i\.\s?e\.?|e\.\s?g\.?"
_CLAUSE_WEAK = r"from|by|via|due\s+to|obtained|computed|calculated|found|following|according|so|hence|thus|therefore"
CLAUSE = re.compile(
    rf"(?:[,;:(\[\u2014\u2013]|\\text\{{|\.\s|\s-{{1,3}}\s)\s{{0,3}}"
    rf"(?:(?:this|that|it)\s{{1,3}}(?:is|was|follows)\s{{1,3}})?(?:{_CLAUSE_STRONG}|{_CLAUSE_WEAK})(?![A-Za-z])"
    rf"|(?<!well)(?<!such)\s(?:{_CLAUSE_STRONG})(?![A-Za-z])",  # "as well as", "such as": not clauses
    re.IGNORECASE,
)
def before_clause(text: str) -> str:
    """text up to a subordinate clause after the value (deviation 15); the clause is never read,
    so the numbers in it are not candidates. Searched in the first MAX_ANSWER_CHARS characters."""
    clause = CLAUSE.search(text, 0, MAX_ANSWER_CHARS + 1)
    return text[: clause.start()] if clause else text
def canonical_int(sign: str, digits: str) -> str:
    """"013" -> "13", "-0" -> "0". String work, never int(): a 10,000-digit answer cannot raise."""
    digits = digits.lstrip("0") or "0"
    return digits if sign != "-" or digits == "0" else "-" + digits


def as_integer(text: str) -> str | None:
    """The canonical integer when text is exactly one ASCII integer, else None."""
    m = _PLAIN_INTEGER.fullmatch(text)
    return canonical_int(m[1], m[2]) if m else None


_PLAIN_INTEGER = re.compile(r"([+-]?)([0-9]+)")
