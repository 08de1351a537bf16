"""Answer-number extraction: every GSM8K test answer, and model-style outputs by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rewards.extract import extract_answer_number, normalise_number, numbers_equal, reference_number

REPO = Path(__file__).resolve().parents[2]


def _gsm8k_test_file() -> Path | None:
    candidates = [REPO.parent / "shared" / "data" / "gsm8k", Path("/work/shared/data/gsm8k")]
    if os.environ.get("AREAL_GSM8K_DIR"):
        candidates.insert(0, Path(os.environ["AREAL_GSM8K_DIR"]))
    for directory in candidates:
        if (directory / "test.jsonl").is_file():
            return directory / "test.jsonl"
    return None


def test_every_gsm8k_test_answer_extracts_its_reference_number() -> None:
    path = _gsm8k_test_file()
    if path is None:
        pytest.skip("GSM8K test.jsonl not found: set AREAL_GSM8K_DIR or put it in ../shared/data/gsm8k")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(rows) == 1319
    wrong = []
    for row in rows:
        # The written reference, e.g. "1,600" or "-3", with its thousands commas dropped.
        expected = row["answer"].split("####")[-1].strip().replace(",", "")
        got = (extract_answer_number(row["answer"]), reference_number(row["answer"]))
        if got != (expected, expected):
            wrong.append((expected, got))
    assert wrong == []


MODEL_OUTPUTS = [
    ("The answer is 18.", "18"),
    ("\\boxed{18}", "18"),
    ("So she makes $18 every day.", "18"),
    ("#### 1,234", "1234"),
    ("Answer: -5", "-5"),
    ("She has 3 apples and 4 pears, so 7 fruits in total", "7"),
    ("The total is 12.50 dollars", "12.5"),
    ("x = 42", "42"),
    ("First 16 - 3 = 13, then 13 - 4 = 9, and 9 * 2 = 18.", "18"),
    ("The answer is 18.00", "18"),
    ("The final answer is $\\boxed{\\$18}$.", "18"),
    ("Therefore \\boxed{18 \\text{ dollars}}", "18"),
    ("She spends $1,234.50 in total.", "1234.5"),
    ("The discount is 50%.", "50"),
    ("Final answer: 3/4", "0.75"),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("He walks 5 km.", "5"),
    ("The answer is 9 * 2 = 18.", "18"),
    ("**Answer:** 18", "18"),
    ("Answer:\n72", "72"),
    ("The temperature drops to −3 degrees.", "-3"),
    ("He loses -$5 on the trade.", "-5"),
    ("Total: 1,000,000 people", "1000000"),
    ("Each stick costs $0.50", "0.5"),
    ("It grows .5 inches a day", "0.5"),
    ("The answer is 18. I double-checked with 3 methods.", "18"),
    ("\\boxed{24} is what I get after 3 steps", "24"),
    ("Step 1: 2 + 3 = 5\nStep 2: 5 * 4 = 20\n#### 20\nHope this helps (took 2 steps).", "20"),
    ("\\boxed{2 + 3 = 5}", "5"),
    ("The answer is x = 42", "42"),
    ("We get 16-3-4=9 eggs.", "9"),
    ("So the answer is $\\$1{,}234$.", "1234"),
    ("I first guessed \\boxed{10}, but the correct value is \\boxed{12}.", "12"),
    ("The answer is 7, since 3 + 4 = 7.", "7"),
    ("The answer is 1.5. Half of 3 is 1.5.", "1.5"),
    ("Janet makes 9 * 2 = $<<9*2=18>>18 every day.", "18"),
    ("The box measures \\boxed{5 \\text{ km}^2}", "5"),
    ("Her answer is not obvious. Counting again: 3 + 4 = 7", "7"),
    ("The answer is 18 dollars per day for 7 days.", "18"),
    ("He paid $6.50 + $5.50 = $12.", "12"),
]


@pytest.mark.parametrize(("text", "expected"), MODEL_OUTPUTS)
def test_model_style_outputs(text: str, expected: str) -> None:
    assert extract_answer_number(text) == expected


@pytest.mark.parametrize("text", ["", "I don't know.", "\\boxed{}", "The answer is unclear.", "####"])
def test_no_number_gives_none(text: str) -> None:
    assert extract_answer_number(text) is None


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("18.00", "18"),
        ("1,234", "1234"),
        ("$1,234.50", "1234.5"),
        ("50%", "50"),
        ("-0", "0"),
        ("1/3", "0.333333333333"),
    ],
)
def test_normalise_number(token: str, expected: str) -> None:
    assert normalise_number(token) == expected


def test_numbers_equal_compares_values_not_spelling() -> None:
    assert numbers_equal("18", "18.0")
    assert numbers_equal("$1,234.50", "1234.5")
    assert numbers_equal("1/3", "0.333333333333")
    assert not numbers_equal("1000000000", "1000000001")
    assert not numbers_equal("18", "19")
    assert not numbers_equal(None, "18")
    assert not numbers_equal(None, None)
    assert not numbers_equal("eighteen", "18")


def test_reference_number_needs_a_hash_line() -> None:
    assert reference_number("She makes 9 * 2 = $18.\n#### 18") == "18"
    assert reference_number("#### -3") == "-3"
    assert reference_number("18") is None
