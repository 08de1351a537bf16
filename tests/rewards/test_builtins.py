"""Built-in rewards and weighted combinations, on hand-built sessions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from rewards import CompletionView, SessionView, reward
from rewards.builtins import combine, parse_combination, resolve_reward
from rewards.registry import REWARDS, DuplicateRewardError, get_reward

GSM8K_ANSWER = (
    "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
    "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18"
)


def _session(text: str, reference: str | None = None, metadata: Mapping[str, Any] | None = None) -> SessionView:
    reply = CompletionView(
        id="c1",
        parent_id=None,
        messages=({"role": "user", "content": "How much does Janet make?"},),
        response={"role": "assistant", "content": text},
        finish_reason="stop",
        created_at=0.0,
    )
    return SessionView(
        session_id="s1",
        task_id="t1",
        group_id=None,
        reference=reference,
        metadata=metadata or {},
        completions=(reply,),
    )


@pytest.fixture
def registry() -> Iterator[dict]:
    """Give each test the built-ins, and drop whatever it registers afterwards."""
    get_reward("math_exact")
    before = dict(REWARDS)
    yield REWARDS
    REWARDS.clear()
    REWARDS.update(before)


def test_math_exact_with_bare_and_full_gsm8k_references() -> None:
    math_exact = get_reward("math_exact")
    assert math_exact(_session("So she makes $18 every day.", reference="18")) == 1.0
    assert math_exact(_session("The answer is 18.00", reference=GSM8K_ANSWER)) == 1.0
    assert math_exact(_session("\\boxed{1,234}", reference="#### 1,234")) == 1.0
    assert math_exact(_session("The answer is 9.", reference=GSM8K_ANSWER)) == 0.0
    assert math_exact(_session("I am not sure.", reference="18")) == 0.0


def test_math_exact_without_reference_raises() -> None:
    with pytest.raises(ValueError, match="math_exact needs a reference"):
        get_reward("math_exact")(_session("18"))


def test_regex_match_uses_metadata_pattern_then_reference() -> None:
    regex_match = get_reward("regex_match")
    assert regex_match(_session("The capital is Paris.", metadata={"pattern": r"\bParis\b"})) == 1.0
    assert regex_match(_session("The capital is Lyon.", metadata={"pattern": r"\bParis\b"})) == 0.0
    assert regex_match(_session("It is 42.", reference=r"4\d")) == 1.0
    with pytest.raises(ValueError, match="regex_match needs"):
        regex_match(_session("anything"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I think... <answer>18</answer>", 1.0),
        ("<answer> 18 </answer> done", 1.0),
        ("<answer>   </answer>", 0.0),
        ("</answer>18<answer>", 0.0),
        ("<answer>18", 0.0),
        ("<answer>17</answer><answer>18</answer>", 0.0),
        ("The answer is 18.", 0.0),
    ],
)
def test_format_needs_one_non_blank_answer_in_tags(text: str, expected: float) -> None:
    assert get_reward("format")(_session(text)) == expected


def test_format_reads_custom_tags_and_rejects_bad_ones() -> None:
    tags = {"answer_tags": ["\\boxed{", "}"]}
    assert get_reward("format")(_session("so \\boxed{18}", metadata=tags)) == 1.0
    with pytest.raises(ValueError, match="answer_tags"):
        get_reward("format")(_session("<answer>1</answer>", metadata={"answer_tags": "<answer>"}))


def test_combine_weights_sync_rewards(registry: dict) -> None:
    combined = combine("test_math_and_format", {"math_exact": 0.9, "format": 0.1})
    assert registry["test_math_and_format"] is combined
    # Right answer, no tags: 0.9 * 1 + 0.1 * 0.
    assert combined(_session("The answer is 18.", reference="18")) == pytest.approx(0.9)
    # Right answer in tags: 0.9 * 1 + 0.1 * 1.
    assert combined(_session("<answer>18</answer>", reference="18")) == pytest.approx(1.0)
    # Wrong answer in tags: 0.9 * 0 + 0.1 * 1.
    assert combined(_session("<answer>17</answer>", reference="18")) == pytest.approx(0.1)


def test_combine_with_an_async_reward_is_async(registry: dict) -> None:
    @reward("test_async_half")
    async def half(session: SessionView) -> float:
        return 0.5

    combined = combine("test_async_mix", {"test_async_half": 2.0, "math_exact": 0.5})
    session = _session("\\boxed{18}", reference="18")
    # 2.0 * 0.5 + 0.5 * 1.0
    assert asyncio.run(combined(session)) == pytest.approx(1.5)


def test_combine_rejects_per_turn_rewards(registry: dict) -> None:
    @reward("test_per_turn")
    def per_turn(session: SessionView) -> dict[str, float]:
        return {completion.id: 1.0 for completion in session.completions}

    combined = combine("test_per_turn_mix", {"test_per_turn": 1.0})
    with pytest.raises(TypeError, match="per-turn mapping"):
        combined(_session("18"))


def test_combine_unknown_part_fails_at_definition(registry: dict) -> None:
    with pytest.raises(KeyError, match="math_exakt"):
        combine("test_typo", {"math_exakt": 1.0})


def test_duplicate_registration_raises(registry: dict) -> None:
    with pytest.raises(DuplicateRewardError, match="math_exact"):

        @reward("math_exact")
        def impostor(session: SessionView) -> float:
            return 1.0

    combine("test_combo_once", {"format": 1.0})
    with pytest.raises(DuplicateRewardError):
        combine("test_combo_once", {"format": 1.0})


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("math_exact*0.9+format*0.1", {"math_exact": 0.9, "format": 0.1}),
        ("math_exact * 0.9 + 0.1 * format", {"math_exact": 0.9, "format": 0.1}),
        ("math_exact+format", {"math_exact": 1.0, "format": 1.0}),
        ("math_exact*2", {"math_exact": 2.0}),
        ("math_exact*1+format*-0.5", {"math_exact": 1.0, "format": -0.5}),
        ("math_exact", None),
    ],
)
def test_parse_combination(spec: str, expected: dict[str, float] | None) -> None:
    assert parse_combination(spec) == expected


@pytest.mark.parametrize(
    "spec", ["math_exact*", "math_exact*0.9+", "0.9*0.1", "math_exact*format", "a*1*2", "a+a*2", "a*x1.5"]
)
def test_parse_combination_rejects_malformed_specs(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_combination(spec)


def test_resolve_reward_builds_and_caches_a_combination(registry: dict) -> None:
    assert resolve_reward("math_exact") is registry["math_exact"]
    spec = "math_exact*0.75+format*0.25"
    combined = resolve_reward(spec)
    assert resolve_reward(spec) is combined
    assert spec not in registry
    # 0.75 * 1 (right answer) + 0.25 * 1 (tagged).
    assert combined(_session("<answer>18</answer>", reference=GSM8K_ANSWER)) == pytest.approx(1.0)
    with pytest.raises(KeyError, match="no_such_reward"):
        resolve_reward("no_such_reward")
    with pytest.raises(KeyError, match="no_such_reward"):
        resolve_reward("math_exact*0.5+no_such_reward*0.5")


def test_tool_call_counts_well_formed_calls_only():
    call = {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2+3"}'}}
    first = CompletionView(
        id="c1",
        parent_id=None,
        messages=({"role": "user", "content": "What is 2 + 3?"},),
        response={"role": "assistant", "content": None, "tool_calls": [call]},
        finish_reason="tool_calls",
        created_at=0.0,
    )
    second = CompletionView(
        id="c2",
        parent_id="c1",
        messages=(*first.messages, first.response, {"role": "tool", "tool_call_id": "call_1", "content": "5"}),
        response={"role": "assistant", "content": "The answer is 5."},
        finish_reason="stop",
        created_at=1.0,
    )
    called = SessionView("s1", "t1", None, "5", {}, (first, second))
    fn = resolve_reward("tool_call")
    assert fn(called) == 1.0
    assert fn(SessionView("s1", "t1", None, "5", {"tool": "calculate"}, (first, second))) == 1.0
    assert fn(SessionView("s1", "t1", None, "5", {"tool": "search"}, (first, second))) == 0.0
    malformed = _session('<tool_call>\n{"name": "calculate", "arguments": {"expression": 2 + 3}}</tool_call>', "5")
    assert fn(malformed) == 0.0, "a call the proxy could not parse stayed text"
    shaped = resolve_reward("math_exact*0.8+tool_call*0.2")
    assert shaped(called) == pytest.approx(1.0)
    assert shaped(_session("The answer is 6.", "5")) == 0.0


def test_calculator_example_reward(registry):
    """The calculator examples' reward module: 1.0 right answer, 0.3 only the tool result right."""
    from rewards.registry import load_modules
    from tests.conftest import REPO

    assert "calculator" in load_modules([str(REPO / "examples/openai_agents_calculator/rewards.py")])
    fn = get_reward("calculator")

    def episode(tool_result: str, answer: str) -> SessionView:
        call = {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": "{}"}}
        asked = ({"role": "user", "content": "What is 27 + 19?"},)
        first = CompletionView(
            "c1", None, asked, {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls", 0.0
        )
        tool = {"role": "tool", "tool_call_id": "call_1", "content": tool_result}
        second = CompletionView(
            "c2", "c1", (*asked, first.response, tool), {"role": "assistant", "content": answer}, "stop", 1.0
        )
        return SessionView("s1", "t1", None, "46", {}, (first, second))

    assert fn(episode("46", "The answer is 46.")) == 1.0
    assert fn(episode("46", "The answer is 27.")) == 0.3
    assert fn(episode("27", "The answer is 27.")) == 0.0
    with pytest.raises(ValueError):
        fn(SessionView("s1", "t1", None, None, {}, ()))
