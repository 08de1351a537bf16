"""bfloat16 on a CPU that only emulates it is many times slower than float32: the engine and the
trainer warn when asked for it there."""

from __future__ import annotations

import logging

import torch

from proxy.runtime import devices
from proxy.runtime.devices import cpu_has_native_bf16, warn_if_emulated_bf16

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\nprocessor\t: 1\n"
WITH_BF16 = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
WITH_AMX = "flags\t\t: fpu avx2 amx_bf16 amx_tile\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert not cpu_has_native_bf16(AVX2_ONLY)
    assert cpu_has_native_bf16(WITH_BF16)
    assert cpu_has_native_bf16(WITH_AMX)
    assert not cpu_has_native_bf16("model name\t: avx512_bf16 in a name, not a flag\n")


def test_a_warning_only_for_bf16_on_a_cpu_without_it(monkeypatch, caplog):
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger=devices.log.name):
        warn_if_emulated_bf16(torch.device("cpu"), False, "engine.dtype")
        assert not caplog.records
        warn_if_emulated_bf16(torch.device("cpu"), True, "engine.dtype")
        assert len(caplog.records) == 1 and "engine.dtype" in caplog.records[0].getMessage()
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=devices.log.name):
        warn_if_emulated_bf16(torch.device("cpu"), True, "engine.dtype")
    assert not caplog.records
