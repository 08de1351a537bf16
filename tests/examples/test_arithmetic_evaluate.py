"""The arithmetic example's evaluation helpers: pass@k by hand, and the kinds of its held-out problems."""

from __future__ import annotations

import pytest

from adapters.tasks import load_object
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "arithmetic"
tasks = load_object(f"{EXAMPLE}/agent.py:tasks")
pass_at_k = load_object(f"{EXAMPLE}/evaluate.py:pass_at_k")
detailed_kind = load_object(f"{EXAMPLE}/evaluate.py:detailed_kind")


def test_pass_at_k_worked_by_hand():
    assert pass_at_k(4, 0, 2) == 0.0
    # 1 right of 4, two drawn: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # 2 right of 4, two drawn: 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    # fewer wrong answers than draws: a right one is always drawn
    assert pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(32, 1, 1) == pytest.approx(1 / 32)
    assert pass_at_k(32, 5, 32) == 1.0


def test_detailed_kind():
    assert detailed_kind("What is 23 + 45?") == "addition, no carry"
    assert detailed_kind("What is 68 + 54?") == "addition, carry"
    assert detailed_kind("What is 15 + 15?") == "addition, carry"
    assert detailed_kind("What is 91 - 71?") == "subtraction, no borrow"
    assert detailed_kind("What is 45 - 45?") == "subtraction, no borrow"
    assert detailed_kind("What is 52 - 15?") == "subtraction, borrow"
    assert detailed_kind("What is 49 - 89?") == "subtraction, negative"


def test_the_held_out_problems_by_kind():
    counts: dict[str, int] = {}
    for task in tasks("eval"):
        kind = detailed_kind(task["question"])
        assert task["form"] == kind  # the field rollout.balance_by can draw by
        counts[kind] = counts.get(kind, 0) + 1
    assert counts == {
        "addition, no carry": 65,
        "addition, carry": 46,
        "subtraction, no borrow": 31,
        "subtraction, borrow": 17,
        "subtraction, negative": 41,
    }
