"""[trainer.critic] in the real trainer loop, against a real proxy and store: a step trains the policy on GAE
advantages and the value head beside it, a lone session included; its checkpoint holds the critic, and a
resumed run carries on from it."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from proxy.config import load_config
from tests.conftest import run_server
from tests.trainer.test_step_failure import CHAT
from trainer import critic, loop


def lone_sessions(proxy, rewards: list[float]) -> None:
    """One finished session per reward, each its own group."""
    for i, reward in enumerate(rewards):
        session = proxy.post("/sessions", json={"count": 1, "group_id": f"g{i}", "task_id": f"t{i}"}).json()["data"][0]
        assert httpx.post(session["base_url"] + "/chat/completions", json=CHAT, timeout=120).status_code == 200
        assert proxy.post(f"/sessions/{session['session_id']}/finish", json={"reward": reward}).status_code == 200


@pytest.mark.parametrize("value_coef", [0.0, 0.5])  # the head alone on the detached body; trained with it
def test_a_critic_run_trains_checkpoints_and_resumes(tmp_path, value_coef):
    db_url = f"sqlite:///{tmp_path}/areal.db"
    with run_server(tmp_path, db_url) as proxy:
        lone_sessions(proxy, [1.0, 0.0, 1.0, 0.0])  # no group to take a baseline from
        run_dir = tmp_path / "run"
        overrides = [
            f"store.url={db_url}",
            f"proxy.port={proxy.url.rsplit(':', 1)[1]}",
            f"trainer.run_dir={run_dir}",
            "trainer.batch.size=2",
            "trainer.batch.skip_zero_variance=false",
            "trainer.checkpoint.every=1",
            "trainer.max_staleness=10",
            "trainer.critic.lr=0.01",
            f"trainer.critic.value_coef={value_coef}",
            "rollout.group_size=1",
        ]
        assert loop.Trainer(load_config(None, [*overrides, "trainer.max_steps=1"])).run() == 0
        first = run_dir / "checkpoints" / "step_0000001"
        head = torch.load(first / critic.CRITIC_FILE, weights_only=True)["head"]
        assert float(head["proj.weight"].abs().sum()) > 0, "the value head trained (it starts at zero)"
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        trained = [m for m in metrics if "value_loss" in m]
        assert trained and trained[0]["value_loss"] > 0

        assert loop.Trainer(load_config(None, [*overrides, "trainer.max_steps=2"])).run() == 0
        second = torch.load(run_dir / "checkpoints" / "step_0000002" / critic.CRITIC_FILE, weights_only=True)
        assert second["optimizer"]["state"][0]["step"] == 2, "the resumed critic's optimizer went on from step 1"
