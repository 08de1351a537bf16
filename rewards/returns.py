"""Tree-aware discounted returns, computed from raw per-completion rewards.

    G(n) = r(n) + γ · agg(G(c) for c in children(n)),   G(leaf) = r(leaf)

with agg = mean (default) or max, γ = `[rewards] discount`. Unrewarded nodes have
r = 0. Because a node only sees its own subtree, a reward never leaks between
sibling branches, unlike discounting over completions in time order. On a linear
chain of N turns with one final reward R, turn k gets γ^(N-1-k) · R.
"""

from __future__ import annotations

from collections.abc import Iterable


def children_first(parents: dict[str, str | None]) -> tuple[list[str], dict[str, list[str]]]:
    """The nodes of a forest given as {id: parent_id}, each after all of its children, and each node's
    children (in the order given); a parent outside the set makes its node a root. Iterative: a deep
    agent episode must not hit the recursion limit."""
    children: dict[str, list[str]] = {node_id: [] for node_id in parents}
    for node_id, parent_id in parents.items():
        if parent_id in children:
            children[parent_id].append(node_id)
    order: list[str] = []
    for root in [n for n, p in parents.items() if p not in children]:
        stack = [(root, False)]
        while stack:
            node_id, expanded = stack.pop()
            kids = children[node_id]
            if not expanded and kids:
                stack.append((node_id, True))
                stack.extend((k, False) for k in kids)
                continue
            order.append(node_id)
    return order, children


def tree_returns(
    nodes: Iterable[tuple[str, str | None, float | None]], gamma: float, agg: str = "mean"
) -> dict[str, float]:
    """Returns for (id, parent_id, raw_reward) nodes; parents outside the set are roots."""
    if agg not in ("mean", "max"):
        raise ValueError(f"aggregate must be 'mean' or 'max', not {agg!r}")
    nodes = list(nodes)
    rewards = {node_id: reward or 0.0 for node_id, _, reward in nodes}
    order, children = children_first({node_id: parent_id for node_id, parent_id, _ in nodes})
    returns: dict[str, float] = {}
    for node_id in order:
        kids = children[node_id]
        if not kids:
            returns[node_id] = rewards[node_id]
        else:
            values = [returns[k] for k in kids]
            pooled = sum(values) / len(values) if agg == "mean" else max(values)
            returns[node_id] = rewards[node_id] + gamma * pooled
    return returns
