"""`[rewards]`: which reward modules load, how rewards become returns, and how long scoring may take.

Read by the proxy's rewards service when a session finishes (its reward function runs,
then `rewards/returns.py` discounts the rewards up the conversation tree). Pydantic only:
user reward modules and the CLI's `--help` import it without torch or the proxy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from proxy.sections import Section


class RewardsConfig(Section):
    modules: list[str] = Field(default_factory=list)
    """Python modules (or .py paths) to import so their @reward functions register."""
    discount: float = Field(default=1.0, ge=0.0, le=1.0)
    """γ in G(n) = r(n) + γ · agg(G(children))."""
    aggregate: Literal["mean", "max"] = "mean"
    """How the returns of a node's children are combined."""
    timeout_s: float = 30.0
    """A reward call running longer than this fails the session."""
    max_workers: int = Field(default=16, ge=1)
    """Sync reward functions running at once; more wait for a slot, their timeout counting."""
