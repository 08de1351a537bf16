"""`[ray]`: how `areal-proxy train --launcher ray` lays a run out on a Ray cluster.

How many proxy replicas, engine servers and episode runners, the CPUs / GPUs / NPUs each
component asks for, and how the launcher watches and restarts them (`trainer/launch/ray.py`).
Pydantic only, so the CLI's `--help` stays instant.
"""

from __future__ import annotations

from pydantic import Field

from proxy.sections import Section


class RayConfig(Section):
    address: str = ""
    """Ray cluster to join (auto, ray://head:10001); empty starts a local one. `--address` overrides it."""
    local_cpus: int = 0
    """Logical CPUs of the local cluster started when no address is given (0: this machine's count)."""
    proxy_replicas: int = Field(default=2, ge=1)
    """Proxy replicas behind the front, all writing the one PostgreSQL store."""
    engine_servers: int = Field(default=0, ge=0)
    """`areal-proxy engine` servers shared by the replicas (sglang backend); 0: each replica has a local engine."""
    runners: int = Field(default=1, ge=1)
    """Episode runners; runner k of N takes the tasks i with i mod N = k."""
    proxy_cpus: float = 1.0
    """CPUs of each proxy replica."""
    proxy_gpus: float = 0.0
    """GPUs of each proxy replica (when it runs its own local engine on cuda)."""
    proxy_npus: float = 0.0
    """NPUs of each proxy replica (when it runs its own local engine on npu)."""
    engine_cpus: float = 1.0
    """CPUs of each engine server."""
    engine_gpus: float = 0.0
    """GPUs of each engine server."""
    engine_npus: float = 0.0
    """NPUs of each engine server."""
    trainer_cpus: float = 1.0
    """CPUs of each trainer process (`trainer.processes` of them, each its own actor)."""
    trainer_gpus: float = 0.0
    """GPUs of each trainer process (one each with `trainer.processes` > 1)."""
    trainer_npus: float = 0.0
    """NPUs of each trainer process (one each with `trainer.processes` > 1)."""
    runner_cpus: float = 1.0
    """CPUs of each episode runner (the agents run inside it)."""
    front_cpus: float = 0.5
    """CPUs of the front."""
    start_timeout_s: float = 900.0
    """How long a component may take to be placed on the cluster and answer its health check."""
    health_interval_s: float = 5.0
    """How often the launcher checks every component (and copies their logs into the run directory)."""
    max_restarts: int = Field(default=3, ge=0)
    """Times a component that died is restarted before the run is stopped."""
