"""`areal-proxy eval` runs every framework example's agent unchanged: the OpenAI Agents SDK (Responses
API, a function tool), CAMEL-AI (Chat Completions) and the `anthropic` client (Messages API, tool use).

Two held-out tasks, two episodes each, with the real model: every episode's calls reach the proxy as
evaluation sessions, and the report counts them as the store does.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import select

from proxy.store.config import StoreConfig
from proxy.store.db import Database
from proxy.store.schema import completions, sessions
from tests.conftest import REPO

EXAMPLES = ["openai_agents_calculator", "camel_math", "claude_style_messages"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_is_evaluated_unchanged(tmp_path, example):
    url = f"sqlite:///{tmp_path}/areal.db"
    out = tmp_path / "report.json"
    args = [sys.executable, "-m", "proxy.cli", "eval", f"examples/{example}/config.toml"]
    args += ["--max-tasks", "2", "--samples", "2", "--db", url, "--out", str(out)]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads(out.read_text())["report"]
    assert report["tasks"] == 2 and report["episodes"] == 4

    db = Database(StoreConfig(url=url))
    try:
        rows = db.read(lambda c: c.execute(select(sessions).where(sessions.c.eval.is_(True))).all())
        turns = db.read(lambda c: c.execute(select(completions.c.session_id, completions.c.api)).all())
    finally:
        db.close()
    assert len(rows) == 4 and all(r.status in ("finished", "failed") for r in rows)
    assert {t.session_id for t in turns} == {r.id for r in rows}  # every episode called the model
    assert report["per_episode"]["turns"] == pytest.approx(len(turns) / 4)
    assert sum(report["failures"].values()) == sum(r.status == "failed" for r in rows)
    api = {"openai_agents_calculator": "responses", "camel_math": "chat", "claude_style_messages": "messages"}
    assert {t.api for t in turns} == {api[example]}
