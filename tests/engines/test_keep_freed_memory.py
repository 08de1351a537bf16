"""glibc's malloc is told to keep freed memory on CPU, and the call is harmless elsewhere."""

from __future__ import annotations

import platform

import pytest
import torch

from proxy.runtime.devices import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_it_applies_on_glibc_and_tensors_still_allocate_and_free():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True, "setting it again is fine (engine and trainer in one process)"
    for _ in range(3):  # blocks above and below the 32 MiB mmap threshold
        big, small = torch.ones(48 << 18), torch.ones(1 << 18)  # 48 MiB and 1 MiB of float32
        assert float(big.sum()) == 48 << 18 and float(small.sum()) == 1 << 18
        del big, small
