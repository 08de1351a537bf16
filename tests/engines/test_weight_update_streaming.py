"""Interruptible generation: a weight update lands during 16 concurrent streamed completions.

Nothing is lost or duplicated, and every recorded token carries the version that sampled it:
completions that straddle the update hold version 0 then version 1, never going back. Run on
both paths a trainer uses: the embedded (local) backend and the sglang backend over an
`areal-proxy engine` server (pause, update from disk, continue).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import openai
import pytest

from tests.conftest import Server, run_server

STREAMS, MAX_TOKENS = 16, 48


@pytest.fixture(scope="module", params=["local", "sglang"])
def proxy(request, tmp_path_factory, engine_runner) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp(f"update-{request.param}")
    db = f"sqlite:///{tmp}/areal.db"
    if request.param == "local":
        with run_server(tmp, db, "--set", "engine.threads=1") as server:
            yield server
        return
    with engine_runner(tmp) as engine:
        backend = ["--set", "engine.backend=sglang", "--set", f"engine.urls={json.dumps([engine.url])}"]
        with run_server(tmp, db, *backend) as server:
            yield server


async def _stream(proxy: Server, index: int, progress: list[int]) -> tuple[str, str, int]:
    session = await asyncio.to_thread(proxy.new_session, task_id=f"update-{index}")
    client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=600)
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": f"Write a long story about dragon number {index}."}],
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=index,
        stream=True,
        stream_options={"include_usage": True},
    )
    completion_id, usage = "", None
    async for chunk in stream:
        completion_id = chunk.id
        usage = chunk.usage or usage
        progress[index] += sum(1 for c in chunk.choices if c.delta.content)
    await client.close()
    assert usage is not None
    return session["session_id"], completion_id, usage.completion_tokens


def test_weight_update_during_16_streams(proxy, perturbed_weights):
    progress = [0] * STREAMS

    async def update_midway(streams: asyncio.Future) -> None:
        while sum(progress) < STREAMS * 6 and not streams.done():  # about six tokens into each stream
            await asyncio.sleep(0.02)
        r = await asyncio.to_thread(proxy.post, "/weights", json={"path": str(perturbed_weights), "version": 1})
        assert r.status_code == 200 and r.json()["version"] == 1, r.text

    async def main():
        streams = asyncio.gather(*(_stream(proxy, i, progress) for i in range(STREAMS)))
        await update_midway(streams)
        return await streams

    results = asyncio.run(main())
    assert proxy.get("/health").json()["version"] == 1
    straddling = 0
    for session_id, completion_id, completion_tokens in results:
        [node] = proxy.session(session_id)["completions"]  # recorded once, none lost
        assert node["id"] == completion_id
        versions = node["output_versions"]
        assert len(versions) == len(node["output_ids"]) == len(node["output_logprobs"]) == completion_tokens
        assert set(versions) <= {0, 1} and versions == sorted(versions), versions
        straddling += versions[0] == 0 and versions[-1] == 1
    assert straddling >= 1, "no completion spans the update"

    # after the update every token is sampled by the new weights
    session = proxy.new_session()
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    [node] = proxy.session(session["session_id"])["completions"]
    assert set(node["output_versions"]) == {1}
