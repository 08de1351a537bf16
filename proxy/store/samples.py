"""Finished sessions as training samples: the exact structures the trainer consumes.

Two styles:
- `individual`: one sample per completion: its full prompt ids, sampled ids, their
  behaviour logprobs and per-token weight versions, its tree return, why it stopped, and the
  session / group / turn it belongs to.
- `concat`: one sample per token sequence (root or segment start to the sequence's end): its
  whole ids (every turn's prompt and reply), a loss mask over every sampled assistant token
  on it, and per-token behaviour logprobs, versions and returns. A turn whose template
  re-rendered the history starts a new sequence (`starts_segment`); its parent's sequence
  then ends at the parent, while returns still flow through the link.
`trainer/export.py` writes them to files; `trainer/loop.py` trains on them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, select

from proxy.store.db import Database
from proxy.store.schema import completions, sessions
from proxy.store.tokens import unpack_floats, unpack_ints
from proxy.store.tree import full_prompts, starts_segment


@dataclass
class IndividualSample:
    session_id: str
    group_id: str
    task_id: str | None
    completion_id: str
    parent_id: str | None
    turn: int
    prompt_ids: list[int]
    output_ids: list[int]
    behav_logprobs: list[float]
    versions: list[int]
    ret: float
    reward: float | None
    session_reward: float
    temperature: float
    finish_reason: str  # "length": the reply stopped at its token limit (truncated)


@dataclass
class ConcatSample:
    session_id: str
    group_id: str
    task_id: str | None
    leaf_id: str
    completion_ids: list[str]
    input_ids: list[int]
    loss_mask: list[int]
    behav_logprobs: list[float]  # 0 where loss_mask is 0
    versions: list[int]  # -1 where loss_mask is 0
    returns: list[float]  # the return of the completion that sampled each token; 0 elsewhere
    session_reward: float
    temperature: float


@dataclass
class SessionSamples:
    session_id: str
    group_id: str
    task_id: str | None
    reward: float
    min_version: int | None
    individual: list[IndividualSample]
    concat: list[ConcatSample]
    prompt_key: str = ""  # what its first call was asked (the request hash): one prompt's episodes share it


def _group(session: Any) -> str:
    return session.group_id or session.task_id or session.id


def samples_for_session(session: Any, rows: list[Any]) -> SessionSamples:
    """Both sample styles for one session (rows: its completion rows)."""
    by_id = {r.id: r for r in rows}
    prompts = full_prompts(rows)
    group = _group(session)
    reward = float(session.reward or 0.0)
    individual = []
    for row in rows:
        individual.append(
            IndividualSample(
                session_id=session.id,
                group_id=group,
                task_id=session.task_id,
                completion_id=row.id,
                parent_id=row.parent_id,
                turn=row.depth,
                prompt_ids=prompts[row.id],
                output_ids=unpack_ints(row.output_ids),
                behav_logprobs=unpack_floats(row.output_logprobs),
                versions=unpack_ints(row.output_versions),
                ret=float(row.ret if row.ret is not None else (row.reward or 0.0)),
                reward=row.reward,
                session_reward=reward,
                temperature=row.temperature,
                finish_reason=row.finish_reason,
            )
        )
    continued = {r.parent_id for r in rows if not starts_segment(r)}  # sequences that go on past these
    concat = []
    for leaf in (r for r in rows if r.id not in continued):
        path = [leaf]
        while not starts_segment(path[-1]) and path[-1].parent_id in by_id:
            path.append(by_id[path[-1].parent_id])
        path.reverse()
        input_ids = prompts[leaf.id] + unpack_ints(leaf.output_ids)
        mask = [0] * len(input_ids)
        behav = [0.0] * len(input_ids)
        versions = [-1] * len(input_ids)
        returns = [0.0] * len(input_ids)
        for node in path:
            start = len(prompts[node.id])
            out = unpack_ints(node.output_ids)
            lps = unpack_floats(node.output_logprobs)
            vs = unpack_ints(node.output_versions)
            ret = float(node.ret if node.ret is not None else (node.reward or 0.0))
            for i in range(len(out)):
                mask[start + i] = 1
                behav[start + i] = lps[i]
                versions[start + i] = vs[i]
                returns[start + i] = ret
        concat.append(
            ConcatSample(
                session_id=session.id,
                group_id=group,
                task_id=session.task_id,
                leaf_id=leaf.id,
                completion_ids=[n.id for n in path],
                input_ids=input_ids,
                loss_mask=mask,
                behav_logprobs=behav,
                versions=versions,
                returns=returns,
                session_reward=reward,
                temperature=leaf.temperature,
            )
        )
    first = next((r for r in rows if r.parent_id is None), None)
    return SessionSamples(
        session_id=session.id,
        group_id=group,
        task_id=session.task_id,
        reward=reward,
        min_version=session.min_version,
        individual=individual,
        concat=concat,
        prompt_key=(first.request_hash or "") if first is not None else "",
    )


def load_samples(conn: Connection, session_ids: list[str]) -> list[SessionSamples]:
    """Samples for the given sessions, in the given order."""
    if not session_ids:
        return []
    session_rows = {r.id: r for r in conn.execute(select(sessions).where(sessions.c.id.in_(session_ids)))}
    rows_by_session: dict[str, list[Any]] = {sid: [] for sid in session_ids}
    query = (
        select(completions)
        .where(completions.c.session_id.in_(session_ids), completions.c.superseded_by.is_(None))
        .order_by(completions.c.created_at, completions.c.id)
    )
    for row in conn.execute(query):
        rows_by_session[row.session_id].append(row)
    return [samples_for_session(session_rows[sid], rows_by_session[sid]) for sid in session_ids]


def iter_samples(db: Database, style: str, status: str) -> Iterator[dict[str, Any]]:
    """Every sample of the sessions with `status` (finished, consumed or all), as flat rows."""
    statuses = ("finished", "training", "consumed") if status == "all" else (status,)
    query = select(sessions.c.id).where(sessions.c.status.in_(statuses)).order_by(sessions.c.created_at, sessions.c.id)
    ids = db.read(lambda c: [r.id for r in c.execute(query)])
    for start in range(0, len(ids), 256):
        for s in db.read(lambda c, chunk=ids[start : start + 256]: load_samples(c, chunk)):
            for sample in s.individual if style == "individual" else s.concat:
                row = asdict(sample)
                if "ret" in row:
                    row["return"] = row.pop("ret")
                yield row
