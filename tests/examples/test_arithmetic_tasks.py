"""The arithmetic example's held-out problems and their kinds (the fields `areal-proxy eval` breaks down by)."""

from __future__ import annotations

from adapters.tasks import load_object
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "arithmetic"
tasks = load_object(f"{EXAMPLE}/agent.py:tasks")
detailed_kind = load_object(f"{EXAMPLE}/agent.py:detailed_kind")


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
