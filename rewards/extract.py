"""Pull the final numeric answer out of model-style text, the way GSM8K grades it.

Models state their answer in many shapes: a GSM8K `#### 18` line, LaTeX
`\\boxed{\\$18}`, "The answer is 18.", or just a last sentence ending in
"$18 every day". We look for those in order of how deliberate they are and
return the number as a canonical string ("1,234.50" and "$1234.5" both become
"1234.5"), so a reward can compare answers with `numbers_equal` without caring
about currency signs, thousands separators, units or trailing zeros.
A comma is only a thousands separator ("1,234"); a decimal comma ("12,5") is
read as two numbers.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

# One number as written in prose or LaTeX: optional sign, optional currency, then
# a fraction "3/4", a comma-grouped or plain integer with optional decimals, or ".5".
# The sign only counts when it does not follow a digit or word, so the "-" in
# "16-3" is subtraction, not a negative 3.
_NUMBER = re.compile(
    r"""
    (?<![\w./])
    (?P<sign>(?<![\w)\]}])[-−])?
    (?:[$€£¥]\s?)?
    (?P<body>
        \d+/\d+(?![\d/])
      | (?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?
      | \.\d+
    )
    """,
    re.VERBOSE,
)
_HASHES = re.compile(r"####[^\n]*")
_PHRASE = re.compile(
    r"\banswer\s*(?:\*\*)?\s*(?:is|was|would\s+be|will\s+be|should\s+be|equals|:|=)",
    re.IGNORECASE,
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's "<<9*2=18>>" annotations
_SENTENCE_END = re.compile(r"\.(?:\s|$)|\n")
_DECIMALS = 12  # places kept for a non-terminating fraction such as 1/3


def extract_answer_number(text: str) -> str | None:
    """The answer number in `text`, canonical (e.g. "18", "-3", "1234.5"), or None.

    Priority: the last `#### X` line, else the last `\\boxed{X}`, else the last
    "answer is X" / "Answer: X" / "final answer: X" phrase, else the last number
    anywhere. A marker that holds no number is skipped in favour of the next candidate.
    """
    text = _clean(text)
    for span in _answer_spans(text):
        number = _first_number(_after_last_equals(span))
        if number is not None:
            return number
    matches = list(_NUMBER.finditer(text))
    for match in reversed(matches):
        number = _canonical(match)
        if number is not None:
            return number
    return None


def reference_number(answer: str) -> str | None:
    """The number after `####` in a GSM8K reference answer; None without a `####` line."""
    lines = _HASHES.findall(_clean(answer))
    if not lines:
        return None
    return _first_number(lines[-1][4:])


def normalise_number(token: str) -> str | None:
    """Canonical form of one written number ("$1,234.50" → "1234.5", "3/4" → "0.75")."""
    return _first_number(_clean(token))


def numbers_equal(a: str | None, b: str | None) -> bool:
    """Whether two written numbers have the same value ("18" == "18.0" == "$18").

    None (no answer found) never equals anything, not even None, so a missing
    answer can never score as correct against a missing reference.
    """
    if a is None or b is None:
        return False
    value_a, value_b = _value(a), _value(b)
    if value_a is None or value_b is None:
        return False
    # The slack only matters for rounded repeating decimals ("0.333333333333" vs 1/3).
    return abs(value_a - value_b) <= Fraction(1, 10 ** (_DECIMALS - 1))


def _clean(text: str) -> str:
    """Rewrite LaTeX and GSM8K notation that would otherwise split or hide numbers."""
    text = _CALCULATOR.sub("", text)
    text = text.replace("\\$", "$").replace("{,}", ",").replace("\\!", "")
    text = re.sub(r"(\d)\\,(\d{3})", r"\1,\2", text)  # LaTeX thin-space thousands "1\,234"
    text = text.replace("\\%", "%")
    return _LATEX_FRAC.sub(r"\1/\2", text)


def _answer_spans(text: str) -> list[str]:
    """Candidate answer texts, most deliberate marker first, last occurrence first."""
    hashes = [line[4:] for line in _HASHES.findall(text)]
    boxed = _boxed_contents(text)
    phrases = []
    for match in _PHRASE.finditer(text):
        rest = text[match.end() :].lstrip(" \t\n:*")
        end = _SENTENCE_END.search(rest)
        phrases.append(rest[: end.start()] if end else rest)
    return [*reversed(hashes), *reversed(boxed), *reversed(phrases)]


def _boxed_contents(text: str) -> list[str]:
    """The brace-balanced contents of every `\\boxed{...}`, in order."""
    contents = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    contents.append(text[start:i])
                    break
    return contents


def _after_last_equals(span: str) -> str:
    """In "9 * 2 = 18 dollars" the answer is what follows the last '='."""
    return span.rsplit("=", 1)[-1]


def _first_number(span: str) -> str | None:
    for match in _NUMBER.finditer(span):
        number = _canonical(match)
        if number is not None:
            return number
    return None


def _canonical(match: re.Match[str]) -> str | None:
    value = _parse_body(match["body"])
    if value is None:
        return None
    if match["sign"]:
        value = -value
    return _format(value)


def _parse_body(body: str) -> Fraction | None:
    if "/" in body:
        numerator, denominator = body.split("/")
        if int(denominator) == 0:
            return None
        return Fraction(int(numerator), int(denominator))
    return Fraction(Decimal(body.replace(",", "")))


def _format(value: Fraction) -> str:
    """Integers without a point, decimals without trailing zeros, never exponent form."""
    if value.denominator == 1:
        return str(value.numerator)
    exact = Decimal(value.numerator) / Decimal(value.denominator)
    if not _terminates(value.denominator):
        exact = exact.quantize(Decimal(1).scaleb(-_DECIMALS))
    text = format(exact, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _terminates(denominator: int) -> bool:
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    return denominator == 1


def _value(written: str) -> Fraction | None:
    canonical = normalise_number(written)
    return None if canonical is None else Fraction(Decimal(canonical))
