"""Control endpoints: sessions, rewards, weights, health, models and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse, Response

from proxy.engines.base import EngineUnavailable
from proxy.errors import APIError, conflict, engine_unavailable, forbidden, invalid_request, unauthorized
from proxy.routes.common import caller_of, json_body, json_response, state_of
from proxy.sessions import check_fields, hash_key
from proxy.store.sessions import SESSION_STATUSES, count_sessions, recent_sessions
from proxy.store.tree import session_rows
from proxy.tree_view import session_payload

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    state = state_of(request)
    state.require_ready()
    try:
        engine = await state.engine.health()
    except EngineUnavailable as exc:  # a crashed engine: unhealthy (503), not a server error
        raise engine_unavailable(f"the engine is not serving: {exc}", retry_after=5) from None
    return json_response(
        {"status": "ok", "model": state.served_name, "version": state.engine.version, "engine": engine}
    )


@router.get("/v1/models")
@router.get("/sessions/{session_id}/v1/models")
async def models(request: Request, session_id: str | None = None) -> Response:
    state = state_of(request)
    entry = {"id": state.served_name, "object": "model", "created": int(state.started_at), "owned_by": "areal-proxy"}
    return json_response({"object": "list", "data": [entry]})


@router.post("/sessions")
async def create_session(request: Request) -> Response:
    state = state_of(request)
    state.sessions.require_admin(caller_of(request).token)
    body = await json_body(request) if await request.body() else {}
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object")
    fields = check_fields(body)
    if fields["reward_fn"]:
        from rewards.builtins import resolve_reward

        try:
            resolve_reward(fields["reward_fn"])
        except (KeyError, ValueError) as exc:
            raise invalid_request(str(exc.args[0] if exc.args else exc), "reward_fn") from None

    count = body.get("count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1024):
        raise invalid_request("count must be an integer between 1 and 1024", "count")

    guard = state.admission.check if state.admission else None
    created = await state.sessions.create(**fields, count=count or 1, guard=guard)
    base = (state.cfg.proxy.public_url or str(request.base_url)).rstrip("/")
    payloads = [
        {"session_id": info.id, "api_key": key, "base_url": f"{base}/sessions/{info.id}/v1"} for info, key in created
    ]
    if count is None:
        return json_response(payloads[0], status=201)
    return json_response({"object": "list", "data": payloads}, status=201)


@router.post("/sessions/{session_id}/fail")
async def fail_session(request: Request, session_id: str) -> Response:
    """End an open session as failed (an agent crash or timeout); its completions are kept."""
    state = state_of(request)
    state.sessions.require_admin(caller_of(request).token)
    body = await json_body(request) if await request.body() else {}
    reason = body.get("reason") if isinstance(body, dict) else None
    if reason is not None and not isinstance(reason, str):
        raise invalid_request("reason must be a string", "reason")
    await state.sessions.get(session_id)
    return json_response(await state.rewards.fail(session_id, reason or "failed by the client"))


@router.get("/sessions")
async def list_sessions(request: Request) -> Response:
    state = state_of(request)
    state.sessions.require_admin(caller_of(request).token)
    status = request.query_params.get("status")
    if status is not None and status not in SESSION_STATUSES:
        raise invalid_request(f"status must be one of {', '.join(SESSION_STATUSES)}", "status")
    limit = _int_param(request, "limit", 100, 1, 10_000)
    offset = _int_param(request, "offset", 0, 0, None)

    def query(conn: Any) -> dict[str, Any]:
        rows = recent_sessions(conn, status, limit, offset)
        return {"object": "list", "total": count_sessions(conn, status), "data": [_session_summary(r) for r in rows]}

    return json_response(await state.db.aread(query))


def _int_param(request: Request, name: str, default: int, lo: int, hi: int | None) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid_request(f"{name} must be an integer", name) from None
    if value < lo or (hi is not None and value > hi):
        raise invalid_request(f"{name} out of range", name)
    return value


def _session_summary(r: Any) -> dict[str, Any]:
    return {
        "session_id": r.id,
        "status": r.status,
        "task_id": r.task_id,
        "group_id": r.group_id,
        "auto": r.auto,
        "reward": r.reward,
        "failure": r.failure,
        "num_completions": r.num_completions,
        "created_at": r.created_at,
        "finished_at": r.finished_at,
        "min_version": r.min_version,
        "max_version": r.max_version,
    }


@router.get("/sessions/{session_id}")
async def get_session(request: Request, session_id: str) -> Response:
    state = state_of(request)
    token = caller_of(request).token
    info = await state.sessions.get(session_id, fresh=True)
    if state.sessions.admin_key and not state.sessions.is_admin(token):
        if token is None:
            raise unauthorized("reading a session needs its key or the admin key")
        if info.key_hash != hash_key(token):
            raise forbidden("this key cannot read that session")
    session, rows = await state.db.aread(lambda c: session_rows(c, session_id))
    return json_response({**_session_summary(session), **session_payload(session, rows)})


@router.post("/sessions/{session_id}/reward")
async def reward(request: Request, session_id: str) -> Response:
    state = state_of(request)
    state.sessions.require_admin(caller_of(request).token)
    await state.sessions.get(session_id)
    return json_response(await state.rewards.set_reward(session_id, await json_body(request)))


@router.post("/sessions/{session_id}/finish")
async def finish(request: Request, session_id: str) -> Response:
    state = state_of(request)
    state.sessions.require_admin(caller_of(request).token)
    body = await json_body(request) if await request.body() else {}
    return json_response(await state.rewards.finish(session_id, body))


@router.post("/weights")
async def weights(request: Request) -> Response:
    state = state_of(request)
    state.sessions.require_admin(caller_of(request).token)
    state.require_ready()
    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("path"), str):
        raise invalid_request("path (a safetensors file or directory) is required", "path")
    version = body.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise invalid_request("version must be a non-negative integer", "version")
    current = state.engine.version
    if version < current:
        raise conflict(f"version {version} is older than the engine's version {current}", "version")
    if version > current:
        try:
            await state.engine.update_weights(body["path"], version)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise invalid_request(f"could not load weights: {exc}", "path") from None
        state.metrics.inc("areal_weight_updates_total")
    return json_response({"status": "ok", "version": state.engine.version})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return PlainTextResponse(state_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


__all__ = ["APIError", "router"]
