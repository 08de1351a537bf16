"""Shared fixtures: real `areal-proxy serve` processes on free ports, real stores.

`proxy` is parametrized over SQLite and the machine's PostgreSQL, so every test
that uses it runs against both. Each PostgreSQL server gets a fresh database that
is dropped afterwards. Servers are session-scoped (the model loads once per
store); tests keep to their own sessions so they never see each other's rows.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainer.launch.processes import free_port, log_tail, start_process, stop_process, wait_healthy

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("AREAL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def tiny_llama(**overrides: object):
    """A seeded, randomly initialised Llama small enough for exact comparisons on CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = {
        "vocab_size": 97,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        **overrides,
    }
    return LlamaForCausalLM(LlamaConfig(**config))


def one_turn_session(
    sid: str,
    output: list[int],
    *,
    group: str | None = None,
    reward: float = 0.0,
    behav: list[float] | None = None,
    temperature: float = 1.0,
    prompt: tuple[int, ...] = (5, 6, 7),
):
    """A claimed session as the trainer loads it, of one turn: `prompt` then `output` sampled with `behav`
    logprobs (default -1 each), its group and task `group` (default: its own id)."""
    from proxy.store.samples import IndividualSample, SessionSamples

    group = group or sid
    turn = IndividualSample(
        session_id=sid,
        group_id=group,
        task_id=group,
        completion_id=f"c-{sid}",
        parent_id=None,
        turn=0,
        prompt_ids=list(prompt),
        output_ids=output,
        behav_logprobs=behav if behav is not None else [-1.0] * len(output),
        versions=[0] * len(output),
        ret=reward,
        reward=reward,
        session_reward=reward,
        temperature=temperature,
        finish_reason="stop",
    )
    return SessionSamples(sid, group, group, reward, 0, [turn], [])


def reuse_after_idle(url: str, idle_s: float) -> None:
    """Two requests on one kept-alive connection, `idle_s` apart: the second must be answered.

    Our servers keep idle connections longer than clients do (httpx and the OpenAI SDKs drop
    them after 5 s): a server that closed first could cut a request the client had just sent.
    """
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", "/health")
        first = conn.getresponse()
        first.read()
        assert first.status == 200 and not first.will_close
        sock = conn.sock
        time.sleep(idle_s)
        conn.request("GET", "/health")  # on the same socket: http.client does not reconnect
        assert conn.sock is sock
        second = conn.getresponse()  # RemoteDisconnected if the server closed the connection
        second.read()
        assert second.status == 200
    finally:
        conn.close()


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT
    db_url: str
    process: subprocess.Popen
    log: Path
    admin_key: str = ""

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers(), timeout=120, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        headers = {**self.headers(), **kw.pop("headers", {})}
        return httpx.post(self.url + path, headers=headers, timeout=600, **kw)

    def new_session(self, **body) -> dict:
        r = self.post("/sessions", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def session(self, session_id: str) -> dict:
        r = self.get(f"/sessions/{session_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def tail(self, n: int = 4000) -> str:
        return log_tail(self.log, n)


@contextlib.contextmanager
def cli_process(
    tmp: Path,
    command: str,
    *args: str,
    timeout: float = 240,
    env: dict[str, str] | None = None,
    ready: Callable[[httpx.Response], bool] | None = None,
) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """`areal-proxy COMMAND --port PORT ARGS` run in `tmp`: yields (url, process, log) once healthy, stops it after."""
    port = free_port()
    log = tmp / f"{command}-{port}.log"
    argv = [sys.executable, "-m", "proxy.cli", command, "--port", str(port), *args]
    proc = start_process(argv, log, cwd=tmp, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=timeout, log_path=log, ready=ready)
        yield url, proc, log
    finally:
        stop_process(proc, 20)


@contextlib.contextmanager
def serve_app(app: Any, **options: Any) -> Iterator[str]:
    """An ASGI app of the test's own under uvicorn in a thread (no lifespan), on a free port: its URL.
    `options` go to `uvicorn.Config`."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the test's server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


@contextlib.contextmanager
def run_server(tmp: Path, db_url: str, *args: str, admin_key: str = "", env: dict | None = None) -> Iterator[Server]:
    """`areal-proxy serve` on `db_url` with extra `args`, on a free port."""
    key = ["--admin-key", admin_key] if admin_key else []
    with cli_process(tmp, "serve", "--db", db_url, *args, *key, env=env) as (url, proc, log):
        yield Server(url=url, db_url=db_url, process=proc, log=log, admin_key=admin_key)


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except Exception:
        return False


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new empty PostgreSQL database; yields its SQLAlchemy URL, drops it afterwards."""
    import psycopg

    if not pg_available():
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL} (required in CI)")
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN_URL}")
    name = "areal_test_" + secrets.token_hex(6)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base.replace('postgresql://', 'postgresql+psycopg://')}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(autouse=True, scope="module")
def _drop_checkpoint_weights(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Once a module's tests are done, delete the weights and optimizer state of the checkpoints they wrote
    (a default-model checkpoint is 1.6 GB; a module that trains writes several, and the whole suite would
    otherwise keep tens of GB on a shared disk until it ends). No session-scoped fixture writes a
    checkpoint, so nothing a later module uses is removed; the logs and metrics a failure needs stay."""
    yield
    for step_dir in tmp_path_factory.getbasetemp().glob("**/checkpoints/step_*"):
        for path in step_dir.iterdir():
            if path.suffix in (".safetensors", ".pt", ".bin"):
                path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def sqlite_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("sqlite-proxy")
    with run_server(tmp, f"sqlite:///{tmp}/areal.db") as server:
        yield server


@pytest.fixture(scope="session")
def pg_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("pg-proxy")
    with fresh_pg_database() as url, run_server(tmp, url) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def proxy(request: pytest.FixtureRequest) -> Server:
    """The proxy under test, once on SQLite and once on PostgreSQL."""
    return request.getfixturevalue(f"{'sqlite' if request.param == 'sqlite' else 'pg'}_proxy")


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """An empty store at the current schema, once on SQLite and once in a fresh PostgreSQL database."""
    from proxy.store.config import StoreConfig
    from proxy.store.db import Database

    with contextlib.ExitStack() as stack:
        url = (
            f"sqlite:///{tmp_path}/store.db" if request.param == "sqlite" else stack.enter_context(fresh_pg_database())
        )
        database = Database(StoreConfig(url=url))
        yield database
        database.close()


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    candidates = [os.environ.get("AREAL_GSM8K_DIR"), REPO.parent / "shared/data/gsm8k", Path("/work/shared/data/gsm8k")]
    for c in candidates:
        if c and (Path(c) / "test.jsonl").is_file():
            return Path(c)
    pytest.skip("GSM8K test data not found (set AREAL_GSM8K_DIR)")


@pytest.fixture(scope="session")
def reference_model():
    """The default model loaded in the test process, for checking stored logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

    path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model


async def agent_turns(
    client: Any, index: int, turns: int, max_tokens: int, answered: list[str] | None = None
) -> list[str]:
    """`turns` turns of agent `index` on an `openai.AsyncOpenAI` client, each reply sent back with a
    request to go on (the history resent whole, as agents do); the completion ids, also appended to
    `answered` as each answer arrives."""
    messages = [{"role": "user", "content": f"Agent {index}: tell me a short story."}]
    ids = []
    for turn in range(turns):
        r = await client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=1.0)
        ids.append(r.id)
        if answered is not None:
            answered.append(r.id)
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": f"Agent {index}, turn {turn + 1}: go on."},
        ]
    return ids


def store_counts(db_url: str) -> tuple[int, int]:
    """(sessions, completions) in the store at `db_url`."""
    from sqlalchemy import create_engine, func, select

    from proxy.store.schema import completions, sessions

    engine = create_engine(db_url)
    with engine.connect() as conn:
        n_sessions = conn.execute(select(func.count()).select_from(sessions)).scalar()
        n_completions = conn.execute(select(func.count()).select_from(completions)).scalar()
    engine.dispose()
    return n_sessions, n_completions


def send_part_of_a_body(url: str, path: str = "/v1/chat/completions") -> None:
    """A client that hangs up mid-upload: 1,000 bytes announced, a few sent, the socket closed."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
            + b"Content-Length: 1000\r\n\r\n"
            + b'{"model": "m", "messages": ['
        )
        time.sleep(0.5)
