"""Partial credit for arithmetic: 1.0 for the exact answer, else 0.4 x the share of right-aligned
digit positions (of |answer| against |reference|) that match; nothing without a number. Exact means equal
as integers, not `numbers_equal` as `math_exact` checks: an answer written "18.0" scores 0 here (the runs
answered in integers). Used with these two settings:

    --set 'rewards.modules=["docs/experiments/arithmetic-2026-12-07/digits_reward.py"]'
    --set rollout.reward_fn=arith_digits
"""

from rewards.extract import extract_answer_number
from rewards.registry import reward
from rewards.session import SessionView


@reward("arith_digits")
def arith_digits(session: SessionView) -> float:
    expected = int(extract_answer_number(session.reference))
    got = extract_answer_number(session.final_text)
    if got is None:
        return 0.0
    try:
        got = int(got)
    except (TypeError, ValueError):
        return 0.0
    if got == expected:
        return 1.0
    a, b = str(abs(got))[::-1], str(abs(expected))[::-1]
    width = max(len(a), len(b))
    right = sum(1 for i in range(width) if i < len(a) and i < len(b) and a[i] == b[i])
    return 0.4 * right / width
