"""The conversation tree: finding a request's parent and rebuilding nodes' sequences.

A parent is the completion whose conversation (its request messages plus its
reply) is the longest prefix of the new request's messages, within the caller's
session (or among automatic sessions). Recent nodes are kept in an in-memory
LRU keyed by their chain hash so a running agent's next turn costs no query;
on a miss (another replica served the parent, or a restart) the store answers.
Rows keep only the prompt ids beyond the parent's full sequence, so a node's
full sequence is rebuilt by walking its ancestors.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from proxy.store.db import Database
from proxy.store.schema import completions, sessions
from proxy.store.tokens import unpack_ints


@dataclass
class Node:
    """A recorded completion, as continuation needs it."""

    id: str
    session_id: str
    auto: bool
    depth: int
    num_messages: int  # messages of its conversation, its reply included
    full_ids: array  # prompt + sampled ids
    ended_with_eos: bool
    reasoning: str = ""  # the reasoning its reply sampled (continuation checks the template keeps it)


class NodeCache:
    """LRU of recent nodes by chain hash, bounded by total tokens held."""

    def __init__(self, max_tokens: int = 20_000_000) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        self._nodes: OrderedDict[str, Node] = OrderedDict()

    def get(self, chain_hash: str) -> Node | None:
        node = self._nodes.get(chain_hash)
        if node is not None:
            self._nodes.move_to_end(chain_hash)
        return node

    def put(self, chain_hash: str, node: Node) -> None:
        old = self._nodes.pop(chain_hash, None)
        if old is not None:
            self.tokens -= len(old.full_ids)
        self._nodes[chain_hash] = node
        self.tokens += len(node.full_ids)
        while self.tokens > self.max_tokens and len(self._nodes) > 1:
            _, evicted = self._nodes.popitem(last=False)
            self.tokens -= len(evicted.full_ids)


def _in_scope(node: Node, session_id: str | None) -> bool:
    return node.session_id == session_id if session_id is not None else node.auto


def find_parent_cached(cache: NodeCache, candidates: list[tuple[int, str]], session_id: str | None) -> Node | None:
    for _, chain_hash in candidates:
        node = cache.get(chain_hash)
        if node is not None and _in_scope(node, session_id):
            return node
    return None


def find_parent_in_store(
    conn: Connection, candidates: list[tuple[int, str]], session_id: str | None, eos_ids: set[int]
) -> Node | None:
    if not candidates:
        return None
    depth_of = {h: k for k, h in candidates}
    query = (
        select(completions.c.id, completions.c.chain_hash, completions.c.session_id, sessions.c.auto)
        .join(sessions, sessions.c.id == completions.c.session_id)
        .where(completions.c.chain_hash.in_(list(depth_of)))
    )
    query = query.where(completions.c.session_id == session_id) if session_id else query.where(sessions.c.auto)
    rows = conn.execute(query).all()
    if not rows:
        return None
    best = max(rows, key=lambda r: (depth_of[r.chain_hash], r.id))
    return load_node(conn, best.id, best.auto, eos_ids)


def load_node(conn: Connection, completion_id: str, auto: bool, eos_ids: set[int]) -> Node:
    """Rebuild one node's full sequence from its ancestors' rows."""
    chain = []
    current: str | None = completion_id
    while current is not None:
        row = conn.execute(
            select(
                completions.c.id,
                completions.c.parent_id,
                completions.c.session_id,
                completions.c.depth,
                completions.c.request,
                completions.c.prompt_ids,
                completions.c.prompt_len,
                completions.c.output_ids,
                completions.c.response,
            ).where(completions.c.id == current)
        ).one()
        chain.append(row)
        current = None if starts_segment(row) else row.parent_id
    full = array("i")
    for row in reversed(chain):
        full.extend(unpack_ints(row.prompt_ids))
        full.extend(unpack_ints(row.output_ids))
    node_row = chain[0]
    output = unpack_ints(node_row.output_ids)
    return Node(
        id=node_row.id,
        session_id=node_row.session_id,
        auto=auto,
        depth=node_row.depth,
        num_messages=int(node_row.request.get("num_messages", 0)) + 1,
        full_ids=full,
        ended_with_eos=bool(output) and output[-1] in eos_ids,
        reasoning=(node_row.response or {}).get("reasoning_content") or "",
    )


async def find_parent(
    db: Database,
    cache: NodeCache,
    candidates: list[tuple[int, str]],
    session_id: str | None,
    eos_ids: set[int],
) -> Node | None:
    node = find_parent_cached(cache, candidates, session_id)
    if node is not None or not candidates:
        return node
    node = await db.aread(lambda c: find_parent_in_store(c, candidates, session_id, eos_ids))
    return node


def session_rows(conn: Connection, session_id: str) -> tuple[Any, list[Any]]:
    """A session row and its completion rows in creation order."""
    session = conn.execute(select(sessions).where(sessions.c.id == session_id)).first()
    rows = conn.execute(
        select(completions)
        .where(completions.c.session_id == session_id)
        .order_by(completions.c.created_at, completions.c.id)
    ).all()
    return session, rows


def full_messages(rows: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """Each completion's full request messages, rebuilt from the new messages stored per node."""
    by_id = {r.id: r for r in rows}
    memo: dict[str, list[dict[str, Any]]] = {}

    def messages_of(row: Any) -> list[dict[str, Any]]:
        if row.id in memo:
            return memo[row.id]
        new = list(row.request.get("messages", []))
        parent = by_id.get(row.parent_id) if row.parent_id else None
        msgs = [*messages_of(parent), parent.response, *new] if parent is not None else new
        memo[row.id] = msgs
        return msgs

    for row in rows:
        messages_of(row)
    return memo


def starts_segment(row: Any) -> bool:
    """Whether a row's prompt ids are its whole prompt: a root, or a turn whose chat template
    re-rendered the history (Qwen3 dropping past reasoning), recorded as a new token sequence
    linked to its parent. Every other row stores only the ids beyond its parent's sequence."""
    return row.parent_id is None or len(row.prompt_ids or b"") // 4 == row.prompt_len


def full_prompts(rows: list[Any]) -> dict[str, list[int]]:
    """Each completion's full prompt ids: parent prompt + parent output + its own new ids (a
    segment's own ids alone)."""
    by_id = {r.id: r for r in rows}
    prompts: dict[str, list[int]] = {}
    for row in sorted(rows, key=lambda r: r.depth):
        parent = by_id.get(row.parent_id) if row.parent_id and not starts_segment(row) else None
        base = prompts[parent.id] + unpack_ints(parent.output_ids) if parent is not None else []
        prompts[row.id] = base + unpack_ints(row.prompt_ids)
    return prompts
