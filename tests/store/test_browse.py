"""The UI's store reads on SQLite and PostgreSQL: keyset pages visit every session once in order
(ties of one timestamp included) and page back exactly; each filter selects what it says; counts
stop at their cap; no read returns a key hash."""

from __future__ import annotations

import random

import pytest

from proxy.store.browse import (
    Cursor,
    SessionFilter,
    count_sessions_capped,
    group_rows,
    session_row,
    sessions_page,
    status_counts,
)
from proxy.store.sessions import insert_sessions

STATUSES = ["open", "finished", "training", "consumed", "failed"]


def make_rows(n: int = 40) -> list[dict]:
    """Sessions in groups of three created at one instant (as POST /sessions with count does)."""
    rng = random.Random(7)
    rows = []
    for i in range(n):
        status = STATUSES[i % len(STATUSES)]
        version = i // 8
        rows.append(
            {
                "id": f"sess_{rng.getrandbits(48):012x}",
                "key_hash": f"hash-{i}",
                "task_id": f"task{i % 4}",
                "group_id": f"g{i // 3}",
                "metadata": {"i": i},
                "status": status,
                "auto": False,
                "eval": i % 7 == 0,
                "reward": None if status in ("open", "failed") else (i % 3) / 2,
                "num_completions": 1,
                "min_version": version,
                "max_version": version + (i % 2),
                "created_at": 1000.0 + i // 3,
                "updated_at": 1000.0 + i,
            }
        )
    return rows


@pytest.fixture
def rows(db):
    made = make_rows()
    db.transaction(lambda c: insert_sessions(c, made))
    return made


def newest_first(rows: list[dict]) -> list[str]:
    return [r["id"] for r in sorted(rows, key=lambda r: (r["created_at"], r["id"]), reverse=True)]


def test_older_cursors_visit_every_session_once_newest_first_and_newer_ones_page_back(db, rows):
    pages, cursor = [], None
    while True:
        page = db.read(lambda c, at=cursor: sessions_page(c, SessionFilter(), 4, older_than=at))
        pages.append(page)
        if page.older is None:
            break
        cursor = page.older
    assert [r.id for p in pages for r in p.rows] == newest_first(rows)
    assert pages[0].newer is None and all(p.newer is not None for p in pages[1:])
    # Back from the last page: each newer page is exactly the page before it.
    for before, after in zip(reversed(pages[:-1]), reversed(pages[1:])):
        back = db.read(lambda c, at=after.newer: sessions_page(c, SessionFilter(), 4, newer_than=at))
        assert [r.id for r in back.rows] == [r.id for r in before.rows]
        assert (back.newer is None) == (before is pages[0])


@pytest.mark.parametrize(
    ("where", "keep"),
    [
        (SessionFilter(status="failed"), lambda r: r["status"] == "failed"),
        (SessionFilter(evaluation=True), lambda r: r["eval"]),
        (SessionFilter(evaluation=False), lambda r: not r["eval"]),
        (SessionFilter(task_id="task1"), lambda r: r["task_id"] == "task1"),
        (SessionFilter(group_id="g4"), lambda r: r["group_id"] == "g4"),
        (SessionFilter(reward_min=0.5), lambda r: r["reward"] is not None and r["reward"] >= 0.5),
        (SessionFilter(reward_max=0.0), lambda r: r["reward"] is not None and r["reward"] <= 0.0),
        (SessionFilter(version_min=3, version_max=3), lambda r: r["min_version"] <= 3 <= r["max_version"]),
        (SessionFilter(since=1004.0, until=1007.0), lambda r: 1004.0 <= r["created_at"] < 1007.0),
        (
            SessionFilter(status="consumed", evaluation=False, reward_min=0.5),
            lambda r: r["status"] == "consumed" and not r["eval"] and (r["reward"] or 0) >= 0.5,
        ),
    ],
)
def test_each_filter_selects_what_it_names(db, rows, where, keep):
    expected = newest_first([r for r in rows if keep(r)])
    assert expected, "the case selects something"
    page = db.read(lambda c: sessions_page(c, where, 100))
    assert [r.id for r in page.rows] == expected
    assert db.read(lambda c: count_sessions_capped(c, where, 1000)) == len(expected)


def test_a_filtered_listing_pages_like_an_unfiltered_one(db, rows):
    where = SessionFilter(evaluation=False)
    seen, cursor = [], None
    while True:
        page = db.read(lambda c, at=cursor: sessions_page(c, where, 3, older_than=at))
        seen += [r.id for r in page.rows]
        if page.older is None:
            break
        cursor = page.older
    assert seen == newest_first([r for r in rows if not r["eval"]])


def test_counts_stop_at_the_cap(db, rows):
    assert db.read(lambda c: count_sessions_capped(c, SessionFilter(), 10)) == 11  # "10+"
    assert db.read(lambda c: count_sessions_capped(c, SessionFilter(), 40)) == 40
    assert db.read(lambda c: count_sessions_capped(c, SessionFilter(status="failed"), 100)) == 8


def test_status_counts_and_group_rows(db, rows):
    assert db.read(status_counts) == {s: 8 for s in STATUSES}
    members = db.read(lambda c: group_rows(c, "g2", 10))
    assert [m.id for m in members] == sorted(r["id"] for r in rows if r["group_id"] == "g2")


def test_no_read_returns_a_key_hash(db, rows):
    listed = db.read(lambda c: sessions_page(c, SessionFilter(), 5)).rows[0]
    one = db.read(lambda c: session_row(c, rows[0]["id"]))
    member = db.read(lambda c: group_rows(c, rows[0]["group_id"], 10))[0]
    for row in (listed, one, member):
        assert "key_hash" not in row._fields
    assert one.metadata == {"i": 0} and one.reference is None


def test_a_cursor_between_rows_resumes_after_it(db, rows):
    """A cursor need not be a row that still exists (a session deleted since): the page starts below it."""
    order = newest_first(rows)
    by_id = {r["id"]: r for r in rows}
    third = by_id[order[2]]
    page = db.read(lambda c: sessions_page(c, SessionFilter(), 2, older_than=Cursor(third["created_at"], third["id"])))
    assert [r.id for r in page.rows] == order[3:5]
