"""Which claimed sessions a step trains: batch selection as named strategies, in a fixed order.

Each claim (whole groups, in `canonical_order`) passes through the selectors the config turns on:
`ShapeOverlong` ([trainer.overlong], DAPO's length penalty and overlong filtering) →
`Downsample` ([trainer.pods], PODS) → `GroupAdvantages` (baseline and scale per session, flat groups
marked; or `RunningMeanAdvantages` with [trainer.running_mean], online RL's ungrouped baseline) →
`TrainUnsolved` ([trainer.unsolved], negative sample reinforcement) →
`SkipFlat` (trainer.batch.skip_zero_variance, DAPO's filter). A `ClaimPolicy` says how much the
loop claims and when its batch is complete: `OneClaim`, or `FillBatch` (trainer.batch.fill,
DAPO's dynamic sampling). Every skipped session is recorded with its reason.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

import torch

from proxy.store.samples import SessionSamples
from trainer.advantages import ADVANTAGES, max_variance_subset
from trainer.config import OverlongConfig, RunningMeanConfig, TrainerConfig
from trainer.overlong import shape

ZERO_VARIANCE = "skipped_zero_variance"


def canonical_order(sessions: list[SessionSamples]) -> list[SessionSamples]:
    """Claimed sessions by group, then by their tokens: the order they finished in (a race
    between episodes) then changes nothing a step computes, and an on-policy run with seeded
    rollouts trains the same batches in the same order every time."""

    def key(s: SessionSamples) -> tuple:
        return s.group_id, [(x.prompt_ids, x.output_ids) for x in s.individual], s.reward

    return sorted(sessions, key=key)


@dataclass(frozen=True)
class Skip:
    counted_as: str  # the metric that counts them
    session_ids: list[str]
    reason: str  # recorded with each session


@dataclass
class Selection:
    """One claim on its way to a step: the sessions still to train (canonical order) with their group
    baseline and scale, those of flat groups not yet decided, what was skipped and counted."""

    sessions: list[SessionSamples]
    baseline: dict[str, float] = field(default_factory=dict)
    scale: dict[str, float] = field(default_factory=dict)
    flat: list[str] = field(default_factory=list)  # sessions of groups whose rewards are all equal
    skips: list[Skip] = field(default_factory=list)
    counts: dict[str, float] = field(default_factory=dict)  # summed over a step's claims and logged

    def skip(self, counted_as: str, session_ids: list[str], reason: str) -> None:
        gone = set(session_ids)
        self.sessions = [s for s in self.sessions if s.session_id not in gone]
        self.flat = [sid for sid in self.flat if sid not in gone]
        self.skips.append(Skip(counted_as, session_ids, reason))


class Selector(Protocol):
    def apply(self, claim: Selection) -> None:
        """Narrow or re-weight one claim in place."""


class ShapeOverlong:
    """DAPO's overlong shaping (`trainer/overlong.py`): each session's reward and returns gain its replies'
    length penalties before anything reads them; with `mask_truncated` its truncated replies leave the loss."""

    def __init__(self, cfg: OverlongConfig, style: str) -> None:
        self.cfg = cfg
        self.style = style

    def apply(self, claim: Selection) -> None:
        shaped = [shape(s, self.cfg, self.style) for s in claim.sessions]
        claim.sessions = [x.session for x in shaped]
        if self.cfg.max_tokens:
            claim.counts["overlong_penalised"] = sum(x.penalised for x in shaped)
            claim.counts["overlong_penalty_total"] = sum(x.penalty for x in shaped)
        if self.cfg.mask_truncated:
            claim.counts["overlong_masked_tokens"] = sum(x.masked_tokens for x in shaped)


class Downsample:
    """PODS: every group whose rewards differ keeps its `keep` sessions of largest reward variance."""

    def __init__(self, keep: int) -> None:
        self.keep = keep

    def apply(self, claim: Selection) -> None:
        _, left_out = downsample_groups(claim.sessions, self.keep)
        claim.counts["downsampled"] = len(left_out)
        if left_out:
            reason = f"down-sampled: not among its group's {self.keep} of largest reward variance"
            claim.skip("downsampled", left_out, reason)


class GroupAdvantages:
    """The estimator's per-session baseline and scale; flat groups are marked, not yet skipped."""

    def __init__(self, estimator: str) -> None:
        self.estimator = ADVANTAGES[estimator]

    def apply(self, claim: Selection) -> None:
        sessions = claim.sessions
        rewards, group_ids = _tensors(sessions)
        adv = self.estimator(rewards, group_ids)
        claim.baseline.update({s.session_id: float(adv.baseline[i]) for i, s in enumerate(sessions)})
        claim.scale.update({s.session_id: float(adv.scale[i]) or 1.0 for i, s in enumerate(sessions)})
        claim.flat = [s.session_id for i, s in enumerate(sessions) if bool(adv.skipped[i])]


class RunningMeans:
    """Exponential moving averages of rewards by key, the least recently used dropped past `max_keys`,
    and one over every reward (the baseline of a key not seen yet). Saved in each checkpoint."""

    def __init__(self, decay: float, max_keys: int) -> None:
        self.decay = decay
        self.max_keys = max_keys
        self.means: OrderedDict[str, float] = OrderedDict()
        self.overall: float | None = None

    def baseline(self, key: str) -> float:
        if key in self.means:
            return self.means[key]
        return self.overall if self.overall is not None else 0.0

    def update(self, key: str, reward: float) -> None:
        old = self.means.pop(key, None)
        self.means[key] = reward if old is None else self.decay * old + (1 - self.decay) * reward
        while len(self.means) > self.max_keys:
            self.means.popitem(last=False)
        self.overall = reward if self.overall is None else self.decay * self.overall + (1 - self.decay) * reward

    def state(self) -> dict:
        return {"means": dict(self.means), "overall": self.overall}

    def load(self, state: dict | None) -> None:
        if state:
            self.means = OrderedDict(state.get("means", {}))
            self.overall = state.get("overall")


class RunningMeanAdvantages:
    """Online RL's baseline: a session's reward less the running mean under its key, taken before the
    claim's own rewards update the means (a session is never its own baseline); scale 1, nothing flat.
    The claim's sessions update the means in canonical order, so a run is reproducible."""

    def __init__(self, cfg: RunningMeanConfig, means: RunningMeans) -> None:
        self.key = cfg.key
        self.means = means

    def key_of(self, s: SessionSamples) -> str:
        if self.key == "global":
            return ""
        if self.key == "task" and s.task_id is not None:
            return "task:" + s.task_id
        return "prompt:" + (s.prompt_key or s.session_id)

    def apply(self, claim: Selection) -> None:
        keys = [self.key_of(s) for s in claim.sessions]
        for s, key in zip(claim.sessions, keys, strict=True):
            claim.baseline[s.session_id] = self.means.baseline(key)
            claim.scale[s.session_id] = 1.0
        for s, key in zip(claim.sessions, keys, strict=True):
            self.means.update(key, s.reward)
        claim.flat = []
        if claim.sessions:
            claim.counts["running_mean_baseline"] = sum(claim.baseline[s.session_id] for s in claim.sessions) / len(
                claim.sessions
            )


class TrainUnsolved:
    """Negative sample reinforcement: a flat group whose rewards are below the claim's mean (failed
    every time while other tasks were solved) is trained, every session with `advantage`, as whole
    groups in claim order while they make at most `share` of the trained sessions."""

    def __init__(self, advantage: float, share: float) -> None:
        self.advantage = advantage
        self.share = share

    def apply(self, claim: Selection) -> None:
        sessions, flat = claim.sessions, set(claim.flat)
        unsolved = unsolved_sessions(sessions, [s.session_id in flat for s in sessions], self.share)
        for i in unsolved:
            sid = sessions[i].session_id
            claim.baseline[sid] = sessions[i].reward - self.advantage
            claim.scale[sid] = 1.0
        rescued = {sessions[i].session_id for i in unsolved}
        claim.flat = [sid for sid in claim.flat if sid not in rescued]
        claim.counts["unsolved_trained"] = len(unsolved)


class SkipFlat:
    """DAPO's filter: sessions of groups whose rewards are all equal carry no signal and are skipped."""

    def apply(self, claim: Selection) -> None:
        if claim.flat:
            claim.skip(ZERO_VARIANCE, list(claim.flat), "zero reward variance in its group")


def selectors(cfg: TrainerConfig, means: RunningMeans | None = None) -> list[Selector]:
    """The selectors the config turns on, in the order they apply."""
    chosen: list[Selector] = []
    if cfg.overlong:
        chosen.append(ShapeOverlong(cfg.overlong, cfg.batch.style))
    if cfg.pods:
        chosen.append(Downsample(cfg.pods.keep))
    if cfg.running_mean is not None:
        chosen.append(RunningMeanAdvantages(cfg.running_mean, means or RunningMeans(cfg.running_mean.decay, 1)))
    else:
        chosen.append(GroupAdvantages(cfg.loss.advantage))
    if cfg.unsolved:
        chosen.append(TrainUnsolved(cfg.unsolved.advantage, cfg.unsolved.share))
    if cfg.batch.skip_zero_variance:
        chosen.append(SkipFlat())
    return chosen


def select(sessions: list[SessionSamples], chosen: list[Selector]) -> Selection:
    claim = Selection(list(sessions))
    for selector in chosen:
        selector.apply(claim)
    return claim


class ClaimPolicy(Protocol):
    settles_skips_at_once: bool
    """Skipped sessions are let go at once, rather than staying claimed until the step ends."""

    def need(self, kept: int) -> int:
        """Sessions the next claim asks for, `kept` being those the batch holds to train."""

    def complete(self, kept: int) -> bool:
        """Whether the batch is ready to train."""


class OneClaim:
    """A step trains what one claim of `size` sessions leaves. Its skipped sessions stay claimed until
    the step ends, so admission control does not start episodes that would sample the weights the
    step replaces."""

    settles_skips_at_once = False

    def __init__(self, size: int) -> None:
        self.size = size

    def need(self, kept: int) -> int:
        return self.size

    def complete(self, kept: int) -> bool:
        return True


class FillBatch:
    """DAPO's dynamic sampling: claim on until `size` sessions to train are in hand. Skipped sessions
    are let go at once, since the step itself waits for the episodes that replace them."""

    settles_skips_at_once = True

    def __init__(self, size: int) -> None:
        self.size = size

    def need(self, kept: int) -> int:
        return self.size - kept

    def complete(self, kept: int) -> bool:
        return kept >= self.size


def claim_policy(cfg: TrainerConfig) -> ClaimPolicy:
    return FillBatch(cfg.batch.size) if cfg.batch.fill else OneClaim(cfg.batch.size)


# -- the pure parts, checked by hand in tests/trainer/test_batch_step.py ---------------------------
def _tensors(sessions: list[SessionSamples]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards (N,) float64 and group index (N,), groups numbered in order of first appearance."""
    groups = {g: i for i, g in enumerate(dict.fromkeys(s.group_id for s in sessions))}
    rewards = torch.tensor([s.reward for s in sessions], dtype=torch.float64)
    return rewards, torch.tensor([groups[s.group_id] for s in sessions])


def unsolved_sessions(sessions: list[SessionSamples], flat: list[bool], share: float) -> list[int]:
    """Indices of the sessions of unsolved groups to train: flat, rewards below the mean of `sessions`;
    whole groups, in order, while they make at most `share` of the trained sessions."""
    if not sessions:
        return []
    rewards, group_ids = _tensors(sessions)
    skipped = torch.tensor(flat, dtype=torch.bool)
    candidates = skipped & (rewards < rewards.mean())
    informative = int((~skipped).sum())
    # Largest count u with u <= share * (informative + u), taken group by group.
    room = informative * share / (1 - share) if share < 1 else len(sessions)
    unsolved = torch.zeros_like(skipped)
    taken = 0
    for g in range(int(group_ids.max()) + 1):
        members = candidates & (group_ids == g)
        size = int(members.sum())
        if size and taken + size <= room + 1e-9:
            unsolved |= members
            taken += size
    return unsolved.nonzero().flatten().tolist()


def downsample_groups(sessions: list[SessionSamples], m: int) -> tuple[list[SessionSamples], list[str]]:
    """(the sessions to train, the ids left out): every group whose rewards differ keeps its m
    sessions of largest reward variance (`max_variance_subset`); flat groups stay whole (they
    carry no signal to select by and are skipped or kept whole as unsolved later)."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(sessions):
        groups.setdefault(s.group_id, []).append(i)
    left_out: set[int] = set()
    for members in groups.values():
        rewards = [sessions[i].reward for i in members]
        if len(members) > m and len(set(rewards)) > 1:
            chosen = {members[j] for j in max_variance_subset(rewards, m)}
            left_out.update(i for i in members if i not in chosen)
    kept = [s for i, s in enumerate(sessions) if i not in left_out]
    return kept, [sessions[i].session_id for i in sorted(left_out)]
