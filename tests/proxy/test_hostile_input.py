# ruff: noqa: E501 - one case a line reads better than wrapped tables
"""A hostile client, table-driven: absurd numbers, wrong types, deep nesting, huge strings, bad
encodings and bad keys, against every route of the proxy (with an admin key, on SQLite and
PostgreSQL) and of the `areal-proxy engine` server. Each case answers its documented 4xx in its
API's shape; afterwards the engine still serves, nothing was logged as unhandled, and the store
holds no row from any refused request.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import Server, fresh_pg_database, run_server, store_counts
from tests.engines.conftest import EngineProcess, run_engine

ADMIN = "admin-key-for-hostile-tests"
USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict:
    return {"model": "m", "messages": USER, "max_tokens": 2, **fields}


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


@dataclass
class Case:
    name: str
    method: str
    path: str
    body: Any = None  # a JSON value, or raw bytes sent as they are
    status: int = 400
    param: str | None = None
    key: str | None = ADMIN  # the bearer key sent; "SESSION": a fresh session's own key
    shape: str = "openai"  # openai | anthropic
    headers: dict[str, str] | None = None


CASES = [
    # -- numbers out of any engine's range ------------------------------------------------
    Case("top_k-2**63", "POST", "/v1/chat/completions", chat(top_k=2**63), param="top_k"),
    Case("seed-2**64", "POST", "/v1/chat/completions", chat(seed=2**64 - 1), param="seed"),
    Case("temperature-huge", "POST", "/v1/chat/completions", chat(temperature=1e300), param="temperature"),
    Case("temperature-inf", "POST", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"x"}],"temperature":1e999}'),
    Case("temperature-NaN", "POST", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"x"}],"temperature":NaN}'),
    Case("n-10**9", "POST", "/v1/chat/completions", chat(n=10**9), param="n"),
    Case("n-over-max_n", "POST", "/v1/chat/completions", chat(n=64), param="n"),
    Case("max_tokens-2**40", "POST", "/v1/chat/completions", chat(max_tokens=2**40), param="max_tokens"),
    Case("top_logprobs-negative", "POST", "/v1/chat/completions", chat(logprobs=True, top_logprobs=-1), param="top_logprobs"),
    Case("int-5000-digits", "POST", "/v1/chat/completions", b'{"messages":[],"max_tokens":' + b"9" * 5000 + b"}"),
    # -- wrong types ---------------------------------------------------------------------
    Case("messages-object", "POST", "/v1/chat/completions", chat(messages={"role": "user"}), param="messages"),
    Case("role-null", "POST", "/v1/chat/completions", chat(messages=[{"role": None, "content": "x"}]), param="messages[0].role"),
    Case("stream-string", "POST", "/v1/chat/completions", chat(stream="true"), param="stream"),
    Case("max_tokens-float", "POST", "/v1/chat/completions", chat(max_tokens=2.5), param="max_tokens"),
    Case("seed-bool", "POST", "/v1/chat/completions", chat(seed=True), param="seed"),
    Case("image-part", "POST", "/v1/chat/completions", chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), param="messages[0].content[0].type"),
    # -- nesting, sizes ------------------------------------------------------------------
    Case("tool-schema-100-deep", "POST", "/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": deep(100)}}]), param="tools[0].function.parameters"),
    Case("tool-arguments-100-deep", "POST", "/v1/chat/completions", chat(messages=[*USER, {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": deep(100)}}]}]), param="messages[1].tool_calls[0].function.arguments"),
    Case("json-3000-deep", "POST", "/v1/chat/completions", b'{"metadata":' + b"[" * 3000 + b"]" * 3000 + b"}"),
    Case("20000-messages", "POST", "/v1/chat/completions", chat(messages=USER * 20_000), param="messages"),
    Case("300-tools", "POST", "/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f"}}] * 300), param="tools"),
    Case("stop-5000-chars", "POST", "/v1/chat/completions", chat(stop=["x" * 5000]), param="stop[0]"),
    Case("model-10k-chars", "POST", "/v1/chat/completions", chat(model="m" * 10_000), param="model"),
    Case("tool-name-with-spaces", "POST", "/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "rm -rf"}}]), param="tools[0].function.name"),
    # -- encodings -----------------------------------------------------------------------
    Case("lone-surrogate", "POST", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"a\\ud800b"}]}'),
    Case("invalid-utf8", "POST", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"\xff\xfe"}]}'),
    Case("truncated-json", "POST", "/v1/chat/completions", b'{"messages":[{"role":"us'),
    # -- keys ----------------------------------------------------------------------------
    Case("no-key", "POST", "/v1/chat/completions", chat(), status=401, key=None),
    Case("wrong-key", "POST", "/v1/chat/completions", chat(), status=401, key="sk-wrong"),
    Case("non-ascii-key", "POST", "/v1/chat/completions", chat(), status=401, key=None, headers={"authorization": "Bearer ÿé"}),
    Case("control-with-session-key", "POST", "/sessions", {}, status=403, key="SESSION"),
    Case("weights-with-session-key", "POST", "/weights", {"path": "/x", "version": 1}, status=403, key="SESSION"),
    Case("list-with-session-key", "GET", "/sessions", status=403, key="SESSION"),
    # -- control bodies and queries ------------------------------------------------------
    Case("sessions-count-0", "POST", "/sessions", {"count": 0}, param="count"),
    Case("sessions-count-5000", "POST", "/sessions", {"count": 5000}, param="count"),
    Case("sessions-seed-negative", "POST", "/sessions", {"seed": -1}, param="seed"),
    Case("sessions-metadata-deep", "POST", "/sessions", {"metadata": deep(50)}, param="metadata"),
    Case("sessions-task-10k", "POST", "/sessions", {"task_id": "t" * 10_000}, param="task_id"),
    Case("sessions-reference-object", "POST", "/sessions", {"reference": {"a": 1}}, param="reference"),
    Case("reward-string", "POST", "/sessions/sess_x/reward", {"reward": "1"}, param="reward"),
    Case("reward-huge", "POST", "/sessions/sess_x/reward", {"reward": 1e300}, param="reward"),
    Case("finish-unknown-fn", "POST", "/sessions/sess_x/finish", {"reward_fn": "x" * 5000}, param="reward_fn"),
    Case("fail-reason-object", "POST", "/sessions/sess_x/fail", {"reason": {"a": 1}}, param="reason"),
    Case("weights-version-2**60", "POST", "/weights", {"path": "/x", "version": 2**60}, param="version"),
    Case("weights-path-empty", "POST", "/weights", {"path": "", "version": 1}, param="path"),
    Case("list-limit-0", "GET", "/sessions?limit=0", param="limit"),
    Case("list-limit-text", "GET", "/sessions?limit=ten", param="limit"),
    Case("list-offset-negative", "GET", "/sessions?offset=-1", param="offset"),
    Case("list-status-bogus", "GET", "/sessions?status=bogus", param="status"),
    # -- the Responses API ---------------------------------------------------------------
    Case("responses-image-item", "POST", "/v1/responses", {"input": [{"type": "input_image"}]}, param="input[0].type"),
    Case("responses-web-search", "POST", "/v1/responses", {"input": "hi", "tools": [{"type": "web_search"}]}, param="tools[0].type"),
    Case("responses-max-output-0", "POST", "/v1/responses", {"input": "hi", "max_output_tokens": 0}, param="max_output_tokens"),
    Case("responses-temperature-text", "POST", "/v1/responses", {"input": "hi", "temperature": "hot"}, param="temperature"),
    # -- the Messages API (Anthropic's shape) --------------------------------------------
    Case("messages-no-max-tokens", "POST", "/v1/messages", {"messages": USER}, shape="anthropic"),
    Case("messages-temperature-1.5", "POST", "/v1/messages", {"max_tokens": 2, "messages": USER, "temperature": 1.5}, shape="anthropic"),
    Case("messages-image-block", "POST", "/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, shape="anthropic"),
    Case("messages-21-stops", "POST", "/v1/messages", {"max_tokens": 2, "messages": USER, "stop_sequences": ["x"] * 21}, shape="anthropic"),
    Case("messages-non-ascii-key", "POST", "/v1/messages", {"max_tokens": 2, "messages": USER}, status=401, key=None, shape="anthropic", headers={"x-api-key": "clé"}),
    # -- the legacy Completions API and Anthropic's token count ---------------------------
    Case("completions-no-prompt", "POST", "/v1/completions", {"model": "m", "max_tokens": 2}, param="prompt"),
    Case("completions-empty-prompt", "POST", "/v1/completions", {"prompt": ""}, param="prompt"),
    Case("completions-batch", "POST", "/v1/completions", {"prompt": ["a", "b"]}, param="prompt"),
    Case("completions-prompt-object", "POST", "/v1/completions", {"prompt": {"text": "hi"}}, param="prompt"),
    Case("completions-id-2**40", "POST", "/v1/completions", {"prompt": [1, 2**40]}, param="prompt[1]"),
    Case("completions-id-out-of-vocab", "POST", "/v1/completions", {"prompt": [2**31 - 1]}, param="prompt"),
    Case("completions-n-over-max_n", "POST", "/v1/completions", {"prompt": "hi", "n": 64}, param="n"),
    Case("completions-max_tokens-beyond-context", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, status=422, param="max_tokens"),
    Case("completions-logprobs-bool", "POST", "/v1/completions", {"prompt": "hi", "logprobs": True}, param="logprobs"),
    Case("completions-echo-logprobs", "POST", "/v1/completions", {"prompt": "hi", "echo": True, "logprobs": 1}, param="echo"),
    Case("count-tokens-no-messages", "POST", "/v1/messages/count_tokens", {"model": "m"}, shape="anthropic"),
    Case("count-tokens-image-block", "POST", "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [{"type": "image"}]}]}, shape="anthropic"),
]  # fmt: skip


def send(server: Server, case: Case, session_key: str) -> httpx.Response:
    headers = dict(case.headers or {})
    key = session_key if case.key == "SESSION" else case.key
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    raw = [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]  # non-ASCII keys as a client sends them
    content = case.body if isinstance(case.body, bytes) else None if case.body is None else orjson.dumps(case.body)
    request = httpx.Request(case.method, server.url + case.path, content=content, headers=raw)
    with httpx.Client(timeout=120) as client:
        return client.send(request)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def locked(request, tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp(f"hostile-{request.param}")
    if request.param == "sqlite":
        with run_server(tmp, f"sqlite:///{tmp}/areal.db", admin_key=ADMIN) as server:
            yield server
    else:
        with fresh_pg_database() as url, run_server(tmp, url, admin_key=ADMIN) as server:
            yield server


def test_every_hostile_request_gets_its_4xx_and_changes_nothing(locked):
    session_key = locked.new_session()["api_key"]
    before = store_counts(locked.db_url)
    failures = []
    for case in CASES:
        r = send(locked, case, session_key)
        problem = None
        try:
            payload = r.json()
        except ValueError:
            payload = None
        if r.status_code != case.status:
            problem = f"status {r.status_code}"
        elif case.shape == "anthropic":
            if not (payload and payload.get("type") == "error" and payload["error"]["message"]):
                problem = "not Anthropic's error shape"
        elif not (payload and set(payload.get("error", {})) == {"message", "type", "param", "code"}):
            problem = "not OpenAI's error shape"
        elif case.param is not None and payload["error"]["param"] != case.param:
            problem = f"param {payload['error']['param']!r}, expected {case.param!r}"
        if problem:
            failures.append(f"{case.name}: {problem}: {r.text[:300]}")
    assert not failures, "\n".join(failures)
    assert store_counts(locked.db_url) == before, "a refused request wrote to the store"
    log = locked.log.read_text()
    assert "unhandled error" not in log and "Traceback" not in log, log[-3000:]
    # and the engine serves as before, text with a NUL character included (valid JSON, valid Unicode)
    nul = chat(messages=[{"role": "user", "content": "a\u0000b"}])
    ok = httpx.post(
        locked.base_url + "/chat/completions", json=nul, headers={"authorization": f"Bearer {ADMIN}"}, timeout=120
    )
    assert ok.status_code == 200, ok.text
    assert locked.get("/health").json()["engine"]["restarts"] == 0


PROMPT = [1, 9690, 198, 2683, 314, 260]

ENGINE_CASES = [
    ("top_k-2**63", {"input_ids": PROMPT, "sampling_params": {"top_k": 2**63}}),
    ("top_k-0", {"input_ids": PROMPT, "sampling_params": {"top_k": 0}}),
    ("seed-2**70", b'{"input_ids":[1,2],"sampling_params":{"sampling_seed":' + str(2**70).encode() + b"}}"),
    ("temperature-negative", {"input_ids": PROMPT, "sampling_params": {"temperature": -1}}),
    ("id-outside-vocabulary", {"input_ids": [2**30]}),
    ("id-negative", {"input_ids": [-5]}),
    ("ids-not-ints", {"input_ids": ["a", "b"]}),
    ("empty-ids", {"input_ids": []}),
    ("both-text-and-ids", {"input_ids": PROMPT, "text": "x"}),
    ("unknown-sampling-field", {"input_ids": PROMPT, "sampling_params": {"frobnicate": 1}}),
    ("penalty-not-neutral", {"input_ids": PROMPT, "sampling_params": {"presence_penalty": 1.0}}),
    ("stop-5000-chars", {"input_ids": PROMPT, "sampling_params": {"stop": "x" * 5000}}),
    ("top_logprobs_num-1000", {"input_ids": PROMPT, "top_logprobs_num": 1000}),
    ("image-data", {"input_ids": PROMPT, "image_data": "http://x"}),
    ("lone-surrogate", b'{"text":"\\ud800"}'),
    ("not-json", b"{nope"),
]


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory) -> Iterator[EngineProcess]:
    with run_engine(tmp_path_factory.mktemp("hostile-engine")) as process:
        yield process


def test_the_engine_server_refuses_hostile_requests_and_keeps_serving(engine_server):
    failures = []
    for name, body in ENGINE_CASES:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        r = httpx.post(engine_server.url + "/generate", content=content, timeout=60)
        error = r.json().get("error") if r.headers.get("content-type", "").startswith("application/json") else None
        if r.status_code != 400 or not (error and error.get("code") == 400 and error.get("message")):
            failures.append(f"{name}: {r.status_code} {r.text[:300]}")
    for path, body in [("/update_weights_from_disk", {"model_path": ""}), ("/pause_generation", {"mode": "explode"})]:
        r = httpx.post(engine_server.url + path, json=body, timeout=60)
        if r.status_code != 400:
            failures.append(f"{path}: {r.status_code} {r.text[:300]}")
    assert not failures, "\n".join(failures)
    ok = engine_server.post(
        "/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
    )
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 3
    assert engine_server.stats()["restarts"] == 0


@pytest.mark.parametrize("levels", [1, 31, 32, 33, 100])
def test_nesting_is_counted_to_the_limit_exactly(levels):
    """A schema or value nested exactly `MAX_JSON_DEPTH` levels passes and one more is refused, however
    the levels mix objects and lists and wherever the deepest branch sits among shallow ones."""
    from pydantic import TypeAdapter, ValidationError

    from proxy.schemas.common import MAX_JSON_DEPTH, JsonValue

    value: Any = "leaf"
    for i in range(levels - 1):  # a container a level, its shallow siblings no deeper than the chain below
        if i == 0:
            value = ["shallow", value]
        else:
            value = [1, {"x": 2}, value] if i % 2 else {"shallow": [3], "deep": value, "z": {}}
    value = {"top": value} if levels > 1 else {"top": 0}
    adapter = TypeAdapter(JsonValue)
    if levels <= MAX_JSON_DEPTH:
        assert adapter.validate_python(value) == value
    else:
        with pytest.raises(ValidationError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
            adapter.validate_python(value)
