"""What the Ray launcher settles before starting anything: refusals with a fix in the message,
and the settings every component must agree on (absolute paths, shared weights directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, load_config
from trainer.launch.ray import check_config, check_resources, local_cluster_cpus, prepare, resources

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


def test_a_run_the_cluster_can_never_place_is_refused_with_both_figures():
    cfg = load_config(None, PG)  # the defaults: front 0.5 + 2 replicas + trainer + runner = 4.5 CPUs
    with pytest.raises(ConfigError, match=r"asks for 4\.5 CPUs .* the Ray cluster has 2\b.*ray\.proxy_cpus"):
        check_resources(cfg, {"CPU": 2.0}, [{"CPU": 2.0}])
    check_resources(cfg, {"CPU": 8.0}, [{"CPU": 4.0}, {"CPU": 4.0}])  # enough in all, each part fits a node
    big = load_config(None, [*PG, "trainer.device=cuda", "ray.trainer_gpus=2"])
    with pytest.raises(ConfigError, match=r"trainer asks for 2 GPUs but no node .* more than 1"):
        check_resources(big, {"CPU": 16.0, "GPU": 2.0}, [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}])


def test_a_local_cluster_is_sized_to_fit_the_run():
    cfg = load_config(None, PG)
    assert local_cluster_cpus(cfg) >= 5  # 4.5 asked, whatever this machine's core count
    assert local_cluster_cpus(load_config(None, [*PG, "ray.local_cpus=3"])) == 3


@pytest.mark.postgres
def test_the_launcher_fails_within_seconds_when_the_cluster_is_too_small(tmp_path):
    """Tried as a new user would: the defaults on a cluster that is too small waited the whole
    900 s start timeout before failing. Now the refusal comes before any component starts."""
    pytest.importorskip("ray")
    import subprocess
    import sys
    import time

    config = tmp_path / "config.toml"
    db = PG[0].split("=", 1)[1]
    config.write_text(f'[store]\nurl = "{db}"\n[trainer]\nrun_dir = "{tmp_path}/run"\n[ray]\nlocal_cpus = 2\n')
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "train", str(config), "--launcher", "ray"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "asks for 4.5 CPUs" in out.stdout and "has 2" in out.stdout, out.stdout[-2000:]
    assert time.monotonic() - started < 120
