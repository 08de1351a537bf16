"""Token exactness: each turn extends its parent's exact sampled tokens, and the stored
logprobs are what the model gives those ids in a fresh forward pass."""

from __future__ import annotations

import openai
import torch

from tests.proxy.test_chat_api import NAMED, SYSTEM, WEATHER


def five_turns(proxy) -> tuple[str, list[str]]:
    session = proxy.new_session(task_id="exact", seed=11)
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    messages = [SYSTEM, {"role": "user", "content": "What's the weather in Paris?"}]
    ids = []
    # turn 1: a tool call (greedy: logprobs are then reported under the untempered model)
    r = client.chat.completions.create(
        model="m", messages=messages, tools=[WEATHER], tool_choice=NAMED, max_tokens=40, temperature=0
    )
    assert r.choices[0].message.tool_calls, r.choices[0].message.content
    ids.append(r.id)
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    call_id = r.choices[0].message.tool_calls[0].id
    messages.append({"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 degrees"})
    # turns 2..5: text, the tool result sits in the middle of the conversation
    for question in [None, "And tomorrow?", "Should I take an umbrella?", "Thanks! Anything else?"]:
        if question:
            messages.append({"role": "user", "content": question})
        r = client.chat.completions.create(
            model="m", messages=messages, tools=[WEATHER], max_tokens=24, temperature=1.0
        )
        ids.append(r.id)
        reply = r.choices[0].message.model_dump(exclude_none=True)
        if "content" not in reply:
            reply["content"] = None
        messages.append(reply)
    return session["session_id"], ids


def test_five_turns_with_tool_result_are_token_exact(proxy, reference_model):
    session_id, ids = five_turns(proxy)
    nodes = {n["id"]: n for n in proxy.session(session_id)["completions"]}
    assert [nodes[i]["parent_id"] for i in ids] == [None, *ids[:-1]], "each turn continues the previous one"
    assert [nodes[i]["depth"] for i in ids] == [0, 1, 2, 3, 4]
    for parent_id, child_id in zip(ids, ids[1:]):
        parent, child = nodes[parent_id], nodes[child_id]
        parent_full = parent["prompt_ids"] + parent["output_ids"]
        child_full = child["prompt_ids"] + child["output_ids"]
        assert child_full[: len(parent_full)] == parent_full
    # The last node's sequence holds every turn's sampled tokens: recompute them all at once.
    last = nodes[ids[-1]]
    full = last["prompt_ids"] + last["output_ids"]
    with torch.no_grad():
        logprobs = torch.log_softmax(reference_model(torch.tensor([full])).logits[0].float(), dim=-1)
    checked = 0
    for node_id in ids:
        node = nodes[node_id]
        start = len(node["prompt_ids"])
        assert full[start : start + len(node["output_ids"])] == node["output_ids"]
        if node["sampling"]["tool_choice"] != "auto":
            continue  # a required call is sampled under its grammar's mask: logprobs of the masked distribution
        for offset, (tok, stored) in enumerate(zip(node["output_ids"], node["output_logprobs"])):
            fresh = logprobs[start + offset - 1, tok].item()
            assert abs(fresh - stored) < 1e-3, (node_id, offset, fresh, stored)
            checked += 1
    assert checked >= 20


def test_new_conversation_is_a_new_root(proxy):
    session = proxy.new_session()
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    a = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    edited = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    b = client.chat.completions.create(model="m", messages=edited, max_tokens=5)
    nodes = {n["id"]: n for n in proxy.session(session["session_id"])["completions"]}
    assert nodes[b.id]["parent_id"] is None, "a history the proxy never produced starts a new root"


def test_branching_from_one_parent(proxy):
    session = proxy.new_session()
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    first = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Pick a number."}], n=2, max_tokens=6, seed=5
    )
    children = []
    for choice in first.choices:
        history = [
            {"role": "user", "content": "Pick a number."},
            {"role": "assistant", "content": choice.message.content},
            {"role": "user", "content": "Why?"},
        ]
        children.append(client.chat.completions.create(model="m", messages=history, max_tokens=6))
    nodes = {n["id"]: n for n in proxy.session(session["session_id"])["completions"]}
    parents = {nodes[c.id]["parent_id"] for c in children}
    assert parents == {first.id, f"{first.id}-1"}, "each branch continues the choice it echoes"
