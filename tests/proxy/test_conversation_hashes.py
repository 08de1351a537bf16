"""The chain hashes that find a call's parent are stored with every turn: a store written by an
earlier version must still be continued. They hash `message_key`, whose bytes must stay those of
`json.dumps(key, ensure_ascii=False, separators=(",", ":")).encode()`, the encoding they were first
made with, now written by orjson."""

from __future__ import annotations

import json

from proxy.conversation import message_key, prefix_hashes

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": 'Zürich → 東京? \u2028 \x07 "q" \\ \U0001f600'},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "route", "arguments": '{"from": "Zürich"}'}}
        ],
    },
    {"role": "tool", "content": "12 h", "tool_call_id": "call_1"},
]


def _reference_key(m: dict) -> bytes:
    calls = [[c["id"], c["function"]["name"], c["function"]["arguments"]] for c in m.get("tool_calls") or ()]
    key = [m["role"], m.get("content") or "", calls, m.get("tool_call_id") or "", m.get("name") or ""]
    return json.dumps(key, ensure_ascii=False, separators=(",", ":")).encode()


def test_the_key_is_the_first_encoding_for_every_character() -> None:
    code_points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]  # all of Unicode but surrogates
    for start in range(0, len(code_points), 1024):
        text = "".join(map(chr, code_points[start : start + 1024]))
        call = {"id": text, "function": {"name": "f", "arguments": text}}
        message = {"role": "assistant", "content": text, "tool_calls": [call], "name": text}
        assert message_key(message) == _reference_key(message), f"code points from {start:#x}"


def test_the_chain_hashes_of_a_conversation_are_those_stores_hold() -> None:
    # Computed by the json.dumps encoding (before orjson wrote the keys); a change here orphans every
    # stored conversation's next turn.
    assert prefix_hashes(CONVERSATION) == [
        "30585adda36be8401b849cb39db083e4",
        "399dc62a85eb7dd1f48e6f37f0b6f535",
        "7ac2d9c40516d65b543ef5e2aedc68a7",
        "075fadfde8577ec12f3880036e63bb55",
        "e6a8a007ca608fb43214684895fd7138",
    ]
