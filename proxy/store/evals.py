"""Reading back an evaluation's episodes: its sessions and what each one did.

An evaluation names its groups `eval:{run}:{task id}` (`evaluation/run.py`), so one prefix scan
over the indexed `group_id` finds every session of a run; the report is computed from these rows,
which makes every number in it a count over the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select

from proxy.store.schema import completions, sessions

GROUP_PREFIX = "eval:"


def eval_group_id(run: str, task_id: str) -> str:
    return f"{GROUP_PREFIX}{run}:{task_id}"


@dataclass
class EvalEpisode:
    session_id: str
    task_id: str
    status: str
    reward: float | None
    failure: str | None
    turns: int
    prompt_tokens: int  # summed over the episode's calls
    output_tokens: int  # sampled, over the episode's calls
    tool_calls: int
    min_version: int | None
    max_version: int | None
    metadata: dict[str, Any]


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def eval_episodes(conn: Connection, run: str) -> list[EvalEpisode]:
    """Every session of evaluation `run`, in task then creation order."""
    rows = conn.execute(
        select(sessions)
        .where(sessions.c.eval.is_(True), sessions.c.group_id.like(_like_prefix(f"{GROUP_PREFIX}{run}:"), escape="\\"))
        .order_by(sessions.c.task_id, sessions.c.created_at, sessions.c.id)
    ).all()
    ids = [r.id for r in rows]
    per: dict[str, dict[str, int]] = {sid: {"turns": 0, "prompt": 0, "output": 0, "calls": 0} for sid in ids}
    for chunk in (ids[i : i + 500] for i in range(0, len(ids), 500)):
        turns = conn.execute(
            select(
                completions.c.session_id,
                completions.c.prompt_len,
                func.length(completions.c.output_ids).label("output_bytes"),
                completions.c.response,
            ).where(completions.c.session_id.in_(chunk))
        )
        for t in turns:
            counts = per[t.session_id]
            counts["turns"] += 1
            counts["prompt"] += t.prompt_len
            counts["output"] += (t.output_bytes or 0) // 4  # int32 ids
            counts["calls"] += len((t.response or {}).get("tool_calls") or [])
    return [
        EvalEpisode(
            session_id=r.id,
            task_id=r.task_id or "",
            status=r.status,
            reward=r.reward,
            failure=r.failure,
            turns=per[r.id]["turns"],
            prompt_tokens=per[r.id]["prompt"],
            output_tokens=per[r.id]["output"],
            tool_calls=per[r.id]["calls"],
            min_version=r.min_version,
            max_version=r.max_version,
            metadata=r.metadata or {},
        )
        for r in rows
    ]
