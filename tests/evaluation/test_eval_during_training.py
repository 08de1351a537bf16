"""Evaluation during training: `[eval] every_steps` on the arithmetic example, through the launcher.

Three tiny steps with an evaluation every two: the starting policy (step 0), step 2, and the final
policy (step 3, the run's budget). Each evaluation's rows in metrics.jsonl come from its own
sessions, all sampled at exactly the version it evaluated; no evaluation session is ever claimed;
best.json names the first step with the highest accuracy, and its checkpoint is kept.
"""

from __future__ import annotations

import json
import subprocess
import sys

from sqlalchemy import select

from proxy.store.config import StoreConfig
from proxy.store.db import Database
from proxy.store.schema import sessions
from tests.conftest import REPO


def test_the_trainer_evaluates_every_n_steps_and_keeps_the_best(tmp_path):
    run_dir = tmp_path / "run"
    url = f"sqlite:///{tmp_path}/areal.db"
    overrides = {
        "trainer.max_steps": 3,
        "trainer.batch.size": 4,
        "rollout.group_size": 2,
        "rollout.screen": "false",
        "trainer.batch.skip_zero_variance": "false",  # every step trains and pushes, whatever its rewards
        "trainer.checkpoint.every": 1000,
        "trainer.run_dir": str(run_dir),
        "store.url": url,
        "eval.every_steps": 2,
        "eval.max_tasks": 8,
        "eval.temperature": 0,  # greedy: the base model solves some
    }
    args = [sys.executable, "-m", "proxy.cli", "train", "examples/arithmetic/config.toml"]
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    evals = {r["step"]: r for r in rows if "eval_accuracy" in r}
    assert sorted(evals) == [0, 2, 3], rows
    trained = {r["step"]: r for r in rows if "reward_mean" in r}
    assert sorted(trained) == [1, 2, 3]
    assert evals[0]["eval_version"] == 0
    for step in (2, 3):
        assert evals[step]["eval_version"] == trained[step]["version"]

    db = Database(StoreConfig(url=url))
    try:
        eval_rows = db.read(lambda c: c.execute(select(sessions).where(sessions.c.eval.is_(True))).all())
        train_rows = db.read(lambda c: c.execute(select(sessions).where(sessions.c.eval.is_(False))).all())
    finally:
        db.close()
    assert len(eval_rows) == 3 * 8
    by_step: dict[int, list] = {}
    for r in eval_rows:
        by_step.setdefault(r.metadata["step"], []).append(r)
        assert r.consumed_step is None and r.claimed_step is None and r.temperature == 0
    for step, members in by_step.items():
        version = evals[step]["eval_version"]
        assert all(m.min_version == m.max_version == version for m in members), step
        solved = sum(m.status == "finished" and m.reward is not None and m.reward >= 1 for m in members)
        assert evals[step]["eval_accuracy"] == solved / 8
    assert any(r.consumed_step is not None for r in train_rows)

    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    top = max(evals[s]["eval_accuracy"] for s in (0, 2, 3))
    assert best["score"] == top and best["step"] == min(s for s in (0, 2, 3) if evals[s]["eval_accuracy"] == top)
    if best["step"] == 0:
        assert best["model"] == "smollm2-135m-instruct" and "path" not in best
    else:
        kept = run_dir / "checkpoints" / "best"
        assert best["path"] == str(kept)
        assert json.loads((kept / "trainer_state.json").read_text())["step"] == best["step"]
        assert (kept / "config.json").is_file()
    assert not (run_dir / "checkpoints" / ".eval_candidate").exists()
