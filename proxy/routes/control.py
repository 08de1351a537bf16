"""Control endpoints: sessions, rewards, weights, health, models and metrics.

Bodies and queries are the models of `proxy/schemas/control.py`; services come from
`proxy/routes/deps.py`. With an admin key set, every control endpoint needs it, except that a
session's own key may read its own session: the recorded turns, not the reference answer, the
reward function or the metadata (the policy being trained holds that key, and a tool-using
policy could otherwise fetch the answer it is graded on).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.responses import PlainTextResponse, Response

from proxy.engines.base import EngineUnavailable
from proxy.errors import APIError, conflict, engine_unavailable, forbidden, invalid_request, not_found, unauthorized
from proxy.routes.common import JsonRoute, json_response
from proxy.routes.deps import Admin, CallerDep, Rewards, Sessions, State
from proxy.schemas.control import CreateSession, Fail, Feedback, Finish, SessionList, SetReward, Weights
from proxy.sessions import hash_key
from proxy.store.sessions import count_sessions, recent_sessions
from proxy.store.tree import session_rows
from proxy.tree_view import session_payload, session_summary

router = APIRouter(route_class=JsonRoute)

ADMIN_ONLY = ("reference", "reward_fn", "metadata")
"""What a session's own key does not get back when it reads its session."""


@router.get("/health")
async def health(state: State) -> Response:
    state.require_ready()
    try:
        engine = await state.engine.health()
    except EngineUnavailable as exc:  # a crashed or restarting engine: unhealthy (503), not a server error
        raise engine_unavailable(f"the engine is not serving: {exc}", retry_after=5) from None
    return json_response(
        {"status": "ok", "model": state.served_name, "version": state.engine.version, "engine": engine}
    )


@router.get("/v1/models")
@router.get("/sessions/{session_id}/v1/models")
async def models(state: State) -> Response:
    entry = {"id": state.served_name, "object": "model", "created": int(state.started_at), "owned_by": "areal-proxy"}
    return json_response({"object": "list", "data": [entry]})


@router.post("/sessions")
async def create_session(request: Request, _: Admin, state: State, body: CreateSession | None = None) -> Response:
    body = body or CreateSession()
    if body.reward_fn:
        from rewards.builtins import resolve_reward

        try:
            resolve_reward(body.reward_fn)
        except (KeyError, ValueError) as exc:
            raise invalid_request(str(exc.args[0] if exc.args else exc), "reward_fn") from None
    guard = state.admission.check if state.admission and not body.eval else None
    created = await state.sessions.create(
        task_id=None if body.task_id is None else str(body.task_id),
        group_id=None if body.group_id is None else str(body.group_id),
        metadata=body.metadata or {},
        reward_fn=body.reward_fn,
        reference=None if body.reference is None else str(body.reference),
        seed=body.seed,
        count=body.count or 1,
        evaluation=body.eval,
        temperature=body.temperature,
        guard=guard,
    )
    base = (state.cfg.proxy.public_url or str(request.base_url)).rstrip("/")
    payloads = [
        {"session_id": info.id, "api_key": key, "base_url": f"{base}/sessions/{info.id}/v1"} for info, key in created
    ]
    if body.count is None:
        return json_response(payloads[0], status=201)
    return json_response({"object": "list", "data": payloads}, status=201)


@router.post("/sessions/{session_id}/fail")
async def fail_session(
    session_id: str, _: Admin, sessions: Sessions, rewards: Rewards, body: Fail | None = None
) -> Response:
    """End an open session as failed (an agent crash or timeout); its completions are kept."""
    await sessions.get(session_id)
    reason = body.reason if body is not None and body.reason else "failed by the client"
    return json_response(await rewards.fail(session_id, reason))


@router.get("/sessions")
async def list_sessions(query: Annotated[SessionList, Query()], _: Admin, state: State) -> Response:
    def read(conn: Any) -> dict[str, Any]:
        rows = recent_sessions(conn, query.status, query.limit, query.offset, evaluation=query.eval)
        total = count_sessions(conn, query.status, evaluation=query.eval)
        return {"object": "list", "total": total, "data": [session_summary(r) for r in rows]}

    return json_response(await state.db.aread(read))


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, caller: CallerDep, sessions: Sessions, state: State) -> Response:
    info = await sessions.get(session_id, fresh=True)
    own_key = False
    if sessions.admin_key and not sessions.is_admin(caller.token):
        if caller.token is None:
            raise unauthorized("reading a session needs its key or the admin key")
        if info.key_hash != hash_key(caller.token):
            raise forbidden("this key cannot read that session")
        own_key = True
    session, rows = await state.db.aread(lambda c: session_rows(c, session_id))
    payload = {**session_summary(session), **session_payload(session, rows)}
    if own_key:
        for name in ADMIN_ONLY:
            payload.pop(name, None)
    return json_response(payload)


@router.post("/sessions/{session_id}/reward")
async def reward(session_id: str, body: SetReward, _: Admin, sessions: Sessions, rewards: Rewards) -> Response:
    await sessions.get(session_id)
    return json_response(await rewards.set_reward(session_id, body.reward, body.completion_id))


@router.post("/feedback")
async def feedback(body: Feedback, _: Admin, state: State) -> Response:
    """Rate an answer by the response id its client got: a score, thumbs up/down, or a configured label."""
    return json_response(await state.online.feedback(body))


@router.post("/sessions/{session_id}/finish")
async def finish(session_id: str, _: Admin, rewards: Rewards, body: Finish | None = None) -> Response:
    return json_response(await rewards.finish(session_id, body or Finish()))


@router.post("/weights")
async def weights(body: Weights, _: Admin, state: State) -> Response:
    state.require_ready()
    current = state.engine.version
    if body.version < current:
        raise conflict(f"version {body.version} is older than the engine's version {current}", "version")
    if body.version > current:
        try:
            await state.engine.update_weights(body.path, body.version, adapter=body.adapter)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise invalid_request(f"could not load weights: {exc}", "path") from None
        state.metrics.inc("areal_weight_updates_total")
    return json_response({"status": "ok", "version": state.engine.version})


@router.post("/debug/engine-fault", include_in_schema=False)
async def engine_fault(_: Admin, state: State) -> Response:
    """With `proxy.fault_injection` on: the embedded engine's next step fails as a real fault would."""
    inject = getattr(state.engine, "inject_fault", None)
    if not state.cfg.proxy.fault_injection or inject is None:
        raise not_found("fault injection is off (proxy.fault_injection) or the engine has none")
    inject()
    return json_response({"status": "ok", "fault": "the engine's next step fails"})


@router.get("/metrics")
async def metrics(state: State) -> Response:
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")


__all__ = ["APIError", "router"]
