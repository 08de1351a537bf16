"""Right answers by problem form in thirds of a run, read from its store, and how the rewards spread.

    python docs/experiments/arithmetic-2026-12-07/by_form.py RUN_DIR/areal.db

A session's third is that of the policy version it was sampled from; right means reward 1.0.
"""

import collections
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples/arithmetic"))
from agent import detailed_kind  # noqa: E402


def main(db: str) -> None:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    query = "SELECT task_id, reward, min_version FROM sessions WHERE reward IS NOT NULL AND eval = 0"
    rows = con.execute(query).fetchall()
    last = max(version or 0 for _, _, version in rows)
    right: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    spread: dict[tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
    for task_id, value, version in rows:
        op = "+" if "+" in task_id else "-"
        a, b = task_id.split(op)
        form = detailed_kind(f"What is {a} {op} {b}?")
        third = min(2, 3 * (version or 0) // (last + 1))
        right[form][f"n{third}"] += 1
        right[form][f"x{third}"] += value == 1.0
        spread[(form, third)][round(value, 2)] += 1
    for form, c in sorted(right.items()):
        cells = [f"{c[f'x{t}']}/{c[f'n{t}']} ({c[f'x{t}'] / max(1, c[f'n{t}']):.0%})" for t in range(3)]
        print(f"{form:25s}", "  ".join(cells))
    if any(len(c) > 2 for c in spread.values()):  # partial credit: the share of each reward value
        for (form, third), c in sorted(spread.items()):
            n = sum(c.values())
            print(f"{form:25s} third {third}:", ", ".join(f"{k}: {v / n:.0%}" for k, v in sorted(c.items())))


if __name__ == "__main__":
    main(sys.argv[1])
