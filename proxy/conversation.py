"""Canonical chat messages and the hashes that link a request to its parent turn.

Clients resend the whole conversation every turn, re-serialized: `content: null`
may come back as `""`, text parts as a list, but tool-call ids, names and argument
strings come back verbatim. Each message is reduced to a canonical key of exactly
the fields that survive that round trip, and keys are chained into prefix hashes:
`h_k` names the conversation `messages[:k]`. A completion is stored under the hash
of its request plus its reply, so a later request whose prefix hash matches it
continues it — found in O(turns) index lookups, in memory or in SQL, on any replica.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

from proxy.errors import invalid_request

ROLES = ("system", "developer", "user", "assistant", "tool")
_EMPTY = hashlib.blake2b(b"areal-proxy/conversation/v1", digest_size=16).hexdigest()


def content_text(content: Any, param: str) -> str:
    """OpenAI content (string, null, or a list of text parts) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
                continue
            if not isinstance(part, dict):
                raise invalid_request(f"{param}[{i}] must be a content part object", f"{param}[{i}]")
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                parts.append(part["refusal"])
            else:
                raise invalid_request(f"content part type {kind!r} is not supported (text only)", f"{param}[{i}].type")
        return "\n".join(parts)
    raise invalid_request(f"{param} must be a string, a list of content parts, or null", param)


def normalize_messages(raw: Any) -> list[dict[str, Any]]:
    """Validate chat messages and return them in canonical form.

    Canonical: role in ROLES (developer → system), content a string, assistant
    tool_calls as [{id, type: function, function: {name, arguments: str}}], tool
    messages with the tool_call_id of an earlier assistant tool call.
    """
    if not isinstance(raw, list):
        raise invalid_request("messages must be an array of message objects", "messages")
    if not raw:
        raise invalid_request("messages must contain at least one message", "messages")
    out: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    for i, msg in enumerate(raw):
        param = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid_request(f"{param} must be an object", param)
        role = msg.get("role")
        if role not in ROLES:
            raise invalid_request(
                f"{param}.role {role!r} is not one of {', '.join(ROLES)}", f"{param}.role", code="invalid_value"
            )
        m: dict[str, Any] = {"role": "system" if role == "developer" else role}
        m["content"] = content_text(msg.get("content"), f"{param}.content")
        if msg.get("name") is not None:
            if not isinstance(msg["name"], str):
                raise invalid_request(f"{param}.name must be a string", f"{param}.name")
            m["name"] = msg["name"]
        if role == "assistant":
            calls = _tool_calls(msg.get("tool_calls"), param)
            if calls:
                m["tool_calls"] = calls
                open_calls.update(c["id"] for c in calls)
            reasoning = msg.get("reasoning_content") or msg.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                m["reasoning_content"] = reasoning
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid_request(f"{param}.tool_call_id is required for tool messages", f"{param}.tool_call_id")
            if call_id not in open_calls:
                raise invalid_request(
                    f"{param}.tool_call_id {call_id!r} does not match any tool call of an earlier assistant message",
                    f"{param}.tool_call_id",
                )
            m["tool_call_id"] = call_id
        out.append(m)
    return out


def _tool_calls(raw: Any, param: str) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid_request(f"{param}.tool_calls must be an array", f"{param}.tool_calls")
    calls = []
    for j, call in enumerate(raw):
        p = f"{param}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid_request(f"{p}.function.name is required", f"{p}.function")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid_request(f"{p}.id is required", f"{p}.id")
        arguments = fn.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append({"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": arguments}})
    return calls


def message_key(m: dict[str, Any]) -> bytes:
    """The fields of a canonical message that survive a client round trip, as compact UTF-8 JSON.

    The stored chain hashes were made from `json.dumps(key, ensure_ascii=False, separators=(",",
    ":")).encode()`; orjson writes the same bytes for every character (tested over all of Unicode)
    at a twentieth of the cost, which every call pays for every message of its conversation."""
    calls = [[c["id"], c["function"]["name"], c["function"]["arguments"]] for c in m.get("tool_calls") or ()]
    key = [m["role"], m.get("content") or "", calls, m.get("tool_call_id") or "", m.get("name") or ""]
    return orjson.dumps(key)


def extend_hash(prev: str, message: dict[str, Any]) -> str:
    h = hashlib.blake2b(prev.encode(), digest_size=16)
    h.update(message_key(message))
    return h.hexdigest()


def prefix_hashes(messages: list[dict[str, Any]]) -> list[str]:
    """h[k] names messages[:k]; h[0] is the empty conversation."""
    hashes = [_EMPTY]
    for m in messages:
        hashes.append(extend_hash(hashes[-1], m))
    return hashes


def parent_candidates(messages: list[dict[str, Any]], hashes: list[str]) -> list[tuple[int, str]]:
    """(k, h[k]) for every prefix ending in an assistant turn, longest first."""
    return [(k, hashes[k]) for k in range(len(messages), 0, -1) if messages[k - 1]["role"] == "assistant"]
