"""The services a route gets, as FastAPI dependencies.

A route names what it uses (`completions: Completions`, `caller: CallerDep`, `_: Admin`) and
FastAPI hands it over: the running app's state is looked up once, model-call services wait for
the engine (503 + Retry-After while it loads), and `Admin` refuses a caller without the admin
key before the route runs. No route reaches into the app's state itself.

Every dependency is `async def`: they only read memory, and FastAPI runs a plain `def` dependency on a
worker thread, a thread hop for each one on every request (a third of the proxy's CPU per request on
`benchmarks/proxy_overhead.py`'s profile went to the hops and their bookkeeping).

The model-call routes (every answered call passes one) skip FastAPI's request handler: `model_call`
registers them with `ModelCallRoute`, which parses and validates the body with the same model and the
same errors and hands the endpoint what these dependencies give (the chat route measured 200-280 µs
of CPU a call through FastAPI's handler and the middleware, 130-205 µs this way). Their signatures stay
as declared, so the OpenAPI schema is FastAPI's. `ModelCallTable`, first in the app's route table, finds
them by their path in a dict: FastAPI 0.165 tries the routes in turn at ~2 µs each through its included
routers, so a call reached the Messages route after ~50 others.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Coroutine, Iterable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

from proxy.completions import CompletionService
from proxy.rewards_service import RewardService
from proxy.routes.common import JsonRequest, JsonRoute
from proxy.schemas.common import validation_error
from proxy.sessions import Caller, SessionService, bearer, episode_header
from proxy.state import AppState
from proxy.store.online import EPISODE_HEADER


async def app_state(request: Request) -> AppState:
    return request.app.state.areal


State = Annotated[AppState, Depends(app_state)]


async def caller(request: Request) -> Caller:
    """The bearer token (`Authorization` or Anthropic's `x-api-key`), the session the path names and
    the episode the `X-Areal-Episode` header names."""
    token = bearer(request.headers.get("authorization"), request.headers.get("x-api-key"))
    episode = episode_header(request.headers.get(EPISODE_HEADER))
    return Caller(token=token, path_session=request.path_params.get("session_id"), episode=episode)


CallerDep = Annotated[Caller, Depends(caller)]


async def sessions(state: State) -> SessionService:
    return state.sessions


Sessions = Annotated[SessionService, Depends(sessions)]


async def require_admin(who: CallerDep, registry: Sessions) -> None:
    registry.require_admin(who.token)


Admin = Annotated[None, Depends(require_admin)]


async def ready_completions(state: State) -> CompletionService:
    state.require_ready()
    return state.completions


Completions = Annotated[CompletionService, Depends(ready_completions)]


async def rewards(state: State) -> RewardService:
    return state.rewards


Rewards = Annotated[RewardService, Depends(rewards)]


Endpoint = Callable[..., Coroutine[Any, Any, Response]]
_MODEL_CALL_ARGS = {"request", "body", "caller", "completions", "state"}


class ModelCallRoute(JsonRoute):
    """A model-call route (`request`, `body`, `caller`, `completions`, `state` parameters) without
    FastAPI's dependency solving.

    It answers as FastAPI would, in the same order: a body that is not JSON is a 400 `invalid_json`;
    then the services (503 while the engine loads); then the body is validated with the endpoint's
    model, its errors located under `body` as FastAPI's are."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint: Endpoint = self.endpoint
        model = typing.get_type_hints(endpoint)["body"]
        wanted = set(inspect.signature(endpoint).parameters)
        if unknown := wanted - _MODEL_CALL_ARGS:
            raise TypeError(f"{endpoint.__name__}: a model-call route takes no {sorted(unknown)}")

        async def route(request: Request) -> Response:
            request = JsonRequest(request.scope, request.receive)
            data = await _json_body(request)
            state = await app_state(request)
            args: dict[str, Any] = {"request": request, "state": state}
            if "caller" in wanted:
                args["caller"] = await caller(request)
            if "completions" in wanted:
                args["completions"] = await ready_completions(state)
            if data is _NO_BODY:
                raise validation_error([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
            try:
                args["body"] = model.model_validate(data, from_attributes=True)
            except ValidationError as exc:
                errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]
                raise validation_error(errors) from None
            return await endpoint(**{name: args[name] for name in wanted})

        return route


_NO_BODY = object()


async def _json_body(request: JsonRequest) -> Any:
    """The parsed body, or `_NO_BODY`."""
    if not await request.body():
        return _NO_BODY
    try:
        return await request.json()
    except orjson.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "ctx": {"error": exc.msg}}
        raise validation_error([error]) from None


def model_call(router: APIRouter, *paths: str) -> Callable[[Endpoint], Endpoint]:
    """Register `endpoint` as a POST model-call route at each of `paths` (see `ModelCallRoute`)."""

    def register(endpoint: Endpoint) -> Endpoint:
        for path in paths:
            router.add_api_route(path, endpoint, methods=["POST"], route_class_override=ModelCallRoute)
        return endpoint

    return register


_SESSION_PARAM = "{session_id}"


class ModelCallTable(BaseRoute):
    """The model-call routes by exact path, in one route put first in the app's table.

    A POST to `/v1/...` or `/sessions/{id}/v1/...` is matched with a dict lookup and handed to the
    `ModelCallRoute` registered for it, with the scope Starlette's router gives a route (endpoint,
    path parameters, route), so the route answers and fails as it does when FastAPI finds it.
    Anything else (another method, a mounted root path, an unknown path) falls through to the routes
    after it: a GET there is still FastAPI's 405."""

    def __init__(self, routes: Iterable[BaseRoute]) -> None:
        self.exact: dict[str, ModelCallRoute] = {}
        # The text before "{session_id}" -> the text after it -> the route.
        self.in_session: dict[str, dict[str, ModelCallRoute]] = {}
        for route in routes:
            if not isinstance(route, ModelCallRoute):
                continue
            head, param, tail = route.path.partition(_SESSION_PARAM)
            if not param and "{" not in head:
                self.exact[route.path] = route
            elif not param or "{" in head + tail or not head.endswith("/") or not tail.startswith("/"):
                raise ValueError(f"a model-call route's path takes only a session id, as a segment: {route.path}")
            else:
                self.in_session.setdefault(head, {})[tail] = route

    def find(self, path: str) -> tuple[ModelCallRoute | None, dict[str, str]]:
        route = self.exact.get(path)
        if route is not None:
            return route, {}
        for head, tails in self.in_session.items():
            if path.startswith(head):
                session_id, slash, rest = path[len(head) :].partition("/")
                route = tails.get("/" + rest) if session_id and slash else None
                if route is not None:
                    return route, {"session_id": session_id}
        return None, {}

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return Match.NONE, {}
        route, params = self.find(scope["path"])
        if route is None:
            return Match.NONE, {}
        path_params = {**scope.get("path_params", {}), **params}
        return Match.FULL, {"endpoint": route.endpoint, "path_params": path_params, "route": route}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await scope["route"].app(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        raise NoMatchFound(name, path_params)  # the routes themselves are named in the table after it
