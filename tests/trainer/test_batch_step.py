"""Prefix-shared logprobs equal the naive per-sequence computation (values and gradients);
packing respects the token budget; a training step moves the policy the right way."""

from __future__ import annotations

import copy

import pytest
import torch

from proxy.store.samples import SessionSamples
from tests.conftest import tiny_llama
from trainer.batch import Sample, build_samples, pack
from trainer.config import TrainerConfig
from trainer.selection import (
    Downsample,
    FillBatch,
    GroupAdvantages,
    OneClaim,
    Selection,
    SkipFlat,
    TrainUnsolved,
    claim_policy,
    downsample_groups,
    select,
    selectors,
)
from trainer.step import (
    group_logprobs,
    m2po_keeps,
    microbatches,
    padded_cost,
    shared_prefix_len,
    target_logprobs,
    train_step,
)


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama().eval()


def sample(ids: list[int], mask: list[int], adv: float = 1.0, temperature: float = 1.0) -> Sample:
    return Sample(
        input_ids=ids,
        loss_mask=mask,
        behav_logprobs=[-1.0 * m for m in mask],
        versions=[0 if m else -1 for m in mask],
        advantages=[adv * m for m in mask],
        temperature=temperature,
    )


def naive_logprobs(model, s: Sample) -> list[float]:
    logits = model(torch.tensor([s.input_ids])).logits[0].float() / s.temperature
    lp = torch.log_softmax(logits, -1)
    return [lp[t - 1, s.input_ids[t]] for t in range(1, len(s.input_ids)) if s.loss_mask[t]]


SAMPLES = [
    sample([5, 6, 7, 8, 9], [0, 0, 0, 1, 1]),
    sample([5, 6, 7, 10, 11, 12], [0, 0, 0, 1, 1, 1], temperature=0.7),
    sample([5, 6, 7, 13], [0, 0, 0, 1]),
    sample([1, 2, 3, 4, 20, 21, 22, 23], [0, 0, 0, 1, 1, 0, 1, 1]),  # concat: two turns with a prompt between
]


def test_prefix_groups_match_naive_logprobs(tiny):
    groups = pack(SAMPLES, tokens_per_microbatch=1000, pad_id=0)
    assert [g.continuation.shape[0] for g in groups] == [3, 1], "three samples share the prefix 5 6 7"
    got = []
    with torch.no_grad():
        for g in groups:
            lp = target_logprobs(tiny, g, torch.device("cpu"))
            for row in range(lp.shape[0]):
                got.append(lp[row][g.loss_mask[row]].tolist())
    by_len = sorted(SAMPLES[:3], key=lambda s: len(s.input_ids))
    expected = [naive_logprobs(tiny, s) for s in [*by_len, SAMPLES[3]]]
    for g_row, e_row in zip(got, expected):
        assert g_row == pytest.approx([float(x) for x in e_row], abs=1e-5)


def test_prefix_sharing_gives_the_same_gradients(tiny):
    a, b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    groups = pack(SAMPLES, tokens_per_microbatch=1000, pad_id=0)
    sum(target_logprobs(a, g, torch.device("cpu"))[g.loss_mask].sum() for g in groups).backward()
    sum(sum(naive_logprobs(b, s)) for s in SAMPLES).backward()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-5), name


RAGGED = [
    *SAMPLES,
    sample([40, 41, 42, 43, 44, 45, 50, 51], [0, 0, 0, 0, 0, 0, 1, 1]),  # a longer prefix
    sample([40, 41, 42, 43, 44, 45, 52], [0, 0, 0, 0, 0, 0, 1], temperature=1.3),
    sample([60, 61, 62], [0, 0, 1]),  # a shorter one
]


def test_batched_groups_match_naive_logprobs_and_gradients(tiny):
    """Groups of different prefix lengths and widths in one padded forward: same values and
    gradients as each sequence run on its own (the padding is masked, positions continue)."""
    a, b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    groups = pack(RAGGED, tokens_per_microbatch=1000, pad_id=0)
    assert sorted(g.prefix.shape[0] for g in groups) == [2, 3, 3, 6]
    assert len(microbatches(groups, 1000)) == 1, "all in one forward"
    logps, entropies = group_logprobs(a, groups, torch.device("cpu"), entropy=True)
    got, got_entropy = {}, {}
    for g, lp, ent in zip(groups, logps, entropies):
        assert lp.shape == g.continuation.shape
        assert not lp[~g.loss_mask].any(), "zero off the mask"
        for row in range(lp.shape[0]):
            ids = g.prefix.tolist() + g.continuation[row][: int(g.loss_mask[row].nonzero().max()) + 1].tolist()
            got[tuple(ids)] = lp[row][g.loss_mask[row]]
            got_entropy[tuple(ids)] = ent[row][g.loss_mask[row]]
    for s in RAGGED:
        expected = torch.stack(naive_logprobs(b, s))
        assert got[tuple(s.input_ids)].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
        with torch.no_grad():
            logits = b(torch.tensor([s.input_ids])).logits[0] / s.temperature
        at = [t - 1 for t in range(1, len(s.input_ids)) if s.loss_mask[t]]
        naive_entropy = torch.distributions.Categorical(logits=logits[at]).entropy()
        assert got_entropy[tuple(s.input_ids)].tolist() == pytest.approx(naive_entropy.tolist(), abs=1e-5)
    sum(lp[g.loss_mask].sum() for g, lp in zip(groups, logps)).backward()
    sum(sum(naive_logprobs(b, s)) for s in RAGGED).backward()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-5), name


COMMON = list(range(70, 80))  # a start every prompt has (think: system prompt and few-shot turns)
SHARED = [
    sample([*COMMON, 80, 90, 91], [0] * 11 + [1, 1]),
    sample([*COMMON, 80, 92], [0] * 11 + [1], temperature=0.8),
    sample([*COMMON, 81, 82, 93, 94, 95], [0] * 12 + [1, 1, 1]),
    sample([*COMMON, 83, 84, 85, 96], [0] * 13 + [1]),
]


def test_a_common_start_of_the_prefixes_runs_once_with_the_same_values_and_gradients(tiny):
    """Ragged prefixes that begin with the same 10 tokens: those run as one row, and the logprobs
    and gradients are still those of each sequence run on its own."""
    a, b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    groups = pack(SHARED, tokens_per_microbatch=1000, pad_id=0)
    assert sorted(g.prefix.shape[0] for g in groups) == [11, 12, 13]
    seen = []
    first_layer = a.base_model.layers[0]
    hook = first_layer.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape[:2])))
    logps, _ = group_logprobs(a, groups, torch.device("cpu"))
    hook.remove()
    assert seen[:2] == [(1, 10), (3, 3)], "the common start once, then each prefix's own tail"
    for g, lp in zip(groups, logps):
        for row in range(lp.shape[0]):
            ids = g.prefix.tolist() + g.continuation[row][: int(g.loss_mask[row].nonzero().max()) + 1].tolist()
            s = next(s for s in SHARED if s.input_ids == ids)
            expected = torch.stack(naive_logprobs(b, s))
            assert lp[row][g.loss_mask[row]].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    sum(lp[g.loss_mask].sum() for g, lp in zip(groups, logps)).backward()
    sum(sum(naive_logprobs(b, s)) for s in SHARED).backward()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-5), name


def test_shared_prefix_len_leaves_every_prefix_its_last_token():
    rows = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 0], [1, 2, 5, 6]])
    assert shared_prefix_len(rows, torch.tensor([4, 3, 4])) == 2
    assert shared_prefix_len(rows[:2], torch.tensor([4, 3])) == 2, "row 2 keeps its last token, 3"
    assert shared_prefix_len(rows[:1], torch.tensor([4])) == 3
    assert shared_prefix_len(torch.tensor([[1, 2], [3, 4]]), torch.tensor([2, 2])) == 0


def test_microbatches_count_the_padding_and_the_copied_prefixes():
    groups = pack(RAGGED, tokens_per_microbatch=1000, pad_id=0)
    by_prefix = {g.prefix.shape[0]: g for g in groups}
    long, short = by_prefix[6], by_prefix[2]  # 6 + 2 rows x 2 wide; 2 + 1 row x 1 wide
    assert padded_cost([long]) == 6 + 2 * 2
    # together: 2 prefixes x 6 + 3 rows x 2 + 3 rows x 6 copied prefix keys/values = 36
    assert padded_cost([long, short]) == 36
    assert [len(c) for c in microbatches([long, short], 36)] == [2]
    assert [len(c) for c in microbatches([long, short], 35)] == [1, 1]


def test_budget_splits_large_groups():
    samples = [sample([1, 2, 3] + [4 + i] * 5, [0, 0, 0] + [1] * 5) for i in range(10)]
    groups = pack(samples, tokens_per_microbatch=3 + 5 * 4, pad_id=0)
    assert [g.continuation.shape[0] for g in groups] == [4, 4, 2]
    assert all(g.cost <= 23 for g in groups)


def test_a_step_raises_the_logprob_of_advantaged_tokens(tiny):
    model = copy.deepcopy(tiny)
    cfg = TrainerConfig(loss={"agg": "token_mean"}, optim={"lr": 1e-2, "grad_clip": 0})
    good = sample([5, 6, 7, 8, 9], [0, 0, 0, 1, 1], adv=1.0)
    bad = sample([5, 6, 7, 30, 31], [0, 0, 0, 1, 1], adv=-1.0)
    groups = pack([good, bad], 1000, 0)
    with torch.no_grad():
        before = [naive_logprobs(model, s) for s in (good, bad)]
    for g in groups:  # behaviour = current policy (on-policy)
        with torch.no_grad():
            g.behav_logprobs = target_logprobs(model, g, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    result = train_step(model, opt, groups, cfg, torch.device("cpu"), version=0)
    assert result.tokens == 4 and result.grad_norm > 0
    with torch.no_grad():
        after = [naive_logprobs(model, s) for s in (good, bad)]
    assert sum(after[0]) > sum(before[0]) and sum(after[1]) < sum(before[1])
    changed = [n for (n, p), q in zip(model.named_parameters(), tiny.parameters()) if not torch.equal(p, q)]
    assert len(changed) == len(list(model.parameters())), "every parameter trained"


def test_a_second_epoch_is_measured_against_the_first_epochs_proximal_policy(tiny):
    """epochs > 1: the proximal logprobs of the first pass are kept on the groups, so the second
    pass's ratio is to the policy before the update (and clips), not to itself (always 1)."""
    cfg = TrainerConfig(loss={"agg": "token_mean", "proximal": "recompute"}, optim={"lr": 5e-2, "grad_clip": 0})
    stats = {}
    for keep in (False, True):
        model = copy.deepcopy(tiny)
        groups = pack([sample([5, 6, 7, 8, 9], [0, 0, 0, 1, 1], adv=1.0)], 1000, 0)
        with torch.no_grad():
            before = target_logprobs(model, groups[0], torch.device("cpu"))
            groups[0].behav_logprobs = before.clone()
        opt = torch.optim.AdamW(model.parameters(), lr=5e-2)
        train_step(model, opt, groups, cfg, torch.device("cpu"), version=0, keep_proximal=keep)
        if keep:
            torch.testing.assert_close(groups[0].prox_logprobs, before)
        else:
            assert groups[0].prox_logprobs is None
        stats[keep] = train_step(model, opt, groups, cfg, torch.device("cpu"), version=0, keep_proximal=keep).stats
    assert stats[False]["ratio_mean"] == pytest.approx(1.0)
    assert stats[True]["ratio_mean"] > 1.28 and stats[True]["clip_frac_high"] > 0  # a token past 1 + 0.28: clipped


def s(sid: str, group: str, reward: float) -> SessionSamples:
    return SessionSamples(sid, group, group, reward, 0, [], [])


def kept_ids(claim: Selection) -> list[str]:
    return [x.session_id for x in claim.sessions]


def skipped_ids(claim: Selection) -> list[str]:
    return [sid for skip in claim.skips for sid in skip.session_ids]


GRPO = GroupAdvantages("grpo")


def test_zero_variance_groups_are_skipped():
    sessions = [s("a1", "a", 1.0), s("a2", "a", 0.0), s("b1", "b", 1.0), s("b2", "b", 1.0)]
    claim = select(sessions, [GRPO, SkipFlat()])
    assert kept_ids(claim) == ["a1", "a2"] and skipped_ids(claim) == ["b1", "b2"]
    assert claim.skips[0].reason == "zero reward variance in its group"
    assert claim.baseline["a1"] == pytest.approx(0.5)
    assert build_samples([], "individual", claim.baseline, claim.scale) == []
    # Without SkipFlat (trainer.batch.skip_zero_variance = false) a flat group is trained, advantage 0.
    assert kept_ids(select(sessions, [GRPO])) == ["a1", "a2", "b1", "b2"]


def test_unsolved_groups_get_the_unsolved_advantage():
    sessions = [
        *(s(f"a{i}", "a", r) for i, r in enumerate([1.0, 0.0])),  # variance: GRPO as usual
        *(s(f"b{i}", "b", 1.0) for i in range(2)),  # solved every time: skipped
        *(s(f"c{i}", "c", 0.0) for i in range(3)),  # failed every time: advantage -0.3
    ]
    claim = select(sessions, [GRPO, TrainUnsolved(-0.3, 1.0), SkipFlat()])
    assert kept_ids(claim) == ["a0", "a1", "c0", "c1", "c2"] and skipped_ids(claim) == ["b0", "b1"]
    assert claim.counts == {"unsolved_trained": 3}
    baseline, scale = claim.baseline, claim.scale
    assert (0.0 - baseline["c0"]) / scale["c0"] == pytest.approx(-0.3)
    assert (1.0 - baseline["a0"]) / scale["a0"] == pytest.approx(0.5 / 0.5**0.5 / (1 + 2e-6), rel=1e-4)
    # Without it, or when nothing in the claim did better (mean 0), a failed group is skipped.
    assert skipped_ids(select(sessions, [GRPO, SkipFlat()])) == ["b0", "b1", "c0", "c1", "c2"]
    only_failures = [s("d0", "d", 0.0), s("d1", "d", 0.0)]
    assert skipped_ids(select(only_failures, [GRPO, TrainUnsolved(-0.3, 1.0), SkipFlat()])) == ["d0", "d1"]


def test_unsolved_groups_are_bounded_to_their_share_of_the_step():
    def unsolved(sessions: list[SessionSamples], share: float) -> list[str]:
        """The sessions of flat groups that were kept."""
        return [
            sid for sid in kept_ids(select(sessions, [GRPO, TrainUnsolved(-0.3, share), SkipFlat()])) if sid[0] != "a"
        ]

    mixed = [s(f"a{i}", "a", float(i % 2)) for i in range(6)]  # 6 sessions with reward variance
    failed = [s(f"{g}{i}", g, 0.0) for g in "cde" for i in range(2)]  # three unsolved groups of 2
    # share 0.25 of the kept sessions: u <= 0.25 * (6 + u), so u <= 2: the first unsolved group only.
    claim = select(mixed + failed, [GRPO, TrainUnsolved(-0.3, 0.25), SkipFlat()])
    assert claim.counts == {"unsolved_trained": 2} and kept_ids(claim) == [*(f"a{i}" for i in range(6)), "c0", "c1"]
    assert skipped_ids(claim) == ["d0", "d1", "e0", "e1"]
    # share 0.5: u <= 6, all three groups (6 sessions).
    assert len(unsolved(mixed + failed, 0.5)) == 6
    # A group larger than the room left is skipped whole, a later smaller one still fits.
    big_then_small = [*(s(f"b{i}", "b", 0.0) for i in range(3)), s("f0", "f", 0.0)]
    assert unsolved(mixed + big_then_small, 0.25) == ["f0"]
    # Nothing with a success to learn from in the claim (the collapse case): nothing trained.
    only = [s("g0", "g", 0.0), s("h0", "h", 1.0), s("h1", "h", 1.0)]
    assert kept_ids(select(only, [GRPO, TrainUnsolved(-0.3, 0.25), SkipFlat()])) == []


def test_downsampled_groups_keep_their_max_variance_sessions_and_advantages_come_from_them():
    sessions = [
        *(s(f"a{i}", "a", float(i == 5)) for i in range(8)),  # a lone success at a5
        *(s(f"b{i}", "b", 1.0) for i in range(8)),  # flat: left whole, then skipped
        *(s(f"c{i}", "c", float(i % 2)) for i in range(3)),  # no more than m: left whole
    ]
    kept, left_out = downsample_groups(sessions, 4)
    assert left_out == ["a3", "a4", "a6", "a7"]
    assert [x.session_id for x in kept] == ["a0", "a1", "a2", "a5", *(f"b{i}" for i in range(8)), "c0", "c1", "c2"]
    claim = select(sessions, [Downsample(4), GRPO, SkipFlat()])
    assert kept_ids(claim) == ["a0", "a1", "a2", "a5", "c0", "c1", "c2"]
    assert [(k.counted_as, k.session_ids) for k in claim.skips] == [
        ("downsampled", ["a3", "a4", "a6", "a7"]),
        ("skipped_zero_variance", [f"b{i}" for i in range(8)]),
    ]
    assert claim.counts == {"downsampled": 4}
    # GRPO over the four kept: mean 1/4, std (n - 1) sqrt(3/16 * 4/3) = 1/2, so the success gets
    # (1 - 1/4) / 1/2 = 1.5 and each failure -0.5 (in the whole group of 8: 2.47 and -0.35).
    baseline, scale = claim.baseline, claim.scale
    assert (1.0 - baseline["a5"]) / scale["a5"] == pytest.approx(1.5, rel=1e-5)
    assert (0.0 - baseline["a0"]) / scale["a0"] == pytest.approx(-0.5, rel=1e-5)


def test_the_config_chooses_the_selectors_in_their_order():
    from proxy.config import ConfigError, load_config

    names = [type(x).__name__ for x in selectors(TrainerConfig())]
    assert names == ["GroupAdvantages", "SkipFlat"]
    everything = TrainerConfig(pods={"keep": 4}, unsolved={"advantage": -0.5}, batch={"skip_zero_variance": False})
    assert [type(x).__name__ for x in selectors(everything)] == ["Downsample", "GroupAdvantages", "TrainUnsolved"]
    assert isinstance(claim_policy(TrainerConfig()), OneClaim)
    fill = claim_policy(TrainerConfig(batch={"size": 8, "fill": True}))
    assert isinstance(fill, FillBatch) and fill.need(3) == 5 and not fill.complete(7) and fill.complete(8)
    with pytest.raises(ConfigError, match=r"trainer.pods.keep 1 leaves every group fewer than two rewards"):
        load_config(None, ["trainer.pods.keep=1"])
    assert load_config(None, ["trainer.pods.keep=4"]).trainer.pods.keep == 4


@pytest.mark.parametrize("samples", [SHARED, RAGGED], ids=["shared-start", "ragged"])
def test_gradient_checkpointing_gives_the_same_step(tiny, samples, monkeypatch):
    """With checkpointing each row runs as one full sequence (the layers take no cache) and every
    layer runs again in the backward; the step's gradients and updated weights are the same."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    seen: list[tuple[int, int]] = []  # (rows, positions) of every MLP call, recomputes included
    forward = LlamaMLP.forward
    monkeypatch.setattr(LlamaMLP, "forward", lambda self, x: seen.append(tuple(x.shape[:2])) or forward(self, x))
    cfg = TrainerConfig(loss={"agg": "token_mean"}, optim={"grad_clip": 0})
    models, calls = [], []
    for ckpt in (False, True):
        model = copy.deepcopy(tiny)
        if ckpt:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        groups = pack(samples, tokens_per_microbatch=1000, pad_id=0)
        seen.clear()
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), groups, cfg, torch.device("cpu"), version=0)
        models.append(model)
        calls.append(list(seen))
    plain, ckpt = models
    rows, longest = len(samples), max(len(s.input_ids) for s in samples)
    assert all(c[0] == rows and c[1] >= longest - 1 for c in calls[1]), "full sequences, every row"
    assert len(calls[1]) == 2 * 2, "each of the 2 layers once forward, once replayed in the backward"
    assert all(c[1] < longest - 1 for c in calls[0]), "without: prefixes, then continuations on their cache"
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5, msg=name)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def stale_groups(model, offsets_seed: int = 0) -> list:
    """SAMPLES packed with behaviour logprobs off the model's by about ±0.4: log w = prox - behav."""
    groups = pack(SAMPLES, tokens_per_microbatch=1000, pad_id=0)
    gen = torch.Generator().manual_seed(offsets_seed)
    with torch.no_grad():
        for g in groups:
            off = 0.4 * torch.randn(g.loss_mask.shape, generator=gen)
            g.behav_logprobs = target_logprobs(model, g, torch.device("cpu")) - torch.where(g.loss_mask, off, 0.0)
    return groups


def step_grads(model, groups, cfg):
    model = copy.deepcopy(model)
    result = train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), groups, cfg, torch.device("cpu"), 0)
    return result, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("option", ["m2po", "floor"])
def test_a_mask_option_drops_exactly_its_tokens_from_a_step(tiny, option):
    """A step with M2PO (tau 0.04) or IcePop's floor (w < 0.8 masked) on the tiny model equals the
    default step over the same samples with those tokens' advantages set to 0."""
    groups = stale_groups(tiny)
    masks = [g.loss_mask for g in groups]
    with torch.no_grad():
        proxs = [target_logprobs(tiny, g, torch.device("cpu")) for g in groups]
    if option == "m2po":
        loss = {"m2po_tau": 0.04}
        keeps = m2po_keeps(proxs, [g.behav_logprobs for g in groups], masks, 0.04)
    else:
        loss = {"behav_floor": 0.8}
        keeps = [(p - g.behav_logprobs).exp() >= 0.8 for p, g in zip(proxs, groups)]
    dropped = sum(int((m & ~k).sum()) for m, k in zip(masks, keeps))
    total = sum(int(m.sum()) for m in masks)
    assert 0 < dropped < total, "the offsets put some tokens on each side"
    on = TrainerConfig(loss={"agg": "token_mean", **loss}, optim={"grad_clip": 0})
    result, grads = step_grads(tiny, groups, on)

    zeroed = copy.deepcopy(groups)
    for g, keep in zip(zeroed, keeps):
        g.advantages = torch.where(keep, g.advantages, 0.0)
    plain, expected = step_grads(tiny, zeroed, TrainerConfig(loss={"agg": "token_mean"}, optim={"grad_clip": 0}))
    assert result.loss == pytest.approx(plain.loss, abs=1e-6)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    key = "m2po_masked_frac" if option == "m2po" else "behav_floored_frac"
    assert result.stats[key] == pytest.approx(dropped / total)
    log_w = torch.cat([(p - g.behav_logprobs)[m] for p, g, m in zip(proxs, groups, masks)])
    assert result.stats["m2"] == pytest.approx(float((log_w**2).mean()), rel=1e-4)


def test_mask_options_that_mask_nothing_leave_the_default_step_bit_identical(tiny):
    groups = stale_groups(tiny)
    default, default_grads = step_grads(tiny, groups, TrainerConfig(optim={"grad_clip": 0}))
    loose = TrainerConfig(loss={"m2po_tau": 1e6, "behav_floor": 1e-30}, optim={"grad_clip": 0})
    result, grads = step_grads(tiny, groups, loose)
    assert result.stats["m2po_masked_frac"] == result.stats["behav_floored_frac"] == 0.0
    assert result.loss == default.loss
    assert all(torch.equal(a, b) for a, b in zip(grads, default_grads))


def test_mask_options_say_how_to_fix_them():
    with pytest.raises(ValueError, match=r"behav_floor 2.0 must be below behav_cap 2.0"):
        TrainerConfig(loss={"behav_floor": 2.0, "behav_cap": 2.0})
    with pytest.raises(ValueError, match=r"use proximal = 'recompute' or 'interpolate'"):
        TrainerConfig(loss={"m2po_tau": 0.04, "proximal": "behaviour"})
    defaults = TrainerConfig().loss
    assert (defaults.behav_floor, defaults.m2po_tau) == (0.0, 0.0), "off unless asked for"
