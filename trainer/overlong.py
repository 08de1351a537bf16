"""DAPO's overlong reward shaping and overlong filtering (Yu et al. 2025, arXiv 2503.14476, §3.4).

A reply of |y| sampled tokens, with L_max = `max_tokens` and L_cache = `buffer`, gets the soft penalty

  R_length(y) = 0                                   |y| <= L_max - L_cache
              = (L_max - L_cache - |y|) / L_cache    L_max - L_cache < |y| <= L_max
              = -1                                   L_max < |y|

times `penalty`. DAPO scores one reply per sample; an agent's session holds several, so a session is
charged the sum of its replies' penalties: its reward (from which its group's baseline and scale come)
and every return of its tokens gain that sum, as a final reward every turn shares (with [rewards]
discount 1, exactly the sum added to the final reward). Overlong filtering leaves the tokens of replies
that stopped at their token limit (finish_reason "length") out of the loss in either sample style; the
session still counts in its group's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from proxy.store.samples import ConcatSample, IndividualSample, SessionSamples
from trainer.config import OverlongConfig


def length_penalty(length: int, max_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment of a reply of `length` sampled tokens (0 or negative)."""
    if not max_tokens or length <= max_tokens - buffer:
        return 0.0
    if length > max_tokens:
        return -penalty
    return penalty * (max_tokens - buffer - length) / buffer


@dataclass(frozen=True)
class Shaped:
    session: SessionSamples  # the session to train: shaped reward and returns, truncated replies left out
    penalty: float  # the sum of its replies' penalties, added to its reward and returns
    penalised: int  # replies with a penalty
    masked_tokens: int  # sampled tokens left out of the loss in the trained style


def _truncated(c: IndividualSample) -> bool:
    return c.finish_reason == "length"


def _span(c: IndividualSample) -> tuple[int, int]:
    """Where the reply's tokens lie on any concat sequence through it: after its full prompt."""
    return len(c.prompt_ids), len(c.prompt_ids) + len(c.output_ids)


def _concat(sample: ConcatSample, penalty: float, spans: list[tuple[int, int]]) -> tuple[ConcatSample, int]:
    """A concat sample with `penalty` added to its returns and the token spans `spans` out of its mask."""
    mask = list(sample.loss_mask)
    masked = 0
    for start, end in spans:
        masked += sum(mask[start:end])
        mask[start:end] = [0] * (end - start)
    returns = [r + penalty if m else r for r, m in zip(sample.returns, sample.loss_mask)]
    return replace(sample, loss_mask=mask, returns=returns), masked


def shape(session: SessionSamples, cfg: OverlongConfig, style: str) -> Shaped:
    """The session with its overlong penalty applied and, with `mask_truncated`, its truncated replies
    left out of the loss (`masked_tokens` counts them in `style`, the samples the step builds)."""
    penalties = [length_penalty(len(c.output_ids), cfg.max_tokens, cfg.buffer, cfg.penalty) for c in session.individual]
    total = sum(penalties)
    cut = {c.completion_id: c for c in session.individual if cfg.mask_truncated and _truncated(c)}
    if not total and not cut:
        return Shaped(session, 0.0, 0, 0)
    individual = [replace(c, ret=c.ret + total) for c in session.individual if c.completion_id not in cut]
    concat, concat_masked = [], 0
    for sample in session.concat:
        spans = [_span(cut[i]) for i in sample.completion_ids if i in cut]
        shaped, masked = _concat(sample, total, spans)
        concat.append(shaped)
        concat_masked += masked
    individual_masked = sum(len(c.output_ids) for c in cut.values())
    return Shaped(
        session=replace(session, reward=session.reward + total, individual=individual, concat=concat),
        penalty=total,
        penalised=sum(p < 0 for p in penalties),
        masked_tokens=individual_masked if style == "individual" else concat_masked,
    )
