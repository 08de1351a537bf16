"""The group page's advantages are the trainer's: `proxy.ui.advantages` on rows as the store keeps
them gives, for every estimator, what `trainer/advantages.py` gives on the same rewards, and leaves
out exactly the sessions the trainer never normalised (failed, dropped as stale, down-sampled)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from proxy.store.claims import DROPPED_STALE, SKIPPED_ZERO_VARIANCE
from proxy.ui.advantages import advantages
from trainer.advantages import ADVANTAGES


def session(sid, reward, group="g", status="finished", consumed_step=None, failure=None, eval=False):
    return SimpleNamespace(
        id=sid,
        group_id=group,
        task_id="t",
        reward=reward,
        status=status,
        consumed_step=consumed_step,
        failure=failure,
        eval=eval,
        auto=False,
    )


@pytest.mark.parametrize("estimator", sorted(ADVANTAGES))
def test_every_estimator_gives_what_the_trainer_gives(estimator):
    rows = [session(f"s{i}", r) for i, r in enumerate([1.0, 0.3, 0.0, 0.0, 1.0])]
    got = advantages(rows, estimator)
    expected = ADVANTAGES[estimator](torch.tensor([r.reward for r in rows], dtype=torch.float64), torch.zeros(5).long())
    for i, row in enumerate(rows):
        assert got[row.id].advantage == pytest.approx(float(expected.values[i]), abs=1e-12)
        assert got[row.id].baseline == pytest.approx(float(expected.baseline[i]), abs=1e-12)
        assert not got[row.id].flat


def test_grpo_by_hand():
    rows = [session("a", 1.0), session("b", 0.0)]  # mean 0.5, sample std 0.7071
    got = advantages(rows, "grpo")
    assert got["a"].advantage == pytest.approx(0.5 / (0.5**0.5 + 1e-6))
    assert got["b"].advantage == pytest.approx(-got["a"].advantage)


def test_sessions_the_trainer_never_normalised_are_left_out():
    rows = [
        session("kept1", 1.0, status="consumed", consumed_step=3),
        session("kept2", 0.0, status="consumed", consumed_step=3),
        session("stale", 1.0, status="consumed", consumed_step=DROPPED_STALE),
        session("pods", 1.0, status="consumed", consumed_step=SKIPPED_ZERO_VARIANCE, failure="skipped: down-sampled"),
        session("failed", None, status="failed"),
        session("open", None, status="open"),
    ]
    got = advantages(rows, "rloo")
    assert set(got) == {"kept1", "kept2"}
    assert got["kept1"].advantage == 1.0 and got["kept2"].advantage == -1.0


def test_a_flat_group_is_skipped_unless_a_step_trained_it_as_unsolved():
    skipped = [session(s, 0.0, status="consumed", consumed_step=SKIPPED_ZERO_VARIANCE) for s in "ab"]
    got = advantages(skipped, "grpo", unsolved_advantage=-0.1)
    assert all(v.flat and not v.unsolved and v.advantage == 0.0 for v in got.values())
    trained = [session(s, 0.0, status="consumed", consumed_step=4) for s in "ab"]
    got = advantages(trained, "grpo", unsolved_advantage=-0.1)
    assert all(v.unsolved and v.advantage == -0.1 and v.baseline == 0.1 for v in got.values())


def test_reinforce_pp_scales_by_the_claimed_batch():
    group = [session("a", 1.0, status="training"), session("b", 0.0, status="training")]
    other = [session("c", 1.0, group="h", status="training"), session("d", 0.5, group="h", status="training")]
    got = advantages(group, "reinforce_pp", batch=[*group, *other])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5], dtype=torch.float64)
    expected = ADVANTAGES["reinforce_pp"](rewards, torch.tensor([0, 0, 1, 1]))
    assert set(got) == {"a", "b"}
    assert got["a"].advantage == pytest.approx(float(expected.values[0]))
    assert got["b"].advantage == pytest.approx(float(expected.values[1]))
    alone = advantages(group, "reinforce_pp")
    assert alone["a"].advantage != pytest.approx(got["a"].advantage)  # the batch's std is not the group's
