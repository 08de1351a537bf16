"""The optimizer state's writer (`trainer/uncached.py`): O_DIRECT through one aligned buffer gives
back exactly what `torch.save` would have written, whatever the tensors' sizes; where O_DIRECT is
refused, at open or at a write, the file is written the ordinary way; other errors are raised."""

from __future__ import annotations

import errno
import io
import os

import pytest
import torch

from trainer import uncached

O_DIRECT = getattr(os, "O_DIRECT", 0)
pytestmark = pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform")


def state() -> dict:
    """Tensors of odd byte lengths, and together more than two of the writer's buffers."""
    g = torch.Generator().manual_seed(0)
    big = torch.randn(uncached.BUFFER_BYTES // 4 * 2 + 1234, generator=g)
    return {
        "big": big,
        "odd": torch.randn(3, 7, generator=g).to(torch.bfloat16),
        "ints": torch.arange(13, dtype=torch.int64),
        "plain": {"step": 7, "name": "x" * 5001},
    }


def in_memory(obj: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def check_same(loaded: dict, saved: dict) -> None:
    assert loaded.keys() == saved.keys()
    for key in ("big", "odd", "ints"):
        assert loaded[key].dtype == saved[key].dtype and torch.equal(loaded[key], saved[key])
    assert loaded["plain"] == saved["plain"]


def test_a_file_written_past_the_page_cache_loads_back_exactly(tmp_path, monkeypatch):
    opened: list[int] = []
    real_open = os.open

    def spy(path, flags, *args):  # noqa: ANN001
        opened.append(flags)
        return real_open(path, flags, *args)

    monkeypatch.setattr(uncached.os, "open", spy)
    saved = state()
    uncached.save(saved, tmp_path / "trainer.pt")
    assert opened and opened[0] & O_DIRECT, "the file was opened with O_DIRECT"
    check_same(torch.load(tmp_path / "trainer.pt", weights_only=True), saved)
    assert (tmp_path / "trainer.pt").read_bytes() == in_memory(saved), "the same bytes as torch.save writes"
    # the last block's padding is cut off: a smaller save over the same file leaves no stale tail
    small = {"ints": torch.arange(3)}
    uncached.save(small, tmp_path / "trainer.pt")
    assert (tmp_path / "trainer.pt").read_bytes() == in_memory(small)


@pytest.mark.parametrize("refused_at", ["open", "write"])
def test_where_o_direct_is_refused_the_file_is_written_the_ordinary_way(tmp_path, monkeypatch, refused_at):
    real_open, real_write = os.open, os.write
    direct_fds: set[int] = set()

    def refusing_open(path, flags, *args):  # noqa: ANN001
        if flags & O_DIRECT and refused_at == "open":
            raise OSError(errno.EINVAL, "Invalid argument")
        fd = real_open(path, flags, *args)
        if flags & O_DIRECT:
            direct_fds.add(fd)
        return fd

    def refusing_write(fd, data):  # noqa: ANN001
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(uncached.os, "open", refusing_open)
    monkeypatch.setattr(uncached.os, "write", refusing_write)
    saved = state()
    uncached.save(saved, tmp_path / "trainer.pt")
    check_same(torch.load(tmp_path / "trainer.pt", weights_only=True), saved)
    for fd in direct_fds:
        with pytest.raises(OSError):
            os.fstat(fd)  # the refused file was closed


def test_a_full_disk_is_an_error_not_a_silent_fallback(tmp_path, monkeypatch):
    def no_space(fd, data):  # noqa: ANN001
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(uncached.os, "write", no_space)
    with pytest.raises(OSError) as raised:
        uncached.save(state(), tmp_path / "trainer.pt")
    assert raised.value.errno == errno.ENOSPC
