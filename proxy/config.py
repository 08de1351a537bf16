"""Configuration: `config.toml` → one pydantic model tree, at most two levels deep.

Each package owns its section (`[engine]` in proxy/engines/config.py, `[trainer]` in
trainer/config.py, `[rollout]` in adapters/config.py, …); this module keeps the proxy's own
sections, assembles the root `Config`, checks what spans sections, and loads a file plus
repeatable `--set section.key=value` overrides. Keys that moved keep working: `MOVED` maps
each old dotted path to its new place, with a warning naming it. Each component receives only
its own section (`Trainer(cfg.trainer)`, `LocalEngine(cfg.engine)`).
"""

from __future__ import annotations

import json
import logging
import os
import tomllib
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field, ValidationError, model_validator

from adapters.config import RolloutConfig
from evaluation.config import EvalConfig
from proxy.engines.config import EngineConfig
from proxy.sections import DEVICES, Device, Section
from proxy.store.config import StoreConfig
from rewards.config import RewardsConfig
from trainer.config import OptimConfig, TrainerConfig
from trainer.launch.config import RayConfig

__all__ = [
    "DEVICES",
    "MOVED",
    "Config",
    "ConfigError",
    "Device",
    "EngineConfig",
    "EvalConfig",
    "FrontConfig",
    "OptimConfig",
    "ProxyConfig",
    "RayConfig",
    "RewardsConfig",
    "RolloutConfig",
    "Section",
    "StoreConfig",
    "TrainerConfig",
    "apply_override",
    "load_config",
    "public_config",
]

log = logging.getLogger("areal_config")
ADMIN_KEY_ENV = "AREAL_ADMIN_KEY"


class ProxyConfig(Section):
    host: str = "127.0.0.1"
    """Interface the HTTP server binds to."""
    port: int = 8000
    """TCP port of the HTTP server (0 picks a free one)."""
    admin_key: str = Field(default_factory=lambda: os.environ.get(ADMIN_KEY_ENV, ""))
    """When set, control endpoints need this key and model calls need a session or admin key; the
    engine server and the front need it too. Unset, the environment's AREAL_ADMIN_KEY is used
    (launchers hand a run's key to its components that way, never in a file or on a command line);
    without any key a server binds only loopback addresses."""
    served_model_name: str = ""
    """Model id listed by /v1/models (slash-free); empty derives it from the model name."""
    public_url: str = ""
    """Base URL handed out in `POST /sessions` answers; empty uses the request's own host."""
    max_request_bytes: int = 8 * 1024 * 1024
    """Request bodies larger than this are refused with 413."""
    default_max_tokens: int = 1024
    """Completion length when a request sets no max_tokens (capped by the context length)."""
    messages_max_tokens: Literal["clamp", "refuse"] = "clamp"
    """A Messages API call whose max_tokens is more than the context leaves: `clamp` samples up to the
    context (stop_reason max_tokens; Anthropic clients send a fixed maximum such as 32000), `refuse`
    answers 422 context_length_exceeded. Chat Completions and Responses calls always refuse."""
    messages_max_tokens_cap: int = Field(default=0, ge=0)
    """Longest reply a Messages API call samples whatever its max_tokens (stop_reason max_tokens);
    0: no cap but the context. Claude Code asks for 32000 or more on every call."""
    max_n: int = 16
    """Largest `n` (choices per request) accepted."""
    session_timeout_s: float = 3600.0
    """Open sessions idle longer than this are closed as failed (their completions are kept); a call
    being generated counts as activity."""
    auto_sessions: bool = True
    """Record calls that name no session in an automatic session per conversation root."""
    fault_injection: bool = False
    """Serve `POST /debug/engine-fault` (admin only), which makes the embedded engine's next step fail
    as a real fault would: for chaos tests of a deployment and the soak benchmark. Off in production."""
    admission: bool = False
    """Refuse new sessions (429) when too far ahead of the trainer; `areal-proxy train` turns it on."""
    log_level: str = "info"
    """Log level of the server (debug, info, warning, error)."""


class FrontConfig(Section):
    host: str = "127.0.0.1"
    """Interface `areal-proxy front` binds to."""
    port: int = 8080
    """TCP port of the front (0 picks a free one)."""
    replicas: list[str] = Field(default_factory=list)
    """Base URLs of the proxy replicas behind the front."""
    health_interval_s: float = 2.0
    """How often every replica's /health is checked (a failed one leaves rotation until it answers)."""
    timeout_s: float = 600.0
    """Longest wait for a replica's answer (generation included) before the request fails as retryable."""
    retry_after_s: int = 1
    """Retry-After of the 503 sent when a replica fails under a request (clients retry elsewhere)."""


class OnlineConfig(Section):
    """Online RL: train on live traffic (`areal-proxy train --online`), with rewards that arrive later."""

    enabled: bool = False
    """End automatic episodes when idle and make them trainable once rewarded; `train --online` turns it on."""
    idle_timeout_s: float = 300.0
    """An automatic episode (a conversation root, or the calls of one `X-Areal-Episode` header) ends
    after this long without a call or feedback; rewarded by then, it is finished and trainable."""
    reward_deadline_s: float = 3600.0
    """An ended episode with no feedback this long after its last activity is scored by
    `default_reward_fn`, or dropped (failed, counted) without one."""
    default_reward_fn: str = ""
    """Registered reward function that scores episodes nobody gave feedback on by the deadline;
    empty drops them."""
    thumbs_up: float = 1.0
    """Reward of a `thumbs: "up"` feedback."""
    thumbs_down: float = 0.0
    """Reward of a `thumbs: "down"` feedback."""
    labels: dict[str, float] = Field(default_factory=dict)
    """Rewards of named feedback labels (`{"label": "solved"}`), e.g. {solved = 1.0, wrong = 0.0}."""
    resend_window_s: float = 600.0
    """A request equal to an earlier one (same conversation, same parent, no continuation yet) made
    within this many seconds is a client's resend: the earlier answer is superseded, recorded but never
    trained. 0 turns detection off."""
    sweep_interval_s: float = 5.0
    """How often the proxy ends idle episodes and applies deadlines."""


class Config(Section):
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    front: FrontConfig = Field(default_factory=FrontConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    online: OnlineConfig = Field(default_factory=OnlineConfig)

    @model_validator(mode="after")
    def _check(self) -> Config:
        if not self.engine.api_key:
            self.engine.api_key = self.proxy.admin_key  # our own engine servers share the run's key
        if self.trainer.batch.size % self.rollout.group_size:
            raise ValueError(
                f"rollout.group_size {self.rollout.group_size} must divide trainer.batch.size {self.trainer.batch.size}"
            )
        return self


class ConfigError(ValueError):
    """A configuration file or override that cannot be used; the message says how to fix it."""


SECRETS = {"proxy": {"admin_key"}, "engine": {"api_key"}}
"""Config fields that are never written to a file a launcher hands to its components."""


def public_config(cfg: Config) -> dict[str, Any]:
    """`cfg` as JSON data without its keys: what launchers write for their components, which get
    the keys from the environment (`AREAL_ADMIN_KEY`) instead."""
    return cfg.model_dump(mode="json", exclude=SECRETS)


class Moved(NamedTuple):
    new: str
    """The key's dotted path now."""
    off: Any = None
    """The old value that meant off, where a strategy section replaced a number: the new path's
    section is then left out (`false`), and present (on) for any other value."""


MOVED: dict[str, Moved] = {
    "trainer.batch_size": Moved("trainer.batch.size"),
    "trainer.skip_zero_variance": Moved("trainer.batch.skip_zero_variance"),
    "trainer.fill_batch": Moved("trainer.batch.fill"),
    "trainer.style": Moved("trainer.batch.style"),
    "trainer.tokens_per_microbatch": Moved("trainer.batch.tokens_per_microbatch"),
    "trainer.minibatches": Moved("trainer.batch.minibatches"),
    "trainer.epochs": Moved("trainer.batch.epochs"),
    "trainer.advantage": Moved("trainer.loss.advantage"),
    "trainer.eps_clip": Moved("trainer.loss.eps_clip"),
    "trainer.eps_clip_high": Moved("trainer.loss.eps_clip_high"),
    "trainer.behav_cap": Moved("trainer.loss.behav_cap"),
    "trainer.behav_cap_mode": Moved("trainer.loss.behav_cap_mode"),
    "trainer.proximal": Moved("trainer.loss.proximal"),
    "trainer.ratio_level": Moved("trainer.loss.ratio_level"),
    "trainer.kl_coef": Moved("trainer.loss.kl_coef"),
    "trainer.entropy_coef": Moved("trainer.loss.entropy_coef"),
    "trainer.loss_agg": Moved("trainer.loss.agg"),
    "trainer.optim.warmup_steps": Moved("trainer.schedule.warmup_steps"),
    "trainer.optim.schedule": Moved("trainer.schedule.shape"),
    "trainer.optim.min_lr_ratio": Moved("trainer.schedule.min_lr_ratio"),
    "trainer.checkpoint_every": Moved("trainer.checkpoint.every"),
    "trainer.keep_checkpoints": Moved("trainer.checkpoint.keep"),
    "trainer.train_per_group": Moved("trainer.pods.keep", off=0),
    "trainer.unsolved_advantage": Moved("trainer.unsolved.advantage", off=0),
    "trainer.unsolved_share": Moved("trainer.unsolved.share"),
    "rollout.screen_size": Moved("rollout.screen.size", off=0),
    "rollout.hard_group_size": Moved("rollout.retry.group_size", off=0),
    "rollout.balance_by": Moved("rollout.balance.by", off=""),
    "rollout.balance_goal": Moved("rollout.balance.goal"),
    "rollout.balance_floor": Moved("rollout.balance.floor"),
}
"""Keys that moved (old dotted path → new place), still read from files and `--set` with a warning."""

# The switch of each strategy section an old key turns on or off.
_SWITCHES = {m.new.rpartition(".")[0]: m.new.rpartition(".")[2] for m in MOVED.values() if m.off is not None}


def _parse_value(raw: str) -> Any:
    """`--set` values are TOML/JSON literals when they parse, else plain strings."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw


def _put(data: dict[str, Any], keys: list[str], value: Any, where: str) -> None:
    node = data
    for key in keys[:-1]:
        if node.get(key) is False:  # a strategy section that was off: setting a key under it turns it on
            node[key] = {}
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {key} is not a section")
    node[keys[-1]] = value


def _get(data: dict[str, Any], keys: list[str]) -> Any:
    node: Any = data
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _leaves(data: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        paths += _leaves(value, f"{path}.") if isinstance(value, dict) else [path]
    return paths


class _Moves:
    """Old keys moved to their new place in raw config data, one warning line each."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.notes: list[str] = []
        self.joined: set[str] = set()  # strategy sections old keys put a setting (not the switch) in

    def file(self, where: str) -> None:
        """Every old key of a file; switches first, so a setting that goes with one finds it."""
        found = sorted((p for p in _leaves(self.data) if p in MOVED), key=lambda p: MOVED[p].off is None)
        for old in found:
            *parent, key = old.split(".")
            self.move(old, _get(self.data, parent).pop(key), where, replace=False)

    def move(self, old: str, value: Any, where: str, replace: bool) -> None:
        new, off = MOVED[old]
        section = new.rpartition(".")[0]
        if not replace and _get(self.data, new.split(".")) is not None:
            raise ConfigError(f"{where}: both {old} (old) and {new} are set; keep {new}")
        if off is not None:
            if value == off:
                _put(self.data, section.split("."), False, where)
                self.notes.append(f"{where}: {old} = {value!r} (off) is now: no [{section}] section")
                return
            self.notes.append(f"{where}: {old} is now {new} (a [{section}] section turns it on)")
        elif section in _SWITCHES:
            if _get(self.data, section.split(".")) is False:
                self.notes.append(f"{where}: {old} is now {new}; ignored, as [{section}] is off")
                return
            self.joined.add(section)
            self.notes.append(f"{where}: {old} is now {new}")
        else:
            self.notes.append(f"{where}: {old} is now {new}")
        _put(self.data, new.split("."), value, where)

    def settle(self) -> None:
        """A strategy section that old keys gave a setting but never its switch was off under the old
        keys (e.g. `unsolved_share` without `unsolved_advantage`): it stays off."""
        for section in sorted(self.joined):
            *parent, name = section.split(".")
            node = _get(self.data, section.split("."))
            if isinstance(node, dict) and _SWITCHES[section] not in node:
                _get(self.data, parent)[name] = False
                self.notes.append(f"[{section}] got no {_SWITCHES[section]}: it stays off, as under the old keys")

    def warn(self) -> None:
        for note in self.notes:
            log.warning("config: %s", note)


def apply_override(data: dict[str, Any], assignment: str, moves: _Moves | None = None) -> None:
    """Apply one `section.key=value` (or `section.sub.key=value`) to raw config data; an old key
    (`MOVED`) goes to its new place."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected section.key=value")
    path, raw = assignment.split("=", 1)
    keys = [k.strip() for k in path.strip().split(".")]
    if len(keys) < 2 or not all(keys):
        raise ConfigError(f"--set {assignment!r}: expected section.key=value, e.g. trainer.max_steps=2")
    value, old = _parse_value(raw.strip()), ".".join(keys)
    if old not in MOVED:
        _put(data, keys, value, f"--set {assignment!r}")
    elif moves is not None:
        moves.move(old, value, "--set", replace=True)
    else:
        moves = _Moves(data)
        moves.move(old, value, "--set", replace=True)
        moves.warn()


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    **options: Any,
) -> Config:
    """Read `path` (if any), apply `section.key=value` overrides, then explicit options.

    `options` are CLI flags already mapped to dotted keys, e.g. {"proxy.port": 9000};
    None values are ignored. Old keys (`MOVED`) are moved to their new place with a warning.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} not found")
        try:
            data = json.loads(p.read_text()) if p.suffix == ".json" else tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{p}: {exc}") from None
    moves = _Moves(data)
    if path is not None:
        moves.file(str(path))
    for assignment in overrides or []:
        apply_override(data, assignment, moves)
    for dotted, value in options.items():
        if value is not None:
            apply_override(data, f"{dotted}={json.dumps(value)}", moves)
    moves.settle()
    moves.warn()
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {loc or 'config'}: {err['msg']}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None
