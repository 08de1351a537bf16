"""Reproducible sampling: seeds derived from a session's seed.

A session created with a `seed` (`POST /sessions`) gives every model call in it that sets no
seed of its own the seed `derive_seed(session seed, prompt ids)`, and the sessions of a group
created together get `derive_seed(seed, i)`. So an episode samples the same tokens whenever its
prompts are the same, whatever else shares the engine's batch or when its requests arrive; the
episode runner seeds every group from `rollout.seed` and the group id, which makes a run's
rollouts a function of its seeds and its weights (the CI learning test relies on it).
"""

from __future__ import annotations

import hashlib
from array import array

SEED_BITS = 63
MAX_SEED = 2**SEED_BITS - 1


def derive_seed(seed: int, *parts: int | str | list[int]) -> int:
    """A seed in [0, 2**63) from `seed` and `parts` (integers, strings, token id lists)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(int(seed).to_bytes(16, "little", signed=True))
    for part in parts:
        if isinstance(part, list):
            tag, data = b"L", array("q", part).tobytes()
        elif isinstance(part, str):
            tag, data = b"S", part.encode()
        else:
            tag, data = b"I", int(part).to_bytes(16, "little", signed=True)
        h.update(tag + len(data).to_bytes(8, "little") + data)
    return int.from_bytes(h.digest(), "little") & MAX_SEED
