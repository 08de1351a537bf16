"""Dedicated proxies for the reward tests, beside the shared ones in tests/conftest.py.

`rewards_proxy` loads a user reward module of misbehaving rewards (written to a
temporary file and loaded with `--rewards PATH`, as a user would load their own)
and serves both the return checks (`--set rewards.discount=0.9`) and the failure
checks (`--set rewards.timeout_s=1`), so the model loads once for both.
`expiring_proxy` closes sessions idle for 2 s; it is kept apart so that its
sweeper never closes another test's session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server, run_server

REWARD_MODULE = '''
"""Rewards that each fail in their own way, plus one per-turn reward that works."""

import asyncio
import time

from rewards import SessionView, reward


@reward("test_raises")
def raises(session: SessionView) -> float:
    raise RuntimeError("grader exploded on [/INST]")


@reward("test_too_slow")
def too_slow(session: SessionView) -> float:
    time.sleep(6)
    return 1.0


@reward("test_too_slow_async")
async def too_slow_async(session: SessionView) -> float:
    await asyncio.sleep(6)
    return 1.0


@reward("test_stuck")
def stuck(session: SessionView) -> float:
    time.sleep(900)  # holds its thread long after the timeout
    return 1.0


@reward("test_nan")
def not_a_number(session: SessionView) -> float:
    return float("nan")


@reward("test_bool")
def boolean(session: SessionView) -> bool:
    return True


@reward("test_string")
def string(session: SessionView) -> str:
    return "1.0"


@reward("test_stranger")
def stranger(session: SessionView) -> dict:
    return {"chatcmpl-not-in-this-session": 1.0}


@reward("test_per_turn")
async def per_turn(session: SessionView) -> dict:
    """Turn k (in creation order) earns k + 1."""
    await asyncio.sleep(0.01)
    return {c.id: float(k + 1) for k, c in enumerate(session.completions)}
'''


# One torch thread: on a small machine shared with other servers, torch's default thread
# count oversubscribes the cores and a short generation runs several times slower.
ENGINE_ARGS = ["--set", "engine.threads=1"]


@pytest.fixture(scope="session")
def reward_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reward-module") / "misbehaving_rewards.py"
    path.write_text(REWARD_MODULE)
    return path


@pytest.fixture(scope="session")
def rewards_proxy(tmp_path_factory: pytest.TempPathFactory, reward_module: Path) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("rewards-proxy")
    args = ["--rewards", str(reward_module), "--set", "rewards.discount=0.9", "--set", "rewards.timeout_s=1"]
    args += ENGINE_ARGS
    with run_server(tmp, f"sqlite:///{tmp}/areal.db", *args) as server:
        yield server


@pytest.fixture(scope="module")
def expiring_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Open sessions idle for 2 s are closed as failed (the sweeper runs every second)."""
    tmp = tmp_path_factory.mktemp("expiring-proxy")
    args = ["--set", "proxy.session_timeout_s=2", *ENGINE_ARGS]
    with run_server(tmp, f"sqlite:///{tmp}/areal.db", *args) as server:
        yield server
