"""The services a route gets, as FastAPI dependencies.

A route names what it uses (`completions: Completions`, `caller: CallerDep`, `_: Admin`) and
FastAPI hands it over: the running app's state is looked up once, model-call services wait for
the engine (503 + Retry-After while it loads), and `Admin` refuses a caller without the admin
key before the route runs. No route reaches into the app's state itself.

Every dependency is `async def`: they only read memory, and FastAPI runs a plain `def` dependency on a
worker thread, a thread hop for each one on every request (a third of the proxy's CPU per request on
`benchmarks/proxy_overhead.py`'s profile went to the hops and their bookkeeping).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from proxy.completions import CompletionService
from proxy.rewards_service import RewardService
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
