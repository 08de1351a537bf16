"""The front's routing, as pure bookkeeping: which session a request names, sticky placement that
moves only a dead replica's sessions, replicas behind the newest weights kept out; runner shards."""

from __future__ import annotations

from proxy.servers.front import Router, routing_key
from trainer.launch.ray_actors import shard, shard_limit


def test_routing_key_from_path_then_session_key():
    assert routing_key("/sessions/sess_1/v1/chat/completions", {}) == "session:sess_1"
    assert routing_key("/sessions/sess_1/finish", {"authorization": "Bearer admin"}) == "session:sess_1"
    assert routing_key("/v1/chat/completions", {"authorization": "Bearer sk-sess-x"}) == "key:sk-sess-x"
    assert routing_key("/v1/messages", {"x-api-key": "sk-sess-y"}) == "key:sk-sess-y"
    # control calls that name no session spread over the replicas, whatever key they carry
    assert routing_key("/sessions", {"authorization": "Bearer admin"}) is None
    assert routing_key("/weights", {"authorization": "Bearer admin"}) is None
    assert routing_key("/v1/models", {}) is None


def _router(n: int) -> Router:
    router = Router([f"http://replica-{i}" for i in range(n)])
    for replica in router.replicas:
        router.observe(replica, 0)
    return router


def test_sessions_stick_and_only_a_dead_replicas_sessions_move():
    router = _router(3)
    keys = [f"session:s{i}" for i in range(300)]
    before = {k: router.pick(k) for k in keys}
    assert all(router.pick(k) is before[k] for k in keys), "the same replica every time"
    assert len(set(before.values())) == 3, "sessions spread over every replica"
    dead = router.replicas[1]
    router.mark_failed(dead, "killed")
    after = {k: router.pick(k) for k in keys}
    assert all(after[k] is before[k] for k in keys if before[k] is not dead), "the others' sessions stay"
    assert all(after[k] is not dead for k in keys)
    router.observe(dead, 0)
    assert {k: router.pick(k) for k in keys} == before, "back in rotation, its sessions return"


def test_unnamed_requests_go_to_the_least_busy_and_failed_ones_are_excluded():
    router = _router(2)
    a, b = router.replicas
    a.in_flight = 3
    assert router.pick(None) is b
    assert router.pick(None, exclude=[b]) is a
    assert router.pick("session:x", exclude=[a, b]) is None


def test_replicas_behind_the_newest_weights_leave_rotation():
    router = _router(2)
    a, b = router.replicas
    router.observe(a, 3)  # a took version 3; b still serves version 0
    assert router.serving() == [a]
    assert {router.pick(f"session:{i}") for i in range(20)} == {a}
    router.observe(b, 3)
    assert router.serving() == [a, b]


def test_runner_shards_are_disjoint_and_cover_the_dataset():
    tasks = [{"id": i} for i in range(10)]
    shards = [shard(tasks, k, 3) for k in range(3)]
    ids = [t["id"] for s in shards for t in s]
    assert sorted(ids) == list(range(10)) and len(ids) == len(set(ids))
    assert [t["id"] for t in shards[1]] == [1, 4, 7]
    assert [shard_limit(7, k, 3) for k in range(3)] == [3, 2, 2]
    assert [shard_limit(2, k, 3) for k in range(3)] == [1, 1, 0]
    assert shard_limit(0, 1, 3) is None
