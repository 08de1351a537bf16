"""What every route needs: the app state, the caller, the JSON body, JSON/SSE encoding."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response

from proxy.errors import APIError, invalid_request
from proxy.sessions import Caller, bearer


def state_of(request: Request) -> Any:
    return request.app.state.areal


def caller_of(request: Request, session_id: str | None = None) -> Caller:
    token = bearer(request.headers.get("authorization"), request.headers.get("x-api-key"))
    return Caller(token=token, path_session=session_id)


async def json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        raise invalid_request("the request body is empty; send a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from None


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json", headers=headers)


def error_response(exc: APIError) -> Response:
    return Response(exc.json(), status_code=exc.status, media_type="application/json", headers=exc.headers)


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def served_model(state: Any) -> str:
    return state.served_name
