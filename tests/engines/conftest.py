"""Fixtures for engine tests: real `areal-proxy engine` processes on free ports, perturbed weights.

Engine processes run with one torch thread each: several share this small machine with the
proxy and the test process.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import cli_process
from trainer.launch.processes import log_tail


@dataclass
class EngineProcess:
    url: str
    process: subprocess.Popen
    log: Path

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=120, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, timeout=600, **kw)

    def stats(self) -> dict:
        r = self.get("/health")
        assert r.status_code == 200, r.text
        return r.json()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def tail(self, n: int = 4000) -> str:
        return log_tail(self.log, n)


@contextlib.contextmanager
def run_engine(tmp: Path, *args: str, threads: int = 1, env: dict[str, str] | None = None) -> Iterator[EngineProcess]:
    """`areal-proxy engine` on a free port; yields once `/health` answers (the model is loaded)."""
    with cli_process(tmp, "engine", "--set", f"engine.threads={threads}", *args, env=env) as (url, proc, log):
        yield EngineProcess(url=url, process=proc, log=log)


@pytest.fixture(scope="session")
def engine_runner() -> Callable[..., contextlib.AbstractContextManager[EngineProcess]]:
    """`run_engine(tmp, *args)` as a fixture, for tests that start their own engines."""
    return run_engine


def write_perturbed_weights(out: Path, scale: float = 0.02, seed: int = 0) -> Path:
    """A copy of the default model's weights with Gaussian noise on every matrix (a "trained" step)."""
    import torch
    from safetensors.torch import load_file, save_file

    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

    source = Path(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")) / "model.safetensors"
    state = load_file(str(source))
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in state.items():
        if tensor.is_floating_point() and tensor.dim() == 2:
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            state[name] = (tensor.float() + scale * tensor.float().std() * noise).to(tensor.dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="session")
def perturbed_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding perturbed safetensors weights of the default model."""
    return write_perturbed_weights(tmp_path_factory.mktemp("perturbed") / "weights")


@pytest.fixture(scope="session")
def original_weights() -> Path:
    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

    return Path(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy"))
