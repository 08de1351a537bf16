"""The evaluation's statistics against brute force and known values."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from evaluation.report import failure_cause
from evaluation.stats import accuracy, breakdown_fields, mean_interval, paired_difference, pass_at, pass_at_k, wilson


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The share of k-subsets of a task's samples holding a correct one: what pass@k estimates."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_the_share_of_subsets_with_a_correct_sample(n):
    rng = random.Random(n)
    for _ in range(20):
        outcomes = [rng.random() < 0.3 for _ in range(n)]
        for k in range(1, n + 1):
            assert pass_at_k(n, sum(outcomes), k) == pytest.approx(brute_pass_at_k(outcomes, k))


def test_pass_at_k_worked_by_hand():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 right of 4, two drawn: 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    assert pass_at_k(4, 3, 2) == 1.0  # fewer wrong answers than draws
    assert pass_at_k(32, 1, 1) == pytest.approx(1 / 32)


def test_pass_at_averages_over_tasks_and_reports_powers_of_two_up_to_the_samples():
    per_task = [[True, False, False], [False, False, False], [True, True, False]]
    got = pass_at(per_task, 3)
    assert sorted(got) == [1, 2, 3]
    for k, value in got.items():
        assert value == pytest.approx(sum(brute_pass_at_k(t, k) for t in per_task) / 3)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_wilson_matches_a_textbook_value_and_stays_in_bounds():
    # 81 of 263 (Newcombe 1998, table I example): 0.2553 to 0.3662
    low, high = wilson(81, 263)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    assert wilson(0, 10)[0] == 0.0 and 0 < wilson(0, 10)[1] < 0.35
    assert wilson(10, 10)[1] == pytest.approx(1.0) and 0.65 < wilson(10, 10)[0] < 1


def test_accuracy_with_one_episode_per_task_is_the_wilson_interval():
    got = accuracy([[True], [False], [True], [True]])
    assert got["value"] == 0.75 and got["solved"] == 3 and got["episodes"] == 4
    assert (got["low"], got["high"]) == pytest.approx(wilson(3, 4))


def test_clustered_accuracy_is_wider_than_counting_correlated_episodes_as_independent():
    # Every task either always or never solved: 8 episodes carry the information of 2 tasks.
    got = accuracy([[True] * 4, [False] * 4])
    naive = wilson(4, 8)
    assert got["value"] == 0.5
    assert got["high"] - got["low"] > naive[1] - naive[0]
    assert (got["low"], got["high"]) == pytest.approx(wilson(1, 2))
    # Nothing solved anywhere: the interval still has width, at the task count.
    none = accuracy([[False] * 3] * 5)
    assert none["low"] == 0 and none["high"] == pytest.approx(wilson(0, 5)[1])


def test_paired_difference_of_identical_results_is_zero_and_of_shifted_ones_is_the_shift():
    a = {"t1": 1.0, "t2": 0.0, "t3": 0.5}
    same = paired_difference(a, dict(a))
    assert same["value"] == 0 and same["low"] == 0 and same["high"] == 0 and same["tasks"] == 3
    shifted = paired_difference({k: v + 0.25 for k, v in a.items()}, a)
    assert shifted["value"] == pytest.approx(0.25) and shifted["low"] == pytest.approx(0.25)
    partial = paired_difference({"t1": 1.0, "x": 0.0}, a)
    assert partial["tasks"] == 1


def test_mean_interval_uses_the_sample_standard_deviation():
    mean, low, high = mean_interval([1.0, 2.0, 3.0, 4.0])
    sd = math.sqrt(sum((x - 2.5) ** 2 for x in [1, 2, 3, 4]) / 3)
    assert mean == 2.5 and high - mean == pytest.approx(1.959963984540054 * sd / 2)


def test_breakdown_fields_are_repeating_short_values_not_ids_or_text():
    tasks = [
        {"id": str(i), "question": f"What is {i}?", "kind": "add" if i % 2 else "sub", "level": i % 3, "long": "x" * 99}
        for i in range(12)
    ]
    assert breakdown_fields(tasks, frozenset({"id", "question"})) == ["kind", "level"]
    assert breakdown_fields(tasks[:1], frozenset()) == []


def test_failure_causes_drop_the_particulars():
    assert failure_cause("agent error: ValueError: bad thing 12") == "agent error: ValueError"
    assert failure_cause("episode timed out after 300s") == "episode timed out after Ns"
    assert failure_cause("timed out: no activity for 600s") == "timed out"
    assert failure_cause(None) == "unknown"
