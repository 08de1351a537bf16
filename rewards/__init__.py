"""Score finished agent sessions: `from rewards import reward, SessionView`.

A reward is a plain function registered with `@reward("name")` that reads a
`SessionView` of one episode and returns a float. Only the registry and the
view are imported here, so user reward modules load without torch or the proxy.
"""

from rewards.registry import reward
from rewards.session import CompletionView, SessionView

__all__ = ["CompletionView", "SessionView", "reward"]
