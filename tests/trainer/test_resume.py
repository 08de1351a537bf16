"""`areal-proxy train` end to end: a smoke run exits 0; a trainer SIGKILLed mid-run resumes
from its last checkpoint when the same command runs again, and no session is trained twice
or lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from proxy.store.schema import sessions
from tests.conftest import REPO, serve_app
from trainer.audit import effective_history
from trainer.loop import WAIT_FOR_ENV
from trainer.metrics import progress_rows, read_metrics
from trainer.weights import default_weights_dir


def write_config(tmp: Path, **trainer) -> Path:
    """The run's config; `trainer` adds keys of [trainer], or of a sub-section as `batch={"fill": True}`."""
    run_dir = tmp / "run"
    keys = {k: v for k, v in trainer.items() if not isinstance(v, dict)}
    trainer_lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items())
    sections = {"checkpoint": {"every": 2}, "batch": {"size": 8}}
    for name, values in trainer.items():
        if isinstance(values, dict):
            sections[name] = {**sections.get(name, {}), **values}
    for name, values in sections.items():
        trainer_lines += f"\n[trainer.{name}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items())
    path = tmp / "config.toml"
    path.write_text(
        f"""
[proxy]
port = 0
[store]
url = "sqlite:///{run_dir}/areal.db"
[rollout]
dataset = "{REPO}/examples/arithmetic/agent.py:tasks"
agent = "{REPO}/examples/arithmetic/agent.py:run"
reward_fn = "math_exact"
group_size = 4
concurrency = 16
[trainer]
max_staleness = 1
run_dir = "{run_dir}"
{trainer_lines}
"""
    )
    return path


def train(config: Path, *overrides: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "proxy.cli", "train", str(config)]
    for o in overrides:
        args += ["--set", o]
    return subprocess.Popen(args, cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line), default=0)


def test_smoke_run_exits_zero(tmp_path):
    config = write_config(tmp_path)
    # A linear decay over the 2-step budget to half the rate: step 1 at 2e-5, step 2 at
    # 2e-5 × (0.5 + 0.5 × (1 - 1/2)) = 1.5e-5.
    proc = train(
        config,
        "trainer.max_steps=2",
        "trainer.optim.lr=2e-5",
        "trainer.schedule.shape=linear",
        "trainer.schedule.min_lr_ratio=0.5",
        "proxy.admin_key=run-secret",  # the children get it from their environment, not from a file
    )
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    assert steps_done(tmp_path / "run") == 2
    written = tmp_path / "run" / "config.json"
    assert written.stat().st_mode & 0o777 == 0o600 and "run-secret" not in written.read_text()
    assert (tmp_path / "run" / "checkpoints").is_dir()
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run") if "lr" in r]
    assert lrs == pytest.approx([2e-5, 1.5e-5])
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_0000002" / "trainer_state.json").read_text())
    assert state["elapsed_s"] > 0
    shm = default_weights_dir(tmp_path / "run", local_engine=True)
    if shm != tmp_path / "run" / "weights":  # a local engine gets its weights through /dev/shm
        assert not shm.exists(), "the pushed weights held in shared memory are freed when the trainer exits"


def test_a_trainer_started_beside_its_proxy_waits_for_it_before_touching_the_store(tmp_path):
    """`areal-proxy train` starts the trainer while the proxy is still starting: the trainer asks the
    proxy's /health until it answers 200, and opens no store meanwhile (the proxy migrates it)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    asked: list[float] = []

    async def health(_request):
        asked.append(time.monotonic())
        return JSONResponse({"error": "starting"}, status_code=503)

    config = write_config(tmp_path)
    db_path = tmp_path / "run" / "areal.db"
    with serve_app(Starlette(routes=[Route("/health", health)])) as url:
        args = [sys.executable, "-m", "trainer.loop", "--config", str(config), "--set", f"proxy.public_url={url}"]
        env = {**os.environ, WAIT_FOR_ENV: url}
        trainer = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 120
            while len(asked) < 5 and time.monotonic() < deadline and trainer.poll() is None:
                time.sleep(0.1)
            assert trainer.poll() is None, trainer.communicate()[0][-3000:]
            assert len(asked) >= 5, "the trainer never asked for the proxy's health"
            assert not db_path.exists(), "the trainer opened the store before the proxy answered"
        finally:
            trainer.kill()
            trainer.wait()


def test_max_minutes_ends_the_run_on_time_and_counts_across_resumes(tmp_path):
    """trainer.max_minutes stops a run by the clock (exit 0, checkpoint kept); the same command again
    finds the budget spent and ends at once, without training a step more."""
    config = write_config(tmp_path)
    run_dir = tmp_path / "run"
    proc = train(config, "trainer.max_minutes=0.75")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    steps = steps_done(run_dir)
    assert steps >= 1, out[-3000:]
    last = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["step"] == steps
    assert 45 <= state["elapsed_s"] < 45 + 300, "stopped once 45 s of training had passed, within a step"
    again = train(config, "trainer.max_minutes=0.75")
    out, _ = again.communicate(timeout=900)
    assert again.returncode == 0, out[-3000:]
    assert steps_done(run_dir) == steps


def test_fill_batch_trains_full_batches_of_groups_with_reward_variance(tmp_path):
    """DAPO dynamic sampling: with trainer.batch.fill every step claims on until it holds
    batch.size sessions of groups whose rewards differ; the rest are skipped, none lost."""
    config = write_config(tmp_path, batch={"fill": True})
    run_dir = tmp_path / "run"
    proc = train(config, "trainer.max_steps=2")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    steps = [json.loads(line) for line in (run_dir / "trained_sessions.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    engine = create_engine(f"sqlite:///{run_dir}/areal.db")
    with engine.connect() as conn:
        rows = conn.execute(
            select(sessions.c.id, sessions.c.group_id, sessions.c.status, sessions.c.consumed_step, sessions.c.reward)
        ).all()
    by_id = {r.id: r for r in rows}
    for entry in steps:
        assert len(entry["trained"]) >= 8, "a step trains a full batch"
        groups = {by_id[sid].group_id for sid in entry["trained"]}
        for group in groups:
            rewards = {r.reward for r in rows if r.group_id == group}
            assert len(rewards) > 1, "only groups whose rewards differ are trained"
        assert {by_id[sid].consumed_step for sid in entry["trained"]} == {entry["step"]}
    skipped = {r.id for r in rows if r.consumed_step == -2}
    assert skipped == {sid for entry in steps for sid in entry["skipped"]}
    for sid in skipped:
        assert len({r.reward for r in rows if r.group_id == by_id[sid].group_id}) == 1
    assert not [r for r in rows if r.status == "consumed" and (r.consumed_step or 0) > 2], "nothing left claimed"


def test_sigkill_mid_run_then_resume(tmp_path):
    config = write_config(tmp_path)
    run_dir = tmp_path / "run"
    first = train(config, "trainer.max_steps=4")
    deadline = time.time() + 900
    while steps_done(run_dir) < 3 and time.time() < deadline and first.poll() is None:
        time.sleep(0.5)
    assert steps_done(run_dir) >= 3, first.communicate()[0][-3000:] if first.poll() is not None else "too slow"
    os.kill(int((run_dir / "trainer.pid").read_text()), signal.SIGKILL)
    out, _ = first.communicate(timeout=300)
    assert first.returncode != 0
    second = train(config, "trainer.max_steps=4")  # from the checkpoint of step 2: steps 3 and 4 again
    out, _ = second.communicate(timeout=900)
    assert second.returncode == 0, out[-3000:]
    assert "resume_from" in (run_dir / "trained_sessions.jsonl").read_text()

    history = effective_history(run_dir)
    assert len(history) == len(set(history)), "a session was trained twice"
    engine = create_engine(f"sqlite:///{run_dir}/areal.db")
    with engine.connect() as conn:
        rows = conn.execute(select(sessions.c.id, sessions.c.status, sessions.c.consumed_step)).all()
    trained = {r.id for r in rows if r.status == "consumed" and (r.consumed_step or 0) >= 1}
    assert trained == set(history), "the store and the trainer agree on what was trained"
    finished_ever = {r.id for r in rows if r.status in ("finished", "consumed")}
    dropped = {r.id for r in rows if r.status == "consumed" and r.consumed_step == -1}
    skipped = {r.id for r in rows if r.status == "consumed" and r.consumed_step == -2}
    waiting = {r.id for r in rows if r.status == "finished"}
    assert trained | dropped | skipped | waiting == finished_ever
    assert len(trained) + len(dropped) + len(skipped) + len(waiting) == len(finished_ever)
    assert not [r for r in rows if r.status == "open"], "the run closed its sessions"


def test_a_run_that_learns_nothing_says_so(tmp_path):
    """A reward that scores every sample alike (here always 0) leaves no group to train on;
    after trainer.stall_steps such steps in a row the trainer warns in its log, its metrics
    and the progress display."""
    config = write_config(tmp_path, stall_steps=2)
    run_dir = tmp_path / "run"
    proc = train(config, "trainer.max_steps=2", "rollout.reward_fn=math_exact*0", "trainer.threads=1")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    log = (run_dir / "trainer.log").read_text()
    assert "on cpu (float32, 1 CPU thread)" in log, "trainer.threads reaches the trainer process"
    assert "no sample trained in the last 2 steps (every sample earned 0)" in log
    assert "collapsed" in log
    steps = [r for r in read_metrics(run_dir) if "reward_mean" in r]
    assert [(r["step"], r["samples"], r.get("stalled_steps")) for r in steps] == [(1, 0, None), (2, 0, 2)]
    assert dict(progress_rows(run_dir, 2))["warning"].startswith("nothing trained in 2 steps")
