"""`areal-proxy train --launcher ray` end to end on a local Ray cluster and PostgreSQL.

Two proxy replicas over one engine server, behind the front, two episode runners and the
trainer, each a Ray actor, run the arithmetic example for a few steps. Afterwards every
session that finished was trained exactly once or counted as dropped / skipped / waiting, no
answered completion is missing, token versions only go up and never pass the final version,
the runners' shares did not overlap, and every component's log is in the run directory. The
slow variant, with a local engine in each replica, SIGKILLs a replica mid-run: the launcher
restarts it, the front brings it up to the newest weights, and the run completes.
SQLite is refused before anything starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, select

from proxy.store.schema import completions, sessions
from tests.conftest import REPO, fresh_pg_database
from trainer.audit import effective_history

GROUP_SIZE = 4


def write_config(tmp: Path, db_url: str, max_steps: int, engine_servers: int = 1) -> Path:
    run_dir = tmp / "run"
    path = tmp / "config.toml"
    path.write_text(
        f"""
[engine]
threads = 1
[store]
url = "{db_url}"
[rollout]
dataset = "{REPO}/examples/arithmetic/agent.py:tasks"
agent = "{REPO}/examples/arithmetic/agent.py:run"
reward_fn = "math_exact"
group_size = {GROUP_SIZE}
concurrency = 8
[trainer]
max_staleness = 1
max_steps = {max_steps}
run_dir = "{run_dir}"
[trainer.batch]
size = 8
skip_zero_variance = false   # the base model rarely varies within a group: train anyway, so weights move
[trainer.checkpoint]
every = 2
[ray]
local_cpus = 16
proxy_replicas = 2
engine_servers = {engine_servers}
runners = 2
health_interval_s = 2
"""
    )
    return path


def train(config: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "proxy.cli", "train", str(config), "--launcher", "ray"]
    return subprocess.Popen(args, cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def check_run(run_dir: Path, db_url: str, max_steps: int) -> int:
    """The invariants of a finished run; returns the final policy version."""
    rows = metrics(run_dir)
    steps = [r for r in rows if "reward_mean" in r]
    assert max(r["step"] for r in steps) == max_steps
    final_version = steps[-1]["version"]
    assert final_version >= 1, "weights were pushed through the front"

    engine = create_engine(db_url)
    with engine.connect() as conn:
        srows = conn.execute(select(sessions).where(sessions.c.auto.is_(False))).all()
        crows = conn.execute(select(completions)).all()
    engine.dispose()

    # exactly once: the trainer's audit log and the store agree, no session twice
    history = effective_history(run_dir)
    assert len(history) == len(set(history)), "a session was trained twice"
    trained = {r.id for r in srows if r.status == "consumed" and (r.consumed_step or 0) >= 1}
    assert trained == set(history), "the store and the trainer agree on what was trained"
    fates = Counter()
    for r in srows:
        if r.status == "consumed":
            fates[{-1: "dropped_stale", -2: "skipped"}.get(r.consumed_step, "trained")] += 1
        else:
            fates[r.status] += 1
    finished_ever = [r for r in srows if r.status in ("finished", "consumed")]
    assert fates["trained"] + fates["dropped_stale"] + fates["skipped"] + fates["finished"] == len(finished_ever)
    assert fates["trained"] + fates["skipped"] == sum(r["sessions"] for r in steps)
    assert not [r for r in srows if r.status == "open"], "the run closed its sessions"

    # no answered completion lost: each finished session has its completions, every node's
    # session and parent exist (same session), and the session's count matches its rows
    by_session = Counter(c.session_id for c in crows)
    ids = {c.id: c for c in crows}
    assert all(by_session[r.id] >= 1 for r in finished_ever), "a finished session has no completion"
    assert all(by_session[r.id] == r.num_completions for r in srows)
    session_ids = {r.id for r in srows} | {c.session_id for c in crows}
    for c in crows:
        assert c.session_id in session_ids
        assert c.parent_id is None or ids[c.parent_id].session_id == c.session_id

    # versions: non-decreasing within a completion, never past the final version
    for c in crows:
        versions = np.frombuffer(c.output_versions, dtype="<i4")
        assert (np.diff(versions) >= 0).all(), f"versions go down in {c.id}: {versions}"
        assert versions.size == 0 or versions.max() <= final_version
    assert all(r.max_version is None or r.min_version <= r.max_version <= final_version for r in srows)

    # the runners' shares never overlapped: each group (task@epoch) was created once, whole
    groups = Counter(r.group_id for r in srows)
    assert set(groups.values()) == {GROUP_SIZE}, groups
    assert {p.name for p in run_dir.glob("runner_state_*.json")} == {"runner_state_0of2.json", "runner_state_1of2.json"}

    # logs and metrics gathered in the run directory
    logs = run_dir / "logs"
    for name in ("front", "proxy-0", "proxy-1", "trainer", "runner-0", "runner-1"):
        assert (logs / f"{name}.log").stat().st_size > 0, name
    if (logs / "engine-0.log").exists():
        pushes = (logs / "engine-0.log").read_text().count("loaded as version")
        assert pushes == final_version, "each version loaded once by the shared engine, not once per replica"
    for replica in ("proxy-0", "proxy-1"):
        text = (logs / f"{replica}.metrics.txt").read_text()
        assert "areal_weight_updates_total" in text, f"{replica} took weight pushes"
    front = json.loads((logs / "front.health.json").read_text())
    assert [r["version"] for r in front["replicas"]] == [final_version] * 2, "every replica ends on the last weights"
    return final_version


def test_ray_launcher_refuses_sqlite(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/areal.db"\n[trainer]\nrun_dir = "{tmp_path}/run"\n')
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "train", str(config), "--launcher", "ray"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "SQLite" in out.stderr and "PostgreSQL" in out.stderr and "postgresql+psycopg://" in out.stderr
    assert not (tmp_path / "run").exists(), "nothing started"


@pytest.mark.postgres
def test_ray_run_two_replicas_one_engine_two_runners(tmp_path):
    pytest.importorskip("ray")
    with fresh_pg_database() as db_url:
        config = write_config(tmp_path, db_url, max_steps=3)
        proc = train(config)
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out[-4000:]
        check_run(tmp_path / "run", db_url, max_steps=3)
        # the run's generated admin key reached every component through the environment, never a file
        written = tmp_path / "run" / "config.json"
        assert written.stat().st_mode & 0o777 == 0o600 and "admin_key" not in written.read_text()


@pytest.mark.slow
@pytest.mark.postgres
def test_ray_run_survives_a_killed_replica(tmp_path):
    """Replicas with their own local engines: the restarted one comes back on the base weights
    and the front brings it up to the newest before it serves again."""
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    with fresh_pg_database() as db_url:
        config = write_config(tmp_path, db_url, max_steps=6, engine_servers=0)
        proc = train(config)
        deadline = time.time() + 900
        while time.time() < deadline and proc.poll() is None and len(metrics(run_dir)) < 2:
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        _, pid = (run_dir / "proxy-1.pid").read_text().split()
        os.kill(int(pid), signal.SIGKILL)
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out[-4000:]
        check_run(run_dir, db_url, max_steps=6)
        launcher_log = (run_dir / "logs" / "launcher.log").read_text()
        assert "proxy-1 exited with -9" in launcher_log and "proxy-1 restarted" in launcher_log
        assert (run_dir / "proxy-1.pid").read_text().split()[1] != pid


@pytest.mark.postgres
def test_sigterm_while_starting_stops_the_launcher_and_its_local_cluster(tmp_path):
    """The launcher used to wait out its 900 s start timeout whatever signal it got while
    components were starting; now SIGTERM stops it, its components and the local Ray cluster."""
    pytest.importorskip("ray")
    import psutil

    run_dir = tmp_path / "run"
    with fresh_pg_database() as db_url:
        config = write_config(tmp_path, db_url, max_steps=3)
        before = {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in ("raylet", "gcs_server")}
        proc = train(config)
        deadline = time.time() + 300
        launcher_log = run_dir / "logs" / "launcher.log"
        while time.time() < deadline and proc.poll() is None:
            if launcher_log.exists() and "starting" in launcher_log.read_text():
                break  # components are being started: the launcher waits on their health checks
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        started = [int(p.read_text().split()[1]) for p in run_dir.glob("*.pid")]
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode != 0, out[-3000:]
        assert time.monotonic() - signalled < 90, "stopped at once, not after the components finished starting (900 s)"

        def running(pids: set[int]) -> set[int]:
            alive = set()
            for pid in pids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                        alive.add(pid)
            return alive

        deadline = time.time() + 30
        while running(set(started)) and time.time() < deadline:
            time.sleep(0.5)
        assert not running(set(started)), "component processes still running"
        ray_left = {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in ("raylet", "gcs_server")}
        assert not running(ray_left - before), f"the local Ray cluster is still running: {ray_left - before}"
