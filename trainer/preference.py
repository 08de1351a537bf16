"""DPO on the pairs the conversation tree already holds: sibling sessions of one prompt whose rewards differ.

With `trainer.algorithm = "dpo"` a step's claimed groups (one task, one prompt, n sampled sessions) become
preference pairs, the higher reward chosen (`preference_pairs`): the group's best against its worst, or every pair
whose rewards differ, largest gap first, up to `dpo.max_pairs`. Ties never pair, so a group whose rewards are all
equal gives none and is skipped as PPO's flat groups are (`skipped_zero_variance`); the sessions no pair uses are
skipped as `skipped_unpaired`, each with its reason. A session's response is every token it sampled (all its turns),
its log-likelihood their logprobs summed at temperature 1, and `losses.dpo_loss` is the loss (Rafailov et al.
2023, arXiv 2305.18290), against a frozen reference (the starting weights, `trainer/policy.py`; resumed runs
rebuild it from the base model) or reference-free, optionally length-normalised with a margin (SimPO).

The loss is not a sum over tokens, so a group's sessions run in one forward pass (with their shared prompt once),
and a step's pairs are averaged over its optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from proxy.store.samples import SessionSamples
from trainer.batch import PrefixGroup, Sample, pack
from trainer.config import DpoConfig, TrainerConfig
from trainer.losses import dpo_loss
from trainer.memory import microbatch_budget
from trainer.policy import Reference
from trainer.selection import ZERO_VARIANCE, Selection, Selector, ShapeOverlong
from trainer.sft import response_samples
from trainer.step import StepResult, apply_gradients, autocast_for, group_logprobs, padded_cost

UNPAIRED = "skipped_unpaired"


def preference_pairs(
    rewards: list[float], pairs: str, max_pairs: int = 0, min_gap: float = 0.0
) -> list[tuple[int, int]]:
    """(chosen, rejected) indices into one group's `rewards`, chosen's reward above rejected's by more than
    `min_gap`. "best_worst": the first of the highest against the first of the lowest. "all": every such pair,
    largest gap first (then by position), at most `max_pairs` (0: all). A pair's order depends only on its own
    rewards and relative positions, so the pairs of the sessions they use are the same pairs again."""
    if pairs == "best_worst":
        best = max(range(len(rewards)), key=lambda i: (rewards[i], -i), default=None)
        worst = min(range(len(rewards)), key=lambda i: (rewards[i], i), default=None)
        if best is None or rewards[best] - rewards[worst] <= min_gap:
            return []
        return [(best, worst)]
    if pairs != "all":
        raise ValueError(f"pairs {pairs!r} must be 'best_worst' or 'all'")
    found = [(i, j) for i in range(len(rewards)) for j in range(len(rewards)) if rewards[i] - rewards[j] > min_gap]
    found.sort(key=lambda p: (-(rewards[p[0]] - rewards[p[1]]), p))
    return found[:max_pairs] if max_pairs else found


def group_pairs(sessions: list[SessionSamples], cfg: DpoConfig) -> dict[str, tuple[list[int], list[tuple[int, int]]]]:
    """Per group id: (its sessions' indices into `sessions`, its pairs as indices into that list)."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(sessions):
        groups.setdefault(s.group_id, []).append(i)
    return {
        gid: (members, preference_pairs([sessions[i].reward for i in members], cfg.pairs, cfg.max_pairs, cfg.min_gap))
        for gid, members in groups.items()
    }


class PreferencePairs:
    """DPO's selection: the sessions of each group that some pair uses stay, the rest are skipped with their reason."""

    def __init__(self, cfg: DpoConfig) -> None:
        self.cfg = cfg

    def apply(self, claim: Selection) -> None:
        flat, unpaired, n_pairs = [], {}, 0
        for members, pairs in group_pairs(claim.sessions, self.cfg).values():
            ids = [claim.sessions[i].session_id for i in members]
            n_pairs += len(pairs)
            if len({claim.sessions[i].reward for i in members}) == 1:
                flat += ids
                continue
            used = {k for pair in pairs for k in pair}
            reason = self._why_unpaired(bool(pairs))
            for k, sid in enumerate(ids):
                if k not in used:
                    unpaired[sid] = reason
        claim.counts["dpo_pairs"] = n_pairs
        claim.counts[UNPAIRED] = len(unpaired)
        if flat:
            claim.skip(ZERO_VARIANCE, flat, "zero reward variance in its group: no preference pair")
        for reason in dict.fromkeys(unpaired.values()):
            claim.skip(UNPAIRED, [sid for sid, r in unpaired.items() if r == reason], reason)

    def _why_unpaired(self, group_has_pairs: bool) -> str:
        if not group_has_pairs:
            return f"no two sessions of its group differ in reward by more than dpo.min_gap {self.cfg.min_gap:g}"
        if self.cfg.pairs == "best_worst":
            return "neither its group's best nor its worst (dpo.pairs = 'best_worst')"
        return f"in none of its group's {self.cfg.max_pairs} pairs of largest reward gap (dpo.max_pairs)"


@dataclass
class PairGroup:
    """One group's paired sessions: each session's samples, and the pairs as indices into them."""

    responses: list[list[Sample]]
    pairs: list[tuple[int, int]]


@dataclass
class PackedGroup:
    """A PairGroup packed for the forward: its prefix groups, the response each belongs to, and the frozen
    reference's summed logprobs per response (None: reference-free)."""

    groups: list[PrefixGroup]
    owner: list[int]
    pairs: list[tuple[int, int]]
    responses: int
    ref: torch.Tensor | None = None  # (S,)


def pair_groups(sessions: list[SessionSamples], cfg: TrainerConfig) -> list[PairGroup]:
    """The paired sessions `PreferencePairs` kept, group by group (their pairs found again: the same pairs)."""
    out = []
    for members, pairs in group_pairs(sessions, cfg.dpo).values():
        if not pairs:
            raise ValueError(f"sessions {[sessions[i].session_id for i in members]} of one group make no pair")
        out.append(PairGroup(response_samples([sessions[i] for i in members], cfg.batch.style), pairs))
    return out


def pack_group(unit: PairGroup, tokens_per_microbatch: int, pad_id: int) -> PackedGroup:
    groups, owner = [], []
    for k, samples in enumerate(unit.responses):
        for g in pack(samples, tokens_per_microbatch, pad_id):
            groups.append(g)
            owner.append(k)
    return PackedGroup(groups, owner, unit.pairs, len(unit.responses))


def _passes(units: list[PackedGroup], tokens: int, fits: Any) -> list[list[PackedGroup]]:
    """Consecutive units in forward passes of at most `tokens` padded tokens (and, with `fits`, memory); a unit is
    never split (its pairs' loss needs all of its responses), so one over the budget gets a pass of its own."""
    out: list[list[PackedGroup]] = []
    for unit in units:
        grown = [*out[-1], unit] if out else []
        groups = [g for u in grown for g in u.groups]
        if out and padded_cost(groups) <= tokens and (fits is None or fits(groups)):
            out[-1].append(unit)
        else:
            out.append([unit])
    return out


def response_sums(
    model: Any, chunk: list[PackedGroup], device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per unit of one pass: each response's summed logprobs (S,) and its token count (S,)."""
    groups = [g for u in chunk for g in u.groups]
    logps = iter(group_logprobs(model, groups, device)[0])
    out = []
    for u in chunk:
        parts: list[list[torch.Tensor]] = [[] for _ in range(u.responses)]
        lengths = torch.zeros(u.responses, device=device)
        for g, k in zip(u.groups, u.owner):
            parts[k].append(next(logps).sum())  # zero off the loss mask
            lengths[k] += g.num_tokens
        zero = torch.zeros((), device=device)  # a response without sampled tokens
        out.append((torch.stack([torch.stack(p).sum() if p else zero for p in parts]), lengths))
    return out


def reference_sums(reference: Reference, units: list[PackedGroup], cfg: TrainerConfig, device: torch.device) -> None:
    with torch.no_grad(), autocast_for(device, cfg.autocast_bf16), reference.active() as ref_model:
        for chunk in _passes(units, cfg.batch.tokens_per_microbatch, None):
            for u, (sums, _) in zip(chunk, response_sums(ref_model, chunk, device)):
                u.ref = sums


def dpo_step(
    model: Any, optimizer: torch.optim.Optimizer, units: list[PackedGroup], cfg: TrainerConfig, device: torch.device
) -> StepResult:
    """One optimizer step of `dpo_loss` averaged over the pairs of `units` (reference sums already on them)."""
    d = cfg.dpo
    model.train()
    optimizer.zero_grad(set_to_none=True)
    n_pairs = sum(len(u.pairs) for u in units)
    total, tokens = 0.0, 0
    sums_of: dict[str, float] = {}
    for chunk in _passes(units, cfg.batch.tokens_per_microbatch, microbatch_budget(model, cfg)):
        with autocast_for(device, cfg.autocast_bf16):
            per_unit = response_sums(model, chunk, device)
        losses = []
        for u, (logp, lengths) in zip(chunk, per_unit):
            c, r = (torch.tensor(side, device=device) for side in zip(*u.pairs))
            ref_c, ref_r = (None, None) if u.ref is None else (u.ref[c], u.ref[r])
            len_c, len_r = (lengths[c], lengths[r]) if d.length_norm else (None, None)
            loss, stats = dpo_loss(
                logp[c],
                logp[r],
                ref_c,
                ref_r,
                beta=d.beta,
                chosen_len=len_c,
                rejected_len=len_r,
                target_margin=d.target_margin,
                normaliser=n_pairs,
            )
            losses.append(loss)
            tokens += int(lengths.sum())
            for key, value in stats.items():
                sums_of[key] = sums_of.get(key, 0.0) + value * len(u.pairs)
        loss = torch.stack(losses).sum()
        loss.backward()
        total += float(loss.detach())
    grad_norm = apply_gradients(model, optimizer, cfg.optim.grad_clip)
    stats = {k: v / n_pairs for k, v in sums_of.items()}
    return StepResult(loss=total, grad_norm=grad_norm, tokens=tokens, stats={**stats, "pairs": float(n_pairs)})


class Dpo:
    """The trainer loop's learner for trainer.algorithm = "dpo": what it selects, the pair groups it builds from
    the kept sessions, and its `batch.epochs` × `batch.minibatches` optimizer steps over them."""

    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self.selectors: list[Selector] = []
        if cfg.overlong:
            self.selectors.append(ShapeOverlong(cfg.overlong, cfg.batch.style))
        self.selectors.append(PreferencePairs(cfg.dpo))

    def samples(self, sessions: list[SessionSamples]) -> list[PairGroup]:
        return pair_groups(sessions, self.cfg)

    def train(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer,
        samples: list[PairGroup],
        device: torch.device,
        reference: Reference | None,
        pad_id: int,
    ) -> StepResult | None:
        b = self.cfg.batch
        units = [pack_group(u, b.tokens_per_microbatch, pad_id) for u in samples]
        if self.cfg.dpo.reference == "frozen":
            if reference is None:
                raise ValueError("dpo.reference = 'frozen' needs the policy's frozen reference (trainer/policy.py)")
            reference_sums(reference, units, self.cfg, device)
        parts = [units[i :: b.minibatches] for i in range(b.minibatches)]
        result = None
        for _ in range(b.epochs):
            for part in (p for p in parts if p):
                result = dpo_step(model, optimizer, part, self.cfg, device)
        return result
