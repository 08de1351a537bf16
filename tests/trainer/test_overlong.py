"""DAPO's overlong shaping against numbers worked out by hand: the soft length penalty, a session's
shaped reward and returns, truncated replies out of the loss, and a step trained on the result."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from proxy.store.samples import ConcatSample, IndividualSample, SessionSamples
from tests.conftest import tiny_llama
from trainer.batch import build_samples, pack
from trainer.config import OverlongConfig, TrainerConfig
from trainer.overlong import length_penalty, shape
from trainer.selection import GroupAdvantages, SkipFlat, select, selectors
from trainer.step import target_logprobs, train_step


def reply(cid: str, parent: str | None, prompt: list[int], output: list[int], finish: str = "stop") -> IndividualSample:
    return IndividualSample(
        session_id="",
        group_id="g",
        task_id="t",
        completion_id=cid,
        parent_id=parent,
        turn=0,
        prompt_ids=prompt,
        output_ids=output,
        behav_logprobs=[-1.0] * len(output),
        versions=[0] * len(output),
        ret=1.0,
        reward=None,
        session_reward=1.0,
        temperature=1.0,
        finish_reason=finish,
    )


def sequence(replies: list[IndividualSample]) -> ConcatSample:
    """The concat sample of a chain of replies, each prompt continuing the last (as the store builds it)."""
    last = replies[-1]
    ids = last.prompt_ids + last.output_ids
    mask = [0] * len(ids)
    for r in replies:
        start = len(r.prompt_ids)
        mask[start : start + len(r.output_ids)] = [1] * len(r.output_ids)
    return ConcatSample(
        session_id="",
        group_id="g",
        task_id="t",
        leaf_id=last.completion_id,
        completion_ids=[r.completion_id for r in replies],
        input_ids=ids,
        loss_mask=mask,
        behav_logprobs=[-1.0 * m for m in mask],
        versions=[0 if m else -1 for m in mask],
        returns=[1.0 * m for m in mask],
        session_reward=1.0,
        temperature=1.0,
    )


def session(sid: str, replies: list[IndividualSample], concat: list[ConcatSample], reward: float = 1.0):
    return SessionSamples(sid, "g", "t", reward, 0, replies, concat)


# Two turns: 8 sampled tokens, then (after a tool result, id 9) 10 tokens cut at the limit.
FIRST = reply("c0", None, [1, 2], [3, 4, 5, 6, 7, 8, 10, 11])
SECOND = reply("c1", "c0", [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 9], list(range(20, 30)), finish="length")
LONG = session("long", [FIRST, SECOND], [sequence([FIRST, SECOND])])


def test_length_penalty_is_daposs_soft_punishment():
    # L_max 10, L_cache 4: free up to 6 tokens, then (6 - |y|) / 4 down to -1 at 10, -1 beyond
    assert [length_penalty(n, 10, 4) for n in (0, 6, 7, 8, 9, 10, 11, 50)] == [0, 0, -0.25, -0.5, -0.75, -1, -1, -1]
    assert length_penalty(8, 10, 4, penalty=0.5) == -0.25
    # buffer 0: nothing up to max_tokens, the whole penalty past it
    assert [length_penalty(n, 10, 0) for n in (10, 11)] == [0, -1]
    assert length_penalty(10_000, 0, 0) == 0  # max_tokens 0: no length penalty


def test_a_session_pays_the_sum_of_its_replies_penalties():
    # penalty 0.5: the 8-token reply -0.5 * 2/4 = -0.25, the 10-token one -0.5: -0.75 in all
    cfg = OverlongConfig(max_tokens=10, buffer=4, penalty=0.5)
    shaped = shape(LONG, cfg, "individual")
    assert shaped.penalty == -0.75 and shaped.penalised == 2 and shaped.masked_tokens == 0
    s = shaped.session
    assert s.reward == 0.25
    assert [c.ret for c in s.individual] == [0.25, 0.25]
    (seq,) = s.concat
    assert seq.loss_mask == LONG.concat[0].loss_mask
    assert seq.returns == [0.25 * m for m in seq.loss_mask], "every return of the session, 0 off the mask"
    assert LONG.reward == 1.0 and LONG.individual[0].ret == 1.0, "the claimed session itself is left as it was"
    # A session whose replies are all short is returned as it is.
    short = session("short", [reply("c2", None, [1, 2], [3, 4])], [])
    assert shape(short, cfg, "individual").session is short


def test_truncated_replies_leave_the_loss_in_both_styles():
    cfg = OverlongConfig(mask_truncated=True)  # no length penalty: filtering alone
    shaped = shape(LONG, cfg, "individual")
    assert shaped.penalty == 0 and shaped.session.reward == 1.0
    assert [c.completion_id for c in shaped.session.individual] == ["c0"]
    assert shaped.masked_tokens == 10
    (seq,) = shaped.session.concat
    assert seq.loss_mask == [0, 0] + [1] * 8 + [0] * 11, "the second reply's 10 tokens masked"
    assert shape(LONG, cfg, "concat").masked_tokens == 10
    # A truncated root shared by two branches: once per completion, once per sequence through it.
    root = reply("r", None, [1, 2], [3, 4, 5, 6], finish="length")
    a = reply("a", "r", [1, 2, 3, 4, 5, 6, 7], [8, 9])
    b = reply("b", "r", [1, 2, 3, 4, 5, 6, 11], [12])
    tree = session("tree", [root, a, b], [sequence([root, a]), sequence([root, b])])
    assert shape(tree, cfg, "individual").masked_tokens == 4
    shaped = shape(tree, cfg, "concat")
    assert shaped.masked_tokens == 8
    assert [sum(c.loss_mask) for c in shaped.session.concat] == [2, 1]


def test_shaping_comes_first_and_gives_an_all_correct_group_a_signal():
    # Both sessions scored 1; without shaping the group is flat and skipped. With it, "long" pays
    # -0.75 (reward 0.25): GRPO mean 0.625, std (n - 1) sqrt(2 * 0.375^2) = 0.530330,
    # so "long" gets -0.375 / 0.530330 = -0.707107 and "brief" +0.707107.
    cfg = TrainerConfig(overlong={"max_tokens": 10, "buffer": 4, "penalty": 0.5, "mask_truncated": True})
    assert [type(x).__name__ for x in selectors(cfg)] == ["ShapeOverlong", "GroupAdvantages", "SkipFlat"]
    brief = session("brief", [reply("c3", None, [1, 2], [40, 41, 42])], [])
    assert select([LONG, brief], [GroupAdvantages("grpo"), SkipFlat()]).sessions == []
    claim = select([LONG, brief], selectors(cfg))
    assert claim.counts == {"overlong_penalised": 2, "overlong_penalty_total": -0.75, "overlong_masked_tokens": 10}
    samples = build_samples(claim.sessions, "individual", claim.baseline, claim.scale)
    assert [s.input_ids[-1] for s in samples] == [11, 42], "the truncated reply is not trained"
    assert samples[0].advantages[-1] == pytest.approx(-0.707107, abs=1e-5)
    assert samples[1].advantages[-1] == pytest.approx(0.707107, abs=1e-5)
    # ... and a step trains on them: the long session's reply becomes less likely, the brief one's more.
    model, cpu = tiny_llama().eval(), torch.device("cpu")
    groups = pack(samples, 1000, 0)
    assert len(groups) == 1, "both replies answer the prompt 1 2"

    def logprobs() -> list[float]:
        with torch.no_grad():
            lp = target_logprobs(model, groups[0], cpu)
        return [float(lp[row][groups[0].loss_mask[row]].sum()) for row in range(2)]

    before = logprobs()
    with torch.no_grad():
        groups[0].behav_logprobs = target_logprobs(model, groups[0], cpu)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    result = train_step(model, opt, groups, cfg, cpu, version=0)
    assert result.tokens == 3 + 8 and result.grad_norm > 0
    brief_after, long_after = logprobs()
    assert brief_after > before[0] and long_after < before[1]  # rows by length: brief first


def test_overlong_config_says_how_to_fix_it():
    with pytest.raises(ValidationError, match=r"buffer 20 must not exceed max_tokens 10"):
        OverlongConfig(max_tokens=10, buffer=20)
    with pytest.raises(ValidationError, match=r"does nothing: set max_tokens"):
        TrainerConfig(overlong={})
    assert TrainerConfig().overlong is None and TrainerConfig(overlong=False).overlong is None
