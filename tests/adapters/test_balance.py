"""The kind balancer: hand-worked weights, and the runner drawing tasks by them against a real proxy."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from adapters.balance import KindBalancer
from adapters.config import RolloutConfig
from adapters.runner import EpisodeRunner
from tests.adapters.test_runner_groups import one_call, run_tasks


def test_weights_follow_the_informative_and_solved_shares_by_hand():
    b = KindBalancer(["a", "b", "c"], window=4, floor=0.2)
    for rewards in ({0.0, 1.0}, {0.0, 1.0}, {0.0, 1.0}, {1.0}):
        b.record("a", rewards)
    for _ in range(4):
        b.record("b", {0.0})
    # a: informative (3 + 1) / (4 + 2) = 2/3, solved 1/6  -> (5/6) / (2/3) = 1.25
    # b: informative 1/6, under the floor 0.2, solved 0    -> 1 / 0.2     = 5
    # c: nothing yet: informative 1/2, solved 0            -> 1 / 0.5     = 2
    assert b.informative("a") == pytest.approx(2 / 3) and b.solved("a") == pytest.approx(1 / 6)
    w = b.weights()
    assert w == pytest.approx({"a": 1.25 / 8.25, "b": 5 / 8.25, "c": 2 / 8.25})
    # the window keeps the last 4 groups: a solved four times -> (1 - 4/6) / max(1/6, 0.2) = 5/3
    for _ in range(4):
        b.record("a", {1.0})
    assert b.weights()["a"] == pytest.approx((5 / 3) / (5 / 3 + 5 + 2))
    b.record("a", set())  # a group whose every episode failed to score says nothing
    assert len(b._recent["a"]) == 4


def test_draws_match_the_weights():
    b = KindBalancer(["a", "b"], seed=3, floor=0.2)
    for _ in range(10):
        b.record("a", {0.0, 1.0})
        b.record("b", {0.0})
    w = b.weights()
    draws = Counter(b.choose() for _ in range(6000))
    assert draws["a"] / 6000 == pytest.approx(w["a"], abs=0.02)


TASKS = [
    *({"id": f"e{i}", "question": "Say hi.", "reference": "easy", "kind": "easy"} for i in range(4)),
    *({"id": f"h{i}", "question": "Say bye.", "reference": "hard", "kind": "hard"} for i in range(4)),
    *({"id": f"m{i}", "question": "Say yes.", "reference": "mixed", "kind": "mixed"} for i in range(4)),
]


def test_the_runner_draws_kinds_that_still_teach_and_saves_where_each_stands(tmp_path: Path):
    state = tmp_path / "runner_state.json"
    cfg = RolloutConfig(
        reward_fn="test_by_reference", group_size=2, concurrency=2, max_tasks=30, balance={"by": "kind"}
    )
    stats, listed = run_tasks(tmp_path, cfg, TASKS, state_path=state)
    kinds = Counter(s["group_id"][0] for s in listed)  # group ids are "<task id>@<pass>"
    assert sum(kinds.values()) == 60 and stats.tasks_started == 30
    # easy groups are all solved and fade; hard ones (never a signal) are held to the floor's share
    assert kinds["e"] < kinds["m"] < kinds["h"], kinds
    saved = json.loads(state.read_text())
    assert saved["tasks_started"] == 30
    assert {k: 2 * n for k, n in saved["kind_positions"].items()} == {
        "easy": kinds["e"],
        "hard": kinds["h"],
        "mixed": kinds["m"],
    }
    # each kind's tasks go round in their own order: a kind drawn more than 4 times starts a second pass
    hard_groups = Counter(s["group_id"] for s in listed if s["group_id"].startswith("h"))
    assert set(hard_groups.values()) == {2} and any(g.endswith("@1") for g in hard_groups)


def test_every_task_needs_the_field_balanced_by(tmp_path: Path):
    cfg = RolloutConfig(
        reward_fn="test_by_reference", group_size=2, concurrency=2, max_tasks=2, balance={"by": "level"}
    )
    with pytest.raises(ValueError, match=r"rollout.balance.by = 'level', but 12 tasks have no 'level' field"):
        run_tasks(tmp_path, cfg, TASKS)


def test_signal_goal_weights_by_size_and_informative_share_by_hand():
    b = KindBalancer(["a", "b", "c"], window=4, floor=0.1, goal="signal", sizes={"a": 30, "b": 50, "c": 20})
    for rewards in ({0.0, 1.0}, {0.0, 1.0}, {0.0, 1.0}, {1.0}):
        b.record("a", rewards)
    for _ in range(4):
        b.record("b", {0.0})
    # a: informative (3 + 1) / (4 + 2) = 2/3       -> 30 · 2/3 = 20
    # b: informative 1/6, above the floor 0.1      -> 50 · 1/6 = 25/3
    # c: nothing yet: informative 1/2              -> 20 · 1/2 = 10
    total = 20 + 25 / 3 + 10
    assert b.weights() == pytest.approx({"a": 20 / total, "b": (25 / 3) / total, "c": 10 / total})
    # a solved four times in a row: informative 1/6, as low as b's; b never informative again
    for _ in range(4):
        b.record("a", {1.0})
    assert b.weights()["a"] == pytest.approx(5 / (5 + 25 / 3 + 10))
    # with the floor above every share, the kinds are drawn by size alone: plain dataset order
    even = KindBalancer(["a", "b"], floor=1.0, goal="signal", sizes={"a": 3, "b": 1})
    even.record("a", {0.0})
    assert even.weights() == pytest.approx({"a": 0.75, "b": 0.25})


def test_the_runner_sends_rollouts_where_groups_get_trained(tmp_path: Path):
    cfg = RolloutConfig(
        reward_fn="test_by_reference",
        group_size=2,
        concurrency=2,
        max_tasks=30,
        balance={"by": "kind", "goal": "signal", "floor": 0.1},
    )
    # each kind is weighed by its number of tasks
    uneven = EpisodeRunner(cfg, "http://127.0.0.1:9", TASKS[:6], agent=one_call)
    assert uneven.order.balancer.sizes == {"easy": 4, "hard": 2}
    stats, listed = run_tasks(tmp_path, cfg, TASKS)
    kinds = Counter(s["group_id"][0] for s in listed)
    assert sum(kinds.values()) == 60 and stats.tasks_started == 30
    # easy (always solved) and hard (never) groups are never informative; mixed ones always are
    assert kinds["m"] > kinds["e"] + kinds["h"], kinds


def test_a_balance_goal_needs_a_field_to_balance_by():
    from proxy.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"rollout.balance.by: Field required"):
        load_config(None, ["rollout.balance.goal=signal"])
    assert load_config(None, ['rollout.balance.by="kind"']).rollout.balance.goal == "even"
