"""Each framework example trains: `areal-proxy train examples/<name>/config.toml`, two tiny steps.

The example's own config runs from the repository root (its paths are relative to it),
with the store and run directory moved into a temporary folder and the batch shrunk
to two groups of two. The run must exit 0 and write metrics for both steps.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from proxy.config import load_config
from tests.conftest import REPO

EXAMPLES = ["openai_agents_calculator", "camel_math", "claude_style_messages", "claude_agent_sdk"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_trains(tmp_path, example):
    run_dir = tmp_path / "run"
    overrides = {
        "trainer.max_steps": 2,
        "trainer.batch.size": 4,
        "rollout.group_size": 2,
        "trainer.checkpoint.every": 1000,
        "trainer.run_dir": str(run_dir),
        "store.url": f"sqlite:///{tmp_path}/areal.db",
    }
    args = [sys.executable, "-m", "proxy.cli", "train", f"examples/{example}/config.toml"]
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    trained = [s for s in steps if "reward_mean" in s]
    assert [s["step"] for s in trained] == [1, 2], steps
    assert all(s["sessions"] >= 4 for s in trained)
    forced = load_config(REPO / "examples" / example / "config.toml").rollout.temperature
    if forced is not None:  # [rollout] temperature: every call of every episode sampled (and recorded) at it
        with sqlite3.connect(tmp_path / "areal.db") as db:
            temperatures = {t for (t,) in db.execute("SELECT DISTINCT temperature FROM completions")}
        assert temperatures == {forced}, temperatures
