"""A run's `metrics.jsonl`, read incrementally for the run page's live curves.

The trainer appends one JSON line per step (`trainer/metrics.py`), evaluation rows carry `eval_`
keys (often with only `step` and `time` beside them). The page asks for the lines after the byte
offset it has already read, so a poll of a long run costs only the new lines; a line still being
written (no newline yet) is left for the next poll. A file that shrank (a run directory reused
from scratch) is read again from the start. Non-finite numbers, which Python's json writes as
`NaN`/`Infinity`, come back as those strings: JSON has no such numbers, and a NaN loss is exactly
what the page must not silently drop.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_BYTES = 64 * 1024 * 1024
"""Most of the file one request reads: a run of a million steps is paged through in several polls."""


@dataclass
class MetricsChunk:
    rows: list[dict[str, Any]]
    offset: int  # where the next read starts
    size: int  # the file's size now
    reset: bool  # the file was shorter than the offset asked for: these rows start over


def read_rows(path: Path, offset: int = 0, max_bytes: int = MAX_BYTES) -> MetricsChunk:
    """The whole lines of `path` from byte `offset` (up to `max_bytes` of them)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return MetricsChunk([], 0, 0, offset > 0)
    reset = offset > size
    start = 0 if reset else offset
    with path.open("rb") as f:
        f.seek(start)
        data = f.read(max_bytes)
    end = data.rfind(b"\n") + 1  # whole lines only
    rows = []
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn line from a crash: the rest of the run is still worth plotting
        if isinstance(row, dict):
            rows.append({k: _finite_or_named(v) for k, v in row.items()})
    return MetricsChunk(rows, start + end, size, reset)


def _finite_or_named(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value
