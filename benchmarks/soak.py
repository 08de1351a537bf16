"""Soak: mixed traffic from the real clients, with faults injected, for N minutes.

Starts `areal-proxy serve` (the real default model, `proxy.fault_injection` on, an admin key) on a
fresh PostgreSQL database reached through `tests/store/relay.py`'s `Relay`. For `--minutes`,
`--clients` agents run episodes of 1-3 turns in sessions (`POST /sessions`, then `/finish`
with a reward), each episode with one real client: the `openai` SDK (Chat Completions, the
Responses API) or the `anthropic` SDK (Messages), streamed or not, up to 16 new tokens a call.
Beside them a hostile client sends the cases of `tests/proxy/test_hostile_input.py`, and raw
sockets hang up mid-request, mid-generation and mid-stream. Every `--fault-gap` seconds one fault,
in turn: the store cut (`relay.down`) or partitioned (`relay.partition`) for 5-10 s, an engine
fault (`POST /debug/engine-fault`), a burst of hang-ups.

Afterwards the database is read directly: every completion a client saw succeed must be stored.
A 503 (or a stream's error event) from a call that overlaps a store outage or an engine restart,
or the `--grace` seconds after it, is expected; any other 5xx is a server error. The server's RSS
is sampled every 5 s. Exit 1 if an acknowledged completion was lost, a hostile request got a 5xx,
any call got a 500, or the server was not healthy at the end.

    python benchmarks/soak.py --minutes 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import re
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import psutil
from sqlalchemy import create_engine, func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.store.schema import completions, sessions  # noqa: E402
from tests.conftest import fresh_pg_database  # noqa: E402
from tests.proxy.test_hostile_input import ADMIN as TABLE_ADMIN  # noqa: E402
from tests.proxy.test_hostile_input import CASES, Case  # noqa: E402
from tests.store.relay import Relay  # noqa: E402
from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy  # noqa: E402

MODEL = "smollm2-135m-instruct"
FAULTS = ("store-down", "store-partition", "engine-fault", "hangup-burst")
EXCUSING = {"store-down", "store-partition", "engine-fault"}
"""Faults under which a 503 (or a stream's error event) is the documented answer."""


@dataclass
class Call:
    kind: str  # chat, chat-stream, responses(-stream), messages(-stream), session, finish, fail, hostile, hangup-*
    start: float
    end: float
    outcome: str  # an HTTP status, or stream-error, incomplete, timeout, transport, hung-up
    detail: str = ""
    case: str = ""  # the hostile case, and the status its table expects
    expected: int | None = None

    def failed_5xx(self) -> bool:
        return self.outcome.startswith("5") or self.outcome in ("stream-error", "incomplete")


@dataclass
class Fault:
    kind: str
    start: float
    end: float
    note: str = ""

    def excuses(self, call: Call, grace: float) -> bool:
        return self.kind in EXCUSING and call.start <= self.end + grace and call.end >= self.start


class StreamFailed(Exception):
    """A stream that ended with an error event (`stream-error`) or without its last event (`incomplete`)."""

    def __init__(self, outcome: str, detail: str = "") -> None:
        super().__init__(detail)
        self.outcome, self.detail = outcome, detail


class Soak:
    """What every worker shares: the server, the ledger of calls, the acknowledged ids, the faults."""

    def __init__(self, url: str, admin: str, relay: Relay, seconds: float, timeout: float) -> None:
        self.url, self.admin, self.relay, self.timeout = url, admin, relay, timeout
        self.t0 = time.monotonic()
        self.stop_at = self.t0 + seconds
        self.calls: list[Call] = []
        self.acked: dict[str, str] = {}  # id the client was answered → the kind of call
        self.faults: list[Fault] = []
        self.hangup_path = self.hangup_key = ""  # the session the hang-up clients call in
        self.stuck_workers = 0  # workers still busy long after the time was up: a hang
        self.rss_idle = 0.0  # the server's RSS once idle after the traffic
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        self.http = httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def running(self) -> bool:
        return time.monotonic() < self.stop_at

    def record(self, kind: str, start: float, outcome: str, detail: str = "", **extra: Any) -> Call:
        call = Call(kind, round(start, 3), round(self.now(), 3), outcome, detail[:300], **extra)
        self.calls.append(call)
        return call

    def log(self, message: str) -> None:
        print(f"[{self.now():7.1f}s] {message}", flush=True)

    async def control(self, kind: str, method: str, path: str, body: Any = None) -> dict | None:
        """An admin call; its JSON on 2xx, else None (recorded either way)."""
        start = self.now()
        try:
            r = await self.http.request(method, self.url + path, json=body, headers=self.auth())
        except httpx.TransportError as exc:
            self.record(kind, start, failure(exc), repr(exc))
            return None
        self.record(kind, start, str(r.status_code), "" if r.is_success else r.text)
        return r.json() if r.is_success else None

    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.admin}"}


def failure(exc: Exception) -> str:
    """A call that got no answer: `timeout` (a hang) or `transport` (the connection failed)."""
    timeouts = (httpx.TimeoutException, openai.APITimeoutError, anthropic.APITimeoutError, TimeoutError)
    return "timeout" if isinstance(exc, timeouts) else "transport"


# -- agents: the real SDKs in sessions ------------------------------------------------------
def question(rng: random.Random, turn: int) -> str:
    if turn == 0:
        return f"What is {rng.randint(2, 99)} + {rng.randint(2, 99)}? Answer with a number."
    return rng.choice(["Are you sure? Answer again.", "Now add 1 to it.", "Say it in words.", "Why?"])


async def attempt(soak: Soak, kind: str, call: Awaitable[tuple[str, Any]]) -> Any:
    """Await one model call; on success record its id as acknowledged and return its result (else None)."""
    start = soak.now()
    try:
        ident, result = await call
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        # anthropic raises a stream's error event as a status error carrying the stream's 200
        outcome = "stream-error" if exc.status_code == 200 else str(exc.status_code)
        soak.record(kind, start, outcome, str(exc.body or exc.message))
        return None
    except (openai.APIConnectionError, anthropic.APIConnectionError) as exc:
        soak.record(kind, start, failure(exc), repr(exc.__cause__ or exc))
        return None
    except openai.APIError as exc:  # openai raises a chat stream's error chunk without a status
        soak.record(kind, start, "stream-error", str(exc.body or exc.message))
        return None
    except StreamFailed as exc:
        soak.record(kind, start, exc.outcome, exc.detail)
        return None
    soak.acked[ident] = kind
    soak.record(kind, start, "200")
    return result


async def chat_call(oa: openai.AsyncOpenAI, messages: list[dict], n: int, stream: bool) -> tuple[str, str]:
    if not stream:
        r = await oa.chat.completions.create(model=MODEL, messages=messages, max_tokens=n)
        return r.id, r.choices[0].message.content or ""
    ident, text, finished = "", [], False
    async for chunk in await oa.chat.completions.create(model=MODEL, messages=messages, max_tokens=n, stream=True):
        ident = chunk.id
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finished |= choice.finish_reason is not None  # sent only once the turn is committed
    if not finished:
        raise StreamFailed("incomplete", "no finish_reason")
    return ident, "".join(text)


async def responses_call(oa: openai.AsyncOpenAI, args: dict, n: int, stream: bool) -> tuple[str, Any]:
    if not stream:
        r = await oa.responses.create(model=MODEL, max_output_tokens=n, **args)
        return r.id, r
    done = None
    async for event in await oa.responses.create(model=MODEL, max_output_tokens=n, stream=True, **args):
        if event.type == "error":  # openai yields the Responses API's error event rather than raising
            raise StreamFailed("stream-error", f"{event.code}: {event.message}")
        if event.type == "response.completed":
            done = event.response
    if done is None:
        raise StreamFailed("incomplete", "no response.completed")
    return done.id, done


async def messages_call(an: anthropic.AsyncAnthropic, messages: list[dict], n: int, stream: bool) -> tuple[str, str]:
    if not stream:
        r = await an.messages.create(model=MODEL, max_tokens=n, messages=messages)
        return r.id, "".join(b.text for b in r.content if b.type == "text")
    ident, text, stopped = "", [], False
    async for event in await an.messages.create(model=MODEL, max_tokens=n, messages=messages, stream=True):
        if event.type == "message_start":
            ident = event.message.id
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            text.append(event.delta.text)
        stopped |= event.type == "message_stop"
    if not stopped:
        raise StreamFailed("incomplete", "no message_stop")
    return ident, "".join(text)


async def episode(soak: Soak, api: str, client: Any, turns: int, rng: random.Random) -> int:
    """Up to `turns` turns of one API, each streamed or not; how many were answered."""
    history: list[dict] = []  # messages, or the Responses API's input items
    previous = None
    for turn in range(turns):
        user = {"role": "user", "content": question(rng, turn)}
        n, stream = rng.randint(4, 16), rng.random() < 0.5
        kind = f"{api}-stream" if stream else api
        if api == "responses":
            chained = previous is not None and rng.random() < 0.5  # else the whole history, as the Agents SDK sends
            args = {"previous_response_id": previous, "input": [user]} if chained else {"input": [*history, user]}
            response = await attempt(soak, kind, responses_call(client, args, n, stream))
            if response is None:
                return turn
            history += [user, *(item.model_dump(exclude_none=True) for item in response.output)]
            previous, reply = response.id, response.output_text
        else:
            call = chat_call if api == "chat" else messages_call
            reply = await attempt(soak, kind, call(client, [*history, user], n, stream))
            if reply is None:
                return turn
            history += [user, {"role": "assistant", "content": reply}]
        if not reply:  # an empty answer: the episode ends there
            return turn + 1
    return turns


async def agent(soak: Soak, worker: int, rng: random.Random) -> None:
    """Episodes until the time is up: a session, 1-3 turns of one API, then finish (or fail).

    Each SDK client is made once (its own connection pool) and pointed at each new session's
    `base_url` and key with `with_options`, as an agent that runs many episodes would."""
    common = {"api_key": "none", "max_retries": 0, "timeout": soak.timeout}
    clients = {"openai": openai.AsyncOpenAI(**common), "anthropic": anthropic.AsyncAnthropic(**common)}
    try:
        for number in itertools.count(1):
            if not soak.running():
                return
            task = f"agent-{worker}-{number}"
            created = await soak.control("session", "POST", "/sessions", {"task_id": task, "group_id": task})
            if created is None:
                await asyncio.sleep(1)
                continue
            api = rng.choice(("chat", "responses", "messages"))
            if api == "messages":  # anthropic adds /v1 itself
                base = clients["anthropic"], created["base_url"].removesuffix("/v1")
            else:
                base = clients["openai"], created["base_url"]
            client = base[0].with_options(base_url=base[1], api_key=created["api_key"])
            answered = await episode(soak, api, client, rng.randint(1, 3), rng)
            await end_episode(soak, created["session_id"], answered, rng)
    finally:
        for client in clients.values():
            await client.close()


async def end_episode(soak: Soak, session_id: str, answered: int, rng: random.Random) -> None:
    """Finish with a reward if any turn was answered, else fail; retried through an outage."""
    kind, body = ("finish", {"reward": round(rng.random(), 3)}) if answered else ("fail", {"reason": "soak"})
    for _ in range(20):
        if await soak.control(kind, "POST", f"/sessions/{session_id}/{kind}", body) is not None:
            return
        await asyncio.sleep(2)


# -- a hostile client and clients that hang up ----------------------------------------------
async def hostile(soak: Soak, session_key: str, rng: random.Random) -> None:
    """The hostile-input table's cases, one at a time in random order, until the time is up."""
    async with httpx.AsyncClient(timeout=soak.timeout, trust_env=False) as client:
        while soak.running():
            case = rng.choice(CASES)
            await send_case(soak, client, case, session_key)
            await asyncio.sleep(rng.uniform(0.2, 0.8))


async def send_case(soak: Soak, client: httpx.AsyncClient, case: Case, session_key: str) -> None:
    key = {TABLE_ADMIN: soak.admin, "SESSION": session_key}.get(case.key, case.key)
    headers = [(k.encode(), v.encode("latin-1")) for k, v in (case.headers or {}).items()]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    content = case.body if isinstance(case.body, bytes) else None if case.body is None else orjson.dumps(case.body)
    start = soak.now()
    try:
        r = await client.send(client.build_request(case.method, soak.url + case.path, content=content, headers=headers))
        outcome, detail = str(r.status_code), r.text
    except httpx.TransportError as exc:
        outcome, detail = failure(exc), repr(exc)
    soak.record("hostile", start, outcome, detail, case=case.name, expected=case.status)


STORY = [{"role": "user", "content": "Tell me a story."}]
HANGUP_BODIES = {  # the path under /v1 → a body
    "chat/completions": {"model": MODEL, "messages": STORY, "max_tokens": 16},
    "responses": {"model": MODEL, "input": STORY, "max_output_tokens": 16},
    "messages": {"model": MODEL, "messages": STORY, "max_tokens": 16},
}


async def hang_up(soak: Soak, rng: random.Random) -> None:
    """One raw-socket client that closes mid-request, mid-generation or mid-stream (half with a reset)."""
    mode = rng.choice(("mid-request", "mid-generation", "mid-stream"))
    api = rng.choice(tuple(HANGUP_BODIES))
    body = orjson.dumps({**HANGUP_BODIES[api], "stream": mode == "mid-stream"})
    host, port = soak.url.removeprefix("http://").split(":")
    head = (
        f"POST {soak.hangup_path}/{api} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {soak.hangup_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    start, outcome, writer = soak.now(), "hung-up", None
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + (body[: len(body) // 2] if mode == "mid-request" else body))
        await writer.drain()
        if mode != "mid-stream":
            await asyncio.sleep(rng.uniform(0, 0.5) if mode == "mid-request" else rng.uniform(0.05, 1.0))
        else:
            status = (await asyncio.wait_for(reader.readline(), soak.timeout)).split()
            outcome = status[1].decode() if len(status) > 1 else "transport"
            if outcome == "200":  # a stream: read into its first tokens, then go
                outcome = "hung-up"
                with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError):
                    await asyncio.wait_for(reader.readuntil(b"delta"), 30)
    except (TimeoutError, OSError) as exc:
        outcome = failure(exc)
    finally:
        if writer is not None and rng.random() < 0.5:
            writer.transport.abort()
        elif writer is not None:
            writer.close()
    soak.record(f"hangup-{mode}", start, outcome)


async def hangups(soak: Soak, rng: random.Random) -> None:
    while soak.running():
        await hang_up(soak, rng)
        await asyncio.sleep(rng.uniform(1, 3))


# -- faults and memory ----------------------------------------------------------------------
async def faults(soak: Soak, kinds: list[str], gap: float, rng: random.Random) -> None:
    """One fault every `gap` seconds, rotating through `kinds`; none that would outlast the traffic."""
    for i in itertools.count():
        if soak.stop_at - time.monotonic() < gap + 15:
            return
        await asyncio.sleep(gap)
        kind, start = kinds[i % len(kinds)], soak.now()
        soak.log(f"fault {kind} begins")
        note = await inject(soak, kind, rng)
        soak.faults.append(Fault(kind, round(start, 3), round(soak.now(), 3), note))
        soak.log(f"fault {kind} ends: {note}")


async def inject(soak: Soak, kind: str, rng: random.Random) -> str:
    if kind in ("store-down", "store-partition"):
        await asyncio.to_thread(soak.relay.down if kind == "store-down" else soak.relay.partition)
        seconds = rng.uniform(5, 10)
        await asyncio.sleep(seconds)
        await asyncio.to_thread(soak.relay.restore)
        return f"store out for {seconds:.1f} s, then restored"
    if kind == "engine-fault":
        before = await engine_restarts(soak)
        r = await soak.http.post(soak.url + "/debug/engine-fault", headers=soak.auth())
        if r.status_code != 200:
            return f"refused: {r.status_code} {r.text[:200]}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the engine has restarted and serves again
            await asyncio.sleep(0.2)
            if (await engine_restarts(soak)) > before:
                return "engine failed its next step and restarted"
        return "the engine did not report a restart within 60 s"
    burst = rng.randint(20, 40)
    await asyncio.gather(*(hang_up(soak, rng) for _ in range(burst)))
    return f"{burst} clients hung up at once"


async def engine_restarts(soak: Soak) -> int:
    """The engine's restart count from /health (-1 while it answers 503)."""
    with contextlib.suppress(httpx.HTTPError):
        r = await soak.http.get(soak.url + "/health", timeout=10)
        if r.status_code == 200:
            return r.json()["engine"]["restarts"]
    return -1


def rss_mib(pid: int) -> float:
    """The resident memory of the server and its children (0 once it is gone)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        proc = psutil.Process(pid)
        return round(sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20, 1)
    return 0.0


async def sample_rss(soak: Soak, pid: int, series: list[tuple[float, float]], every: float = 5.0) -> None:
    while True:
        series.append((round(soak.now(), 1), rss_mib(pid)))
        await asyncio.sleep(every)


# -- the run --------------------------------------------------------------------------------
async def traffic(args: argparse.Namespace, url: str, admin: str, relay: Relay, pid: int) -> tuple[Soak, list]:
    """Every client and the faults for `--minutes`; then the calls in flight, and the RSS once idle."""
    soak = Soak(url, admin, relay, args.minutes * 60, args.request_timeout)
    rng = random.Random(args.seed)
    rss: list[tuple[float, float]] = []
    hostile_session = await soak.control("session", "POST", "/sessions", {"task_id": "hostile"})
    hangup_session = await soak.control("session", "POST", "/sessions", {"task_id": "hangups"})
    assert hostile_session and hangup_session, "could not create the soak's sessions"
    soak.hangup_path = f"/sessions/{hangup_session['session_id']}/v1"
    soak.hangup_key = hangup_session["api_key"]
    gap = args.fault_gap if args.fault_gap is not None else min(30.0, args.minutes * 60 / 8)
    background = [
        asyncio.create_task(sample_rss(soak, pid, rss)),
        asyncio.create_task(faults(soak, args.faults, gap, rng)),
    ]
    workers = [asyncio.create_task(agent(soak, i, random.Random(rng.random()))) for i in range(args.clients)]
    workers.append(asyncio.create_task(hostile(soak, hostile_session["api_key"], random.Random(rng.random()))))
    workers.append(asyncio.create_task(hangups(soak, random.Random(rng.random()))))
    soak.log(f"traffic: {args.clients} agents, a hostile client, hang-ups; a fault every {gap:.0f} s")
    await background[1]  # the faults end before the traffic does
    await asyncio.sleep(max(0.0, soak.stop_at - time.monotonic()))
    soak.log("time is up: waiting for the calls in flight")
    _, stuck = await asyncio.wait(workers, timeout=args.request_timeout + 60)
    for session in (hostile_session, hangup_session):
        await soak.control("fail", "POST", f"/sessions/{session['session_id']}/fail", {"reason": "soak over"})
    for task in stuck:
        task.cancel()
    for task in workers:
        if task.done() and not task.cancelled() and task.exception():
            raise task.exception()
    background[0].cancel()
    rss.append((round(soak.now(), 1), rss_mib(pid)))
    await asyncio.sleep(args.idle_s)  # the engine hands freed memory back once idle (engine.idle_release_s)
    soak.rss_idle = rss_mib(pid)
    soak.stuck_workers = len(stuck)
    await soak.http.aclose()
    return soak, rss


def store_check(db_url: str, acked: dict[str, str]) -> dict[str, Any]:
    """Read the database directly (not through the relay): which acknowledged ids are missing."""
    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(completions.c.response_id, completions.c.api, sessions.c.task_id).join(
                sessions, sessions.c.id == completions.c.session_id
            )
        ).all()
        stored = Counter(r.response_id for r in rows)
        by_status = dict(conn.execute(select(sessions.c.status, func.count()).group_by(sessions.c.status)).all())
    engine.dispose()
    missing = sorted(i for i in acked if i not in stored)
    return {
        "acknowledged": len(acked),
        "lost": len(missing),
        "lost_ids": [f"{i} ({acked[i]})" for i in missing[:50]],
        "stored": sum(stored.values()),
        "stored_not_acknowledged": sum(1 for i in stored if i not in acked),
        "stored_not_acknowledged_by": dict(  # which clients and APIs those came from
            Counter(f"{(r.task_id or 'auto').split('-')[0]} {r.api}" for r in rows if r.response_id not in acked)
        ),
        "stored_more_than_once": sum(1 for n in stored.values() if n > 1),
        "sessions_by_status": by_status,
    }


# -- the report -----------------------------------------------------------------------------
EXCUSED = ("503", "stream-error")
"""What a fault may excuse: the documented 503, or a stream's error event; never a 500 or a cut stream."""


def classify(soak: Soak, grace: float) -> dict[str, list[Call]]:
    """Every failed call by cause: expected under a fault, a server error, a 5xx to a hostile request."""
    out: dict[str, list[Call]] = {"expected": [], "server_errors": [], "hostile_5xx": [], "500s": []}
    for call in soak.calls:
        if call.outcome == "500":
            out["500s"].append(call)
        if not call.failed_5xx():
            continue
        excused = call.outcome in EXCUSED and any(f.excuses(call, grace) for f in soak.faults)
        out["expected" if excused else "server_errors"].append(call)
        if call.kind == "hostile" and not excused:
            out["hostile_5xx"].append(call)
    return out


def server_log_errors(log: Path) -> dict[str, Any]:
    """What the server logged at ERROR, by logger and message (numbers as N), and its first unhandled error."""
    lines = log.read_text(errors="replace").splitlines()
    logged = Counter()
    for line in lines:
        if found := re.match(r"\S+ \S+ (?:ERROR|CRITICAL) (\S+) (.*)", line):
            logged[found[1] + " " + re.sub(r"\d+", "N", found[2])[:100]] += 1
    first = next((i for i, line in enumerate(lines) if "unhandled error" in line), None)
    return {
        "errors_logged": dict(logged.most_common()),
        "unhandled_errors": sum(n for k, n in logged.items() if "unhandled error" in k),
        "first_unhandled": "\n".join(lines[first : first + 40]) if first is not None else "",
    }


def summarize(args: argparse.Namespace, soak: Soak, rss: list, store: dict, healthy: bool, log: Path) -> dict:
    causes = classify(soak, args.grace)
    hostile = [c for c in soak.calls if c.kind == "hostile" and c not in causes["expected"]]
    mismatched = Counter(f"{c.case}: {c.expected} -> {c.outcome}" for c in hostile if c.outcome != str(c.expected))
    server_log = server_log_errors(log)
    peak = max(m for _, m in rss)
    kinds = sorted({c.kind for c in soak.calls})
    return {
        "requests": len(soak.calls),
        "by_kind": {k: dict(Counter(c.outcome for c in soak.calls if c.kind == k)) for k in kinds},
        "statuses": dict(Counter(c.outcome for c in soak.calls).most_common()),
        "faults": [asdict(f) for f in soak.faults],
        "must_be_zero": {
            "acknowledged completions lost": store["lost"],
            "server errors caused by client mistakes (5xx to a hostile request)": len(causes["hostile_5xx"]),
            "unexpected 500s": len(causes["500s"]),
        },
        "figures": {
            "completions acknowledged to a client": store["acknowledged"],
            f"5xx expected under a fault (503 or a stream's error event, within {args.grace:g} s)": len(
                causes["expected"]
            ),
            "other server errors (5xx outside a fault)": len(causes["server_errors"]),
            "hostile requests answered other than the table's status": sum(mismatched.values()),
            "client timeouts (hangs); workers stuck at the end": f"{failed(soak, 'timeout')}; {soak.stuck_workers}",
            "calls whose connection failed": failed(soak, "transport"),
            "stored completions; stored but never acknowledged (by whom)": (
                f"{store['stored']}; {store['stored_not_acknowledged']} {store['stored_not_acknowledged_by'] or ''}"
            ),
            "sessions by status": ", ".join(f"{k} {v}" for k, v in sorted(store["sessions_by_status"].items())),
            "server RSS MiB: start / peak / end / idle after": (
                f"{rss[0][1]:,.0f} / {peak:,.0f} / {rss[-1][1]:,.0f} / {soak.rss_idle:,.0f}"
            ),
            "server RSS MiB each minute": " ".join(f"{m:,.0f}" for _, m in rss[::12]),
            "server healthy at the end": healthy,
            **{f"server log: {k}": n for k, n in server_log["errors_logged"].items()},
        },
        "server_errors_outside_faults": [asdict(c) for c in causes["server_errors"]],
        "hostile_status_mismatches": dict(mismatched),
        "lost_ids": store["lost_ids"],
        "rss_mib": rss,
        "server_log": {"path": str(log), **server_log},
    }


def failed(soak: Soak, outcome: str) -> int:
    return sum(c.outcome == outcome for c in soak.calls)


def render(s: dict, args: argparse.Namespace) -> str:
    outcomes = sorted(s["statuses"], key=lambda o: (not o[0].isdigit(), o))
    lines = [f"## Soak: {args.minutes:g} min, {args.clients} agents, {s['requests']:,} requests", ""]
    lines += [f"| kind | {' | '.join(outcomes)} |", "|---|" + "---:|" * len(outcomes)]
    for kind, counts in [*s["by_kind"].items(), ("all", s["statuses"])]:
        lines.append(f"| {kind} | " + " | ".join(f"{counts.get(o, 0):,}" for o in outcomes) + " |")
    lines += ["", "| t (s) | fault | lasted (s) | what |", "|---:|---|---:|---|"]
    lines += [f"| {f['start']:.0f} | {f['kind']} | {f['end'] - f['start']:.1f} | {f['note']} |" for f in s["faults"]]
    lines += ["", "| figure | value |", "|---|---:|"]
    lines += [f"| **{k}** | **{v}** |" for k, v in s["must_be_zero"].items()]
    lines += [f"| {k} | {v} |" for k, v in s["figures"].items()]
    return "\n".join(lines)


def fault_list(text: str) -> list[str]:
    kinds = text.split(",")
    if unknown := set(kinds) - set(FAULTS):
        raise argparse.ArgumentTypeError(f"unknown fault {', '.join(sorted(unknown))}; choose from {', '.join(FAULTS)}")
    return kinds


def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="areal-soak-"))
    log = tmp / "serve.log"
    admin = "soak-" + secrets.token_hex(16)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"server log: {log}", flush=True)
    with fresh_pg_database() as db_url, Relay(db_url) as relay:
        argv = [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), "--db", relay.url]
        argv += ["--admin-key", admin, "--set", "proxy.fault_injection=true"]
        for override in args.set:
            argv += ["--set", override]
        proc = start_process(argv, log, cwd=tmp, env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
        healthy = False
        try:
            wait_healthy(url, proc, timeout=300, log_path=log)
            soak, rss = asyncio.run(traffic(args, url, admin, relay, proc.pid))
            with contextlib.suppress(httpx.HTTPError):
                healthy = httpx.get(url + "/health", timeout=30).status_code == 200
        finally:
            exit_code = stop_process(proc, 30)
        store = store_check(db_url, soak.acked)
    summary = {"args": vars(args), **summarize(args, soak, rss, store, healthy, log), "server_exit": exit_code}
    out = Path(args.out or tmp / "soak.json")
    out.write_text(json.dumps(summary, indent=2))
    print(render(summary, args))
    print(f"\nsummary: {out}\nserver log: {log}")
    return 1 if any(summary["must_be_zero"].values()) or not healthy else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the traffic runs")
    parser.add_argument("--clients", type=int, default=8, help="concurrent agents (each in its own sessions)")
    parser.add_argument(
        "--fault-gap", type=float, default=None, help="seconds between faults (default: min(30, run/8))"
    )
    parser.add_argument(
        "--grace", type=float, default=10.0, help="seconds after a fault ends during which a 503 is still expected"
    )
    parser.add_argument(
        "--faults",
        type=fault_list,
        default=list(FAULTS),
        help=f"the faults to rotate through, comma-separated (default: {','.join(FAULTS)})",
    )
    parser.add_argument("--idle-s", type=float, default=15.0, help="idle seconds after the traffic before the last RSS")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="client timeout of one call (a hang)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the traffic and fault schedule")
    parser.add_argument("--set", action="append", default=[], help="extra `serve --set` override (repeatable)")
    parser.add_argument("--out", default=None, help="where to write the JSON summary (default: beside the log)")
    sys.exit(main(parser.parse_args()))
