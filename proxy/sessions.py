"""Sessions (episodes) and who may touch them.

A model call names its session by the path prefix `/sessions/{id}/v1/...` or by
a session key as its bearer token. Without `[proxy] admin_key` (the local
default) anything else goes into an automatic session per conversation root.
With an admin key, model calls need their session's key (or the admin key) and
control endpoints need the admin key; a session key never reaches another session.
Keys are stored as SHA-256 hashes. The most recently used sessions are cached (a
bounded LRU); the store is the truth.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from proxy.errors import APIError, conflict, forbidden, invalid_request, not_found, unauthorized
from proxy.seeds import derive_seed
from proxy.store.db import Database
from proxy.store.online import open_episode
from proxy.store.sessions import fail_idle_sessions, get_session, insert_sessions, session_by_key_hash, touch_sessions


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_session_id() -> str:
    return "sess_" + secrets.token_hex(12)


@dataclass
class SessionInfo:
    id: str
    status: str
    auto: bool
    key_hash: str | None
    reward_fn: str | None = None
    reference: str | None = None
    seed: int | None = None  # sampling seed of its calls that set none (proxy/seeds.py)
    temperature: float | None = None  # forced on every call (an evaluation at a chosen temperature)


@dataclass(frozen=True)
class Caller:
    """Who is calling: the bearer token and the session the path names, if any."""

    token: str | None
    path_session: str | None
    episode: str | None = None  # the X-Areal-Episode header: calls that share it share an automatic session


def bearer(authorization: str | None, x_api_key: str | None = None) -> str | None:
    """The caller's key: `Authorization: Bearer <key>`, else Anthropic's `x-api-key`; a key that is
    not printable ASCII (no key we issue is) is a 401, never a server error."""
    token = None
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            token = value.strip()
    if token is None and x_api_key and x_api_key.strip():
        token = x_api_key.strip()
    if token is not None and not (token.isascii() and token.isprintable()):
        raise unauthorized("invalid API key: keys are printable ASCII")
    return token


MAX_EPISODE_HEADER = 256


def episode_header(value: str | None) -> str | None:
    """The client's episode name from `X-Areal-Episode`: up to 256 printable ASCII characters, else a 400."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if len(value) > MAX_EPISODE_HEADER or not (value.isascii() and value.isprintable()):
        raise invalid_request(
            f"X-Areal-Episode must be 1 to {MAX_EPISODE_HEADER} printable ASCII characters", "X-Areal-Episode"
        )
    return value


class RecentSessions:
    """The sessions used most recently, at most `size`, by id and by key hash: a server running for
    days in front of millions of episodes holds the working set, not every session it ever saw."""

    def __init__(self, size: int = 65_536) -> None:
        self.size = size
        self._by_id: OrderedDict[str, SessionInfo] = OrderedDict()
        self._by_key: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, session_id: str) -> SessionInfo | None:
        info = self._by_id.get(session_id)
        if info is not None:
            self._by_id.move_to_end(session_id)
        return info

    def id_for_key(self, key_hash: str) -> str | None:
        return self._by_key.get(key_hash)

    def put(self, info: SessionInfo) -> None:
        self.pop(info.id)
        self._by_id[info.id] = info
        if info.key_hash:
            self._by_key[info.key_hash] = info.id
        while len(self._by_id) > self.size:
            _, evicted = self._by_id.popitem(last=False)
            self._by_key.pop(evicted.key_hash or "", None)

    def pop(self, session_id: str) -> None:
        info = self._by_id.pop(session_id, None)
        if info is not None and info.key_hash:
            self._by_key.pop(info.key_hash, None)


class SessionService:
    def __init__(self, db: Database, admin_key: str, auto_sessions: bool) -> None:
        self.db = db
        self.admin_key = admin_key
        self.auto_sessions = auto_sessions
        self.recent = RecentSessions()

    # -- auth -----------------------------------------------------------------------
    def is_admin(self, token: str | None) -> bool:
        return bool(self.admin_key) and token is not None and hmac.compare_digest(token, self.admin_key)

    def require_admin(self, token: str | None) -> None:
        if not self.admin_key:
            return
        if token is None:
            raise unauthorized("this endpoint needs the admin key as a bearer token")
        if not self.is_admin(token):
            raise (
                forbidden("this endpoint needs the admin key")
                if self._known_key(token)
                else unauthorized("invalid admin key")
            )

    def _known_key(self, token: str) -> bool:
        return self.recent.id_for_key(hash_key(token)) is not None

    async def for_model_call(self, caller: Caller) -> SessionInfo | None:
        """The open session a model call belongs to; None means an automatic session."""
        token_session = await self._by_token(caller.token) if caller.token else None
        admin = self.is_admin(caller.token)
        if caller.path_session is not None:
            info = await self.get(caller.path_session)
            if self.admin_key and not admin:
                if caller.token is None:
                    raise unauthorized(f"session {info.id} needs its session key (or the admin key)")
                if token_session is None:
                    raise unauthorized("invalid API key")
            if token_session is not None and token_session.id != info.id:
                raise forbidden("this session key belongs to another session")
        elif token_session is not None:
            info = token_session
        else:
            if self.admin_key and not admin:
                raise unauthorized("invalid API key: use a session key from POST /sessions, or the admin key")
            if not self.auto_sessions:
                raise invalid_request("no session: create one with POST /sessions and use its key or base_url")
            return None
        if info.status != "open":
            raise conflict(f"session {info.id} is {info.status}; it accepts no more model calls")
        return info

    async def _by_token(self, token: str) -> SessionInfo | None:
        digest = hash_key(token)
        session_id = self.recent.id_for_key(digest)
        if session_id is None:
            row = await self.db.aread(lambda c: session_by_key_hash(c, digest))
            if row is None:
                return None
            self._remember(row)
            session_id = row.id
        return await self.get(session_id)

    async def episode(self, key_hash: str) -> SessionInfo | None:
        """The open automatic session of an `X-Areal-Episode` header (by its key hash), if any."""
        session_id = self.recent.id_for_key(key_hash)
        if session_id is not None:
            info = self.recent.get(session_id)
            if info is not None and info.status == "open":
                return info
        row = await self.db.aread(lambda c: open_episode(c, key_hash))
        return None if row is None else self._remember(row)

    # -- lookup ---------------------------------------------------------------------
    async def get(self, session_id: str, *, fresh: bool = False) -> SessionInfo:
        info = None if fresh else self.recent.get(session_id)
        if info is None:
            row = await self.db.aread(lambda c: get_session(c, session_id))
            if row is None:
                raise not_found(f"session {session_id!r} not found", "session_id")
            info = self._remember(row)
        return info

    def _remember(self, row: Any) -> SessionInfo:
        info = SessionInfo(
            id=row.id,
            status=row.status,
            auto=row.auto,
            key_hash=row.key_hash,
            reward_fn=row.reward_fn,
            reference=row.reference,
            seed=row.seed,
            temperature=row.temperature,
        )
        self.recent.put(info)
        return info

    def set_status(self, session_id: str, status: str) -> None:
        info = self.recent.get(session_id)
        if info is not None:
            info.status = status

    def forget(self, session_id: str) -> None:
        self.recent.pop(session_id)

    # -- creation -------------------------------------------------------------------
    async def create(
        self,
        *,
        task_id: str | None,
        group_id: str | None,
        metadata: dict[str, Any],
        reward_fn: str | None,
        reference: str | None,
        seed: int | None = None,
        count: int = 1,
        evaluation: bool = False,
        temperature: float | None = None,
        guard: Callable[[Connection, int], APIError | None] | None = None,
    ) -> list[tuple[SessionInfo, str]]:
        """Create `count` sessions in one transaction; (info, key) for each.

        With a `seed`, a single session gets that seed and session i of a group `derive_seed(seed, i)`.

        `guard(conn, count)` runs first in that transaction and may refuse by returning the error
        to raise: admission control counts and inserts atomically, whichever replica serves it.
        `evaluation` sessions are recorded and scored like any other but never trained on; a
        `temperature` is forced on every call they make.
        """
        now = time.time()
        made = []
        for i in range(count):
            key = "sk-sess-" + secrets.token_urlsafe(24)
            row = {
                "id": new_session_id(),
                "key_hash": hash_key(key),
                "task_id": task_id,
                "group_id": group_id,
                "metadata": metadata,
                "status": "open",
                "auto": False,
                "reward_fn": reward_fn,
                "reference": reference,
                "seed": None if seed is None else seed if count == 1 else derive_seed(seed, i),
                "eval": evaluation,
                "temperature": temperature,
                "num_completions": 0,
                "created_at": now,
                "updated_at": now,
            }
            made.append((row, key))

        def insert(conn: Connection) -> APIError | None:
            if guard is not None and (refusal := guard(conn, count)) is not None:
                return refusal  # returned, not raised: the rest of the group commit goes on
            insert_sessions(conn, [row for row, _ in made])
            return None

        refusal = await self.db.write(insert)
        if refusal is not None:
            raise refusal
        out = []
        for row, key in made:
            info = SessionInfo(
                id=row["id"],
                status="open",
                auto=False,
                key_hash=row["key_hash"],
                reward_fn=reward_fn,
                reference=reference,
                seed=row["seed"],
                temperature=temperature,
            )
            self.recent.put(info)
            out.append((info, key))
        return out


def expire_open_sessions(
    conn: Connection, timeout_s: float, now: float, *, named_only: bool = False, busy: list[str] | None = None
) -> list[str]:
    """Close sessions idle past the timeout as failed (only named ones with `named_only`); their
    completions are kept. A session with a call being generated (`busy`: this replica's) is not
    idle: it is marked active now, so no replica's sweeper closes it under a long generation, whose
    turn would then be refused."""
    touch_sessions(conn, busy or [], now)
    failure = f"timed out: no activity for {timeout_s:.0f}s"
    return fail_idle_sessions(conn, now - timeout_s, failure, now, named_only=named_only)


__all__ = ["APIError", "Caller", "SessionInfo", "SessionService", "bearer"]
