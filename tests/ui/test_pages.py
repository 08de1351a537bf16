"""The UI in a real headless Chromium over a store filled by a short real run (tests/ui/conftest.py).

What a page shows is checked against the proxy's own API: the sessions listed, a tree's node count,
each node's reward and return, a group's advantages (against `trainer/advantages.py` on the API's
rewards), a run's curves against its metrics.jsonl. Every page is screenshotted and must log no
console error (the `page` fixture).
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

from proxy.sessions import hash_key
from tests.ui.conftest import ADMIN_KEY, GROUP, KEY_STORAGE, UIProxy
from trainer.advantages import ADVANTAGES
from trainer.metrics import MetricsSink, read_metrics


def goto(page, base: str, route: str) -> None:
    """Open a view and wait until the page has rendered it (not the view it showed before)."""
    page.tab.goto(f"{base}/ui/#{route}")
    page.tab.wait_for_function("hash => document.querySelector('#main').dataset.rendered === hash", arg=f"#{route}")


def shown(text: str) -> float | None:
    """A number as the page prints it ("–" for none)."""
    return None if text in ("–", "") else float(text.replace("+", ""))


def close(text: str, value: float | None) -> bool:
    """The page prints 4 significant digits: equal to the API's value at that precision."""
    if value is None:
        return shown(text) is None
    return shown(text) == pytest.approx(value, rel=1e-3, abs=1e-6)


def exact(attr: str | None, value: float | None) -> bool:
    """A data attribute holds the full value ("" for none)."""
    return (attr in ("", None)) if value is None else float(attr) == value


def all_sessions(proxy: UIProxy) -> list[dict]:
    return proxy.api("/sessions", limit=1000)["data"]


def test_sessions_page_lists_what_the_api_lists(ui_proxy, page):
    sessions = all_sessions(ui_proxy)
    goto(page, ui_proxy.server.url, "/sessions?limit=500")
    page.tab.wait_for_selector("#sessions tbody tr")
    rows = page.tab.locator("#sessions tbody tr").evaluate_all(
        "rows => rows.map(r => ({id: r.dataset.sessionId, reward: r.querySelector('.reward').dataset.value,"
        " text: r.querySelector('.reward').textContent}))"
    )
    assert sorted(r["id"] for r in rows) == sorted(s["session_id"] for s in sessions)
    by_id = {s["session_id"]: s for s in sessions}
    for row in rows:
        assert exact(row["reward"], by_id[row["id"]]["reward"]) and close(row["text"], by_id[row["id"]]["reward"])
    created = [by_id[r["id"]]["created_at"] for r in rows]
    assert created == sorted(created, reverse=True), "newest first"
    assert page.tab.inner_text("#range") == f"1–{len(sessions)} of {len(sessions)}"
    for status in ("consumed", "failed", "finished"):
        total = ui_proxy.api("/sessions", status=status, limit=1)["total"]
        assert page.tab.inner_text(f"#counts [data-status={status}] b") == str(total)


def test_filters_and_keyset_pages(ui_proxy, page):
    evaluation = ui_proxy.api("/sessions", eval="true", limit=1000)["data"]
    assert evaluation, "the run evaluated"
    goto(page, ui_proxy.server.url, "/sessions?eval=true&limit=500")
    page.tab.wait_for_selector("#sessions tbody tr")
    ids = page.tab.locator("#sessions tbody tr").evaluate_all("rows => rows.map(r => r.dataset.sessionId)")
    assert sorted(ids) == sorted(s["session_id"] for s in evaluation)

    everything = [s["session_id"] for s in all_sessions(ui_proxy)]
    goto(page, ui_proxy.server.url, "/sessions?limit=5")
    page.tab.wait_for_selector("#sessions tbody tr")
    first = page.tab.locator("#sessions tbody tr").evaluate_all("rows => rows.map(r => r.dataset.sessionId)")
    page.tab.click("#older")
    page.tab.wait_for_function("() => document.querySelector('#range').textContent.startsWith('6–')")
    second = page.tab.locator("#sessions tbody tr").evaluate_all("rows => rows.map(r => r.dataset.sessionId)")
    assert len(first) == len(second) == 5 and not set(first) & set(second)
    assert set(first + second) <= set(everything)
    assert page.tab.inner_text("#range") == f"6–10 of {len(everything)}"
    page.tab.click("#newer")
    page.tab.wait_for_function("() => document.querySelector('#range').textContent.startsWith('1–')")
    again = page.tab.locator("#sessions tbody tr").evaluate_all("rows => rows.map(r => r.dataset.sessionId)")
    assert again == first
    assert page.tab.locator("#newer").is_disabled()


def tree_nodes(page) -> dict[str, dict]:
    nodes = page.tab.locator("#tree .node").evaluate_all(
        "nodes => nodes.map(n => ({id: n.dataset.nodeId, reward: n.dataset.reward, ret: n.dataset.return,"
        " r: n.querySelector('.r').textContent, g: n.querySelector('.g').textContent,"
        " a: n.querySelector('.a') && n.querySelector('.a').textContent}))"
    )
    return {n["id"]: n for n in nodes}


def test_from_the_list_into_a_branched_tree_and_into_its_group(ui_proxy, page):
    sid = ui_proxy.group["branched"]
    session = ui_proxy.server.session(sid)
    goto(page, ui_proxy.server.url, f"/sessions?group={GROUP}")
    page.tab.click(f"tr[data-session-id='{sid}'] a.session-link")
    page.tab.wait_for_selector("#tree .node")
    page.tab.wait_for_selector("#session-advantage[data-value]")  # the group's advantages arrived

    nodes = tree_nodes(page)
    assert len(nodes) == len(session["completions"]) == int(page.tab.inner_text("#node-count")) == 3
    for node in session["completions"]:
        seen = nodes[node["id"]]
        assert exact(seen["reward"], node["reward"]) and close(seen["r"], node["reward"])
        assert exact(seen["ret"], node["return"]) and close(seen["g"], node["return"])
    assert exact(page.tab.get_attribute("#session-reward", "data-value"), session["reward"])
    assert page.tab.locator("#tree .badge.seg").count() == session["history_rewrites"] == 2
    assert page.tab.locator("#tree .badge", has_text="2 branches").count() == 1

    # The group: each session's reward and the trainer's own advantages on the API's rewards.
    members = {s: ui_proxy.server.session(s) for s in ui_proxy.group.values()}
    rewards = torch.tensor([members[s]["reward"] for s in ui_proxy.group.values()], dtype=torch.float64)
    expected = ADVANTAGES["grpo"](rewards, torch.zeros(len(rewards), dtype=torch.long))
    mine = list(ui_proxy.group.values()).index(sid)
    baseline, scale = float(expected.baseline[mine]), float(expected.scale[mine])
    for node in session["completions"]:  # each turn is trained with (return - b) / s
        assert close(nodes[node["id"]]["a"], (node["return"] - baseline) / scale)
    advantage = float(page.tab.get_attribute("#session-advantage", "data-value"))
    assert advantage == pytest.approx(float(expected.values[mine]))

    page.tab.click(".crumbs a:has-text('group')")
    page.tab.wait_for_selector("#cards .card")
    cards = page.tab.locator("#cards .card").evaluate_all(
        "cards => cards.map(c => ({id: c.dataset.sessionId, reward: c.dataset.reward, advantage: c.dataset.advantage,"
        " shown: c.querySelector('.adv').textContent}))"
    )
    assert sorted(c["id"] for c in cards) == sorted(ui_proxy.group.values())
    for i, sid_i in enumerate(ui_proxy.group.values()):
        card = next(c for c in cards if c["id"] == sid_i)
        assert exact(card["reward"], members[sid_i]["reward"])
        assert float(card["advantage"]) == pytest.approx(float(expected.values[i]), abs=1e-12)
        assert close(card["shown"], float(expected.values[i]))
    assert page.tab.inner_text("#group-size") == "3"


def test_a_tool_calling_episode_shows_its_calls_results_and_tokens(ui_proxy, page):
    trained = [s for s in all_sessions(ui_proxy) if s["status"] == "consumed" and s["num_completions"] >= 2]
    session = ui_proxy.server.session(trained[0]["session_id"])
    first, second = session["completions"][:2]
    assert first["response"]["tool_calls"], "the agent's first call is a forced tool call"
    goto(page, ui_proxy.server.url, f"/session/{session['session_id']}?node={second['id']}")
    page.tab.wait_for_selector("#tree .node")
    name = first["response"]["tool_calls"][0]["function"]["name"]
    assert f"→ {name}" in page.tab.inner_text(f"#tree .node[data-node-id='{first['id']}']")
    results = [m for m in second["messages"] if m["role"] == "tool"]
    assert results, "the tool's result is in the next call's request"
    shown_results = page.tab.locator("#detail .msg.tool .body").all_inner_texts()
    assert str(results[-1]["content"]).strip() in [t.strip() for t in shown_results]
    assert page.tab.locator("#tokens .tok").count() == len(second["output_ids"])
    page.tab.click("button[data-heat=version]")
    versions = sorted(set(second["output_versions"]))
    legend = page.tab.inner_text("#detail .legend")
    assert all(f"v{v}:" in legend for v in versions)
    page.screenshot("versions")


def test_a_new_sequence_shows_where_its_prompt_departs_from_the_parents(ui_proxy, page):
    session = ui_proxy.server.session(ui_proxy.group["branched"])
    by_id = {n["id"]: n for n in session["completions"]}
    node = next(n for n in session["completions"] if n["segment_start"])
    parent = by_id[node["parent_id"]]
    before = parent["prompt_ids"] + parent["output_ids"]
    at = next((i for i, (a, b) in enumerate(zip(before, node["prompt_ids"])) if a != b), len(before))
    goto(page, ui_proxy.server.url, f"/session/{session['session_id']}?node={node['id']}")
    page.tab.wait_for_selector("#segment-note")
    page.tab.click("#prompt-panel summary")
    page.tab.wait_for_selector("#prompt-panel .diverge")
    text = page.tab.inner_text("#prompt-panel .diverge p")
    assert f"for {at} of its {len(before)} tokens" in text
    page.tab.click("#prompt-panel details summary")
    assert json.loads(page.tab.inner_text("#prompt-panel details pre")) == node["prompt_ids"]


def test_the_run_page_plots_the_runs_metrics_and_follows_new_rows(ui_proxy, page):
    run_dir = ui_proxy.run.run_dir
    rows = read_metrics(run_dir)
    train = [r for r in rows if "reward_mean" in r]
    evals = [r for r in rows if "eval_accuracy" in r]
    assert train and evals and any("loss" in r for r in train)
    goto(page, ui_proxy.server.url, "/run")
    reward = "[data-chart=reward] path[data-series='reward mean']"
    page.tab.wait_for_selector(reward, state="attached")  # a flat line has no height: "hidden"
    assert page.tab.get_attribute(reward, "data-points") == str(len(train))
    loss = [r for r in train if isinstance(r.get("loss"), float) and math.isfinite(r["loss"])]
    assert page.tab.get_attribute("[data-chart=loss] path[data-series=loss]", "data-points") == str(len(loss))
    accuracy = "[data-chart=eval] path[data-series='accuracy (95% interval)']"
    assert page.tab.get_attribute(accuracy, "data-points") == str(len(evals))
    assert page.tab.locator("[data-chart=eval] polygon").count() == 1, "the interval band"
    assert page.tab.inner_text("#run-step") == str(train[-1]["step"])

    # The trainer writes a step: the page shows it without a reload.
    sink = MetricsSink(run_dir, tensorboard=False)
    values = {k: v for k, v in train[-1].items() if k not in ("step", "time")}
    sink.log(train[-1]["step"] + 1, {**values, "reward_mean": 0.75})
    sink.close()
    page.tab.wait_for_function(
        "([selector, n]) => document.querySelector(selector)?.dataset.points === n", arg=[reward, str(len(train) + 1)]
    )
    assert page.tab.inner_text("#run-step") == str(train[-1]["step"] + 1)


def test_the_admin_key_is_asked_for_once_and_enforced(ui_proxy, keyless_page):
    url = ui_proxy.server.url
    refused = httpx.get(f"{url}/ui/api/sessions", timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    wrong = httpx.get(f"{url}/ui/api/overview", headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401
    session_key = httpx.get(f"{url}/ui/api/overview", headers={"Authorization": f"Bearer {ui_proxy.keys[0]}"})
    assert session_key.status_code == 401, "a session key is not the admin key"
    assert httpx.get(f"{url}/ui/static/main.js", timeout=30).status_code == 200, "the static files are public"
    index = httpx.get(f"{url}/ui", follow_redirects=True, timeout=30)
    assert index.status_code == 200 and "script-src 'self'" in index.headers["content-security-policy"]

    page = keyless_page
    page.tab.goto(f"{url}/ui/")
    page.tab.wait_for_selector("#key-dialog[open]")
    page.tab.fill("#key-input", "not-the-key")
    page.tab.press("#key-input", "Enter")
    page.tab.wait_for_function("() => document.querySelector('#key-error').textContent.includes('not the admin key')")
    page.tab.fill("#key-input", ADMIN_KEY)
    page.tab.press("#key-input", "Enter")
    page.tab.wait_for_selector("#sessions tbody tr")
    assert page.tab.evaluate(f"sessionStorage.getItem({KEY_STORAGE!r})") == ADMIN_KEY
    page.tab.reload()  # the same tab keeps it: no second question
    page.tab.wait_for_selector("#sessions tbody tr")
    assert not page.tab.locator("#key-dialog").evaluate("d => d.open")


def test_no_page_shows_a_session_key_or_its_hash(ui_proxy, page):
    secrets = [*ui_proxy.keys, *(hash_key(k) for k in ui_proxy.keys)]
    sid = ui_proxy.group["branched"]
    bodies = [
        httpx.get(f"{ui_proxy.server.url}{path}", headers=ui_proxy.server.headers(), timeout=60).text
        for path in ("/ui/api/sessions?limit=500", f"/ui/api/sessions/{sid}", f"/ui/api/groups/{GROUP}")
    ]
    goto(page, ui_proxy.server.url, f"/session/{sid}")
    page.tab.wait_for_selector("#session-advantage[data-value]")
    bodies.append(page.tab.content())
    for body in bodies:
        assert not [s for s in secrets if s in body]


def test_the_standalone_ui_shows_the_same_store(ui_proxy, standalone_ui, page):
    sessions = all_sessions(ui_proxy)
    goto(page, standalone_ui, "/sessions?limit=500")
    page.tab.wait_for_selector("#sessions tbody tr")
    assert page.tab.locator("#sessions tbody tr").count() == len(sessions)
    sid = ui_proxy.group["branched"]
    page.tab.click(f"tr[data-session-id='{sid}'] a.session-link")
    page.tab.wait_for_selector("#tree .node")
    assert page.tab.locator("#tree .node").count() == len(ui_proxy.server.session(sid)["completions"])
    assert page.tab.locator("#tokens .tok").count() > 0
    assert "tokens are shown as ids" not in page.tab.inner_text("main"), "the standalone UI loaded the tokenizer"
    goto(page, standalone_ui, "/run")
    reward = "[data-chart=reward] path[data-series='reward mean']"
    page.tab.wait_for_selector(reward, state="attached")  # a flat line has no height: "hidden"
    train = [r for r in read_metrics(ui_proxy.run.run_dir) if "reward_mean" in r]
    assert page.tab.get_attribute(reward, "data-points") == str(len(train))
