"""Fixtures for scale-out tests: proxy replicas sharing one PostgreSQL store and one engine
server, and `areal-proxy front` processes over them. Everything is a real process."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Server, cli_process, run_server
from tests.engines.conftest import EngineProcess, original_weights, run_engine


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One `areal-proxy engine` server that every replica of these tests shares."""
    with run_engine(tmp_path_factory.mktemp("scaleout-engine")) as server:
        yield server


@contextlib.contextmanager
def run_replicas(tmp: Path, db_url: str, engine: EngineProcess, n: int = 2, *extra: str) -> Iterator[list[Server]]:
    """`n` proxy replicas on one store, all over `engine` through the sglang backend."""
    backend = ["--set", "engine.backend=sglang", "--set", f"engine.urls={json.dumps([engine.url])}"]
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(run_server(tmp, db_url, *backend, *extra)) for _ in range(n)]


@contextlib.contextmanager
def run_front(tmp: Path, replicas: list[Server], *extra: str) -> Iterator[Server]:
    """`areal-proxy front` over the replicas; a `Server` whose url is the front's, once it serves them all."""
    args = ["--replicas", ",".join(r.url for r in replicas), "--set", "front.health_interval_s=0.5", *extra]

    def serves_all(response: httpx.Response) -> bool:
        return response.json().get("serving") == len(replicas)

    with cli_process(tmp, "front", *args, timeout=60, ready=serves_all) as (url, proc, log):
        yield Server(url=url, db_url=replicas[0].db_url, process=proc, log=log)


__all__ = ["original_weights", "run_front", "run_replicas"]
