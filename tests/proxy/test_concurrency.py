"""32 concurrent sessions × 4 turns: every completion recorded once, in its own tree."""

from __future__ import annotations

import asyncio

import openai

from tests.conftest import agent_turns


async def one_episode(proxy, index: int) -> tuple[str, list[str]]:
    session = await asyncio.to_thread(proxy.new_session, task_id=f"conc-{index}")
    client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=600)
    ids = await agent_turns(client, index, 4, 6)
    await client.close()
    return session["session_id"], ids


def test_32_sessions_4_turns(proxy):
    async def main():
        return await asyncio.gather(*(one_episode(proxy, i) for i in range(32)))

    episodes = asyncio.run(main())
    seen: set[str] = set()
    for session_id, ids in episodes:
        nodes = proxy.session(session_id)["completions"]
        assert sorted(n["id"] for n in nodes) == sorted(ids), "exactly this episode's completions, once each"
        by_id = {n["id"]: n for n in nodes}
        assert [by_id[i]["parent_id"] for i in ids] == [None, *ids[:-1]], "linked in order, never across sessions"
        seen.update(ids)
    assert len(seen) == 32 * 4
    # the engine batched them: far fewer decode steps than tokens
    engine = proxy.get("/health").json()["engine"]
    assert engine["steps"] < engine["tokens"]
