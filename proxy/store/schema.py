"""The SQL schema: sessions (episodes) and completions (nodes of a conversation tree).

A completion row is one sampled answer: the request it answered, the assistant
message returned, and the exact token data — prompt ids beyond the parent's full
sequence, sampled ids, their behaviour logprobs and the weight version of each
token — stored as compact little-endian int32/float32 blobs. `parent_id` links a
turn to the earlier completion whose conversation it continues; `chain_hash`
identifies the conversation that completion ends (its messages plus its reply),
which is how a later request finds its parent.

Only `proxy/store/` imports this module; a change to it comes with an Alembic
revision under `proxy/store/migrations/versions/`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


def _where_set(table: str, column: str) -> Index:
    """An index of `column` over the rows where it is set: every lookup by value implies it is."""
    where = text(f"{column} IS NOT NULL")
    return Index(f"ix_{table}_{column}", column, sqlite_where=where, postgresql_where=where)


class SessionRow(Base):
    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    task_id: Mapped[str | None] = mapped_column(String(256))
    group_id: Mapped[str | None] = mapped_column(String(256))
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="open")
    auto: Mapped[bool] = mapped_column(Boolean, default=False)
    reward_fn: Mapped[str | None] = mapped_column(String(256))
    reference: Mapped[str | None] = mapped_column(Text)
    reward: Mapped[float | None] = mapped_column(Float)  # the episode's reward once scored
    failure: Mapped[str | None] = mapped_column(Text)  # why the session failed
    finish_spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # how it was finished (idempotency)
    num_completions: Mapped[int] = mapped_column(Integer, default=0)
    min_version: Mapped[int | None] = mapped_column(Integer)  # oldest weight version of any token
    max_version: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    consumed_step: Mapped[int | None] = mapped_column(Integer)  # trainer step that used it
    claimed_step: Mapped[int | None] = mapped_column(Integer)  # trainer step that claimed it
    seed: Mapped[int | None] = mapped_column(BigInteger)  # sampling seed of calls that set none (derived per prompt)
    eval: Mapped[bool] = mapped_column(Boolean, server_default=false())  # evaluation: never trained on
    temperature: Mapped[float | None] = mapped_column(Float)  # forced on every call of the session (evaluation)

    # Status + age is how admission control and the timeout sweeper scan sessions; creation time (under
    # a status or not) is the order the web UI pages them in, by keyset (proxy/store/browse.py). Columns
    # empty on most rows and looked up by value are indexed over the rows that have one (migration 0008).
    __table_args__ = (
        Index("ix_sessions_status_updated", "status", "updated_at"),
        Index("ix_sessions_created", "created_at", "id"),
        Index("ix_sessions_status_created", "status", "created_at", "id"),
        *(_where_set("sessions", column) for column in ("task_id", "group_id", "claimed_step")),
    )


class CompletionRow(Base):
    __tablename__ = "completions"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    parent_id: Mapped[str | None] = mapped_column(String(80))
    response_id: Mapped[str] = mapped_column(String(80), index=True)  # id the client saw (shared by n choices)
    choice_index: Mapped[int] = mapped_column(Integer, default=0)
    api: Mapped[str] = mapped_column(String(16), default="chat")  # chat | responses | messages
    depth: Mapped[int] = mapped_column(Integer, default=0)
    chain_hash: Mapped[str] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)  # messages, tools, sampling
    response: Mapped[dict[str, Any]] = mapped_column(JSON)  # the assistant message
    prompt_ids: Mapped[bytes] = mapped_column(LargeBinary)  # ids beyond the parent's full sequence
    prompt_len: Mapped[int] = mapped_column(Integer)  # full prompt length
    output_ids: Mapped[bytes] = mapped_column(LargeBinary)
    output_logprobs: Mapped[bytes] = mapped_column(LargeBinary)
    output_versions: Mapped[bytes] = mapped_column(LargeBinary)
    finish_reason: Mapped[str] = mapped_column(String(16))
    temperature: Mapped[float] = mapped_column(Float, default=1.0)
    reward: Mapped[float | None] = mapped_column(Float)  # raw reward of this turn
    ret: Mapped[float | None] = mapped_column(Float)  # tree-discounted return
    created_at: Mapped[float] = mapped_column(Float)
    request_hash: Mapped[str | None] = mapped_column(String(64))  # the request's conversation prefix hash
    superseded_by: Mapped[str | None] = mapped_column(String(80))  # a resend of the same request replaced it

    # The request hash finds an earlier identical request (a client's resend after a timeout).
    __table_args__ = (
        Index("ix_completions_chain", "chain_hash", "session_id"),
        Index("ix_completions_request", "request_hash", "created_at"),
        _where_set("completions", "parent_id"),  # empty on a conversation's first turn
    )


sessions = SessionRow.__table__
completions = CompletionRow.__table__
