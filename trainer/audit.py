"""The trainer's audit log, `run_dir/trained_sessions.jsonl`: which sessions each step trained or
skipped, and every resume (with the sessions it handed back). Append-only; `effective_history`
replays it into the sessions the final weights were trained on, steps undone by a resume left out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILE = "trained_sessions.jsonl"


def record(run_dir: Path, entry: dict[str, Any]) -> None:
    with open(run_dir / FILE, "a") as f:
        f.write(json.dumps(entry) + "\n")


def effective_history(run_dir: Path) -> list[str]:
    """Session ids the final weights were trained on, in order; a session twice here was trained twice."""
    kept: list[tuple[int, list[str]]] = []
    for line in (run_dir / FILE).read_text().splitlines():
        entry = json.loads(line)
        if "resume_from" in entry:
            kept = [(step, ids) for step, ids in kept if step <= entry["resume_from"]]
        elif "step" in entry:
            kept.append((entry["step"], entry["trained"]))
    return [sid for _, ids in kept for sid in ids]
