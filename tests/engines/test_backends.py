"""The table of backends: its names are the config's, and a remote backend never imports torch."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

from proxy.engines.backends import BACKENDS, make_engine
from proxy.engines.config import EngineConfig


def test_the_table_holds_exactly_the_backends_the_config_allows():
    allowed = get_args(EngineConfig.model_fields["backend"].annotation)
    assert set(allowed) == set(BACKENDS)
    assert EngineConfig().backend in BACKENDS


@pytest.mark.parametrize(("backend", "cls"), [("sglang", "SGLangEngine"), ("vllm", "VLLMEngine")])
def test_a_remote_backend_is_built_without_importing_torch(backend, cls):
    # A fresh interpreter: the test process may have imported torch already.
    script = f"""
import sys
import proxy.engines.backends as backends
assert "aiohttp" not in sys.modules, "importing the table imported a backend"
from proxy.engines.config import EngineConfig
engine = backends.make_engine(EngineConfig(backend="{backend}", urls=["http://127.0.0.1:1"]))
assert type(engine).__name__ == "{cls}", type(engine)
assert engine.backend == "{backend}"  # the name its /health reports
assert engine.pool.servers[0].url == "http://127.0.0.1:1"
assert "torch" not in sys.modules, "a remote backend imported torch"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_unknown_backend_names_the_known_ones():
    cfg = EngineConfig.model_construct(backend="tgi")  # past the config's own check
    with pytest.raises(ValueError, match="'tgi' is not one of local, sglang, vllm"):
        make_engine(cfg)
