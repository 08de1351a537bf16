"""A session's recorded tree as JSON: every node with its messages and exact tokens.

Rows store only the prompt ids beyond the parent's sequence; here each node's
full prompt is rebuilt (parent prompt + parent output + its own new ids), so a
reader sees exactly the ids the engine was given and sampled. A node whose chat
template re-rendered the history starts a new sequence (`segment_start`);
`history_rewrites` counts them.
"""

from __future__ import annotations

from typing import Any

from proxy.store.tokens import unpack_floats, unpack_ints
from proxy.store.tree import full_messages, full_prompts, starts_segment


def session_summary(r: Any) -> dict[str, Any]:
    """A session row as the session listings and reads show it (the UI's rows add to it)."""
    return {
        "session_id": r.id,
        "status": r.status,
        "task_id": r.task_id,
        "group_id": r.group_id,
        "auto": r.auto,
        "eval": r.eval,
        "temperature": r.temperature,
        "reward": r.reward,
        "failure": r.failure,
        "num_completions": r.num_completions,
        "created_at": r.created_at,
        "finished_at": r.finished_at,
        "min_version": r.min_version,
        "max_version": r.max_version,
    }


def node_fields(r: Any) -> dict[str, Any]:
    """What every view of a recorded turn shows: its place in the tree, the request's sampling, the reply,
    and the exact sampled tokens with their logprobs, versions, reward and return."""
    request = r.request or {}
    return {
        "id": r.id,
        "parent_id": r.parent_id,
        "response_id": r.response_id,
        "choice_index": r.choice_index,
        "api": r.api,
        "depth": r.depth,
        "created_at": r.created_at,
        **({"prompt": request["prompt"]} if "prompt" in request else {}),
        "sampling": request.get("sampling") or {},
        "response": r.response,
        "finish_reason": r.finish_reason,
        "segment_start": r.parent_id is not None and starts_segment(r),
        "output_ids": unpack_ints(r.output_ids),
        "output_logprobs": unpack_floats(r.output_logprobs),
        "output_versions": unpack_ints(r.output_versions),
        "temperature": r.temperature,
        "reward": r.reward,
        "return": r.ret,
        "superseded_by": r.superseded_by,  # a client's resend replaced it: never trained
    }


def session_payload(session: Any, rows: list[Any]) -> dict[str, Any]:
    messages = full_messages(rows)
    prompts = full_prompts(rows)
    nodes = [
        {
            **node_fields(r),
            "messages": messages[r.id],
            "tools": r.request.get("tools") or [],
            "prompt_ids": prompts[r.id],
        }
        for r in rows
    ]
    return {
        "metadata": session.metadata or {},
        "reference": session.reference,
        "reward_fn": session.reward_fn,
        "history_rewrites": sum(n["segment_start"] for n in nodes),
        "completions": nodes,
    }
