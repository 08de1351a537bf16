"""What each page's JSON holds: the store's rows shaped for reading, tokens decoded to text.

A session's tree goes out as its nodes, each with only the messages its request added beyond its
parent's conversation (the page rebuilds a node's whole conversation from its ancestors, so a long
episode is not sent once per turn), its reply, and its sampled tokens as text pieces with their
logprobs and policy versions. A node's full prompt, which can be long, is fetched on its own when
the reader opens it (`prompt_view`), with where it stops following its parent's token sequence
when the chat template re-rendered the history.
"""

from __future__ import annotations

from typing import Any

from proxy.store.claims import DROPPED_STALE, SKIPPED_ZERO_VARIANCE
from proxy.store.tokens import unpack_ints
from proxy.store.tree import full_prompts, starts_segment
from proxy.tree_view import node_fields, session_summary
from proxy.ui.advantages import SessionAdvantage
from proxy.ui.tokens import Decode, text_split, token_pieces

DIVERGENCE_CONTEXT = 48
"""Tokens shown on each side where a re-rendered prompt departs from its parent's sequence."""


def fate(row: Any) -> str:
    """Where a session is on its way to the trainer, in words."""
    if row.status == "finished":
        return "evaluation" if row.eval else "finished, not yet claimed"
    if row.status == "training":
        return f"in step {row.claimed_step}"
    if row.status == "consumed":
        if row.consumed_step == DROPPED_STALE:
            return "dropped: stale"
        if row.consumed_step == SKIPPED_ZERO_VARIANCE:
            return row.failure or "skipped"
        return f"trained at step {row.consumed_step}"
    return row.status


def summary(row: Any) -> dict[str, Any]:
    """One session as a list row shows it (`proxy.store.browse.SUMMARY_COLUMNS`): the API's summary, its
    fate and the steps that claimed and consumed it."""
    return {
        **session_summary(row),
        "fate": fate(row),
        "updated_at": row.updated_at,
        "claimed_step": row.claimed_step,
        "consumed_step": row.consumed_step,
    }


def session_view(session: Any, rows: list[Any], decode: Decode | None) -> dict[str, Any]:
    """A session's page: its summary, what only an admin sees, and its tree's nodes."""
    nodes = [_node(r, decode) for r in rows]
    return {
        **summary(session),
        "reference": session.reference,
        "reward_fn": session.reward_fn,
        "metadata": session.metadata or {},
        "seed": session.seed,
        "history_rewrites": sum(n["segment_start"] for n in nodes),
        "tokens_decoded": decode is not None,
        "completions": nodes,
    }


def _node(r: Any, decode: Decode | None) -> dict[str, Any]:
    fields = node_fields(r)
    request = r.request or {}
    return {
        **fields,
        "new_messages": request.get("messages") or [],
        "tools": [_tool_name(t) for t in request.get("tools") or []],
        "prompt_len": r.prompt_len,
        "new_prompt_tokens": len(r.prompt_ids or b"") // 4,
        "output_pieces": token_pieces(decode, fields["output_ids"]) if decode is not None else None,
    }


def _tool_name(tool: Any) -> str:
    if isinstance(tool, dict):
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        return str(fn.get("name", "?"))
    return "?"


def prompt_view(rows: list[Any], node_id: str, decode: Decode | None) -> dict[str, Any] | None:
    """One node's full prompt: the ids the engine was given, split into what its parent's sequence
    held and what its request added; for a node that starts a new sequence, where it departs from
    its parent's. None if the session has no such node."""
    by_id = {r.id: r for r in rows}
    row = by_id.get(node_id)
    if row is None:
        return None
    prompts = full_prompts(rows)
    ids = prompts[node_id]
    new = len(row.prompt_ids or b"") // 4
    segment = row.parent_id is not None and starts_segment(row)
    view: dict[str, Any] = {"id": node_id, "ids": ids, "inherited": len(ids) - new, "segment_start": segment}
    if decode is not None:
        view["inherited_text"], view["new_text"] = text_split(decode, ids, len(ids) - new)
    parent = by_id.get(row.parent_id) if row.parent_id else None
    if segment and parent is not None:
        before = prompts[parent.id] + unpack_ints(parent.output_ids)
        view["divergence"] = _divergence(before, ids, decode)
    return view


def _divergence(parent_seq: list[int], prompt: list[int], decode: Decode | None) -> dict[str, Any]:
    """Where `prompt` stops repeating the parent's sequence (prompt + reply) token for token."""
    at = 0
    for a, b in zip(parent_seq, prompt):
        if a != b:
            break
        at += 1
    out: dict[str, Any] = {"at": at, "parent_tokens": len(parent_seq)}
    if decode is not None:
        lo, hi = max(0, at - DIVERGENCE_CONTEXT), at + DIVERGENCE_CONTEXT
        out["common_text"] = decode(prompt[lo:at])
        out["parent_text"] = decode(parent_seq[at:hi])
        out["prompt_text"] = decode(prompt[at:hi])
    return out


def group_view(
    group_id: str,
    rows: list[Any],
    turns: list[Any],
    advantages: dict[str, SessionAdvantage],
    estimator: str,
    batch_step: int | None,
) -> dict[str, Any]:
    """A group side by side: each session's reward, advantage, fate and final reply, and each turn's
    return and advantage `(return - b) / s`."""
    by_session: dict[str, list[Any]] = {}
    for t in turns:
        by_session.setdefault(t.session_id, []).append(t)
    sessions = []
    for row in rows:
        adv = advantages.get(row.id)
        own = by_session.get(row.id, [])
        sessions.append(
            {
                **summary(row),
                "reference": row.reference,
                "advantage": None if adv is None else _advantage(adv),
                "final": own[-1].response if own else None,
                "turns": [_turn(t, adv) for t in own],
            }
        )
    scored = [s["reward"] for s in sessions if s["reward"] is not None]
    return {
        "group_id": group_id,
        "estimator": estimator,
        "batch_step": batch_step,
        "sessions": sessions,
        "stats": _stats(scored),
    }


def _advantage(adv: SessionAdvantage) -> dict[str, Any]:
    return {
        "reward": adv.reward,
        "baseline": adv.baseline,
        "scale": adv.scale,
        "value": adv.advantage,
        "flat": adv.flat,
        "unsolved": adv.unsolved,
    }


def _turn(t: Any, adv: SessionAdvantage | None) -> dict[str, Any]:
    ret = t.ret if t.ret is not None else (t.reward or 0.0)  # as the trainer reads it
    advantage = None
    if adv is not None:
        advantage = 0.0 if adv.flat and not adv.unsolved else (ret - adv.baseline) / adv.scale
    return {
        "id": t.id,
        "parent_id": t.parent_id,
        "depth": t.depth,
        "finish_reason": t.finish_reason,
        "reward": t.reward,
        "return": t.ret,
        "advantage": advantage,
    }


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    n = len(values)
    mean = sum(values) / n
    std = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else 0.0
    return {
        "n": n,
        "mean": mean,
        "std": std,
        "min": min(values),
        "max": max(values),
        "flat": min(values) == max(values),
    }
