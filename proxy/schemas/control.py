"""Control bodies and queries: sessions, rewards, finishing, weights.

These are the proxy's own endpoints (the episode runner's, the trainer's and an operator's),
so unknown fields are still ignored but every known one is typed and bounded: ids and names
to 256 characters, references to 64 KiB, metadata to `MAX_JSON_DEPTH` levels, counts and
offsets to what a store can page through, a weight version to a JSON-safe integer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from proxy.schemas.common import MAX_ID, Id, JsonObject, Wire

SessionStatus = Literal["open", "finished", "training", "consumed", "failed"]
IdLike = Annotated[str, Field(max_length=MAX_ID)] | Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
"""A task or group id: a string, or an integer used as one."""
Reference = Annotated[str, Field(max_length=65_536)] | int | float
RewardValue = Annotated[float, Field(ge=-1e12, le=1e12)]


class CreateSession(Wire):
    task_id: IdLike | None = None
    group_id: IdLike | None = None
    metadata: JsonObject | None = None
    """Free-form task information; only the admin key can read it back."""
    reward_fn: Annotated[str, Field(min_length=1, max_length=MAX_ID)] | None = None
    reference: Reference | None = None
    """The expected answer; only the admin key can read it back."""
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    """Sampling seed of the session's calls that set none; sessions of a group get one each, derived from it."""
    count: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Create a group of this many sessions at once (admitted or refused together)."""
    eval: bool = False
    """Evaluation sessions: recorded and scored, never claimed by a trainer nor held by admission control."""
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    """The sampling temperature of every call of the session(s), whatever the calls ask (0: greedy)."""


class SetReward(Wire):
    reward: RewardValue
    completion_id: Id | None = None
    """The turn rewarded; default: the session's last completion."""


class Feedback(Wire):
    """How good an answer was, from whatever saw it (online RL): exactly one of score, thumbs or label."""

    response_id: Id
    """The id the client got with the answer (`chatcmpl-…`, `resp_…`, `msg_…`, `cmpl-…`)."""
    choice_index: Annotated[int, Field(ge=0, le=1024)] = 0
    """Which of the response's choices (n > 1)."""
    score: RewardValue | None = None
    thumbs: Literal["up", "down"] | None = None
    """Mapped to a reward by [online] thumbs_up / thumbs_down."""
    label: Annotated[str, Field(min_length=1, max_length=MAX_ID)] | None = None
    """Mapped to a reward by [online] labels."""

    @model_validator(mode="after")
    def _one(self) -> Feedback:
        given = [name for name in ("score", "thumbs", "label") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of score, thumbs or label (got {', '.join(given) or 'none'})")
        return self


class Finish(Wire):
    reward: RewardValue | None = None
    """The episode's reward, given inline."""
    reward_fn: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    """A registered reward function (or a weighted combination) to score the episode with."""
    reference: Reference | None = None


class Fail(Wire):
    reason: Annotated[str, Field(max_length=4096)] | None = None


class Weights(Wire):
    path: Annotated[str, Field(min_length=1, max_length=4096)]
    """A safetensors file or a directory holding the new weights."""
    version: Annotated[int, Field(ge=0, le=2**53 - 1)]
    adapter: bool = False
    """`path` is a LoRA adapter (peft's adapter_config.json + adapter_model.safetensors) to apply onto the
    base weights, as a trainer with [trainer.lora] pushes."""


class SessionList(Wire):
    """`GET /sessions` query parameters (strings on the wire, so not strict)."""

    model_config = ConfigDict(extra="ignore", strict=False, allow_inf_nan=False)

    status: SessionStatus | None = None
    eval: bool | None = None
    """Only evaluation sessions (true) or only training ones (false)."""
    limit: Annotated[int, Field(ge=1, le=10_000)] = 100
    offset: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
