"""`trainer.processes` = N under the Ray launcher: N trainer actors, one process group.

The settings are checked without Ray. Then, on a local Ray cluster, two trainer actors are
placed and given their ranks as `_bring_up` does (`Cluster.join`); each starts a small script
that joins the process group (gloo) from that environment and sums its rank with the other's.
One rank is SIGKILLed: the launcher's check restarts both ranks together, which meet again.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from proxy.config import ConfigError, load_config
from trainer.launch.ray import check_config, demand, rank_env, trainer_names

PG = ["store.url=postgresql+psycopg://postgres@127.0.0.1/areal"]

# A stand-in for `python -m trainer.loop`: joins the group from the launcher's environment, writes
# the sum of every rank's (rank + 1), then waits with the others until `done` exists. Like the
# trainer's, ranks other than 0 leave SIGTERM to rank 0 (they end when it does).
RANK_SCRIPT = """
import datetime, os, signal, sys, time
from pathlib import Path
import torch, torch.distributed as dist

if os.environ["RANK"] != "0":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = Path(sys.argv[1])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
(out / f"rank{os.environ['RANK']}.{os.getpid()}").write_text(str(int(total.item())))
while True:
    flag = torch.tensor([float((out / "done").exists())])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        break
    time.sleep(0.2)
dist.destroy_process_group()
"""


def test_each_rank_is_an_actor_with_the_trainer_resources():
    cfg = load_config(None, [*PG, "trainer.processes=3", "trainer.device=cuda", "ray.trainer_gpus=1"])
    assert trainer_names(cfg) == ["trainer", "trainer-1", "trainer-2"]
    assert [who for who, _ in demand(cfg)["GPU"]] == ["trainer", "trainer-1", "trainer-2"]
    check_config(cfg)
    with pytest.raises(ConfigError, match="uses one accelerator: set ray.trainer_gpus"):
        check_config(load_config(None, [*PG, "trainer.processes=2", "trainer.device=cuda", "ray.trainer_gpus=2"]))
    assert trainer_names(load_config(None, PG)) == ["trainer"]
    assert rank_env(1, 2, "10.0.0.1", 29500) == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }


def _wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _sums(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in out.glob("rank*.*")}


def test_two_trainer_actors_join_one_group_and_restart_together(tmp_path):
    ray = pytest.importorskip("ray")
    from rich.console import Console

    from trainer.launch.ray import Cluster

    script, out = tmp_path / "rank.py", tmp_path / "out"
    script.write_text(RANK_SCRIPT)
    out.mkdir()
    cfg = load_config(None, [*PG, "trainer.processes=2", f"trainer.run_dir={tmp_path / 'run'}"])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cluster = None
    try:
        cluster = Cluster(cfg, tmp_path / "run", tmp_path, Console(quiet=True))
        trainers = [cluster.add_process(name, "trainer", 0.5) for name in trainer_names(cfg)]
        cluster.place(trainers)
        cluster.join(trainers)
        cluster.start(trainers, [str(script), str(out)], health=False)
        _wait_for(lambda: len(_sums(out)) == 2, "both ranks to join")
        assert sorted(_sums(out).values()) == ["3", "3"], "one group of two ranks"
        assert cluster.check() is None and [t.state for t in trainers] == ["running", "running"]

        _, pid = (tmp_path / "run" / "trainer-1.pid").read_text().split()
        os.kill(int(pid), signal.SIGKILL)
        _wait_for(lambda: cluster.check() is None and trainers[0].restarts == 1, "the restart")
        _wait_for(lambda: len(_sums(out)) == 4, "both ranks to join again")
        assert sorted(_sums(out).values()) == ["3"] * 4
        assert "the trainer's 2 processes restarted (1 of 3)" in (tmp_path / "run/logs/launcher.log").read_text()

        (out / "done").touch()
        _wait_for(lambda: cluster.check() is None and trainers[0].state == "finished", "rank 0 to finish")
        assert cluster.stop() == 0
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.postgres
def test_ray_run_with_two_trainer_processes(tmp_path):
    """The arithmetic example end to end with the trainer as two ranks (gloo on CPU): the same
    invariants as one trainer process, and rank 1 logged its place in the group."""
    pytest.importorskip("ray")
    import subprocess
    import sys

    from tests.conftest import fresh_pg_database
    from tests.scaleout.test_ray_launcher import check_run, write_config

    with fresh_pg_database() as db_url:
        config = write_config(tmp_path, db_url, max_steps=2)
        args = [sys.executable, "-m", "proxy.cli", "train", str(config), "--launcher", "ray"]
        args += ["--set", "trainer.processes=2"]
        proc = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        check_run(tmp_path / "run", db_url, max_steps=2)
        assert "rank 1 of 2" in (tmp_path / "run" / "logs" / "trainer-1.log").read_text()
