"""From claimed sessions to padded microbatches under a token budget.

Each session yields samples in the configured style (`individual`: one per
completion; `concat`: one per root-to-leaf path, see rewards/export.py). Every
sample carries per-token targets: the sampled ids, their behaviour logprobs and
versions, and an advantage built from the tree returns and the session group's
baseline/scale. Samples are sorted by length and packed so that each microbatch's
padded size stays under `tokens_per_microbatch`: memory stays flat whatever the
sequence lengths, and gradients accumulate across microbatches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rewards.export import SessionSamples


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where input_ids[t] was sampled (the target of position t-1)
    behav_logprobs: list[float]
    versions: list[int]
    advantages: list[float]
    temperature: float


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    loss_mask: torch.Tensor  # (B, T-1) bool: targets input_ids[:, 1:]
    targets: torch.Tensor  # (B, T-1)
    behav_logprobs: torch.Tensor  # (B, T-1)
    versions: torch.Tensor  # (B, T-1)
    advantages: torch.Tensor  # (B, T-1)
    temperature: torch.Tensor  # (B,)
    prox_logprobs: torch.Tensor | None = None  # (B, T-1), recomputed before several minibatches

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


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
                out.append(
                    Sample(
                        input_ids=c.prompt_ids + c.output_ids,
                        loss_mask=[0] * len(c.prompt_ids) + [1] * n,
                        behav_logprobs=[0.0] * len(c.prompt_ids) + c.behav_logprobs,
                        versions=[-1] * len(c.prompt_ids) + c.versions,
                        advantages=[0.0] * len(c.prompt_ids) + [(c.ret - b) / k] * n,
                        temperature=c.temperature,
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


def pack(samples: list[Sample], tokens_per_microbatch: int, pad_id: int) -> list[MicroBatch]:
    """Length-sorted packing; a sample longer than the budget gets a microbatch of its own."""
    order = sorted(samples, key=lambda s: len(s.input_ids))
    batches: list[list[Sample]] = []
    for sample in order:
        if batches and len(sample.input_ids) * (len(batches[-1]) + 1) <= tokens_per_microbatch:
            batches[-1].append(sample)
        else:
            batches.append([sample])
    return [_collate(group, pad_id) for group in batches]


def _collate(samples: list[Sample], pad_id: int) -> MicroBatch:
    width = max(len(s.input_ids) for s in samples)

    def padded(values: list, fill: float | int, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=dtype)

    ids = padded([s.input_ids for s in samples], pad_id, torch.long)
    attention = padded([[1] * len(s.input_ids) for s in samples], 0, torch.long)
    mask = padded([s.loss_mask for s in samples], 0, torch.bool)
    return MicroBatch(
        input_ids=ids,
        attention_mask=attention,
        loss_mask=mask[:, 1:],
        targets=ids[:, 1:],
        behav_logprobs=padded([s.behav_logprobs for s in samples], 0.0, torch.float32)[:, 1:],
        versions=padded([s.versions for s in samples], -1, torch.long)[:, 1:],
        advantages=padded([s.advantages for s in samples], 0.0, torch.float32)[:, 1:],
        temperature=torch.tensor([s.temperature if s.temperature > 1e-5 else 1.0 for s in samples]),
    )
