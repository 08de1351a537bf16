"""`areal-proxy train --launcher ray`: the run's components as Ray actors on a cluster.

Engine servers (`areal-proxy engine`), proxy replicas, the front over them, the trainer and
N episode runners each run in an actor holding the resources `[ray]` declares (CPUs, GPUs,
NPUs). The replicas share one PostgreSQL store — SQLite is refused up front — and the engine
servers through the sglang backend (with `ray.engine_servers = 0` each replica runs its own
local engine). Runners, agents and the trainer use the front's URL, so a weight push reaches
every replica and a dead replica is routed around. Every `health_interval_s` the launcher
checks each component, restarts one whose process died (up to `max_restarts`; an actor lost
with its node stops the run), and appends what each component logged to `run_dir/logs/`;
the trainer writes `metrics.jsonl`, checkpoints and its audit log into `run_dir`, which must
be on a filesystem every node shares when the cluster has several. The run ends as the local
launcher's does, and running the same command again resumes it.

With `trainer.processes` = N the trainer is N actors (`trainer`, `trainer-1`, ...), each with
the `ray.trainer_*` resources (one GPU or NPU each), joined into one torch.distributed group at
rank 0's node (`trainer/distributed.py`). If one rank dies the others cannot go on, so all of
them are restarted together and resume from the last checkpoint (counted as one restart).

Before anything starts, what the run asks of the cluster (each component's CPUs, GPUs, NPUs)
is checked against what the cluster has: a run that could never be placed fails within
seconds, naming both figures and the settings to change. A local cluster (no address) is
started with at least as many logical CPUs as the run asks for, so the defaults fit any
machine (the components then share its cores). SIGINT or SIGTERM stops the run, also while
it is still starting, and with it a local cluster the launcher started.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from proxy.config import ADMIN_KEY_ENV, Config, ConfigError, public_config
from proxy.store.db import is_sqlite
from trainer.launch.processes import write_private
from trainer.metrics import progress_rows

FORWARDED_ENV = re.compile(r"^(HF_|HUGGINGFACE_|TRANSFORMERS_|AREAL_|TOKENIZERS_PARALLELISM$|OPENAI_AGENTS_)")


def check_config(cfg: Config) -> None:
    """What the ray launcher cannot run, said before anything starts."""
    if is_sqlite(cfg.store.url):
        raise ConfigError(
            f"--launcher ray runs several processes that write one store, and SQLite ({cfg.store.url}) "
            "allows one proxy process. Use PostgreSQL: --db postgresql+psycopg://user@host/dbname "
            "(or [store] url = ...)."
        )
    r = cfg.ray
    devices = {
        "engine servers": (cfg.engine.device, r.engine_gpus, r.engine_npus, r.engine_servers > 0),
        "proxy replicas (local engines)": (cfg.engine.device, r.proxy_gpus, r.proxy_npus, r.engine_servers == 0),
        "trainer": (cfg.trainer.device, r.trainer_gpus, r.trainer_npus, True),
    }
    if cfg.trainer.processes > 1 and max(r.trainer_gpus, r.trainer_npus) > 1:
        raise ConfigError(
            f"each of the {cfg.trainer.processes} trainer processes uses one accelerator: set ray.trainer_gpus "
            "(or ray.trainer_npus) = 1 and trainer.processes to the number of accelerators to train on"
        )
    for what, (device, gpus, npus, used) in devices.items():
        if used and device == "cuda" and gpus <= 0:
            raise ConfigError(f"the {what} run on cuda but get no GPU: set the ray *_gpus field for them")
        if used and device == "npu" and npus <= 0:
            raise ConfigError(f"the {what} run on npu but get no NPU: set the ray *_npus field for them")


def trainer_names(cfg: Config) -> list[str]:
    """The trainer's actors: `trainer` (rank 0, which claims and writes the run's files), then
    `trainer-1` ... with `trainer.processes` > 1, each asking for the `ray.trainer_*` resources."""
    return ["trainer"] + [f"trainer-{r}" for r in range(1, cfg.trainer.processes)]


def rank_env(rank: int, world: int, master: str, port: int) -> dict[str, str]:
    """What `trainer/distributed.py` reads to join the trainer's process group. Ray shows each actor
    only the GPUs (NPUs) it was given, so every rank's own device is its node-local device 0."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
    }


def demand(cfg: Config) -> dict[str, list[tuple[str, float]]]:
    """What each component asks of the cluster, by resource: {"CPU": [(who, amount), ...], ...}."""
    r = cfg.ray
    asks = [("front", r.front_cpus, 0.0, 0.0)]
    asks += [(f"engine server {i}", r.engine_cpus, r.engine_gpus, r.engine_npus) for i in range(r.engine_servers)]
    asks += [(f"proxy replica {i}", r.proxy_cpus, r.proxy_gpus, r.proxy_npus) for i in range(r.proxy_replicas)]
    asks += [(name, r.trainer_cpus, r.trainer_gpus, r.trainer_npus) for name in trainer_names(cfg)]
    asks += [(f"runner {i}", r.runner_cpus, 0.0, 0.0) for i in range(r.runners)]
    out: dict[str, list[tuple[str, float]]] = {"CPU": [], "GPU": [], "NPU": []}
    for who, *amounts in asks:
        for resource, amount in zip(out, amounts):
            if amount > 0:
                out[resource].append((who, amount))
    return out


_SETTINGS = {
    "CPU": "ray.front_cpus, ray.engine_cpus, ray.proxy_cpus, ray.trainer_cpus, ray.runner_cpus",
    "GPU": "ray.engine_gpus, ray.proxy_gpus, ray.trainer_gpus",
    "NPU": "ray.engine_npus, ray.proxy_npus, ray.trainer_npus",
}


def check_resources(cfg: Config, total: dict[str, float], nodes: list[dict[str, float]]) -> None:
    """Refuse a run the cluster can never place: more of a resource than the whole cluster has,
    or one component larger than every node. (A cluster that is only busy is waited for.)"""
    r = cfg.ray
    counts = f"{r.engine_servers} engine servers, {r.proxy_replicas} proxy replicas, {r.runners} runners"
    for resource, asks in demand(cfg).items():
        need = sum(amount for _, amount in asks)
        have = float(total.get(resource, 0.0))
        if need > have + 1e-9:
            detail = ", ".join(f"{who} {amount:g}" for who, amount in asks)
            raise ConfigError(
                f"the run asks for {need:g} {resource}s ({detail}) but the Ray cluster has {have:g}. "
                f"Lower {_SETTINGS[resource]} or the component counts ({counts}), add nodes"
                + (", or raise ray.local_cpus (0 sizes a local cluster to the run)" if resource == "CPU" else "")
            )
        largest = max((n.get(resource, 0.0) for n in nodes), default=0.0)
        for who, amount in asks:
            if amount > largest + 1e-9:
                raise ConfigError(
                    f"the {who} asks for {amount:g} {resource}s but no node of the Ray cluster has more than "
                    f"{largest:g}; lower it ({_SETTINGS[resource]})"
                )


def local_cluster_cpus(cfg: Config) -> int:
    """Logical CPUs of a local cluster: ray.local_cpus, or (0) enough for the run and at least the
    machine's cores, so the default settings can always be placed."""
    if cfg.ray.local_cpus:
        return cfg.ray.local_cpus
    need = sum(amount for _, amount in demand(cfg)["CPU"])
    return max(os.cpu_count() or 1, math.ceil(need))


def _absolute(spec: str, cwd: Path) -> str:
    """`file.py:fn`, `data.jsonl` or `module.py` made absolute when that file exists here."""
    path, sep, attr = spec.rpartition(":") if ".py:" in spec else (spec, "", "")
    if path.endswith((".py", ".jsonl")) and (cwd / path).is_file():
        return f"{(cwd / path).resolve()}{sep}{attr}"
    return spec


def prepare(cfg: Config, cwd: Path) -> Path:
    """Settings every component must agree on; returns the absolute run directory."""
    run_dir = (cwd / cfg.trainer.run_dir).resolve()
    cfg.trainer.run_dir = str(run_dir)
    if not cfg.trainer.weights_dir:
        cfg.trainer.weights_dir = str(run_dir / "weights")  # readable by every engine, unlike /dev/shm
    cfg.proxy.admission = True
    if not cfg.proxy.admin_key:  # components listen on the nodes' addresses: never without a key
        cfg.proxy.admin_key = secrets.token_urlsafe(32)
    if not cfg.engine.api_key:
        cfg.engine.api_key = cfg.proxy.admin_key
    cfg.rollout.dataset = _absolute(cfg.rollout.dataset, cwd)
    cfg.rollout.agent = _absolute(cfg.rollout.agent, cwd)
    cfg.rewards.modules = [_absolute(m, cwd) for m in cfg.rewards.modules]
    return run_dir


def resources(cpus: float, gpus: float, npus: float) -> dict[str, Any]:
    options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus}
    if npus > 0:
        options["resources"] = {"NPU": npus}
    return options


@dataclass
class Component:
    name: str
    kind: str  # engine | proxy | front | trainer | runner
    actor: Any
    url: str = ""
    node: str = ""
    state: str = "starting"
    restarts: int = 0
    log_offset: int = 0


class Cluster:
    """The run's actors: creation, start order, checks, restarts, logs, teardown."""

    def __init__(self, cfg: Config, run_dir: Path, cwd: Path, console: Console) -> None:
        import ray

        from trainer.launch.ray_actors import ProcessActor, RunnerActor

        self.ray = ray
        self.cfg = cfg
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.cwd = str(cwd)
        self.env = {k: v for k, v in os.environ.items() if FORWARDED_ENV.match(k)}
        self.env[ADMIN_KEY_ENV] = cfg.proxy.admin_key  # components get the run's key here, never in a file
        self.console = console
        self.components: list[Component] = []
        self._process = ray.remote(ProcessActor)
        self._runner = ray.remote(RunnerActor)
        self.runner_stats: dict[str, dict[str, Any]] = {}
        self.stop_marked = False

    # -- creation ---------------------------------------------------------------------
    def add_process(self, name: str, kind: str, cpus: float, gpus: float = 0.0, npus: float = 0.0) -> Component:
        actor = self._process.options(**resources(cpus, gpus, npus)).remote(name, self.cwd, self.env)
        component = Component(name, kind, actor)
        self.components.append(component)
        return component

    def add_runner(self, name: str) -> Component:
        actor = self._runner.options(num_cpus=self.cfg.ray.runner_cpus).remote(name, self.cwd, self.env)
        component = Component(name, "runner", actor)
        self.components.append(component)
        return component

    def of(self, kind: str) -> list[Component]:
        return [c for c in self.components if c.kind == kind]

    def place(self, components: list[Component]) -> None:
        """Wait until the actors are placed; learn their host:port."""
        try:
            calls = [c.actor.endpoint.remote() for c in components]
            endpoints = self.ray.get(calls, timeout=self.cfg.ray.start_timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the cluster could not place every component in {self.cfg.ray.start_timeout_s:.0f}s; "
                f"it has {self.ray.available_resources()} free. Lower the [ray] resources or add nodes."
            ) from None
        for component, (host, port) in zip(components, endpoints):
            component.url, component.node = f"http://{host}:{port}", host

    def join(self, trainers: list[Component]) -> None:
        """Give placed trainer actors their ranks: the process group meets at rank 0's node, on the
        port its actor holds (a trainer serves no HTTP)."""
        if len(trainers) < 2:
            return
        master, port = trainers[0].url.removeprefix("http://").rsplit(":", 1)
        env = [rank_env(rank, len(trainers), master, int(port)) for rank in range(len(trainers))]
        self.ray.get([t.actor.set_env.remote(e) for t, e in zip(trainers, env)])
        self.say(f"{len(trainers)} trainer processes, process group at {master}:{port}")

    def start(self, components: list[Component], argv: list[str], health: bool = True) -> None:
        config = public_config(self.cfg)
        pids = self.ray.get([c.actor.start.remote(argv, config) for c in components])
        for component, pid in zip(components, pids):
            self.write_pid(component, pid)
        if health:
            timeout = self.cfg.ray.start_timeout_s
            errors = self.ray.get([c.actor.wait_healthy.remote(timeout) for c in components])
            self.copy_logs()
            for component, error in zip(components, errors):
                if error:
                    raise RuntimeError(f"{error}; see {self.logs / component.name}.log")
        for component in components:
            component.state = "running"

    def start_runners(self, front_url: str) -> None:
        config = public_config(self.cfg)
        n = len(self.of("runner"))
        calls = [self._start_runner(c, config, front_url, k, n) for k, c in enumerate(self.of("runner"))]
        self.ray.get(calls)

    def _start_runner(self, component: Component, config: dict, front_url: str, k: int, n: int) -> Any:
        component.state = "running"
        state_path = self.run_dir / f"runner_state_{k}of{n}.json"
        return component.actor.start.remote(config, front_url, k, n, str(state_path))

    # -- supervision ------------------------------------------------------------------
    def check(self) -> str | None:
        """One round of checks and restarts; a message when the run cannot go on."""
        for component in self.components:
            try:
                if component.kind == "runner":
                    problem = self._check_runner(component)
                else:
                    problem = self._check_process(component)
            except self.ray.exceptions.GetTimeoutError:
                component.state = "not answering"  # busy or overloaded: asked again next round
                continue
            except self.ray.exceptions.RayActorError as exc:
                return f"the actor of {component.name} died ({type(exc).__name__}); run the command again to resume"
            if problem:
                return problem
        return None

    def _check_process(self, component: Component) -> str | None:
        status = self.ray.get(component.actor.status.remote(), timeout=60)
        code = status["returncode"]
        if code is None:
            if component.kind != "trainer":
                healthy = self.ray.get(component.actor.healthy.remote(), timeout=60)
                component.state = "running" if healthy else "not answering"
            return None
        if component.kind == "trainer" and code == 0:
            component.state = "finished"
            return None
        if component.kind == "trainer" and len(self.of("trainer")) > 1:
            return self._restart_trainers(component, f"exited with {code}")
        return self._restart(component, f"exited with {code}")

    def _check_runner(self, component: Component) -> str | None:
        stats = self.ray.get(component.actor.status.remote(), timeout=60)
        self.runner_stats[component.name] = stats
        if stats.get("error"):
            return self._restart(component, f"failed: {stats['error']}")
        component.state = "done" if stats.get("done") else "running"
        return None

    def _restart(self, component: Component, why: str) -> str | None:
        self.say(f"{component.name} {why}; see {self.logs / component.name}.log")
        if component.restarts >= self.cfg.ray.max_restarts:
            return f"{component.name} {why} and was restarted {component.restarts} times already"
        component.restarts += 1
        component.state = "restarting"
        self.copy_logs()
        if component.kind == "runner":
            runners, front = self.of("runner"), self.of("front")[0]
            k, config = runners.index(component), public_config(self.cfg)
            self.ray.get(self._start_runner(component, config, front.url, k, len(runners)))
            return None
        self.write_pid(component, self.ray.get(component.actor.restart.remote()))
        if component.kind != "trainer":
            error = self.ray.get(component.actor.wait_healthy.remote(self.cfg.ray.start_timeout_s))
            if error:
                return f"{component.name} did not come back: {error}"
        if component.kind == "engine":
            self._reload_weights(component)
        component.state = "running"
        self.say(f"{component.name} restarted ({component.restarts} of {self.cfg.ray.max_restarts})")
        return None

    def _restart_trainers(self, component: Component, why: str) -> str | None:
        """One rank of several died: the others cannot go on (a step and a checkpoint need every
        rank), so all of them start again, with the same ranks, and resume from the last checkpoint.
        The restarts are counted on rank 0's component."""
        self.say(f"{component.name} {why}; see {self.logs / component.name}.log")
        trainers = self.of("trainer")
        main = trainers[0]
        if main.restarts >= self.cfg.ray.max_restarts:
            return f"{component.name} {why} and the trainer was restarted {main.restarts} times already"
        main.restarts += 1
        self.copy_logs()
        # The survivors wait in a collective for the dead rank: rank 0 is asked to stop, the others
        # ignore SIGTERM (rank 0 leads their shutdown) and are killed after a short wait.
        self.ray.get([t.actor.stop.remote(30) for t in trainers], timeout=120)
        pids = self.ray.get([t.actor.restart.remote() for t in trainers])
        for trainer, pid in zip(trainers, pids):
            self.write_pid(trainer, pid)
            trainer.state = "running"
        self.say(f"the trainer's {len(trainers)} processes restarted ({main.restarts} of {self.cfg.ray.max_restarts})")
        return None

    def _reload_weights(self, engine: Component) -> None:
        """A restarted engine server starts from the base model: give it the newest pushed weights."""
        front = self.of("front")[0]
        _, health = self.ray.get(front.actor.request.remote("GET", "/health"))  # a 503 still names the version
        version = int(health.get("version", 0)) if isinstance(health, dict) else 0
        if version <= 0:
            return
        path = Path(self.cfg.trainer.weights_dir) / f"v{version:07d}"
        body = {"model_path": str(path), "weight_version": str(version), "abort_all_requests": False}
        status, answer = self.ray.get(engine.actor.request.remote("POST", "/update_weights_from_disk", body))
        self.say(f"{engine.name} reloaded weights v{version}: {status} {str(answer)[:200]}")

    def write_pid(self, component: Component, pid: int) -> None:
        """run_dir/<name>.pid: the process id on its node (`<node> <pid>`), for operators and tests."""
        (self.run_dir / f"{component.name}.pid").write_text(f"{component.node} {pid}\n")

    def mark_stop(self, present: bool = True) -> None:
        """The trainer's STOP file, on the trainer's node: it ends once nothing more can be claimed."""
        for trainer in self.of("trainer"):
            self.ray.get(trainer.actor.mark.remote(str(self.run_dir / "STOP"), present))
        self.stop_marked = present

    # -- logs and metrics -------------------------------------------------------------
    def copy_logs(self) -> None:
        """Append what every component logged since the last copy to run_dir/logs/<name>.log."""
        from trainer.launch.ray_actors import LOG_CHUNK

        pending = list(self.components)
        while pending:
            try:
                chunks = self.ray.get([c.actor.read_log.remote(c.log_offset) for c in pending], timeout=60)
            except self.ray.exceptions.RayError:
                return  # an actor is gone; the checks report it
            again = []
            for component, chunk in zip(pending, chunks):
                if chunk:
                    with open(self.logs / f"{component.name}.log", "ab") as f:
                        f.write(chunk)
                    component.log_offset += len(chunk)
                if len(chunk) == LOG_CHUNK:
                    again.append(component)
            pending = again

    def save_metrics(self) -> None:
        """Each replica's Prometheus metrics and the front's view of them, into run_dir/logs."""
        for component in self.of("proxy") + self.of("front"):
            path = "/metrics" if component.kind == "proxy" else "/health"
            with contextlib.suppress(self.ray.exceptions.RayError):
                status, body = self.ray.get(component.actor.request.remote("GET", path), timeout=30)
                if status == 200:
                    suffix = "metrics.txt" if component.kind == "proxy" else "health.json"
                    text = body if isinstance(body, str) else json.dumps(body, indent=2)
                    (self.logs / f"{component.name}.{suffix}").write_text(text)

    def say(self, message: str) -> None:
        self.console.print(message)
        with open(self.logs / "launcher.log", "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")

    # -- teardown ---------------------------------------------------------------------
    def stop(self) -> int | None:
        """Runners first (they end their open sessions through the front), then the trainer, then the rest."""
        ray = self.ray
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get([c.actor.stop.remote(60) for c in self.of("runner")], timeout=120)
        trainer_code = None
        for rank, trainer in enumerate(self.of("trainer")):
            # Rank 0 checkpoints (with every rank) and then tells the others to exit: they get less time.
            timeout = 300 if rank == 0 else 30
            with contextlib.suppress(ray.exceptions.RayError):
                code = ray.get(trainer.actor.stop.remote(timeout), timeout=timeout + 60)
                trainer_code = code if trainer_code in (0, None) else trainer_code
        self.save_metrics()
        rest = self.of("front") + self.of("proxy") + self.of("engine")
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get([c.actor.stop.remote(30) for c in rest], timeout=120)
        self.copy_logs()
        for component in self.components:
            with contextlib.suppress(Exception):
                ray.kill(component.actor)
        return trainer_code


def progress_table(cluster: Cluster, started: float) -> Table:
    table = Table(title=f"areal-proxy train (ray) — {cluster.run_dir}", show_header=False, min_width=60)
    table.add_column(style="bold")
    table.add_column()
    for row in progress_rows(cluster.run_dir, cluster.cfg.trainer.max_steps):
        table.add_row(*row)
    stats = cluster.runner_stats.values()
    finished = sum(s.get("episodes_finished", 0) for s in stats)
    failed = sum(s.get("episodes_failed", 0) for s in stats)
    table.add_row("episodes finished / failed", f"{finished} / {failed}")
    table.add_row("admission waits", str(sum(s.get("admission_waits", 0) for s in stats)))
    if cluster.cfg.rollout.screen:
        table.add_row("groups screened out", str(sum(s.get("screened_out", 0) for s in stats)))
    for c in cluster.components:
        restarts = f", {c.restarts} restarts" if c.restarts else ""
        where = c.url if c.kind in ("engine", "proxy", "front") else c.node
        table.add_row(c.name, f"{c.state} {where}{restarts}")
    table.add_row("elapsed", f"{time.time() - started:.0f}s")
    return table


def _bring_up(cluster: Cluster) -> str:
    """Place every actor, then start engines → replicas → front → trainer → runners; the front's URL."""
    cfg, r = cluster.cfg, cluster.cfg.ray
    front = cluster.add_process("front", "front", r.front_cpus)
    engine_res, proxy_res = (r.engine_cpus, r.engine_gpus, r.engine_npus), (r.proxy_cpus, r.proxy_gpus, r.proxy_npus)
    engines = [cluster.add_process(f"engine-{i}", "engine", *engine_res) for i in range(r.engine_servers)]
    proxies = [cluster.add_process(f"proxy-{i}", "proxy", *proxy_res) for i in range(r.proxy_replicas)]
    trainer_res = (r.trainer_cpus, r.trainer_gpus, r.trainer_npus)
    trainers = [cluster.add_process(name, "trainer", *trainer_res) for name in trainer_names(cfg)]
    for i in range(r.runners):
        cluster.add_runner(f"runner-{i}")
    cluster.place([front, *engines, *proxies, *trainers])
    cluster.join(trainers)
    if engines:
        cfg.engine.urls = [e.url for e in engines]  # first: the sglang backend needs them
        cfg.engine.backend = "sglang"
    cfg.proxy.public_url = front.url
    cfg.front.replicas = [p.url for p in proxies]
    write_private(cluster.run_dir / "config.json", json.dumps(public_config(cfg), indent=2))
    serve = ["-m", "proxy.cli", "{kind}", "--host", "{{host}}", "--port", "{{port}}"]
    if engines:
        cluster.say(f"starting {len(engines)} engine servers")
        cluster.start(engines, [a.format(kind="engine") for a in serve])
    cluster.say(f"starting {len(proxies)} proxy replicas")
    cluster.start(proxies, [a.format(kind="serve") for a in serve])
    cluster.start([front], [a.format(kind="front") for a in serve])
    cluster.say(f"front at {front.url} over {', '.join(cfg.front.replicas)}")
    cluster.mark_stop(False)  # a STOP left by an earlier run would end this one at once
    cluster.start(trainers, ["-m", "trainer.loop"], health=False)
    cluster.start_runners(front.url)
    return front.url


def _supervise(cluster: Cluster, console: Console, stop: threading.Event) -> int:
    started, last_check, last_print = time.time(), 0.0, 0.0
    interactive = console.is_terminal
    with (
        Live(progress_table(cluster, started), console=console, refresh_per_second=1)
        if interactive
        else contextlib.nullcontext() as live
    ):
        while not stop.wait(1.0):
            if time.time() - last_check >= cluster.cfg.ray.health_interval_s:
                last_check = time.time()
                problem = cluster.check()
                cluster.copy_logs()
                if problem:
                    cluster.say(f"stopping the run: {problem}")
                    return 1
                if cluster.of("trainer")[0].state == "finished":  # rank 0, which ends the others
                    return 0
                runners = cluster.of("runner")
                if not cluster.stop_marked and runners and all(c.state == "done" for c in runners):
                    cluster.mark_stop()  # the dataset is used up: the trainer ends once it trained the rest
            if live is not None:
                live.update(progress_table(cluster, started))
            elif time.time() - last_print > 30:
                console.print(progress_table(cluster, started))
                last_print = time.time()
    return 130


def launch(cfg: Config, config_path: str | None, address: str | None) -> int:
    check_config(cfg)
    try:
        import ray
    except ImportError:
        raise ConfigError("--launcher ray needs Ray: pip install 'areal-proxy[ray]'") from None
    console = Console()
    cwd = Path.cwd()
    run_dir = prepare(cfg, cwd)
    address = address or cfg.ray.address or None
    options: dict[str, Any] = {"log_to_driver": False}
    if address is None:
        options.update(include_dashboard=False, num_cpus=local_cluster_cpus(cfg))
    stop = threading.Event()
    supervising = threading.Event()

    def on_signal(*_: Any) -> None:
        if stop.is_set() or not supervising.is_set():
            raise KeyboardInterrupt  # while starting, or a second Ctrl-C: stop waiting (the teardown still runs)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster: Cluster | None = None
    code, trainer_code = 1, None
    try:
        ray.init(address=address, **options)
        alive = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        check_resources(cfg, ray.cluster_resources(), alive)
        cluster = Cluster(cfg, run_dir, cwd, console)
        interrupted = ray.get(
            ray.remote(num_cpus=0)(_close_interrupted).remote(public_config(cfg), cfg.proxy.admin_key)
        )
        if interrupted:
            cluster.say(f"closed {interrupted} sessions left open by an interrupted run")
        _bring_up(cluster)
        supervising.set()
        code = _supervise(cluster, console, stop)
    except ConfigError as exc:
        console.print(f"areal-proxy: {exc}")
        code = 2
    except KeyboardInterrupt:
        console.print("interrupted; stopping the run")
        code = 130
    except (RuntimeError, ray.exceptions.RayError) as exc:
        if cluster is None:
            raise
        cluster.say(f"areal-proxy: {exc}")
    finally:
        stop.set()
        supervising.clear()  # a signal during the teardown cuts the graceful part short
        try:
            if cluster is not None:
                trainer_code = cluster.stop()
        except KeyboardInterrupt:
            console.print("teardown interrupted; shutting Ray down")
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            ray.shutdown()  # a local cluster started by ray.init goes with it
    if code == 0 and trainer_code not in (0, None):
        code = trainer_code
    console.print(f"run finished (exit {code}); metrics: {run_dir / 'metrics.jsonl'}; logs: {run_dir / 'logs'}")
    return code


def _close_interrupted(config: dict[str, Any], admin_key: str) -> int:
    from trainer.launch.local import close_interrupted_sessions

    cfg = Config.model_validate(config)
    cfg.proxy.admin_key = admin_key
    return close_interrupted_sessions(cfg)
