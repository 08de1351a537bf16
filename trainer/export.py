"""`areal-proxy export`: training samples from the store as JSONL or Parquet files.

The samples are exactly what the trainer consumes (`proxy/store/samples.py`), in
either style (`individual` per completion, `concat` per root-to-leaf path), so a
run can be trained on offline or inspected; the file's extension picks the format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proxy.config import Config
from proxy.store.db import Database
from proxy.store.samples import iter_samples


def export_file(cfg: Config, out: str, style: str, status: str = "finished") -> int:
    if style not in ("individual", "concat"):
        raise ValueError(f"style must be individual or concat, not {style!r}")
    if status not in ("finished", "consumed", "all"):
        raise ValueError(f"status must be finished, consumed or all, not {status!r}")
    db = Database(cfg.store)
    try:
        rows = list(iter_samples(db, style, status))
    finally:
        db.close()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with path.open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return len(rows)


def read_file(path: str) -> list[dict[str, Any]]:
    """Load an exported file back (JSONL or Parquet)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
