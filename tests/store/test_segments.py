"""A turn whose template re-rendered the history starts a new token sequence under its parent:
full prompts, the trainer's concatenated sequences and the tree's returns all respect the link."""

from __future__ import annotations

from types import SimpleNamespace

from proxy.store.samples import samples_for_session
from proxy.store.tokens import pack_floats, pack_ints
from proxy.store.tree import full_prompts, starts_segment


def row(id, parent, depth, prompt, prompt_len, output, ret=1.0):
    return SimpleNamespace(
        id=id,
        parent_id=parent,
        depth=depth,
        prompt_ids=pack_ints(prompt),
        prompt_len=prompt_len,
        output_ids=pack_ints(output),
        output_logprobs=pack_floats([-0.5] * len(output)),
        output_versions=pack_ints([0] * len(output)),
        ret=ret,
        reward=None,
        temperature=1.0,
        finish_reason="stop",
        request_hash=None,
        superseded_by=None,
    )


# root: prompt [1,2] out [3]; a continues it: new [4] out [5]; b re-renders: whole prompt [1,2,9,4] out [6];
# c continues b: new [7] out [8]
ROWS = [
    row("root", None, 0, [1, 2], 2, [3], ret=0.25),
    row("a", "root", 1, [4], 4, [5], ret=0.5),
    row("b", "a", 2, [1, 2, 9, 4], 4, [6], ret=0.75),
    row("c", "b", 3, [7], 6, [8], ret=1.0),
]


def test_which_rows_start_a_sequence():
    assert [starts_segment(r) for r in ROWS] == [True, False, True, False]


def test_full_prompts_restart_at_a_segment():
    assert full_prompts(ROWS) == {"root": [1, 2], "a": [1, 2, 3, 4], "b": [1, 2, 9, 4], "c": [1, 2, 9, 4, 6, 7]}


def test_each_sequence_is_its_own_training_sample():
    session = SimpleNamespace(id="s", group_id=None, task_id="t", reward=1.0, min_version=0)
    samples = samples_for_session(session, ROWS)
    concat = {tuple(s.completion_ids): s for s in samples.concat}
    assert set(concat) == {("root", "a"), ("b", "c")}
    first, second = concat[("root", "a")], concat[("b", "c")]
    assert first.input_ids == [1, 2, 3, 4, 5] and first.loss_mask == [0, 0, 1, 0, 1]
    assert first.returns == [0, 0, 0.25, 0, 0.5]
    assert second.input_ids == [1, 2, 9, 4, 6, 7, 8] and second.loss_mask == [0, 0, 0, 0, 1, 0, 1]
    assert second.returns == [0, 0, 0, 0, 0.75, 0, 1.0]
