"""From claimed sessions to prefix-shared training groups under a token budget.

Each session yields samples in the configured style (`individual`: one per
completion; `concat`: one per token sequence, root or segment to its end, see proxy/store/samples.py), each a
token sequence with a loss mask over sampled tokens, behaviour logprobs,
versions and per-token advantages ((return - baseline) / scale of its group).

GRPO's samples share their prompt: the n answers to one task start with the same
ids. Samples are grouped by their prefix (the ids before the first trained
token); the trainer runs the prefix once and the G continuations on top of its
KV, so a group costs P + G·O tokens instead of G·(P + O). Groups are split so
each forward stays under `tokens_per_microbatch`: memory stays flat whatever the
sequence lengths, and gradients accumulate across them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from proxy.store.samples import SessionSamples


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where input_ids[t] was sampled
    behav_logprobs: list[float]
    versions: list[int]
    advantages: list[float]
    temperature: float
    turn: tuple[str, str | None, float] | None = None  # individual style: (completion id, parent id, raw reward)

    @property
    def prefix_len(self) -> int:
        return self.loss_mask.index(1)


@dataclass
class PrefixGroup:
    """G samples sharing their first P ids; tensors over the continuation positions (G, O)."""

    prefix: torch.Tensor  # (P,)
    continuation: torch.Tensor  # (G, O) ids after the prefix, right-padded
    loss_mask: torch.Tensor  # (G, O) bool
    behav_logprobs: torch.Tensor  # (G, O)
    versions: torch.Tensor  # (G, O)
    advantages: torch.Tensor  # (G, O)
    temperature: torch.Tensor  # (G,)
    prox_logprobs: torch.Tensor | None = None  # (G, O), recomputed before several minibatches
    turns: list[tuple[str, str | None, float] | None] | None = None  # (G,) each row's `Sample.turn`
    old_values: torch.Tensor | None = None  # (G, O) the critic's values before this step (trainer/critic.py)
    value_targets: torch.Tensor | None = None  # (G, O) GAE returns A + V_old the critic is trained towards

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def cost(self) -> int:
        return self.prefix.shape[0] + self.continuation.numel()


def build_samples(
    sessions: list[SessionSamples], style: str, baseline: dict[str, float], scale: dict[str, float]
) -> list[Sample]:
    """Samples with per-token advantages (return - baseline) / scale of their session."""
    out: list[Sample] = []
    for s in sessions:
        b, k = baseline[s.session_id], scale[s.session_id]
        if style == "individual":
            for c in s.individual:
                n = len(c.output_ids)
                if n == 0:
                    continue
                p = len(c.prompt_ids)
                out.append(
                    Sample(
                        input_ids=c.prompt_ids + c.output_ids,
                        loss_mask=[0] * p + [1] * n,
                        behav_logprobs=[0.0] * p + c.behav_logprobs,
                        versions=[-1] * p + c.versions,
                        advantages=[0.0] * p + [(c.ret - b) / k] * n,
                        temperature=c.temperature,
                        turn=(c.completion_id, c.parent_id, float(c.reward or 0.0)),
                    )
                )
        else:
            for c in s.concat:
                if not any(c.loss_mask):
                    continue
                out.append(
                    Sample(
                        input_ids=c.input_ids,
                        loss_mask=c.loss_mask,
                        behav_logprobs=c.behav_logprobs,
                        versions=c.versions,
                        advantages=[(r - b) / k if m else 0.0 for r, m in zip(c.returns, c.loss_mask)],
                        temperature=c.temperature,
                    )
                )
    return out


def pack(samples: list[Sample], tokens_per_microbatch: int, pad_id: int) -> list[PrefixGroup]:
    """Group samples by shared prefix, then split groups to fit the token budget."""
    by_prefix: OrderedDict[tuple[int, ...], list[Sample]] = OrderedDict()
    for s in samples:
        by_prefix.setdefault(tuple(s.input_ids[: s.prefix_len]), []).append(s)
    groups: list[PrefixGroup] = []
    for prefix, members in by_prefix.items():
        members.sort(key=lambda s: len(s.input_ids))
        chunk: list[Sample] = []
        for s in members:
            width = len(s.input_ids) - len(prefix)
            if chunk and len(prefix) + width * (len(chunk) + 1) > tokens_per_microbatch:
                groups.append(_collate(prefix, chunk, pad_id))
                chunk = []
            chunk.append(s)
        groups.append(_collate(prefix, chunk, pad_id))
    return groups


def _collate(prefix: tuple[int, ...], samples: list[Sample], pad_id: int) -> PrefixGroup:
    p = len(prefix)
    width = max(len(s.input_ids) for s in samples) - p

    def tail(values: list, fill: float | int, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([v[p:] + [fill] * (width - (len(v) - p)) for v in values], dtype=dtype)

    return PrefixGroup(
        prefix=torch.tensor(prefix, dtype=torch.long),
        continuation=tail([s.input_ids for s in samples], pad_id, torch.long),
        loss_mask=tail([s.loss_mask for s in samples], 0, torch.bool),
        behav_logprobs=tail([s.behav_logprobs for s in samples], 0.0, torch.float32),
        versions=tail([s.versions for s in samples], -1, torch.long),
        advantages=tail([s.advantages for s in samples], 0.0, torch.float32),
        temperature=torch.tensor([s.temperature if s.temperature > 1e-5 else 1.0 for s in samples]),
        turns=[s.turn for s in samples],
    )
