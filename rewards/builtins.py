"""Built-in rewards, and weighted combinations of any registered rewards.

`math_exact` grades a final numeric answer against the task's reference (a bare
number or a whole GSM8K answer), `regex_match` checks a pattern, and `format`
checks that the answer sits inside answer tags. `combine` registers a weighted
sum of other rewards; `resolve_reward` also accepts such a sum written in config
as a string, "math_exact*0.9+format*0.1", and builds it once on first use.
A reward raises instead of returning 0.0 when it cannot score (no reference, bad
metadata), so the session is recorded as unscored rather than as wrong.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Mapping, Sequence
from numbers import Real

from rewards.extract import extract_answer_number, numbers_equal
from rewards.registry import REWARDS, RewardFn, RewardValue, get_reward, is_async, reward
from rewards.session import SessionView

DEFAULT_ANSWER_TAGS = ("<answer>", "</answer>")


@reward("math_exact")
def math_exact(session: SessionView) -> float:
    """1.0 when the final reply's answer number equals the reference's, else 0.0."""
    if session.reference is None:
        raise ValueError("math_exact needs a reference")
    expected = extract_answer_number(session.reference)
    if expected is None:
        raise ValueError(f"math_exact found no number in the reference {session.reference!r}")
    return 1.0 if numbers_equal(extract_answer_number(session.final_text), expected) else 0.0


@reward("regex_match")
def regex_match(session: SessionView) -> float:
    """1.0 when `metadata["pattern"]` (else the reference) is found in the final reply."""
    pattern = session.metadata.get("pattern") or session.reference
    if not pattern:
        raise ValueError("regex_match needs metadata['pattern'] or a reference")
    return 1.0 if re.search(pattern, session.final_text) else 0.0


@reward("format")
def answer_format(session: SessionView) -> float:
    """1.0 when the final reply has exactly one non-blank answer between its tags.

    The tags come from `metadata["answer_tags"]` (an [open, close] pair, default
    ["<answer>", "</answer>"]). Each tag must appear exactly once, open before
    close, with something other than whitespace between them; text outside the
    tags (reasoning) is allowed. A repeated tag scores 0.0, since a policy that
    writes several answers should not be rewarded for any of them.
    """
    opening, closing = _answer_tags(session.metadata)
    text = session.final_text
    if text.count(opening) != 1 or text.count(closing) != 1:
        return 0.0
    start = text.index(opening) + len(opening)
    end = text.find(closing, start)
    return 1.0 if end != -1 and text[start:end].strip() else 0.0


@reward("tool_call")
def tool_call(session: SessionView) -> float:
    """1.0 when the episode made at least one well-formed tool call, else 0.0.

    Well-formed means the proxy parsed it as a call of an offered tool with JSON arguments
    (a malformed call stays plain text and is not counted). `metadata["tool"]` narrows it to
    calls of that tool. A shaping term for a policy that first has to learn to call tools at
    all (`"math_exact*0.8+tool_call*0.2"`); on its own it is easy to game (a call with any
    arguments scores), so prefer partial credit for a tool call that did the right thing where
    the task allows it, as `examples/openai_agents_calculator/rewards.py` does.
    """
    wanted = session.metadata.get("tool")
    names = [call.get("function", {}).get("name") for call in session.tool_calls]
    return 1.0 if any(wanted is None or name == wanted for name in names) else 0.0


def _answer_tags(metadata: Mapping[str, object]) -> tuple[str, str]:
    tags = metadata.get("answer_tags", DEFAULT_ANSWER_TAGS)
    valid = (
        isinstance(tags, Sequence)
        and not isinstance(tags, str)
        and len(tags) == 2
        and all(isinstance(tag, str) and tag for tag in tags)
    )
    if not valid:
        raise ValueError(f"metadata['answer_tags'] must be two non-empty strings [open, close], got {tags!r}")
    return tags[0], tags[1]


def combine(name: str, weights: Mapping[str, float]) -> RewardFn:
    """Register under `name` the weighted sum of the registered rewards in `weights`.

    The parts are looked up now, so a typo fails at import. The result is sync when
    every part is sync; otherwise it is async and runs sync parts in a worker thread.
    A part returning a per-turn mapping raises TypeError when the sum is computed.
    """
    return reward(name)(_weighted_sum(name, weights))


def parse_combination(spec: str) -> dict[str, float] | None:
    """Read "math_exact*0.9+format*0.1" as {"math_exact": 0.9, "format": 0.1}.

    Each term is `name*weight`, `weight*name` or a bare `name` (weight 1). A
    string with no "+" or "*" is a plain reward name, and gives None.
    """
    if "+" not in spec and "*" not in spec:
        return None
    weights: dict[str, float] = {}
    for term in spec.split("+"):
        part, weight = _parse_term(term.strip(), spec)
        if part in weights:
            raise ValueError(f"reward {part!r} appears twice in the combination {spec!r}")
        weights[part] = weight
    return weights


_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_resolve_lock = threading.Lock()
_COMBINATIONS: dict[str, RewardFn] = {}


def resolve_reward(name: str) -> RewardFn:
    """A registered reward by name, or the weighted sum a combination spec describes.

    Combinations are built once per spec string and cached here, not registered,
    so they never collide with (or show up among) the names users chose.
    """
    if name in REWARDS:
        return REWARDS[name]
    weights = parse_combination(name)
    if weights is None:
        return get_reward(name)
    with _resolve_lock:
        if name not in _COMBINATIONS:
            _COMBINATIONS[name] = _weighted_sum(name, weights)
        return _COMBINATIONS[name]


def _parse_term(term: str, spec: str) -> tuple[str, float]:
    factors = [factor.strip() for factor in term.split("*")]
    names = [factor for factor in factors if _NAME.fullmatch(factor)]
    numbers = [factor for factor in factors if factor not in names]
    if len(factors) > 2 or len(names) != 1:
        raise ValueError(f"bad term {term!r} in reward combination {spec!r}: write name*weight")
    try:
        weight = float(numbers[0]) if numbers else 1.0
    except ValueError:
        raise ValueError(f"bad weight {numbers[0]!r} in reward combination {spec!r}") from None
    return names[0], weight


def _weighted_sum(label: str, weights: Mapping[str, float]) -> RewardFn:
    if not weights:
        raise ValueError(f"combination {label!r} needs at least one reward")
    parts = {part: _lookup(part, label) for part in weights}

    def total(values: Mapping[str, RewardValue]) -> float:
        return sum(weights[part] * _as_float(value, part, label) for part, value in values.items())

    if not any(is_async(fn) for fn in parts.values()):

        def weighted(session: SessionView) -> float:
            return total({part: fn(session) for part, fn in parts.items()})

    else:

        async def weighted(session: SessionView) -> float:
            values = {}
            for part, fn in parts.items():
                if is_async(fn):
                    values[part] = await fn(session)
                else:
                    values[part] = await asyncio.to_thread(fn, session)
            return total(values)

    weighted.__name__ = weighted.__qualname__ = f"combine[{label}]"
    return weighted


def _lookup(part: str, label: str) -> RewardFn:
    if part not in REWARDS:
        known = ", ".join(sorted(REWARDS)) or "none"
        raise KeyError(f"combination {label!r} uses unknown reward {part!r} (registered: {known})")
    return REWARDS[part]


def _as_float(value: RewardValue, part: str, label: str) -> float:
    if isinstance(value, Mapping):
        raise TypeError(
            f"combination {label!r}: reward {part!r} returned a per-turn mapping; "
            "combine only sums rewards that return one float per session"
        )
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"combination {label!r}: reward {part!r} returned {value!r}, not a number")
    return float(value)
