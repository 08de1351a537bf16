"""The learning-rate schedule, by hand-worked numbers, and the config it needs."""

from __future__ import annotations

import math

import pytest

from proxy.config import ConfigError, load_config
from trainer.config import ScheduleConfig
from trainer.schedule import lr_factor, progress


def test_progress_is_the_larger_fraction_of_the_budget_spent():
    assert progress(0, 0.0, 100, 0) == 0.0
    assert progress(25, 999.0, 100, 0) == 0.25  # no time budget: the clock does not count
    assert progress(25, 900.0, 100, 30) == pytest.approx(0.5)  # 15 of 30 minutes beats 25 of 100 steps
    assert progress(80, 900.0, 100, 30) == pytest.approx(0.8)
    assert progress(500, 0.0, 100, 0) == 1.0  # past the budget: held at the end
    assert progress(500, 1e6, 0, 0) == 0.0  # no budget at all


def test_constant_schedule_is_the_warm_up_alone():
    o = ScheduleConfig(warmup_steps=4)
    assert [lr_factor(o, s, 0.9) for s in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    assert lr_factor(ScheduleConfig(), 1, 0.5) == 1.0


def test_linear_decay_to_the_floor():
    o = ScheduleConfig(shape="linear", min_lr_ratio=0.1)
    # 0.1 + 0.9 × (1 - spent)
    assert lr_factor(o, 10, 0.0) == pytest.approx(1.0)
    assert lr_factor(o, 10, 0.5) == pytest.approx(0.55)
    assert lr_factor(o, 10, 1.0) == pytest.approx(0.1)
    assert lr_factor(o, 10, 1.7) == pytest.approx(0.1)  # clamped


def test_cosine_decay_along_a_half_cosine():
    o = ScheduleConfig(shape="cosine", min_lr_ratio=0.0)
    assert lr_factor(o, 5, 0.0) == pytest.approx(1.0)
    assert lr_factor(o, 5, 0.5) == pytest.approx(0.5)
    assert lr_factor(o, 5, 1 / 3) == pytest.approx(0.75)  # (1 + cos 60°) / 2
    assert lr_factor(o, 5, 1.0) == pytest.approx(0.0, abs=1e-12)
    floor = ScheduleConfig(shape="cosine", min_lr_ratio=0.2)
    assert lr_factor(floor, 5, 0.5) == pytest.approx(0.2 + 0.8 * 0.5)


def test_warm_up_multiplies_the_decay():
    o = ScheduleConfig(shape="linear", min_lr_ratio=0.0, warmup_steps=10)
    assert lr_factor(o, 2, 0.25) == pytest.approx(0.2 * 0.75)
    assert lr_factor(o, 20, 0.25) == pytest.approx(0.75)
    assert math.isclose(lr_factor(o, 10, 0.0), 1.0)


def test_a_decay_needs_a_budget():
    with pytest.raises(ConfigError, match=r"decays the learning rate over the run's budget"):
        load_config(None, ["trainer.schedule.shape=cosine"])
    assert load_config(None, ["trainer.schedule.shape=cosine", "trainer.max_minutes=30"]).trainer.max_minutes == 30
    linear = load_config(None, ["trainer.schedule.shape=linear", "trainer.max_steps=100"])
    assert linear.trainer.schedule.min_lr_ratio == 0.1
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        load_config(None, ["trainer.schedule.min_lr_ratio=1.5"])
    with pytest.raises(ConfigError, match="max_minutes"):
        load_config(None, ["trainer.max_minutes=-1"])


def test_a_step_that_trains_nothing_logs_its_scheduled_rate(tmp_path):
    """Step 2 claims only a group whose rewards are all equal (nothing to train): its metrics still show
    the rate the schedule gives step 2, not step 1's (the smoke run logged that when its step 2 drew such groups)."""
    import json

    import httpx

    from proxy.config import load_config
    from tests.conftest import run_server
    from tests.trainer.test_dpo import OPEN, scored_groups
    from trainer import loop

    db_url = f"sqlite:///{tmp_path}/areal.db"
    run_dir = tmp_path / "run"
    with run_server(tmp_path, db_url) as proxy:
        overrides = [
            f"store.url={db_url}",
            f"proxy.port={proxy.url.rsplit(':', 1)[1]}",
            f"trainer.run_dir={run_dir}",
            "trainer.max_staleness=10",
            "trainer.batch.size=2",
            "rollout.group_size=2",
            "trainer.optim.lr=2e-5",
            "trainer.schedule.shape=linear",
            "trainer.schedule.min_lr_ratio=0.5",
        ]
        scored_groups(proxy, [[1.0, 0.0]])
        assert loop.Trainer(load_config(None, [*overrides, "trainer.max_steps=1"])).run() == 0
        created = proxy.post("/sessions", json={"count": 2, "group_id": "flat", "task_id": "t-flat"})
        for session in created.json()["data"]:
            assert httpx.post(session["base_url"] + "/chat/completions", json=OPEN, timeout=600).status_code == 200
            assert proxy.post(f"/sessions/{session['session_id']}/finish", json={"reward": 0.0}).status_code == 200
        assert loop.Trainer(load_config(None, [*overrides, "trainer.max_steps=2"])).run() == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in rows if "lr" in r}
    assert steps[2]["samples"] == 0, "step 2 had nothing to train"
    assert [steps[1]["lr"], steps[2]["lr"]] == pytest.approx([2e-5, 1.5e-5])
