"""Two proxy replicas on one PostgreSQL store, one engine server, `areal-proxy front` over them.

Any replica serves any session (the parent of a turn is found in the store); a session closed
on one replica takes no more completions on the other; the front keeps sessions on one replica,
streams SSE through unchanged and hands a weight push to every replica, and the engine they
share loads it once; admission control holds across replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from sqlalchemy import create_engine, func, select

from proxy.store.schema import completions, sessions
from tests.conftest import Server, fresh_pg_database
from tests.scaleout.conftest import run_front, run_replicas

pytestmark = pytest.mark.postgres


@dataclass
class Cluster:
    replicas: list[Server]
    front: Server
    db_url: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, engine) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("front")
    with (
        fresh_pg_database() as db_url,
        run_replicas(tmp, db_url, engine) as replicas,
        run_front(tmp, replicas) as front,
    ):
        yield Cluster(replicas, front, db_url)


def _ask(base_url: str, api_key: str, messages: list[dict]) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
    return client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=1.0)


def _count(db_url: str, query) -> int:  # noqa: ANN001
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(query).scalar()
    finally:
        engine.dispose()


def test_any_replica_serves_any_session(cluster):
    a, b = cluster.replicas
    session = a.new_session(task_id="cross")
    sid, key = session["session_id"], session["api_key"]
    messages = [{"role": "user", "content": "Name a colour."}]
    first = _ask(f"{a.url}/sessions/{sid}/v1", key, messages)
    reply = {"role": "assistant", "content": first.choices[0].message.content}
    messages += [reply, {"role": "user", "content": "More"}]
    second = _ask(f"{b.url}/sessions/{sid}/v1", key, messages)  # b never saw this session
    nodes = {n["id"]: n for n in a.session(sid)["completions"]}
    assert nodes[second.id]["parent_id"] == first.id, "b found the parent a recorded, in the store"
    assert b.post(f"/sessions/{sid}/finish", json={"reward": 1.0}).json()["status"] == "finished"


def test_a_session_closed_on_one_replica_takes_no_completion_on_another(cluster):
    a, b = cluster.replicas
    session = a.new_session(task_id="stale-cache")
    sid, key = session["session_id"], session["api_key"]
    _ask(f"{b.url}/sessions/{sid}/v1", key, [{"role": "user", "content": "Hi"}])  # b caches it as open
    assert a.post(f"/sessions/{sid}/finish", json={"reward": 0.0}).status_code == 200
    with pytest.raises(openai.ConflictError):
        _ask(f"{b.url}/sessions/{sid}/v1", key, [{"role": "user", "content": "Hi again"}])
    stored = _count(cluster.db_url, select(func.count()).where(completions.c.session_id == sid))
    assert stored == 1, "the call on the stale replica recorded nothing"


def test_front_keeps_a_session_on_one_replica_and_streams_through(cluster):
    front = cluster.front
    session = front.new_session(task_id="front-stream")
    assert session["base_url"].startswith(front.url + "/sessions/"), "clients are sent back to the front"
    messages = [{"role": "user", "content": "Count to three."}]
    served, ids = set(), []
    for turn in range(3):
        with httpx.stream(
            "POST",
            f"{session['base_url']}/chat/completions",
            json={"model": "m", "messages": messages, "max_tokens": 8, "stream": True},
            headers={"Authorization": f"Bearer {session['api_key']}"},
            timeout=300,
        ) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            served.add(r.headers["x-areal-replica"])
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        chunks = [httpx.Response(200, content=e[6:]).json() for e in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        ids.append(chunks[0]["id"])
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"turn {turn}"}]
    assert len(served) == 1, f"the session moved between replicas: {served}"
    nodes = {n["id"]: n for n in front.session(session["session_id"])["completions"]}
    assert [nodes[i]["parent_id"] for i in ids] == [None, *ids[:-1]]


def test_unnamed_calls_spread_over_the_replicas(cluster):
    served = {httpx.get(cluster.front.url + "/v1/models", timeout=30).headers["x-areal-replica"] for _ in range(4)}
    assert served == {r.url for r in cluster.replicas}


def test_a_weight_push_reaches_every_replica_and_the_engine_loads_it_once(cluster, engine, original_weights):
    r = httpx.post(cluster.front.url + "/weights", json={"path": str(original_weights), "version": 1}, timeout=300)
    assert r.status_code == 200, r.text
    assert [rep.get("/health").json()["version"] for rep in cluster.replicas] == [1, 1]
    assert httpx.get(cluster.front.url + "/health").json()["version"] == 1
    assert engine.tail(100_000).count("loaded as version 1") == 1, "the second replica found it loaded"
    stale = httpx.post(cluster.front.url + "/weights", json={"path": str(original_weights), "version": 0}, timeout=60)
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "conflict"


def test_admission_holds_across_replicas(tmp_path, engine):
    admission = ["--set", "proxy.admission=true", "--set", "rollout.group_size=2"]
    admission += ["--set", "trainer.batch.size=4", "--set", "trainer.max_staleness=0"]
    with fresh_pg_database() as db_url, run_replicas(tmp_path, db_url, engine, 2, *admission) as replicas:

        async def create(client: httpx.AsyncClient, url: str) -> int:
            r = await client.post(f"{url}/sessions", json={"count": 2, "group_id": "g"})
            return r.status_code

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as client:
                calls = [create(client, replicas[i % 2].url) for i in range(16)]
                return await asyncio.gather(*calls)

        codes = asyncio.run(burst())
        assert sorted(codes).count(201) == 2 and set(codes) == {201, 429}, codes
        assert _count(db_url, select(func.count()).select_from(sessions)) == 4, "limit 4 = (0 + 1) × 4"


def test_a_front_with_an_admin_key_checks_pushes_before_fanning_them_out(cluster, tmp_path):
    before = [rep.get("/health").json()["version"] for rep in cluster.replicas]
    with run_front(tmp_path, cluster.replicas, "--set", "proxy.admin_key=front-secret") as front:
        body = {"path": "/nonexistent", "version": 99}
        refused = httpx.post(front.url + "/weights", json=body, timeout=60)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        keyed = {"Authorization": "Bearer front-secret"}
        bad = httpx.post(front.url + "/weights", json={"path": "", "version": -1}, headers=keyed, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] in ("path", "version"), bad.text
        assert [rep.get("/health").json()["version"] for rep in cluster.replicas] == before, "nothing reached them"
