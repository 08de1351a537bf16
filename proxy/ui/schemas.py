"""The UI's query parameters: typed and bounded like every other route's, a bad one a 400.

A page cursor is opaque to the browser: the `(created_at, id)` of the row a page stops at,
as URL-safe base64 of JSON, so a float timestamp survives the round trip exactly.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from proxy.errors import invalid_request
from proxy.schemas.common import MAX_ID
from proxy.schemas.control import SessionStatus
from proxy.store.browse import Cursor, SessionFilter

NO_NUL = r"^[^\x00]*$"
"""PostgreSQL refuses a NUL in any string it is sent: a 400 here, not a database error."""
Text = Annotated[str, Field(min_length=1, max_length=MAX_ID, pattern=NO_NUL)]
Version = Annotated[int, Field(ge=0, le=2**31 - 1)]
Time = Annotated[float, Field(ge=0, le=1e11)]
CursorText = Annotated[str, Field(min_length=1, max_length=1024, pattern=NO_NUL)]


class QueryString(BaseModel):
    """Query strings: values arrive as text, so not strict; unknown parameters are ignored."""

    model_config = ConfigDict(extra="ignore", strict=False, allow_inf_nan=False)


class SessionsQuery(QueryString):
    """`GET /ui/api/sessions`: filters, a page size, and where the page starts."""

    status: SessionStatus | None = None
    task: Text | None = None
    group: Text | None = None
    eval: bool | None = None
    """Only evaluation sessions (true) or only training ones (false)."""
    reward_min: Annotated[float, Field(ge=-1e12, le=1e12)] | None = None
    reward_max: Annotated[float, Field(ge=-1e12, le=1e12)] | None = None
    version_min: Version | None = None
    """Sessions with a token sampled by this policy version or a later one."""
    version_max: Version | None = None
    since: Time | None = None
    """Created at or after (epoch seconds)."""
    until: Time | None = None
    """Created before (epoch seconds)."""
    older_than: CursorText | None = None
    """The page after this cursor (older sessions)."""
    newer_than: CursorText | None = None
    """The page before this cursor (newer sessions)."""
    limit: Annotated[int, Field(ge=1, le=500)] = 50
    count: bool = True
    """Count the matches (up to the cap); paging within one listing can leave it off."""

    def check(self) -> None:
        """Ranges that cannot match anything and contradictory cursors are the caller's mistake: 400."""
        for low, high in (("reward_min", "reward_max"), ("version_min", "version_max"), ("since", "until")):
            a, b = getattr(self, low), getattr(self, high)
            if a is not None and b is not None and a > b:
                raise invalid_request(f"{low} {a:g} is above {high} {b:g}", low)
        if self.older_than is not None and self.newer_than is not None:
            raise invalid_request("give older_than or newer_than, not both", "newer_than")

    def filter(self) -> SessionFilter:
        return SessionFilter(
            status=self.status,
            task_id=self.task,
            group_id=self.group,
            evaluation=self.eval,
            reward_min=self.reward_min,
            reward_max=self.reward_max,
            version_min=self.version_min,
            version_max=self.version_max,
            since=self.since,
            until=self.until,
        )


class RunQuery(QueryString):
    """`GET /ui/api/run`: the metrics lines after a byte offset."""

    offset: Annotated[int, Field(ge=0, le=2**53)] = 0


def encode_cursor(cursor: Cursor | None) -> str | None:
    if cursor is None:
        return None
    raw = json.dumps([cursor.created_at, cursor.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str | None, param: str) -> Cursor | None:
    """A cursor this server handed out; anything else is a 400 naming `param`."""
    if text is None:
        return None
    try:
        created_at, session_id = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if isinstance(created_at, bool) or not isinstance(created_at, int | float) or not isinstance(session_id, str):
            raise ValueError
        if not math.isfinite(created_at := float(created_at)) or "\x00" in session_id:
            raise ValueError
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise invalid_request(f"{param} is not a cursor from a sessions page", param, "invalid_cursor") from None
    return Cursor(created_at, session_id)
