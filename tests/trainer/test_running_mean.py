"""The running-mean baseline of online RL ([trainer.running_mean]), checked by hand.

decay 0.5: a key's mean after rewards r1, r2 is r1 then 0.5·r1 + 0.5·r2; a session's baseline is the
mean before its own claim updates it; a key not seen yet takes the mean over every key (0 before any).
"""

from __future__ import annotations

import pytest

from proxy.store.samples import SessionSamples
from trainer.checkpoint import TrainerState
from trainer.config import RunningMeanConfig, TrainerConfig
from trainer.selection import RunningMeanAdvantages, RunningMeans, Selection, SkipFlat, select, selectors


def s(sid: str, reward: float, prompt: str, task: str | None = None) -> SessionSamples:
    return SessionSamples(sid, sid, task, reward, 0, [], [], prompt_key=prompt)


def test_means_by_hand():
    means = RunningMeans(decay=0.5, max_keys=10)
    assert means.baseline("a") == 0.0  # nothing seen yet
    means.update("a", 1.0)
    assert means.baseline("a") == 1.0 and means.baseline("b") == 1.0  # a new key: the overall mean
    means.update("a", 0.0)
    assert means.baseline("a") == 0.5
    means.update("b", 0.0)
    assert means.baseline("b") == 0.0
    assert means.overall == pytest.approx(0.25)  # 1 → 0.5·1 + 0.5·0 = 0.5 → 0.5·0.5 + 0.5·0 = 0.25


def test_the_least_recently_used_key_goes_first():
    means = RunningMeans(decay=0.5, max_keys=2)
    means.update("a", 1.0)
    means.update("b", 2.0)
    means.update("a", 1.0)  # a is used again
    means.update("c", 3.0)
    assert set(means.means) == {"a", "c"}


def test_a_claims_baselines_come_before_its_own_rewards():
    means = RunningMeans(decay=0.5, max_keys=10)
    picker = RunningMeanAdvantages(RunningMeanConfig(key="prompt", decay=0.5), means)
    first = select([s("x1", 1.0, "p"), s("x2", 0.0, "p"), s("y1", 1.0, "q")], [picker])
    assert first.baseline == {"x1": 0.0, "x2": 0.0, "y1": 0.0}
    assert first.scale == {"x1": 1.0, "x2": 1.0, "y1": 1.0} and first.flat == []
    # p: 1 then 0.5·1 + 0.5·0 = 0.5; q: 1.
    second = select([s("x3", 1.0, "p"), s("y2", 0.0, "q"), s("z1", 1.0, "r")], [picker])
    overall = 0.5 * (0.5 * 1.0 + 0.5 * 0.0) + 0.5 * 1.0  # 1, 0, 1 in claim order
    assert second.baseline == {"x3": 0.5, "y2": 1.0, "z1": pytest.approx(overall)}


@pytest.mark.parametrize(
    ("key", "expected"),
    [("prompt", "prompt:p"), ("task", "task:t"), ("global", "")],
)
def test_keys(key, expected):
    picker = RunningMeanAdvantages(RunningMeanConfig(key=key), RunningMeans(0.9, 10))
    assert picker.key_of(s("a", 1.0, "p", task="t")) == expected
    assert picker.key_of(s("b", 1.0, "p")) == ("" if key == "global" else "prompt:p")  # no task: the prompt


def test_lone_sessions_are_trained_not_skipped_as_flat_groups():
    """GRPO would give a group of one advantage 0 and the skip filter would drop it; the running mean trains it."""
    cfg = TrainerConfig(running_mean={"key": "global", "decay": 0.5})
    chosen = selectors(cfg, RunningMeans(0.5, 10))
    assert any(isinstance(x, RunningMeanAdvantages) for x in chosen) and any(isinstance(x, SkipFlat) for x in chosen)
    claim: Selection = select([s("a", 1.0, "p"), s("b", 0.0, "q")], chosen)
    assert [x.session_id for x in claim.sessions] == ["a", "b"] and claim.skips == []
    plain = select([s("a", 1.0, "p"), s("b", 0.0, "q")], selectors(TrainerConfig()))
    assert plain.sessions == []  # the group estimator: two groups of one, both flat, both skipped


def test_the_means_survive_a_checkpoint():
    means = RunningMeans(decay=0.5, max_keys=10)
    means.update("prompt:p", 1.0)
    state = TrainerState(baselines=means.state())
    again = RunningMeans(decay=0.5, max_keys=10)
    again.load(state.baselines)
    assert again.baseline("prompt:p") == 1.0 and again.overall == 1.0


def test_running_mean_and_a_critic_are_refused_together():
    with pytest.raises(ValueError, match="running_mean"):
        TrainerConfig(running_mean={"key": "prompt"}, critic={}, batch={"style": "individual"})
