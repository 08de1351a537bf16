"""The session cache is bounded: the least recently used sessions leave it, keys with them."""

from __future__ import annotations

from proxy.sessions import RecentSessions, SessionInfo


def info(i: int) -> SessionInfo:
    return SessionInfo(id=f"s{i}", status="open", auto=False, key_hash=f"k{i}")


def test_the_least_recently_used_sessions_leave_with_their_keys():
    recent = RecentSessions(size=3)
    for i in range(3):
        recent.put(info(i))
    assert recent.get("s0") is not None  # s0 used again: s1 is now the oldest
    recent.put(info(3))
    assert len(recent) == 3
    assert recent.get("s1") is None and recent.id_for_key("k1") is None
    assert recent.id_for_key("k0") == "s0" and recent.get("s3") is not None
    for i in range(100, 1100):
        recent.put(info(i))
    assert len(recent) == 3 and recent.id_for_key("k0") is None
    recent.pop("s1099")
    assert recent.get("s1099") is None and recent.id_for_key("k1099") is None
