"""Fixtures for scale-out tests: proxy replicas sharing one PostgreSQL store and one engine
server, and `areal-proxy front` processes over them. Everything is a real process."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Server, free_port, run_server
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
    """`areal-proxy front` over the replicas; a `Server` whose url is the front's."""
    port = free_port()
    log = tmp / f"front-{port}.log"
    urls = ",".join(r.url for r in replicas)
    cmd = [sys.executable, "-m", "proxy.cli", "front", "--port", str(port), "--replicas", urls]
    cmd += ["--set", "front.health_interval_s=0.5", *extra]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=out, stderr=subprocess.STDOUT)
    front = Server(url=f"http://127.0.0.1:{port}", db_url=replicas[0].db_url, process=proc, log=log)
    try:
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"areal-proxy front exited with {proc.returncode}:\n{front.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(front.url + "/health", timeout=2).json().get("serving") == len(replicas):
                    break
            if time.time() > deadline:
                raise RuntimeError(f"areal-proxy front did not see its replicas:\n{front.tail()}")
            time.sleep(0.2)
        yield front
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


__all__ = ["original_weights", "run_front", "run_replicas"]
