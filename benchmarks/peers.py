"""Peer recording proxies, run in front of the same instant engine as ours for a like-for-like comparison.

Each peer lives in its own virtual environment under ~/.cache/areal-proxy/peers/<name>/venv (or $AREAL_PEERS_DIR),
installed from PyPI as a new user would; a peer whose environment is missing is left out. To make
them (Python 3.11; none of them needs torch):

    python3 -m venv $PEERS/agentlightning/venv
    $PEERS/agentlightning/venv/bin/pip install agentlightning==0.3.0 'opentelemetry-exporter-otlp<1.45'
    python3 -m venv $PEERS/agentlightning-gateway/venv
    $PEERS/agentlightning-gateway/venv/bin/pip install --ignore-requires-python agentlightning==1.0.2
    python3 -m venv $PEERS/rllm-model-gateway/venv
    $PEERS/rllm-model-gateway/venv/bin/pip install rllm-model-gateway==0.1.0

agentlightning (0.3.0, the newest release for Python 3.11): its LiteLLM-based `LLMProxy`, started as
its docs and examples/minimal/llm_proxy.py do: an `InMemoryLightningStore` behind a
`LightningStoreServer`, then `LLMProxy(port, model_list=[hosted_vllm/<model> at the upstream],
store=...)` with the default launch mode (a child process), middlewares (rollout/attempt routing,
stream conversion) and callbacks (`return_token_ids`, OpenTelemetry spans exported into the store).
Spans are stored only for calls under /rollout/<id>/attempt/<id>/v1/..., so the launcher starts one
rollout (with fixed ids, so that the path is known up front) and every call goes there. Two things a
user needs today: LiteLLM 1.108+ refuses to start without a master key
(LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY=true keeps the unauthenticated proxy Agent
Lightning was built for), and OpenTelemetry 1.45 ignores the exporter endpoint Agent Lightning sets,
so every span would go to localhost:4318 and be lost (hence the `<1.45` pin).
LITELLM_LOCAL_MODEL_COST_MAP=True only skips ~10 s of retries fetching a price list at start-up.

agentlightning-gateway (1.0.2, what the issue measured; it declares Python >= 3.12 but runs on 3.11):
a rewrite without LiteLLM, `agl-server` (Hydra config, defaults otherwise) forwarding with httpx and
appending a `model_request` event (request, response, latency) to its in-memory store per call. As a
trainer does, the launcher registers the upstream (`POST /api/models`) and a rollout
(`POST /api/rollouts`), and calls go to its train route, which adds `logprobs` and
`return_token_ids`. Its default logging stays on: an access line, an httpx line and a Hydra log-file
line per call.

rllm-model-gateway (0.1.0): `rllm-model-gateway --worker <upstream>/v1` with its default SQLite trace
store (the file put in the run's folder), `logprobs` and `return_token_ids` added to each request,
and each trace written just after the answer. Only calls under /sessions/<id>/v1/... are traced.
Its log level is warning, as ours is, so that it prints no access line per call.

    for peer in installed_peers():
        argv = peer.argv(engine_url, port, workdir)  # run with cwd=workdir, env=peer.env(workdir)
        # wait for GET peer.health == 200, send to peer.path, then peer.recorded(base_url, workdir)
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from trainer.launch.processes import free_port

MODEL = "instant"
ROLLOUT, ATTEMPT = "ro-arealbench", "at-bench"  # where the Agent Lightning peers record every call
SESSION = "bench"  # the rLLM session likewise

# Run with the agentlightning (0.3.0) environment's Python: upstream port store_port model rollout attempt info
_LLM_PROXY_LAUNCHER = '''\
"""Agent Lightning's LLMProxy in front of one OpenAI-compatible upstream (written by benchmarks/peers.py)."""

import asyncio
import json
import signal
import sys
from pathlib import Path

import agentlightning as agl
from agentlightning.store import collection_based


async def main(upstream: str, port: int, store_port: int, model: str, rollout_id: str, attempt_id: str, info: str):
    store = agl.InMemoryLightningStore()
    store_server = agl.LightningStoreServer(store, "127.0.0.1", store_port)
    await store_server.start()
    # The rollout every call is recorded under; only its ids are chosen here (the generators are swapped
    # for this one call), so that the request path is known before the proxy starts.
    generators = collection_based._generate_rollout_id, collection_based._generate_attempt_id
    collection_based._generate_rollout_id = lambda: rollout_id
    collection_based._generate_attempt_id = lambda: attempt_id
    await store.start_rollout(input={"origin": "areal-proxy benchmark"})
    collection_based._generate_rollout_id, collection_based._generate_attempt_id = generators
    Path(info).write_text(json.dumps({"store": store_server.endpoint}))
    model_list = [{"model_name": model, "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": upstream}}]
    proxy = agl.LLMProxy(port=port, host="127.0.0.1", model_list=model_list, store=store_server)
    await proxy.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await proxy.stop()
    await store_server.stop()


asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:8]))
'''

# Run with the agentlightning-gateway (1.0.2) environment's Python: agl-server upstream port model rollout
_GATEWAY_LAUNCHER = '''\
"""Agent Lightning's agl-server, with one upstream and one rollout registered (written by benchmarks/peers.py)."""

import signal
import subprocess
import sys
import time

import httpx

agl_server, upstream, port, model, rollout_id = sys.argv[1:6]
server = subprocess.Popen([agl_server, "host=127.0.0.1", f"port={port}", f"default_proxy.model_name={model}"])
stopping = []


def stop(*_):
    stopping.append(True)
    server.terminate()


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
base = f"http://127.0.0.1:{port}"
while server.poll() is None:
    try:
        if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.2)
if server.poll() is None:
    httpx.post(f"{base}/api/models", json=[{"model": model, "endpoint": upstream}], timeout=30).raise_for_status()
    httpx.post(f"{base}/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}], timeout=30).raise_for_status()
code = server.wait()
sys.exit(0 if stopping else code)
'''


@dataclass(frozen=True)
class Peer:
    """One peer proxy: how to start it, where to send chat completions, how many calls it recorded."""

    name: str  # "agentlightning", "agentlightning-gateway" or "rllm-model-gateway"
    version: str  # installed version, read from its environment
    python: Path  # the peer environment's interpreter
    path: str  # full path of chat completions on the peer, under which its calls are recorded
    health: str  # GET path that answers 200 once calls to `path` are served
    extra_env: dict[str, str] = field(default_factory=dict)
    model: str = MODEL  # model name clients send (the instant engine ignores it)

    def argv(self, upstream_url: str, port: int, workdir: Path) -> list[str]:
        """The command serving on 127.0.0.1:`port` in front of `upstream_url` (the engine's root URL).

        Run it in `workdir`; what it needs or writes (launcher, trace store, logs) goes there.
        """
        workdir.mkdir(parents=True, exist_ok=True)
        upstream = upstream_url.rstrip("/") + "/v1"
        if self.name == "agentlightning":
            launcher = workdir / "llm_proxy.py"
            launcher.write_text(_LLM_PROXY_LAUNCHER)
            rest = [str(free_port()), self.model, ROLLOUT, ATTEMPT, str(workdir / "agl.json")]
            return [str(self.python), str(launcher), upstream, str(port), *rest]
        if self.name == "agentlightning-gateway":
            launcher = workdir / "agl_server.py"
            launcher.write_text(_GATEWAY_LAUNCHER)
            agl_server = str(self.python.parent / "agl-server")
            return [str(self.python), str(launcher), agl_server, upstream, str(port), self.model, ROLLOUT]
        return [
            str(self.python.parent / "rllm-model-gateway"),
            *("--host", "127.0.0.1", "--port", str(port), "--worker", upstream),
            *("--db-path", str(workdir / "gateway_traces.db"), "--log-level", "warning"),
        ]

    def env(self, workdir: Path) -> dict[str, str]:
        """Variables to add to the environment of `argv`."""
        return dict(self.extra_env)

    def recorded(self, base_url: str, workdir: Path) -> int:
        """How many calls the peer has recorded so far (rLLM writes each one just after answering)."""
        if self.name == "agentlightning":
            store = json.loads((workdir / "agl.json").read_text())["store"]
            params = {"rollout_id": ROLLOUT, "name": "raw_gen_ai_request", "limit": 1}
            return httpx.get(f"{store}/v1/agl/spans", params=params, timeout=30).json()["total"]
        if self.name == "agentlightning-gateway":
            events = f"{base_url}/api/rollouts/{ROLLOUT}/events"
            return len(httpx.get(events, params={"event_type": "model_request"}, timeout=60).json())
        return httpx.get(f"{base_url}/sessions/{SESSION}", timeout=30).json()["trace_count"]


# name: (package, import name, path, health, environment)
_PEERS = {
    "agentlightning": (
        "agentlightning",
        "agentlightning",
        f"/rollout/{ROLLOUT}/attempt/{ATTEMPT}/v1/chat/completions",
        "/health/liveliness",
        {"LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    ),
    "agentlightning-gateway": (
        "agentlightning",
        "agentlightning",
        f"/proxy/rollout/{ROLLOUT}/attempt/0/mode/train/openai/v1/chat/completions",
        f"/api/rollouts/{ROLLOUT}",
        {},
    ),
    "rllm-model-gateway": (
        "rllm-model-gateway",
        "rllm_model_gateway",
        f"/sessions/{SESSION}/v1/chat/completions",
        "/health",
        {},
    ),
}


PEERS_DIR = Path(os.environ.get("AREAL_PEERS_DIR", "~/.cache/areal-proxy/peers")).expanduser()


def installed_peers(root: Path = PEERS_DIR) -> list[Peer]:
    """The peers whose environment exists under `root`/<name>/venv with the package in it."""
    peers = []
    for name, (package, module, path, health, env) in _PEERS.items():
        python = root / name / "venv" / "bin" / "python"
        if not python.exists():
            continue
        probe = f"import importlib.metadata as m, importlib.util as u; assert u.find_spec({module!r}); "
        probe += f"print(m.version({package!r}))"
        result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
        if result.returncode == 0:
            peers.append(Peer(name, result.stdout.strip(), python, path, health, env))
    return peers
