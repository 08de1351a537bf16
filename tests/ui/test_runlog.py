"""Reading metrics.jsonl incrementally: whole lines only, from the offset given; a torn line is
skipped, a shrunk file starts over, non-finite numbers keep their name."""

from __future__ import annotations

import json

from proxy.ui.runlog import read_rows
from trainer.metrics import MetricsSink


def test_rows_come_in_increments_and_a_line_being_written_waits(tmp_path):
    sink = MetricsSink(tmp_path, tensorboard=False)
    sink.log(1, {"reward_mean": 0.5, "loss": float("nan")})
    first = read_rows(sink.path)
    assert [r["step"] for r in first.rows] == [1] and first.rows[0]["loss"] == "NaN"
    sink.log(2, {"reward_mean": 0.75, "grad_norm": float("inf")})
    with sink.path.open("a") as f:
        f.write('{"step": 3, "reward_me')  # half a line: the trainer is writing it
    second = read_rows(sink.path, first.offset)
    assert [r["step"] for r in second.rows] == [2] and second.rows[0]["grad_norm"] == "Infinity"
    assert not second.reset and second.size > second.offset
    with sink.path.open("a") as f:
        f.write('an": 1.0}\n')
    third = read_rows(sink.path, second.offset)
    assert third.rows == [{"step": 3, "reward_mean": 1.0}] and third.offset == third.size
    sink.close()


def test_a_torn_line_is_skipped_and_a_shrunk_file_starts_over(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n' + json.dumps({"step": 3}) + "\n")
    chunk = read_rows(path)
    assert [r["step"] for r in chunk.rows] == [1, 3]
    path.write_text('{"step": 1}\n')  # a new run in the same directory
    again = read_rows(path, chunk.offset)
    assert again.reset and again.rows == [{"step": 1}]
    missing = read_rows(tmp_path / "none.jsonl", 10)
    assert missing.rows == [] and missing.reset
