"""`areal-proxy sessions list|show`: the store in the terminal, sessions as rich trees.

Everything recorded (ids, messages, replies, failure reasons) is escaped before it
reaches rich, whose markup would otherwise eat "[...]" in model text or crash on
a stray closing tag such as "[/INST]".
"""

from __future__ import annotations

import datetime as dt

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from proxy.config import Config
from proxy.store.db import Database
from proxy.store.sessions import recent_sessions
from proxy.store.tree import session_rows
from proxy.tree_view import session_payload


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def list_sessions(cfg: Config, status: str | None, limit: int) -> int:
    db = Database(cfg.store)
    rows = db.read(lambda c: recent_sessions(c, status, limit))
    table = Table("session", "status", "task", "group", "turns", "reward", "versions", "created", "failure")
    for r in rows:
        versions = "-" if r.min_version is None else f"{r.min_version}..{r.max_version}"
        reward = "-" if r.reward is None else f"{r.reward:g}"
        table.add_row(
            escape(r.id),
            r.status,
            escape(r.task_id or "-"),
            escape(r.group_id or "-"),
            str(r.num_completions),
            reward,
            versions,
            _when(r.created_at),
            escape((r.failure or "")[:60]),
        )
    Console().print(table)
    db.close()
    return 0


def _clip(text: str | None, n: int = 80) -> str:
    text = (text or "").replace("\n", "⏎ ")
    return escape(text if len(text) <= n else text[: n - 1] + "…")


def show_session(cfg: Config, session_id: str, show_tokens: bool) -> int:
    db = Database(cfg.store)
    session, rows = db.read(lambda c: session_rows(c, session_id))
    db.close()
    console = Console()
    if session is None:
        console.print(f"[red]session {escape(session_id)} not found")
        return 1
    payload = session_payload(session, rows)
    reward = "-" if session.reward is None else f"{session.reward:g}"
    task = escape(session.task_id or "-")
    title = f"[bold]{escape(session.id)}[/] status=[bold]{session.status}[/] reward={reward} task={task}"
    if session.failure:
        title += f"\n[red]failure: {escape(session.failure)}"
    tree = Tree(title)
    branches = {}
    for node in payload["completions"]:
        parent = branches.get(node["parent_id"], tree)
        message = node["response"]
        calls = escape(", ".join(c["function"]["name"] for c in message.get("tool_calls") or []))
        versions = sorted(set(node["output_versions"])) or ["-"]
        label = (
            f"[cyan]{escape(node['id'])}[/] turn {node['depth']} {node['finish_reason']} "
            f"prompt={len(node['prompt_ids'])} out={len(node['output_ids'])} v={versions} "
            f"r={node['reward']} G={node['return']}\n"
            f"  last msg: {_clip(node['messages'][-1].get('content') if node['messages'] else '')}\n"
            f"  reply: {_clip(message.get('content'))}" + (f" [yellow]tools: {calls}" if calls else "")
        )
        if show_tokens:
            label += f"\n  output_ids: {node['output_ids']}"
        branches[node["id"]] = parent.add(label)
    console.print(tree)
    return 0
