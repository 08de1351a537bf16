"""The calculator examples' reward: the right answer, with partial credit for the right tool result.

An outcome reward alone gives the small model nothing to learn from at first (it rarely
completes the protocol), and a reward for any well-formed tool call is gamed: the policy
learns to call `calculate` with any expression at all. So partial credit goes only to an
episode whose tool call actually computed the reference (the tool's result equals it) but
whose final reply did not state it.

    [rewards]
    modules = ["examples/openai_agents_calculator/rewards.py"]
    [rollout]
    reward_fn = "calculator"
"""

from __future__ import annotations

from rewards import reward
from rewards.extract import extract_answer_number, numbers_equal

TOOL_RESULT_CREDIT = 0.3


@reward("calculator")
def calculator(session) -> float:
    expected = extract_answer_number(session.reference or "")
    if expected is None:
        raise ValueError(f"the calculator reward needs a numeric reference, got {session.reference!r}")
    if numbers_equal(session.final_answer_number(), expected):
        return 1.0
    results = [str(m.get("content")) for m in session.messages if m.get("role") == "tool"]
    if any(numbers_equal(extract_answer_number(text), expected) for text in results):
        return TOOL_RESULT_CREDIT
    return 0.0
