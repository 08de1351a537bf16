"""Token arrays as compact little-endian blobs: int32 ids/versions, float32 logprobs.

Four bytes per token instead of a JSON list keeps a long agent episode's rows small
and makes loading a batch for training a `numpy.frombuffer`, not a parse.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pack_ints(values: Sequence[int]) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def pack_floats(values: Sequence[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_ints(blob: bytes | None) -> list[int]:
    return np.frombuffer(blob or b"", dtype="<i4").tolist()


def unpack_floats(blob: bytes | None) -> list[float]:
    return np.frombuffer(blob or b"", dtype="<f4").tolist()


def ints_array(blob: bytes | None) -> np.ndarray:
    return np.frombuffer(blob or b"", dtype="<i4")


def floats_array(blob: bytes | None) -> np.ndarray:
    return np.frombuffer(blob or b"", dtype="<f4")
