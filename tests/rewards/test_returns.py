"""Tree returns G(n) = r(n) + γ · agg(G(children)), checked against numbers worked by hand,
then end to end: a real branched tree built with the openai client, per-completion rewards
posted over HTTP, and the returns the server stored after finish."""

from __future__ import annotations

import sys

import openai
import pytest

from rewards.returns import tree_returns

GAMMA = 0.9


def chain(rewards: list[float | None]) -> list[tuple[str, str | None, float | None]]:
    """A linear conversation t0 → t1 → ... with the given raw rewards."""
    return [(f"t{k}", f"t{k - 1}" if k else None, r) for k, r in enumerate(rewards)]


def test_linear_chain_discounts_the_final_reward():
    returns = tree_returns(chain([None, None, None, 1.0]), GAMMA)
    # G(t3) = 1
    # G(t2) = 0 + 0.9 · 1    = 0.9
    # G(t1) = 0 + 0.9 · 0.9  = 0.81
    # G(t0) = 0 + 0.9 · 0.81 = 0.729
    assert returns == pytest.approx({"t0": 0.729, "t1": 0.81, "t2": 0.9, "t3": 1.0})


def test_branches_are_averaged_or_maxed():
    nodes = [("root", None, None), ("good", "root", 1.0), ("bad", "root", 0.0)]
    # mean: G(root) = 0 + 0.9 · (1 + 0) / 2 = 0.45
    assert tree_returns(nodes, GAMMA) == pytest.approx({"root": 0.45, "good": 1.0, "bad": 0.0})
    # max:  G(root) = 0 + 0.9 · max(1, 0) = 0.9
    assert tree_returns(nodes, GAMMA, agg="max") == pytest.approx({"root": 0.9, "good": 1.0, "bad": 0.0})


def test_intermediate_rewards_add_to_the_discounted_future():
    returns = tree_returns(chain([0.0, 0.5, 0.0, 1.0]), GAMMA)
    # G(t3) = 1
    # G(t2) = 0   + 0.9 · 1     = 0.9
    # G(t1) = 0.5 + 0.9 · 0.9   = 0.5 + 0.81 = 1.31
    # G(t0) = 0   + 0.9 · 1.31  = 1.179
    assert returns == pytest.approx({"t0": 1.179, "t1": 1.31, "t2": 0.9, "t3": 1.0})


def test_a_deeper_reward_never_reaches_the_sibling_branch():
    #        root
    #       /    \
    #      a      b           a, b, b1: raw 0
    #     / \      \
    #   a1   a2     b1        a1: raw 1 (two levels down), a2: raw 0.5
    nodes = [
        ("root", None, 0.0),
        ("a", "root", 0.0),
        ("b", "root", 0.0),
        ("a1", "a", 1.0),
        ("a2", "a", 0.5),
        ("b1", "b", 0.0),
    ]
    returns = tree_returns(nodes, GAMMA)
    # G(a)    = 0 + 0.9 · (1 + 0.5) / 2 = 0.675
    # G(b)    = 0 + 0.9 · 0             = 0       (nothing from a's subtree)
    # G(root) = 0 + 0.9 · (0.675 + 0) / 2 = 0.30375
    assert returns == pytest.approx({"root": 0.30375, "a": 0.675, "b": 0.0, "a1": 1.0, "a2": 0.5, "b1": 0.0})


def test_order_of_nodes_does_not_matter_and_missing_parents_make_roots():
    nodes = chain([None, None, 2.0])
    # children listed before their parents; "x" continues a parent outside the set, so it is a root
    shuffled = [nodes[2], ("x", "gone", 1.0), nodes[0], nodes[1]]
    # G(t2) = 2, G(t1) = 0.9 · 2 = 1.8, G(t0) = 0.9 · 1.8 = 1.62; G(x) = 1
    assert tree_returns(shuffled, GAMMA) == pytest.approx({"t0": 1.62, "t1": 1.8, "t2": 2.0, "x": 1.0})


def test_gamma_zero_keeps_raw_rewards_and_one_sums_them():
    nodes = chain([0.25, None, 1.0])
    assert tree_returns(nodes, 0.0) == pytest.approx({"t0": 0.25, "t1": 0.0, "t2": 1.0})
    # γ = 1: G(t1) = 0 + 1 = 1, G(t0) = 0.25 + 1 = 1.25
    assert tree_returns(nodes, 1.0) == pytest.approx({"t0": 1.25, "t1": 1.0, "t2": 1.0})


def test_unknown_aggregate_is_refused():
    with pytest.raises(ValueError, match="mean' or 'max"):
        tree_returns(chain([1.0]), GAMMA, agg="min")


def test_five_thousand_turns_do_not_recurse():
    depth = 5000
    assert depth > sys.getrecursionlimit() - 100, "the check only means something past the recursion limit"
    rewards: list[float | None] = [None] * depth
    rewards[-1] = 1.0
    returns = tree_returns(chain(rewards), 0.999)
    # turn k of N gets γ^(N-1-k) · R
    assert returns["t4999"] == 1.0
    assert returns["t0"] == pytest.approx(0.999**4999)
    assert returns["t2500"] == pytest.approx(0.999**2499)


# -- through the server ------------------------------------------------------------------------


def _continue(client: openai.OpenAI, history: list[dict], reply: str, question: str, **kw) -> tuple:
    messages = [*history, {"role": "assistant", "content": reply}, {"role": "user", "content": question}]
    return client.chat.completions.create(model="m", messages=messages, max_tokens=6, **kw), messages


def test_server_stores_tree_returns_of_posted_rewards(rewards_proxy):
    # The tree, from n=2 at turn 1 (two roots) and n=2 again on A0:
    #         A0          A1
    #        /  \          |
    #      B0    B1        C
    #      |
    #      D
    proxy = rewards_proxy
    session = proxy.new_session(task_id="returns-tree")
    sid = session["session_id"]
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    ask = [{"role": "user", "content": "Pick a number."}]
    first = client.chat.completions.create(model="m", messages=ask, n=2, max_tokens=6, seed=5)
    a0, a1 = first.choices
    assert a0.message.content != a1.message.content, "the branches must differ to be told apart"
    second, history_b = _continue(client, ask, a0.message.content, "Why?", n=2, seed=11)
    b0, b1 = second.choices
    assert b0.message.content != b1.message.content
    c, _ = _continue(client, ask, a1.message.content, "Why?")
    d, _ = _continue(client, history_b, b0.message.content, "Are you sure?")
    ids = {"A0": first.id, "A1": f"{first.id}-1", "B0": second.id, "B1": f"{second.id}-1", "C": c.id, "D": d.id}
    nodes = {n["id"]: n for n in proxy.session(sid)["completions"]}
    parent_of = {name: nodes[cid]["parent_id"] for name, cid in ids.items()}
    assert parent_of == {
        "A0": None,
        "A1": None,
        "B0": ids["A0"],
        "B1": ids["A0"],
        "C": ids["A1"],
        "D": ids["B0"],
    }

    posts = [({"completion_id": ids["B1"], "reward": 0.5}, "B1"), ({"completion_id": ids["C"], "reward": 1}, "C")]
    posts.append(({"reward": 0.25}, "D"))  # no completion_id: the most recent completion, D
    for body, target in posts:
        r = proxy.post(f"/sessions/{sid}/reward", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["completion_id"] == ids[target]
    done = proxy.post(f"/sessions/{sid}/finish", json={"reward": 1.0})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "finished" and done.json()["reward"] == 1.0

    stored = {n["id"]: n for n in proxy.session(sid)["completions"]}
    raw = {name: stored[cid]["reward"] for name, cid in ids.items()}
    got = {name: stored[cid]["return"] for name, cid in ids.items()}
    # raw: D = 0.25 posted + 1.0 from finish (added to the last completion) = 1.25; B1 = 0.5; C = 1;
    # the unrewarded turns stay None (r = 0 in the returns)
    assert raw == {"A0": None, "A1": None, "B0": None, "B1": 0.5, "C": 1.0, "D": pytest.approx(1.25)}
    # G(D)  = 1.25                    G(B1) = 0.5      G(C) = 1
    # G(B0) = 0 + 0.9 · 1.25          = 1.125
    # G(A0) = 0 + 0.9 · (1.125 + 0.5) / 2 = 0.9 · 0.8125 = 0.73125
    # G(A1) = 0 + 0.9 · 1             = 0.9
    expected = {"A0": 0.73125, "A1": 0.9, "B0": 1.125, "B1": 0.5, "C": 1.0, "D": 1.25}
    assert got == pytest.approx(expected)
    again = tree_returns(((n["id"], n["parent_id"], n["reward"]) for n in stored.values()), GAMMA)
    assert {cid: n["return"] for cid, n in stored.items()} == pytest.approx(again)
