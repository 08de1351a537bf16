"""What the Ray launcher settles before starting anything: refusals with a fix in the message,
and the settings every component must agree on (absolute paths, shared weights directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, load_config
from trainer.launch.ray import check_config, prepare, resources

PG = ["store.url=postgresql+psycopg://postgres@127.0.0.1/areal"]


def test_sqlite_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="SQLite.*Use PostgreSQL: --db postgresql"):
        check_config(load_config(None, ["store.url=sqlite:///x.db"]))


def test_accelerators_must_be_declared():
    with pytest.raises(ConfigError, match="trainer run on cuda but get no GPU"):
        check_config(load_config(None, [*PG, "trainer.device=cuda"]))
    with pytest.raises(ConfigError, match="engine servers run on npu but get no NPU"):
        check_config(load_config(None, [*PG, "engine.device=npu", "ray.engine_servers=1"]))
    check_config(load_config(None, [*PG, "engine.device=cuda", "ray.engine_servers=1", "ray.engine_gpus=1"]))
    assert resources(2, 1, 0) == {"num_cpus": 2, "num_gpus": 1}
    assert resources(1, 0, 4) == {"num_cpus": 1, "num_gpus": 0, "resources": {"NPU": 4}}


def test_prepare_makes_paths_absolute_and_weights_shared(tmp_path: Path):
    (tmp_path / "agent.py").write_text("async def run(task, base_url, api_key): pass\n")
    (tmp_path / "tasks.jsonl").write_text('{"id": 1}\n')
    paths = ["rollout.agent=agent.py:run", "rollout.dataset=tasks.jsonl", "trainer.run_dir=runs/x"]
    cfg = load_config(None, [*PG, *paths, 'rewards.modules=["agent.py", "rewards.builtins"]'])
    run_dir = prepare(cfg, tmp_path)
    assert run_dir == tmp_path / "runs" / "x" and cfg.trainer.run_dir == str(run_dir)
    assert cfg.rollout.agent == f"{tmp_path}/agent.py:run"
    assert cfg.rollout.dataset == f"{tmp_path}/tasks.jsonl"
    assert cfg.rewards.modules == [f"{tmp_path}/agent.py", "rewards.builtins"]
    assert cfg.trainer.weights_dir == str(run_dir / "weights") and cfg.proxy.admission
