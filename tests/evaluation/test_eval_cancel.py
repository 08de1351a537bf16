"""A trainer that stops mid-evaluation ends the evaluation at once: its open episodes fail as stopped
and it reports no score (a partial evaluation is not a result)."""

from __future__ import annotations

import time

from sqlalchemy import select

from evaluation.during import PeriodicEval
from proxy.config import load_config
from proxy.store.config import StoreConfig
from proxy.store.db import Database
from proxy.store.schema import sessions
from tests.conftest import REPO


def test_cancel_ends_a_running_evaluation_and_fails_its_open_episodes(sqlite_proxy, tmp_path):
    cfg = load_config(
        None,
        [
            f"store.url={sqlite_proxy.db_url}",
            f"rollout.dataset={REPO}/examples/arithmetic/agent.py:tasks",
            "rollout.agent=sleep 600",  # an agent that never finishes by itself
            "eval.max_tasks=2",
            "eval.every_steps=1",
            f"trainer.run_dir={tmp_path}",
        ],
    )
    evals = PeriodicEval(cfg, tmp_path, sqlite_proxy.url)
    try:
        evals.start(3, 7, None)
        deadline = time.monotonic() + 120
        while len(_open_episodes(sqlite_proxy)) < 2:  # both episodes running (their agent sleeps)
            assert time.monotonic() < deadline, "the evaluation's episodes never started"
            time.sleep(0.2)
        evals.cancel()
        done = evals.collect(wait=True)
    finally:
        evals.close()
    assert done is not None and done.step == 3 and done.report is None
    assert done.error.startswith("stopped")
    assert evals.metrics(done) == {"eval_error": done.error}
    db = Database(StoreConfig(url=sqlite_proxy.db_url))
    try:
        rows = db.read(lambda c: c.execute(select(sessions).where(sessions.c.group_id.like("eval:step3-%"))).all())
    finally:
        db.close()
    assert len(rows) == 2
    assert all(r.eval and r.status == "failed" and r.failure.startswith("stopped") for r in rows)


def _open_episodes(server) -> list[dict]:
    listed = server.get("/sessions", params={"eval": "true", "status": "open", "limit": 10000}).json()["data"]
    return [s for s in listed if (s["group_id"] or "").startswith("eval:step3-")]
