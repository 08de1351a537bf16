"""Claiming sessions: complete groups only, stale ones dropped and counted, exactly once —
also with two trainers racing on PostgreSQL, and after a resume from an earlier checkpoint."""

from __future__ import annotations

import itertools
import threading
import time

from proxy.store.claims import (
    DROPPED_STALE,
    claim_batch,
    end_step,
    mark_skipped,
    release_after,
    settle_through,
    trained_count,
)
from proxy.store.db import Database
from proxy.store.schema import sessions

# Sessions finish in the order they are added, 1 ms apart, whatever the machine's speed:
# `now + i * 1e-3` per call let a later call's first row sort before an earlier call's last.
_finish_order = itertools.count()


def add_sessions(db: Database, group: str, statuses: list[str], min_version: int = 0) -> list[str]:
    now = time.time()
    rows = []
    for i, status in enumerate(statuses):
        sid = f"s-{group}-{i}-{time.monotonic_ns()}"
        rows.append(
            {
                "id": sid,
                "group_id": group,
                "task_id": group,
                "metadata": {},
                "status": status,
                "auto": False,
                "num_completions": 1,
                "min_version": min_version,
                "max_version": min_version,
                "created_at": now,
                "updated_at": now,
                "finished_at": 1.7e9 + next(_finish_order) * 1e-3,
                "reward": 1.0,
            }
        )
    db.transaction(lambda c: c.execute(sessions.insert(), rows))
    return [r["id"] for r in rows]


def claim(db: Database, step: int, batch: int, version: int = 0, staleness: int = 1):
    return db.transaction(
        lambda c: claim_batch(c, step=step, batch_size=batch, current_version=version, max_staleness=staleness)
    )


def test_only_complete_groups_are_claimed(db):
    a = add_sessions(db, "a", ["finished"] * 4)
    add_sessions(db, "b", ["finished", "finished", "open", "finished"])
    c = add_sessions(db, "c", ["finished", "failed", "finished", "finished"])
    got = claim(db, step=1, batch=6)
    assert set(got.session_ids) == set(a) | {c[0], c[2], c[3]}, "group b still has an open session"
    assert claim(db, step=2, batch=1).session_ids == [], "nothing claimable twice"


def test_too_few_sessions_claims_nothing(db):
    add_sessions(db, "a", ["finished"] * 4)
    assert claim(db, step=1, batch=8).session_ids == []
    assert len(claim(db, step=1, batch=4).session_ids) == 4


def test_stale_sessions_are_dropped_and_counted(db):
    old = add_sessions(db, "old", ["finished"] * 4, min_version=2)
    fresh = add_sessions(db, "new", ["finished"] * 4, min_version=5)
    got = claim(db, step=1, batch=4, version=6, staleness=1)
    assert sorted(got.dropped_stale) == sorted(old)
    assert sorted(got.session_ids) == sorted(fresh)
    counts = db.read(trained_count)
    assert counts["dropped_stale"] == 4 and counts["training"] == 4 and counts["trained"] == 0
    db.transaction(lambda c: end_step(c, 1))
    counts = db.read(trained_count)
    assert counts["training"] == 0 and counts["trained"] == 4
    rows = db.read(lambda c: c.execute(sessions.select().where(sessions.c.id.in_(old))).all())
    assert all(r.consumed_step == DROPPED_STALE and r.failure.startswith("dropped") for r in rows)


def test_resume_hands_back_sessions_trained_after_the_checkpoint(db):
    ids = [add_sessions(db, f"g{i}", ["finished"] * 2) for i in range(4)]
    for step in (1, 2, 3, 4):
        assert len(claim(db, step=step, batch=2).session_ids) == 2
    assert db.transaction(lambda c: release_after(c, 2)) == 4
    again = {sid for step in (3, 4) for sid in claim(db, step=step, batch=2).session_ids}
    assert again == set(ids[2]) | set(ids[3])


def test_admission_counts_sessions_in_a_running_step(db):
    """With max_staleness 0, a batch claimed by a step still training holds the next one back:
    the episodes it would admit would sample the weights that step is about to replace."""
    from proxy.store.sessions import unconsumed_count

    add_sessions(db, "a", ["finished"] * 4)
    assert db.read(unconsumed_count) == 4
    assert len(claim(db, step=1, batch=4, staleness=0).session_ids) == 4
    assert db.read(unconsumed_count) == 4, "claimed for a step that has not pushed its weights"
    db.transaction(lambda c: end_step(c, 1))
    assert db.read(unconsumed_count) == 0


def test_a_step_that_never_ended_is_handed_back(db):
    ids = add_sessions(db, "a", ["finished"] * 2)
    assert len(claim(db, step=1, batch=2).session_ids) == 2  # the trainer dies before end_step
    assert db.transaction(lambda c: release_after(c, 0)) == 2
    assert set(claim(db, step=1, batch=2).session_ids) == set(ids)


def test_two_trainers_never_claim_the_same_session(db):
    for i in range(40):
        add_sessions(db, f"g{i}", ["finished"] * 2)
    taken: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def trainer(k: int) -> None:
        try:
            race(k)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    def race(k: int) -> None:
        for step in range(1, 200):  # a claim may come back empty while the other holds the locks
            if db.read(trained_count)["finished"] == 0:
                return
            got = claim(db, step=step, batch=2)
            taken[k].extend(got.session_ids)
            if got.session_ids:
                assert len({sid.split("-")[1] for sid in got.session_ids}) == 1, "one whole group per step"

    threads = [threading.Thread(target=trainer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not set(taken[0]) & set(taken[1])
    assert len(taken[0]) + len(taken[1]) == 80


def test_a_group_cut_by_the_scan_window_waits_until_it_fits(db):
    # g0's last member finished after 40 sessions of other groups: a scan of the first
    # batch*8 rows holds only part of g0 and must not train that part on its own.
    first = add_sessions(db, "g0", ["finished"] * 3)
    others = [add_sessions(db, f"h{i}", ["finished"] * 4) for i in range(10)]
    last = add_sessions(db, "g0", ["finished"])
    got = claim(db, step=1, batch=4)
    assert set(got.session_ids) == set(others[0]), "g0 is incomplete in the window: the next whole group is taken"
    # Nothing claimable except by widening the window past the other groups.
    for step in range(2, 12):
        claim(db, step=step, batch=4)
    rows = db.read(lambda c: c.execute(sessions.select().where(sessions.c.group_id == "g0")).all())
    steps = {r.consumed_step for r in rows}
    assert len(steps) == 1 and None not in steps, f"g0 trained whole, in one step: {steps}"
    assert {r.id for r in rows} == set(first) | set(last)


def test_a_lost_step_hands_back_what_it_skipped_too(db):
    """Skipped and down-sampled sessions belong to the step that claimed them: when that step is
    lost (the run resumes from an earlier checkpoint), they come back with the trained ones, so
    the group is judged again whole."""
    trained = add_sessions(db, "g", ["finished"] * 4)
    assert len(claim(db, step=3, batch=4).session_ids) == 4
    db.transaction(lambda c: mark_skipped(c, trained[2:], "down-sampled", settle=False))
    assert db.read(trained_count)["training"] == 4, "held until the step ends"
    db.transaction(lambda c: end_step(c, 3))
    assert db.read(trained_count)["skipped"] == 2 and db.read(trained_count)["trained"] == 2
    assert db.transaction(lambda c: release_after(c, 2)) == 4
    assert set(claim(db, step=3, batch=4).session_ids) == set(trained)
    rows = db.read(lambda c: c.execute(sessions.select().where(sessions.c.group_id == "g")).all())
    assert {r.failure for r in rows} == {None}, "the skip reasons of the lost step are cleared"


def test_a_checkpointed_step_that_never_ended_is_settled(db):
    """A trainer that died after its checkpoint of step 2 but before `end_step(2)`: step 2's update
    is in the checkpoint, so its sessions are consumed, not held as `training` forever."""
    ids = add_sessions(db, "g", ["finished"] * 2)
    assert len(claim(db, step=2, batch=2).session_ids) == 2
    assert db.transaction(lambda c: release_after(c, 2)) == 0
    assert db.transaction(lambda c: settle_through(c, 2)) == 2
    counts = db.read(trained_count)
    assert counts["training"] == 0 and counts["trained"] == 2
    assert claim(db, step=3, batch=2).session_ids == [], f"{ids} stay trained"
