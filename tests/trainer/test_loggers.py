"""The metrics loggers: metrics.jsonl keeps every row whole, TensorBoard and Weights & Biases get its
numbers. W&B runs for real in offline mode (no network); its run file (`run-<id>.wandb`, records of
wandb's own protobuf `Record` in a block-framed log) is read back here, since wandb ships no Python
reader for it any more."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from proxy.config import ConfigError, load_config
from trainer.config import LoggingConfig
from trainer.loggers import WANDB_ID_FILE, scalars
from trainer.metrics import MetricsSink, read_metrics

STEP_ROWS = [
    (1, {"reward_mean": 0.25, "loss": 1.5, "version": 1, "note": "warm-up", "eval_by_task": {"add": 0.5, "tag": "x"}}),
    (2, {"reward_mean": 0.75, "loss": 0.5, "version": 2, "skipped": ["s1", "s2"], "flag": True}),
    (1, {"eval_accuracy": 0.4, "eval_error": None}),  # an evaluation of step 1, reported after step 2
]


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)


def log_rows(sink: MetricsSink) -> None:
    for step, values in STEP_ROWS:
        sink.log(step, values)
    sink.close()


# -- reading a W&B run file -----------------------------------------------------------------------
BLOCK = 32 * 1024
HEADER = 7  # b":W&B", a 2-byte magic, a version byte
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """The `Record`s of a .wandb file: 32 KiB blocks of chunks (crc32, length, type), a record split
    over blocks as FIRST, MIDDLE…, LAST; fewer than 7 bytes left in a block are padding."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, pending, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def history(records: list[Any]) -> list[dict[str, Any]]:
    rows = [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in records if r.HasField("history")]
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]


def summary(records: list[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for r in records:
        if r.HasField("summary"):
            found.update({_key(u): json.loads(u.value_json) for u in r.summary.update})
    return found


def the_run(records: list[Any]) -> Any:
    runs = [r.run for r in records if r.HasField("run")]
    assert len(runs) == 1
    return runs[0]


# -- tests ----------------------------------------------------------------------------------------
def test_scalars_keeps_numbers_and_flattens_dicts() -> None:
    values = {"a": 1, "b": 2.5, "c": "text", "d": {"e": 3, "f": [1], "g": {"h": -1.0}}, "i": None, "j": True}
    assert scalars(values) == {"a": 1, "b": 2.5, "d/e": 3, "d/g/h": -1.0, "j": 1}


def test_metrics_jsonl_keeps_every_value(tmp_path: Path) -> None:
    log_rows(MetricsSink(tmp_path, LoggingConfig(tensorboard=False)))
    rows = read_metrics(tmp_path)
    assert [{k: v for k, v in r.items() if k not in ("step", "time")} for r in rows] == [v for _, v in STEP_ROWS]
    assert [r["step"] for r in rows] == [1, 2, 1]
    assert not (tmp_path / "tensorboard").exists()
    assert not (tmp_path / "wandb").exists() and not (tmp_path / WANDB_ID_FILE).exists()


def test_tensorboard_holds_the_numbers(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    log_rows(MetricsSink(tmp_path, LoggingConfig()))
    events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    seen = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert seen == {
        "reward_mean": [(1, 0.25), (2, 0.75)],
        "loss": [(1, 1.5), (2, 0.5)],
        "version": [(1, 1.0), (2, 2.0)],
        "eval_by_task/add": [(1, 0.5)],
        "flag": [(2, 1.0)],
        "eval_accuracy": [(1, pytest.approx(0.4))],
    }
    assert len(read_metrics(tmp_path)) == 3  # metrics.jsonl is written beside it


@pytest.mark.usefixtures("wandb_offline")
def test_wandb_offline_run_holds_the_numbers_and_the_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "arith-run"
    cfg = LoggingConfig(tensorboard=False, wandb=True, wandb_project="tests", wandb_tags=["ci", "offline"])
    run_config = {"trainer": {"optim": {"lr": 1e-5}, "run_dir": str(run_dir)}, "rollout": {"group_size": 4}}
    log_rows(MetricsSink(run_dir, cfg, run_config))

    files = offline_runs(run_dir)
    assert len(files) == 1, "WANDB_MODE=offline writes one offline run under run_dir/wandb"
    records = wandb_records(files[0])
    run = the_run(records)
    assert run.run_id == (run_dir / WANDB_ID_FILE).read_text().strip()
    assert (run.project, run.display_name, list(run.tags)) == ("tests", "arith-run", ["ci", "offline"])
    config = {_key(u): json.loads(u.value_json) for u in run.config.update}
    assert config["trainer"] == run_config["trainer"] and config["rollout"] == {"group_size": 4}

    # Numbers only, nested dicts flattened; the rows keep their own step, the late eval row included.
    assert history(records) == [
        {"step": 1, "reward_mean": 0.25, "loss": 1.5, "version": 1, "eval_by_task/add": 0.5},
        {"step": 2, "reward_mean": 0.75, "loss": 0.5, "version": 2, "flag": 1},
        {"step": 1, "eval_accuracy": 0.4},
    ]
    last = summary(records)
    assert {k: last[k] for k in ("reward_mean", "loss", "version", "eval_accuracy", "step")} == {
        "reward_mean": 0.75,
        "loss": 0.5,
        "version": 2,
        "eval_accuracy": 0.4,
        "step": 1,
    }
    assert not any(k in last for k in ("note", "skipped", "eval_error", "eval_by_task/tag"))
    metrics = [m for r in records if r.HasField("metric") for m in [r.metric]]
    assert any(m.glob_name == "*" and m.step_metric == "step" for m in metrics), "charts use the logged step"
    assert len(read_metrics(run_dir)) == 3


@pytest.mark.usefixtures("wandb_offline")
def test_a_resumed_run_continues_its_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE")  # the config's mode alone keeps it offline
    cfg = LoggingConfig(tensorboard=False, wandb=True, wandb_mode="offline", wandb_run_name="named")
    first = MetricsSink(tmp_path, cfg, {"trainer": {"max_steps": 2}})
    first.log(1, {"loss": 1.0})
    first.log(2, {"loss": 0.9})
    first.close()
    run_id = (tmp_path / WANDB_ID_FILE).read_text().strip()

    again = MetricsSink(tmp_path, cfg, {"trainer": {"max_steps": 4}})
    again.log(3, {"loss": 0.8})
    again.close()

    files = offline_runs(tmp_path)
    assert len(files) == 2
    runs = [the_run(wandb_records(f)) for f in files]
    assert [r.run_id for r in runs] == [run_id, run_id]
    assert [r.display_name for r in runs] == ["named", "named"]
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == run_id
    assert history(wandb_records(files[1])) == [{"step": 3, "loss": 0.8}]
    assert [r["loss"] for r in read_metrics(tmp_path)] == [1.0, 0.9, 0.8]


def test_wandb_configured_but_missing_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets where it is not installed
    with pytest.raises(ImportError, match=r"pip install 'areal-proxy\[wandb\]'"):
        MetricsSink(tmp_path, LoggingConfig(wandb=True))
    assert not (tmp_path / "metrics.jsonl").exists(), "it fails before any logger opens a file"


def test_logging_section_reads_from_overrides() -> None:
    cfg = load_config(
        None,
        [
            "trainer.logging.wandb=true",
            "trainer.logging.wandb_mode=offline",
            'trainer.logging.wandb_tags=["gsm8k", "lora"]',
            "trainer.logging.tensorboard=false",
        ],
    ).trainer.logging
    assert (cfg.wandb, cfg.wandb_mode, cfg.wandb_tags, cfg.tensorboard) == (True, "offline", ["gsm8k", "lora"], False)
    assert LoggingConfig().model_dump() == {
        "tensorboard": True,
        "wandb": False,
        "wandb_project": "areal-proxy",
        "wandb_entity": "",
        "wandb_run_name": "",
        "wandb_mode": "",
        "wandb_dir": "",
        "wandb_tags": [],
    }
    with pytest.raises(ConfigError, match="wandb_mode"):
        load_config(None, ["trainer.logging.wandb_mode=cloud"])
