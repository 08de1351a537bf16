"""Child server processes: pick a port, start one with its log, wait until it answers, stop it.

The launchers (local and Ray), the test fixtures and the benchmarks all run proxies, engines
and fronts as child processes; they share these few functions so that a server is started,
health-checked and stopped the same way everywhere, and a failed start shows its log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_process(
    argv: list[str], log_path: Path, *, cwd: str | Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`argv` as a child, stdout and stderr appended to `log_path`, stdin closed.

    `env` is added on top of this process's environment.
    """
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def log_tail(log_path: Path | None, n: int = 4000) -> str:
    """The last `n` characters of a log ("" when there is none)."""
    if log_path is None or not Path(log_path).exists():
        return ""
    return Path(log_path).read_text(errors="replace")[-n:]


def wait_healthy(
    url: str,
    proc: subprocess.Popen,
    *,
    timeout: float,
    log_path: Path | None = None,
    path: str = "/health",
    ready: Callable[[httpx.Response], bool] | None = None,
) -> None:
    """Return once GET `url + path` answers 200 (or, given `ready`, once `ready(response)` is true).

    Raises RuntimeError, with the tail of the child's log, if the child exits first or
    `timeout` seconds pass.
    """
    command = " ".join(str(a) for a in proc.args)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"`{command}` exited with {proc.returncode}; log {log_path}:\n{log_tail(log_path)}")
        try:
            response = httpx.get(url + path, timeout=2, trust_env=False)
            if ready(response) if ready else response.status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"`{command}` was not ready at {url}{path} in {timeout:.0f}s; log {log_path}:\n{log_tail(log_path)}"
            )
        time.sleep(0.3)


def stop_process(proc: subprocess.Popen | None, timeout: float = 60) -> int | None:
    """SIGTERM, wait up to `timeout` s, then SIGKILL; the exit code (None if never started)."""
    if proc is None or proc.poll() is not None:
        return proc.returncode if proc else None
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by this user only (0600), as a run's config files are."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(text)
