"""`areal-proxy eval` on the arithmetic example with the real model, checked by hand over the store.

One command evaluates the default model and, with `--compare`, the same model again: both runs are
recounted from their recorded sessions (solved episodes, pass@k by enumerating subsets, the
breakdown by kind, turns and sampled tokens, the forced temperature), no trainer can claim them,
admission control does not count them, and the paired difference of a model with itself holds 0.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
from sqlalchemy import select

from proxy.store.claims import claim_batch
from proxy.store.config import StoreConfig
from proxy.store.db import Database
from proxy.store.schema import completions, sessions
from proxy.store.sessions import unconsumed_count
from tests.conftest import REPO

TASKS, SAMPLES = 10, 3


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    url = f"sqlite:///{tmp}/areal.db"
    out = tmp / "report.json"
    args = [
        sys.executable, "-m", "proxy.cli", "eval", "examples/arithmetic/config.toml",
        "--max-tasks", str(TASKS), "--samples", str(SAMPLES), "--temperature", "1",
        "--model", "smollm2-135m-instruct", "--compare", "smollm2-135m-instruct",
        "--db", url, "--out", str(out), "--name", "ab",
        "--set", "rollout.concurrency=32",
    ]  # fmt: skip
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    db = Database(StoreConfig(url=url))
    yield json.loads(out.read_text()), db, proc.stdout
    db.close()


def _recount(db: Database, run: str) -> dict:
    rows = db.read(lambda c: c.execute(select(sessions).where(sessions.c.group_id.like(f"eval:{run}:%"))).all())
    turns = db.read(
        lambda c: c.execute(
            select(completions.c.session_id, completions.c.output_ids, completions.c.temperature).where(
                completions.c.session_id.in_([r.id for r in rows])
            )
        ).all()
    )
    return {"sessions": rows, "turns": turns}


def _check_report(report: dict, db: Database) -> None:
    got = _recount(db, report["run"])
    rows = got["sessions"]
    assert len(rows) == TASKS * SAMPLES == report["episodes"]
    assert all(r.eval and r.temperature == 1.0 for r in rows)
    assert all(t.temperature == 1.0 for t in got["turns"])  # the forced temperature was sampled with
    solved = [r.status == "finished" and r.reward is not None and r.reward >= 1.0 for r in rows]
    assert report["accuracy"]["solved"] == sum(solved)
    assert report["accuracy"]["value"] == pytest.approx(sum(solved) / len(rows))
    assert report["accuracy"]["low"] <= report["accuracy"]["value"] <= report["accuracy"]["high"]
    by_task: dict[str, list[bool]] = {}
    for r, s in zip(rows, solved):
        by_task.setdefault(r.task_id, []).append(s)
    assert len(by_task) == TASKS and all(len(v) == SAMPLES for v in by_task.values())
    for k in (1, 2, 3):
        brute = sum(
            sum(any(c) for c in itertools.combinations(v, k)) / len(list(itertools.combinations(v, k)))
            for v in by_task.values()
        )
        assert report["pass_at_k"][str(k)] == pytest.approx(brute / TASKS)
    assert {t: v["solved"] for t, v in report["per_task"].items()} == {t: sum(v) for t, v in by_task.items()}
    # the breakdown by kind: the example's own task field
    kind_of = _kinds()
    kinds: dict[str, list[bool]] = {}
    for r, s in zip(rows, solved):
        kinds.setdefault(kind_of[r.task_id], []).append(s)
    for kind, outcomes in kinds.items():
        assert report["by"]["kind"][kind]["solved"] == sum(outcomes)
    assert report["per_episode"]["turns"] == pytest.approx(len(got["turns"]) / len(rows))
    sampled = sum(len(t.output_ids) // 4 for t in got["turns"])
    assert report["per_episode"]["output_tokens"] == pytest.approx(sampled / len(rows))
    scored = [r.reward for r in rows if r.status == "finished" and r.reward is not None]
    assert report["reward_mean"]["scored"] == len(scored)
    assert report["policy_versions"] == [0, 0]


def _kinds() -> dict[str, str]:
    """Each eval task's kind, by the example's own generator."""
    from adapters.tasks import load_tasks

    return {t["id"]: t["kind"] for t in load_tasks(str(REPO / "examples/arithmetic/agent.py:tasks"), "eval")}


def test_the_report_equals_a_hand_count_over_the_recorded_sessions(evaluated):
    result, db, stdout = evaluated
    _check_report(result["report"], db)
    _check_report(result["compare"]["report"], db)
    assert "accuracy (95% interval)" in stdout and "by kind" in stdout


def test_evaluation_sessions_are_never_claimed_nor_counted_by_admission(evaluated):
    _, db, _ = evaluated
    claim = db.transaction(lambda c: claim_batch(c, step=1, batch_size=1, current_version=0, max_staleness=0))
    assert claim.session_ids == [] and claim.dropped_stale == []
    assert db.read(unconsumed_count) == 0
    finished = db.read(lambda c: c.execute(select(sessions.c.status, sessions.c.consumed_step)).all())
    assert len(finished) == 2 * TASKS * SAMPLES
    assert all(s.consumed_step is None for s in finished)


def test_a_model_compared_with_itself_differs_by_an_interval_holding_zero(evaluated):
    result, _, stdout = evaluated
    diff = result["compare"]["difference"]
    assert diff["accuracy"]["tasks"] == TASKS
    assert diff["accuracy"]["low"] <= 0 <= diff["accuracy"]["high"]
    assert "paired difference" in stdout
    # both runs drew every task from the same seeds
    a, b = result["report"], result["compare"]["report"]
    assert a["run"] != b["run"] and set(a["per_task"]) == set(b["per_task"])


def test_eval_through_a_running_proxy_with_url(sqlite_proxy, tmp_path):
    from evaluation.cli import run_eval
    from proxy.config import load_config

    cfg = load_config(
        str(REPO / "examples/arithmetic/config.toml"),
        [f"store.url={sqlite_proxy.db_url}", "eval.max_tasks=3", "eval.temperature=0", f"trainer.run_dir={tmp_path}"],
    )
    cfg.rollout.agent = str(REPO / "examples/arithmetic/agent.py:run")
    cfg.rollout.dataset = str(REPO / "examples/arithmetic/agent.py:tasks")
    result, path = run_eval(cfg, url=sqlite_proxy.url, name="via-url")
    report = result["report"]
    assert path == tmp_path / "evals" / f"{report['run']}.json" and path.is_file()
    assert report["run"].startswith("via-url-") and report["episodes"] == 3
    assert result["model"] == "smollm2-135m-instruct" and "compare" not in result
    listed = sqlite_proxy.get("/sessions", params={"eval": "true", "limit": 10000}).json()["data"]
    mine = [s for s in listed if (s["group_id"] or "").startswith(f"eval:{report['run']}:")]
    assert len(mine) == 3 and all(s["temperature"] == 0 for s in mine)
