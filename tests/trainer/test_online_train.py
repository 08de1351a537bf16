"""`areal-proxy train --online` end to end: live traffic, feedback from another process, exact training.

A plain `openai` client holding one fixed key (no sessions, no runner) sends 200 one-turn
conversations to the proxy that `train --online` starts. A separate process posts feedback for 60 of
them by the response ids the client got: scores, thumbs and labels. The trainer (3 steps of 20) must
train exactly those 60 episodes, each once, per its audit log and the store, while the client never
sees an error; the 140 episodes nobody rated are never trained.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
from sqlalchemy import select

from proxy.store.config import StoreConfig
from proxy.store.db import Database
from proxy.store.schema import sessions
from trainer import audit
from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy

CONVERSATIONS = 200
BATCH = 20
STEPS = 3

FEEDBACK = textwrap.dedent(
    """
    import json, sys
    import httpx

    url, path = sys.argv[1], sys.argv[2]
    out = []
    for i, response_id in enumerate(json.load(open(path))):
        kind = ("score", "thumbs", "label")[i % 3]
        value = {"score": 0.25 * (i % 5), "thumbs": "up" if i % 2 else "down", "label": "solved"}[kind]
        r = httpx.post(url + "/feedback", json={"response_id": response_id, kind: value}, timeout=60)
        r.raise_for_status()
        out.append(r.json())
    print(json.dumps(out))
    """
)


def config(tmp: Path, port: int) -> Path:
    path = tmp / "online.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [proxy]
            port = {port}
            [engine]
            model = "smollm2-135m-instruct"
            device = "cpu"
            [store]
            url = "sqlite:///{tmp}/areal.db"
            [rollout]
            group_size = 1
            [trainer]
            device = "cpu"
            run_dir = "{tmp}/run"
            max_steps = {STEPS}
            max_staleness = 8   # the unrated traffic keeps nothing back; every rated episode is trainable
            [trainer.batch]
            size = {BATCH}
            [trainer.checkpoint]
            every = 1000
            [online]
            idle_timeout_s = 2
            reward_deadline_s = 600
            sweep_interval_s = 0.5
            labels = {{solved = 1.0}}
            """
        )
    )
    return path


def ask(client: openai.OpenAI, i: int) -> str:
    a, b = 10 + i % 37, 20 + (7 * i) % 41
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}],
        max_tokens=8,
    )
    return reply.id


def test_online_training_trains_exactly_the_rated_episodes(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "proxy.cli", "train", "--online", str(config(tmp_path, port))]
    log = tmp_path / "train.log"
    train = start_process(argv, log, cwd=tmp_path)
    try:
        wait_healthy(url, train, timeout=600, log_path=log)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-my-app", max_retries=0, timeout=600)
        with ThreadPoolExecutor(8) as pool:
            response_ids = list(pool.map(lambda i: ask(client, i), range(CONVERSATIONS)))  # raises on any error
        assert len(set(response_ids)) == CONVERSATIONS

        rated = [rid for i, rid in enumerate(response_ids) if i % 10 in (0, 3, 6)]
        (tmp_path / "rated.json").write_text(json.dumps(rated))
        done = subprocess.run(
            [sys.executable, "-c", FEEDBACK, url, str(tmp_path / "rated.json")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        answers = json.loads(done.stdout)
        rated_sessions = {a["session_id"] for a in answers}
        assert len(rated_sessions) == len(rated) == BATCH * STEPS

        assert train.wait(timeout=900) == 0, log.read_text()[-4000:]
    finally:
        stop_process(train, 60)

    trained = audit.effective_history(tmp_path / "run")
    assert sorted(trained) == sorted(rated_sessions)  # each rated episode once, nothing else
    db = Database(StoreConfig(url=f"sqlite:///{tmp_path}/areal.db"))
    try:
        rows = db.read(lambda c: c.execute(select(sessions.c.id, sessions.c.status, sessions.c.consumed_step)).all())
    finally:
        db.close()
    assert len(rows) == CONVERSATIONS  # one automatic episode per conversation
    consumed = {r.id for r in rows if r.status == "consumed" and r.consumed_step is not None and r.consumed_step > 0}
    assert consumed == rated_sessions
    assert all(r.status in ("open", "failed") for r in rows if r.id not in rated_sessions)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x]
    steps = [m for m in metrics if "reward_mean" in m]
    assert [m["step"] for m in steps] == [1, 2, 3] and all(m["sessions"] == BATCH for m in steps)
