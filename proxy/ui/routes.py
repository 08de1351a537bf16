"""The UI's routes: the page and its static files (public), and the JSON it reads (admin only).

Every `/ui/api/...` route needs the admin key when one is set, as the control endpoints do;
`/ui/api/auth` alone answers without it, saying whether a key is needed and whether the one
sent is right, so the page can ask for the key before it reads anything (and the browser
console stays free of refused requests). Nothing here returns a session's key or key hash.
Pages are served with a content security policy that allows only this origin's scripts and
styles: everything recorded (model text, tool arguments) is put into the page as text, and a
reply that contains markup stays text even if a bug let it through.
"""

from __future__ import annotations

import asyncio
import hashlib
from functools import cache
from pathlib import Path as FilePath
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import RedirectResponse, Response

from proxy.errors import not_found
from proxy.routes.common import JsonRoute, json_response
from proxy.schemas.common import MAX_ID
from proxy.sessions import bearer
from proxy.store.browse import (
    count_sessions_capped,
    group_rows,
    session_row,
    sessions_page,
    status_counts,
    step_batch_rows,
    turn_summaries,
)
from proxy.store.claims import trained_count
from proxy.store.tree import session_rows
from proxy.ui.advantages import BATCH_WIDE, advantages, in_claim
from proxy.ui.runlog import read_rows
from proxy.ui.schemas import NO_NUL, RunQuery, SessionsQuery, decode_cursor, encode_cursor
from proxy.ui.state import UIState
from proxy.ui.views import group_view, prompt_view, session_view, summary

STATIC = FilePath(__file__).parent / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
COUNT_CAP = 10_000
"""Sessions counted at most per listing: beyond, the page says "10,000+"."""
GROUP_LIMIT = 1024
"""Sessions shown of one group (a group is `rollout.group_size`, 1,024 at most a request)."""

router = APIRouter(route_class=JsonRoute)
Ident = Annotated[str, Path(min_length=1, max_length=MAX_ID, pattern=NO_NUL)]
"""A session, node or group id in a path."""


async def ui_state(request: Request) -> UIState:
    return request.app.state.ui


UI = Annotated[UIState, Depends(ui_state)]


async def require_admin(request: Request, ui: UI) -> None:
    ui.require_admin(bearer(request.headers.get("authorization")))


Admin = Annotated[None, Depends(require_admin)]


# -- the page and its files ---------------------------------------------------------------
@router.get("/ui", include_in_schema=False)
async def page_without_slash() -> Response:
    # The page's links are relative to /ui/, so that it also works under a reverse proxy's prefix.
    return RedirectResponse("ui/", status_code=308)


@router.get("/ui/", include_in_schema=False)
async def page(request: Request) -> Response:
    return _static("index.html", request)


@router.get("/ui/static/{name}", include_in_schema=False)
async def static(name: str, request: Request) -> Response:
    return _static(name, request)


@cache
def _asset(name: str) -> tuple[bytes, str] | None:
    """A file of `static/` by its bare name (no folders, so no path escapes it) and its ETag."""
    path = STATIC / name
    if "/" in name or "\\" in name or name.startswith(".") or path.suffix not in CONTENT_TYPES or not path.is_file():
        return None
    body = path.read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:20] + '"'


def _static(name: str, request: Request) -> Response:
    asset = _asset(name)
    if asset is None:
        raise not_found(f"no UI file {name!r}", "name")
    body, etag = asset
    # Revalidated on every load (a 304 when unchanged): an upgrade never runs stale modules.
    headers = {"etag": etag, "cache-control": "no-cache", "x-content-type-options": "nosniff"}
    if name.endswith(".html"):
        headers |= {"content-security-policy": CSP, "referrer-policy": "no-referrer"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=CONTENT_TYPES[FilePath(name).suffix], headers=headers)


# -- data ---------------------------------------------------------------------------------
@router.get("/ui/api/auth")
async def auth(request: Request, ui: UI) -> Response:
    """Whether the data needs the admin key, and whether this request's bearer token is it."""
    token = bearer(request.headers.get("authorization"))
    return json_response({"key_required": bool(ui.admin_key), "authorized": ui.authorized(token)})


@router.get("/ui/api/overview")
async def overview(_: Admin, ui: UI) -> Response:
    def read(conn: Any) -> dict[str, Any]:
        return {"statuses": status_counts(conn), "training": trained_count(conn)}

    counts = await ui.db.aread(read)
    trainer = ui.cfg.trainer
    return json_response(
        {
            **counts,
            "estimator": trainer.loss.advantage,
            "run_dir": str(ui.run_dir),
            "model": ui.cfg.engine.model,
            "store": ui.db.engine.url.get_backend_name(),
            "count_cap": COUNT_CAP,
        }
    )


@router.get("/ui/api/sessions")
async def sessions(query: Annotated[SessionsQuery, Query()], _: Admin, ui: UI) -> Response:
    query.check()
    older = decode_cursor(query.older_than, "older_than")
    newer = decode_cursor(query.newer_than, "newer_than")
    where = query.filter()

    def read(conn: Any) -> dict[str, Any]:
        page = sessions_page(conn, where, query.limit, older_than=older, newer_than=newer)
        total = count_sessions_capped(conn, where, COUNT_CAP) if query.count else None
        return {
            "object": "list",
            "data": [summary(r) for r in page.rows],
            "older": encode_cursor(page.older),
            "newer": encode_cursor(page.newer),
            "total": None if total is None else min(total, COUNT_CAP),
            "total_capped": total is not None and total > COUNT_CAP,
        }

    return json_response(await ui.db.aread(read))


@router.get("/ui/api/sessions/{session_id}")
async def session(session_id: Ident, _: Admin, ui: UI) -> Response:
    def read(conn: Any) -> tuple[Any, list[Any]]:
        return session_row(conn, session_id), session_rows(conn, session_id)[1]

    row, rows = await ui.db.aread(read)
    if row is None:
        raise not_found(f"session {session_id!r} not found", "session_id")
    # Decoding a long episode's tokens takes a while: off the event loop, which meanwhile streams
    # the agents' replies when the UI is served by the proxy.
    return json_response(await asyncio.to_thread(session_view, row, rows, await ui.decoder()))


@router.get("/ui/api/sessions/{session_id}/prompts/{node_id}")
async def prompt(session_id: Ident, node_id: Ident, _: Admin, ui: UI) -> Response:
    """One node's full prompt (ids and text), fetched when the reader opens it."""
    _, rows = await ui.db.aread(lambda c: session_rows(c, session_id))
    view = await asyncio.to_thread(prompt_view, rows, node_id, await ui.decoder())
    if view is None:
        raise not_found(f"session {session_id!r} has no completion {node_id!r}", "node_id")
    return json_response(view)


@router.get("/ui/api/groups/{group_id:path}")
async def group(group_id: Ident, _: Admin, ui: UI) -> Response:
    estimator = ui.cfg.trainer.loss.advantage

    def read(conn: Any) -> tuple[list[Any], list[Any], list[Any] | None, int | None]:
        rows = group_rows(conn, group_id, GROUP_LIMIT)
        steps = {r.claimed_step for r in rows if in_claim(r) and r.claimed_step is not None}
        step = steps.pop() if estimator in BATCH_WIDE and len(steps) == 1 else None
        batch = step_batch_rows(conn, step) if step is not None else None
        return rows, turn_summaries(conn, [r.id for r in rows]), batch, step

    rows, turns, batch, step = await ui.db.aread(read)
    if not rows:
        raise not_found(f"group {group_id!r} has no sessions", "group_id")
    unsolved = ui.cfg.trainer.unsolved.advantage if ui.cfg.trainer.unsolved else None
    # A thread: the first call imports torch, which the UI alone has not loaded.
    values = await asyncio.to_thread(advantages, rows, estimator, batch=batch, unsolved_advantage=unsolved)
    return json_response(group_view(group_id, rows, turns, values, estimator, step))


@router.get("/ui/api/run")
async def run(query: Annotated[RunQuery, Query()], _: Admin, ui: UI) -> Response:
    """The run's metrics lines after `offset`, and the store's sessions by fate."""
    chunk = await asyncio.to_thread(read_rows, ui.run_dir / "metrics.jsonl", query.offset)
    training = await ui.db.aread(trained_count)
    return json_response(
        {
            "run_dir": str(ui.run_dir),
            "exists": (ui.run_dir / "metrics.jsonl").is_file(),
            "rows": chunk.rows,
            "offset": chunk.offset,
            "size": chunk.size,
            "reset": chunk.reset,
            "training": training,
        }
    )
