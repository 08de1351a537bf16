"""The proxy's `sglang` backend against two real `areal-proxy engine` servers.

The proxy acceptance tests run here unchanged: they are imported into this module, where the
`proxy` fixture is a `serve --set engine.backend=sglang` process over two engine servers.
Then routing: sessions stick to one engine, sessions spread over both, and SIGKILL of one
engine during concurrent multi-turn sessions loses no answered completion.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, fields

import httpx
import openai
import pytest

from tests.conftest import Server, agent_turns, run_server
from tests.proxy import test_chat_api, test_concurrency, test_token_exactness

# The acceptance tests, in their own order (some read what earlier ones left, e.g. /metrics);
# pytest collects them here, where `proxy` below is the sglang-backed proxy.
for _module in (test_chat_api, test_token_exactness, test_concurrency):
    globals().update({name: obj for name, obj in vars(_module).items() if name.startswith("test_")})


def sglang_backend(engines, *extra: str) -> list[str]:
    urls = json.dumps([e.url for e in engines])
    return ["--set", "engine.backend=sglang", "--set", f"engine.urls={urls}", *extra]


@dataclass
class ProxyOverEngines(Server):
    """The proxy under test; its `/health` also sums the engines' own decode counters.

    With the local backend `/health` reports the engine's steps and tokens; with the sglang
    backend those live on the engine servers, so the batching check reads them there.
    """

    engines: list = field(default_factory=list)

    def get(self, path: str, **kw) -> httpx.Response:
        response = super().get(path, **kw)
        if path != "/health" or response.status_code != 200:
            return response
        body = response.json()
        stats = [e.stats() for e in self.engines]
        body["engine"].update({key: sum(s[key] for s in stats) for key in ("steps", "tokens")})
        return httpx.Response(200, json=body)


@pytest.fixture(scope="module")
def engines(tmp_path_factory, engine_runner) -> Iterator[list]:
    tmp = tmp_path_factory.mktemp("engines")
    with engine_runner(tmp) as a, engine_runner(tmp) as b:
        yield [a, b]


@pytest.fixture(scope="module")
def sglang_proxy(tmp_path_factory, engines) -> Iterator[ProxyOverEngines]:
    tmp = tmp_path_factory.mktemp("sglang-proxy")
    with run_server(tmp, f"sqlite:///{tmp}/areal.db", *sglang_backend(engines)) as server:
        yield ProxyOverEngines(**{f.name: getattr(server, f.name) for f in fields(server)}, engines=engines)


@pytest.fixture
def proxy(sglang_proxy) -> ProxyOverEngines:
    """Overrides the SQLite/PostgreSQL `proxy` of tests/conftest.py for the imported tests."""
    return sglang_proxy


def engine_requests(engines) -> list[int]:
    return [e.stats()["requests"] for e in engines]


def test_sessions_stick_to_one_engine_and_spread_over_both(sglang_proxy, engines):
    placements = []
    for i in range(6):
        session = sglang_proxy.new_session(task_id=f"sticky-{i}")
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
        messages = [{"role": "user", "content": f"Session {i}: name a fruit."}]
        served = []
        for _ in range(3):
            before = engine_requests(engines)
            r = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
            delta = [after - b for after, b in zip(engine_requests(engines), before)]
            assert sorted(delta) == [0, 1], delta
            served.append(delta.index(1))
            reply = {"role": "assistant", "content": r.choices[0].message.content}
            messages += [reply, {"role": "user", "content": "And another?"}]
        assert len(set(served)) == 1, f"session {i} moved between engines: {served}"
        placements.append(served[0])
    assert set(placements) == {0, 1}, f"all sessions on one engine: {placements}"
    servers = sglang_proxy.get("/health").json()["engine"]["servers"]
    assert all(s["alive"] and s["affinities"] >= 3 for s in servers), servers


async def _episode(proxy: Server, index: int, turns: int, answered: list[str]) -> tuple[str, list[str]]:
    session = await asyncio.to_thread(proxy.new_session, task_id=f"kill-{index}")
    # the SDK retries 503 (what an engine dying mid-generation gives): a real agent's behaviour
    client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=4, timeout=300)
    ids = await agent_turns(client, index, turns, 12, answered)
    await client.close()
    return session["session_id"], ids


def test_killing_an_engine_mid_run_loses_no_answered_completion(tmp_path, engine_runner):
    sessions, turns = 8, 4
    db = f"sqlite:///{tmp_path}/areal.db"
    with engine_runner(tmp_path) as victim, engine_runner(tmp_path) as survivor:
        backend = sglang_backend([victim, survivor], "--set", "engine.retry_dead_after_s=300")
        with run_server(tmp_path, db, *backend) as proxy:
            _kill_mid_run(proxy, victim, survivor, sessions, turns)


def _kill_mid_run(proxy: Server, victim, survivor, sessions: int, turns: int) -> None:
    answered: list[str] = []
    at_kill: dict = {}

    async def kill_when_busy() -> None:
        while len(answered) < sessions * turns:  # after the first turns, while the victim is decoding
            await asyncio.sleep(0.02)
            if len(answered) >= sessions and (stats := await asyncio.to_thread(victim.stats))["running"] > 0:
                at_kill.update(stats)
                break
        else:
            return
        at_kill["servers"] = (await asyncio.to_thread(proxy.get, "/health")).json()["engine"]["servers"]
        await asyncio.to_thread(victim.kill)

    async def main():
        killer = asyncio.create_task(kill_when_busy())
        episodes = await asyncio.gather(*(_episode(proxy, i, turns, answered) for i in range(sessions)))
        await killer
        return episodes

    episodes = asyncio.run(main())
    assert at_kill and victim.process.poll() is not None, "the engine was killed while decoding"
    pinned_before = {s["url"]: s["affinities"] for s in at_kill["servers"]}
    assert pinned_before[victim.url] > 0, "sessions were pinned to the killed engine"

    # every completion a client received is recorded, once, in its session's chain
    stored = 0
    for session_id, ids in episodes:
        nodes = proxy.session(session_id)["completions"]
        assert sorted(n["id"] for n in nodes) == sorted(ids)
        by_id = {n["id"]: n for n in nodes}
        assert [by_id[i]["parent_id"] for i in ids] == [None, *ids[:-1]]
        stored += len(nodes)
    assert stored == len(answered) == sessions * turns

    # the killed engine's sessions moved to the survivor; new sessions go there too
    servers = {s["url"]: s for s in proxy.get("/health").json()["engine"]["servers"]}
    assert not servers[victim.url]["alive"] and servers[victim.url]["failures"] >= 1
    assert servers[victim.url]["affinities"] < pinned_before[victim.url]
    before = survivor.stats()["requests"]
    session_id, ids = asyncio.run(_episode(proxy, 99, 2, []))
    assert survivor.stats()["requests"] - before == 2
    assert len(proxy.session(session_id)["completions"]) == 2
