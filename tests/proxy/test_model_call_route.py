"""The model-call routes skip FastAPI's request handler (`ModelCallRoute`) and its route matching
(`ModelCallTable`); they must answer every body exactly as FastAPI's handler with the same
dependencies does. One app serves the same endpoint both ways (uvicorn on a free port), for each
client API's body model, and every answer is compared: status, headers that matter, body. The
services are a stand-in whose readiness the test switches, so the order of checks (body parsed,
services, body validated) is compared too."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from proxy.app import BodyLimit, ProxyApp, install_error_handlers
from proxy.errors import engine_unavailable
from proxy.routes.common import JsonRoute, json_response
from proxy.routes.deps import CallerDep, Completions, ModelCallRoute, ModelCallTable, State
from proxy.schemas.chat import ChatCompletionRequest
from proxy.schemas.completions import CompletionRequest
from proxy.schemas.messages import MessagesRequest
from proxy.schemas.responses import ResponsesRequest
from tests.conftest import serve_app

MODELS = {
    "chat/completions": ChatCompletionRequest,
    "responses": ResponsesRequest,
    "messages": MessagesRequest,
    "completions": CompletionRequest,
}


@dataclass
class Services:
    """What the routes' dependencies read from the app's state."""

    ready: bool = True
    completions: object = field(default_factory=object)

    def require_ready(self) -> None:
        if not self.ready:
            raise engine_unavailable("the model is loading")


def _endpoint(model: type) -> Any:
    async def endpoint(
        request: Request, body: Any, caller: CallerDep, completions: Completions, state: State
    ) -> Response:
        if getattr(body, "model", None) == "boom":
            raise RuntimeError("a bug in the endpoint")
        return json_response(
            {
                "body": body.model_dump(mode="json", exclude_unset=True),
                "session": caller.path_session,
                "token": caller.token,
                "episode": caller.episode,
                "services": completions is state.completions,
            }
        )

    endpoint.__annotations__["body"] = model  # a local name: not resolvable from the annotation's text
    return endpoint


class CountingTable(ModelCallTable):
    """The table, counting the routes it finds (every lean call must be found by it)."""

    handled = 0

    def find(self, path: str) -> Any:
        route, params = super().find(path)
        CountingTable.handled += route is not None
        return route, params


def _app(services: Services, lane: bool) -> FastAPI:
    app = ProxyApp(docs_url=None, redoc_url=None)
    app.state.areal = services
    install_error_handlers(app)
    lean = []
    for name, model in MODELS.items():
        for kind, route_class in (("fastapi", JsonRoute), ("lean", ModelCallRoute)):
            router = APIRouter(route_class=route_class)
            for path in (f"/{kind}/v1/{name}", f"/{kind}/sessions/{{session_id}}/v1/{name}"):
                router.add_api_route(path, _endpoint(model), methods=["POST"])
            app.include_router(router)
            if kind == "lean":
                lean.extend(router.routes)
    table = CountingTable(lean)
    app.router.routes.insert(0, table)  # as `create_app` puts it
    app.add_middleware(BodyLimit, limit=4096)
    if lane:
        app.open_lane(table, 4096)
    return app


@pytest.fixture(scope="module", params=["lane", "route-table"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Services, bool]]:
    """The app as `create_app` makes it (model calls in the lane past FastAPI), and with the table
    only in FastAPI's route table (the way a call takes under a mounted root path)."""
    services = Services()
    lane = request.param == "lane"
    with serve_app(_app(services, lane)) as url:
        yield url, services, lane


BODIES: list[tuple[str, bytes, dict[str, str]]] = [
    ("empty", b"", {}),
    ("null", b"null", {}),
    ("truncated JSON", b'{"model": "m", "messages": [', {}),
    ("NaN", b'{"model": NaN}', {}),
    ("lone surrogate", b'{"model": "\\ud800"}', {}),
    ("a list", b"[1, 2]", {}),
    ("a string", b'"hello"', {}),
    ("an empty object", b"{}", {}),
    ("wrong types", b'{"model": 5, "messages": "hi", "max_tokens": "x", "prompt": 3, "input": 4}', {}),
    ("unknown field", b'{"model": "m", "messages": [], "frobnicate": true}', {}),
    ("form content type", b'{"model": "m"}', {"content-type": "application/x-www-form-urlencoded"}),
    ("too large", b'{"model": "' + b"x" * 5000 + b'"}', {}),
    (
        "valid chat",
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}',
        {"authorization": "Bearer key-1", "x-areal-episode": "ep-7"},
    ),
    ("valid responses", b'{"model": "m", "input": "hi", "max_output_tokens": 16}', {}),
    ("valid messages", b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}', {}),
    ("valid completion", b'{"model": "m", "prompt": "Once upon", "max_tokens": 4}', {}),
]


def _answer(response: httpx.Response) -> tuple[int, str | None, str | None, Any]:
    headers = response.headers
    return response.status_code, headers.get("content-type"), headers.get("retry-after"), response.json()


@pytest.mark.parametrize("ready", [True, False], ids=["ready", "loading"])
@pytest.mark.parametrize("api", list(MODELS))
def test_model_call_route_answers_as_fastapi(served: tuple[str, Services, bool], api: str, ready: bool) -> None:
    url, services, lane = served
    services.ready = ready
    statuses = set()
    handled = CountingTable.handled
    with httpx.Client(timeout=30) as client:
        for label, content, headers in BODIES:
            for prefix in ("", "/sessions/s-1"):
                expected = client.post(f"{url}/fastapi{prefix}/v1/{api}", content=content, headers=headers)
                got = client.post(f"{url}/lean{prefix}/v1/{api}", content=content, headers=headers)
                assert _answer(got) == _answer(expected), f"{api} {label} {prefix or '/'}"
                statuses.add(expected.status_code)
    # The bodies reach every outcome: valid, refused, too large, and the 503 while loading.
    assert statuses == ({200, 400, 413} if ready else {400, 413, 503})
    # Every lean call was found by the table; in FastAPI's route table, not those its body limit refused
    # before routing (in the lane the limit is checked after the lookup).
    too_large = 0 if lane else sum(1 for _, content, _ in BODIES if len(content) > 4096)
    assert CountingTable.handled - handled == 2 * (len(BODIES) - too_large)


def test_an_unexpected_error_is_a_plain_500_both_ways(served: tuple[str, Services, bool]) -> None:
    url, services, _ = served
    services.ready = True
    body = b'{"model": "boom", "messages": [{"role": "user", "content": "hi"}]}'
    # Each on its own connection: uvicorn closes one after the app raised (Starlette re-raises after its 500).
    expected = httpx.post(f"{url}/fastapi/v1/chat/completions", content=body, timeout=30)
    got = httpx.post(f"{url}/lean/sessions/s-1/v1/chat/completions", content=body, timeout=30)
    assert expected.status_code == 500 and "Traceback" not in expected.text
    assert (got.status_code, got.json()) == (500, expected.json())
    assert got.json()["error"]["type"] == "server_error"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/chat/completions"),  # a model-call path, another method: 405
        ("PUT", "/sessions/s-1/v1/messages"),
        ("POST", "/sessions//v1/chat/completions"),  # no session id: 404
        ("POST", "/sessions/a/b/v1/chat/completions"),  # a session id with a slash: 404
        ("POST", "/sessions/s-1/v1/chat/completions/"),  # a trailing slash: FastAPI's redirect
        ("POST", "/v1/chat/completion"),
    ],
)
def test_what_the_table_does_not_match_is_answered_as_fastapi_answers_it(
    served: tuple[str, Services, bool], method: str, path: str
) -> None:
    url, _, _ = served
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    with httpx.Client(timeout=30) as client:
        expected = client.request(method, f"{url}/fastapi{path}", content=body)
        got = client.request(method, f"{url}/lean{path}", content=body)
    assert expected.status_code in (307, 404, 405)
    if expected.status_code == 307:
        location = expected.headers["location"].replace("/fastapi/", "/lean/")
        assert (got.status_code, got.headers["location"]) == (307, location)
    else:
        assert (got.status_code, got.json()) == (expected.status_code, expected.json())


def test_the_table_finds_each_route_and_its_session_id() -> None:
    router = APIRouter()
    paths = ["/v1/chat/completions", "/sessions/{session_id}/v1/chat/completions", "/sessions/{session_id}/v1/messages"]
    endpoint = _endpoint(ChatCompletionRequest)
    for path in paths:
        router.add_api_route(path, endpoint, methods=["POST"], route_class_override=ModelCallRoute)
    table = ModelCallTable(router.routes)
    route, params = table.find("/sessions/ep%2F1 x/v1/messages")
    assert route is not None and route.path == paths[2] and params == {"session_id": "ep%2F1 x"}
    route, params = table.find("/v1/chat/completions")
    assert route is not None and route.path == paths[0] and params == {}
    assert table.find("/sessions/x/v1/responses") == (None, {})
    assert table.find("/sessions/x") == (None, {})
    with pytest.raises(ValueError, match="only a session id"):
        bad = APIRouter()
        bad.add_api_route("/v1/{model}/chat", endpoint, methods=["POST"], route_class_override=ModelCallRoute)
        ModelCallTable(bad.routes)


def test_a_model_call_route_refuses_a_parameter_it_cannot_fill() -> None:
    """Registration fails, not the first call: the route fills only the five model-call parameters."""

    async def endpoint(body: ChatCompletionRequest, session_id: str) -> Response:
        return json_response({})

    router = APIRouter(route_class=JsonRoute)
    with pytest.raises(TypeError, match=r"takes no \['session_id'\]"):
        router.add_api_route("/v1/chat/completions", endpoint, methods=["POST"], route_class_override=ModelCallRoute)
