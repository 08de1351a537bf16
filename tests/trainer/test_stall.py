"""The trainer warns when a run stops learning: steps that train nothing because every group
scored alike (a collapsed policy gets almost no gradient and hardly recovers by itself)."""

from trainer.metrics import StallWatch


def test_warns_after_limit_empty_steps_and_again_each_limit():
    watch = StallWatch(limit=3)
    assert watch.update(0, [0.0] * 8) is None
    assert watch.update(0, [0.0] * 8) is None
    message = watch.update(0, [0.0] * 8)
    assert message is not None
    assert "last 3 steps" in message and "every sample earned 0" in message and "collapsed" in message
    assert watch.update(0, [0.0] * 8) is None
    assert watch.update(0, [0.0] * 8) is None
    assert "last 6 steps" in watch.update(0, [0.0] * 8)


def test_a_step_that_trains_resets_the_count():
    watch = StallWatch(limit=2)
    assert watch.update(0, [0.0] * 4) is None
    assert watch.update(5, [0.0, 1.0, 0.0, 1.0]) is None
    assert watch.update(0, [0.0] * 4) is None
    assert watch.update(0, [1.0] * 4 + [0.0] * 4) == (
        "no sample trained in the last 2 steps (mean reward 0.333, each group's samples alike): "
        "nothing is being learned; if reward fell from earlier steps the policy has collapsed: lower "
        "trainer.optim.lr or trainer.max_staleness and restart, from a checkpoint before the fall if one is kept"
    )


def test_all_right_reads_as_solved_not_collapsed():
    watch = StallWatch(limit=1)
    message = watch.update(0, [1.0] * 8)
    assert "every sample earned 1" in message and "solved" in message and "collapsed" not in message


def test_limit_zero_never_warns():
    watch = StallWatch(limit=0)
    assert all(watch.update(0, [0.0] * 4) is None for _ in range(50))
    assert not watch.stalled and watch.empty == 50
