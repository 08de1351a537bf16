"""A step that fails part-way (after its first minibatch moved the weights) trains nothing twice:
its partial update is not checkpointed (before, the trainer's exit saved it as the last completed
step, and the step's sessions, handed back, were trained again on top of it), and the next run
trains every session exactly once. The trainer runs in this process against a real proxy and store; the
failure is raised where a real one (out of memory in the second minibatch) would be."""

from __future__ import annotations

import httpx
import pytest

from proxy.config import load_config
from proxy.store.claims import trained_count
from proxy.store.db import Database
from tests.conftest import run_server
from trainer import loop
from trainer.audit import effective_history

CHAT = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 4}


def finished_groups(proxy, groups: int = 2, size: int = 4) -> list[str]:
    ids = []
    for g in range(groups):
        created = proxy.post("/sessions", json={"count": size, "group_id": f"g{g}", "task_id": f"t{g}"}).json()["data"]
        for i, session in enumerate(created):
            r = httpx.post(session["base_url"] + "/chat/completions", json=CHAT, timeout=120)
            assert r.status_code == 200, r.text
            assert (
                proxy.post(f"/sessions/{session['session_id']}/finish", json={"reward": float(i % 2)}).status_code
                == 200
            )
            ids.append(session["session_id"])
    return ids


def test_a_step_failing_part_way_trains_nothing_twice(tmp_path, monkeypatch):
    db_url = f"sqlite:///{tmp_path}/areal.db"
    with run_server(tmp_path, db_url) as proxy:
        ids = finished_groups(proxy, groups=4)
        run_dir = tmp_path / "run"
        overrides = [
            f"store.url={db_url}",
            f"proxy.port={proxy.url.rsplit(':', 1)[1]}",
            f"trainer.run_dir={run_dir}",
            "trainer.batch.size=8",
            "trainer.batch.minibatches=2",
            "trainer.batch.tokens_per_microbatch=64",  # several microbatches, so both minibatches have some
            "trainer.max_steps=2",
            "trainer.max_staleness=10",  # every session was sampled by the base weights
            "rollout.group_size=4",
        ]
        cfg = load_config(None, overrides)
        real_step = loop.train_step
        calls = 0

        def second_minibatch_fails(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls == 4:  # step 1: calls 1 and 2; step 2: call 3 moves the weights, call 4 fails
                raise MemoryError("injected: out of memory in the second minibatch")
            return real_step(*args, **kwargs)

        monkeypatch.setattr(loop, "train_step", second_minibatch_fails)
        with pytest.raises(MemoryError):
            loop.Trainer(cfg).run()
        assert calls == 4, "step 2's first minibatch did move the weights"
        assert not (run_dir / "checkpoints").exists(), "the partial update of step 2 was not checkpointed"
        db = Database(cfg.store)
        assert db.read(trained_count)["finished"] == len(ids) // 2, "the failed step's sessions were handed back"

        monkeypatch.setattr(loop, "train_step", real_step)
        assert loop.Trainer(load_config(None, overrides)).run() == 0
        counts = db.read(trained_count)
        db.close()
        assert counts["trained"] + counts["skipped"] == len(ids) and counts["finished"] == 0
        trained = effective_history(run_dir)
        assert len(trained) == len(set(trained)), "a session is in the final weights twice"
        assert set(trained) <= set(ids)
