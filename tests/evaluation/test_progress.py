"""The launcher's live table shows the last held-out evaluation beside the first."""

from __future__ import annotations

import json

from trainer.metrics import progress_rows


def test_the_live_table_shows_the_last_evaluation_and_where_it_started(tmp_path):
    train = {"version": 2, "reward_mean": 0.5, "accuracy": 0.5, "staleness_mean": 0.0, "staleness_max": 0}
    train |= {"samples_per_s": 3.0, "loss": 0.1, "grad_norm": 0.2}
    rows = [
        {"step": 0, "eval_accuracy": 0.1, "eval_accuracy_low": 0.05, "eval_accuracy_high": 0.2, "eval_version": 0},
        {"step": 2, **train},
        {"step": 2, "eval_accuracy": 0.4, "eval_accuracy_low": 0.3, "eval_accuracy_high": 0.5, "eval_version": 2}
        | {"eval_best_step": 2},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = dict(progress_rows(tmp_path, 10))
    assert table["step"] == "2 / 10"
    assert table["held-out eval (step 2, v2)"] == "0.400 [0.300, 0.500], from 0.100 at step 0"
    assert table["best evaluated step"] == "2"
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert dict(progress_rows(tmp_path, 0))["held-out eval (step 0, v0)"] == "0.100 [0.050, 0.200]"
