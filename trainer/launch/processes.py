"""Child processes of the launchers (local and Ray): how one is stopped."""

from __future__ import annotations

import signal
import subprocess


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
