"""`[trainer]` and its sub-sections: what a training run is, and how each step learns.

`[trainer]` holds the run (model, device, budget, directories); `[trainer.batch]` what a step
claims and how it is cut into forward passes; `[trainer.loss]` the advantage estimator and the
decoupled PPO loss; `[trainer.optim]` AdamW; `[trainer.schedule]` the learning rate over the
run; `[trainer.checkpoint]` what is kept; `[trainer.logging]` where metrics go. `[trainer.pods]`,
`[trainer.unsolved]` and `[trainer.overlong]` turn batch selection strategies on by being present
(`trainer/selection.py`); `[trainer.critic]`, present, trains a value function and takes advantages from
GAE (`trainer/critic.py`). `trainer.algorithm` picks how a step learns: PPO, or DPO (`[trainer.dpo]`) or
supervised fine-tuning (`[trainer.sft]`) from the same store. Pydantic only, so the CLI's `--help` stays instant.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from proxy.sections import Device, Section, Strategy


class BatchConfig(Section):
    size: int = 64
    """Sessions per training step (a multiple of the group size)."""
    skip_zero_variance: bool = True
    """Skip groups whose rewards are all equal: they carry no signal (DAPO's dynamic sampling filter)."""
    fill: bool = False
    """With skip_zero_variance: keep claiming until `size` sessions of groups whose rewards differ are
    in hand, so every step trains a full batch (DAPO); off: a step trains the part of its `size`
    claimed sessions that has reward variance."""
    style: Literal["individual", "concat"] = "individual"
    """Training sample style built from each session."""
    tokens_per_microbatch: int = 8192
    """Token budget of one forward/backward; batches are split to stay under it."""
    minibatches: int = 1
    """Optimizer steps per training batch (more than 1 recomputes proximal logprobs first)."""
    epochs: int = Field(default=1, ge=1)
    """Passes over each training batch (PPO epochs), each of `minibatches` optimizer steps. From the
    second pass on the samples are reused, so the clip (`loss.eps_clip`, `loss.eps_clip_high`) against
    the proximal logprobs, fixed before the first pass, bounds how far the later passes move."""


class LossConfig(Section):
    advantage: Literal["grpo", "drgrpo", "rloo", "reinforce_pp"] = "grpo"
    """Advantage estimator."""
    eps_clip: float = 0.2
    """PPO clip range below 1."""
    eps_clip_high: float = 0.28
    """PPO clip range above 1 (asymmetric, DAPO clip-higher)."""
    behav_cap: float = 5.0
    """Cap on the behaviour importance weight π_prox/π_behav (0 disables)."""
    behav_cap_mode: Literal["mask", "clamp"] = "mask"
    """Tokens over the cap (or under `behav_floor`) are masked out, or their weight clamped."""
    behav_floor: float = Field(default=0.0, ge=0)
    """Lower bound on the behaviour weight (0 disables): with the cap, tokens whose weight falls outside
    [behav_floor, behav_cap] are masked on both sides (IcePop; e.g. 0.5 with a cap of 2), or clamped into it."""
    m2po_tau: float = Field(default=0.0, ge=0)
    """M2PO's second-moment trust region (0 disables; the paper uses 0.04): in each forward pass the tokens
    of largest (log π_prox/π_behav)² are masked until the mean of the rest is at most this."""
    proximal: Literal["recompute", "interpolate", "behaviour"] = "recompute"
    """Proximal logprobs: recomputed, log-linear interpolation by version, or = behaviour."""
    ratio_level: Literal["token", "sequence"] = "token"
    """Token-level ratios (PPO) or sequence-level geometric mean (GSPO)."""
    kl_coef: float = 0.0
    """Coefficient of the KL penalty to the reference model (0 disables)."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of an entropy bonus in the loss (0 disables); the policy's entropy on trained tokens is
    logged as `entropy` either way, so a collapse onto one reply per prompt shows early."""
    agg: Literal["auto", "token_mean", "seq_mean", "token_sum_norm"] = "auto"
    """Loss aggregation: token mean, per-sequence mean, or Dr. GRPO's constant-normalised sum (auto picks it
    for drgrpo, token_mean otherwise)."""

    @model_validator(mode="after")
    def _resolve_agg(self) -> LossConfig:
        if self.agg == "auto":
            self.agg = "token_sum_norm" if self.advantage == "drgrpo" else "token_mean"
        return self

    @model_validator(mode="after")
    def _check_masks(self) -> LossConfig:
        if self.behav_floor and self.behav_cap and self.behav_floor >= self.behav_cap:
            raise ValueError(
                f"trainer.loss.behav_floor {self.behav_floor} must be below behav_cap {self.behav_cap}: "
                "the weights kept lie between them"
            )
        if self.m2po_tau and self.proximal == "behaviour":
            raise ValueError(
                "trainer.loss.m2po_tau measures π_prox against π_behav, which proximal = 'behaviour' makes "
                "equal (nothing would be masked): use proximal = 'recompute' or 'interpolate'"
            )
        return self


class OptimConfig(Section):
    name: Literal["adamw", "adamw_8bit"] = "adamw"
    """Optimizer: AdamW with float32 state, or AdamW with 8-bit state (torchao's; a quarter of the state's
    memory, for models whose optimizer state would not fit)."""
    lr: float = 2e-5
    """AdamW learning rate (the peak, under `[trainer.schedule]`)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip (0 disables)."""


class LoraConfig(Section):
    """Low-rank adapters (LoRA, with peft): only the adapters train; the base weights stay frozen. A weight push
    sends the adapter alone, checkpoints hold it (servable on its own with the base) and the merged model."""

    rank: int = Field(default=16, ge=1, le=1024)
    """Rank of each adapter."""
    alpha: float = Field(default=32.0, gt=0)
    """Scale numerator: an adapter's update is (alpha / rank) · B A."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input during training."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names of the linear layers that get adapters (module name suffixes; ["all-linear"]: every linear layer
    but the LM head)."""
    save_merged: bool = True
    """Checkpoints also hold the merged model, servable with `areal-proxy serve --model <checkpoint>`; off: the
    adapter alone (for models whose full copy per checkpoint costs too much disk)."""


class MemoryConfig(Section):
    """What a step holds in memory: activations, and how batches are cut to fit."""

    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them (about a third more
    compute for activations of one layer instead of all)."""
    microbatch_gb: float = Field(default=0.0, ge=0)
    """Memory budget of one forward/backward in GiB: microbatches are sized from an estimate of their
    activation memory under this budget (and still under `batch.tokens_per_microbatch`); 0: tokens only."""


class ScheduleConfig(Section):
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps."""
    shape: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate over the run: constant, or decayed linearly or along a half cosine from `optim.lr` to
    `min_lr_ratio` × `optim.lr` at the end of the run's budget (trainer.max_steps or trainer.max_minutes,
    whichever is reached first), on top of the warm-up."""
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    """The decayed shapes' last learning rate as a fraction of `optim.lr`."""


class CheckpointConfig(Section):
    every: int = 10
    """Checkpoint every N steps (and at exit)."""
    keep: int = 2
    """How many of the newest checkpoints to keep."""


class LoggingConfig(Section):
    """Where metrics go: run_dir/metrics.jsonl always (every value), TensorBoard and Weights & Biases the
    numbers alone (`trainer/loggers.py`). Only the main trainer process logs."""

    tensorboard: bool = True
    """Write TensorBoard event files to run_dir/tensorboard."""
    wandb: bool = False
    """Log to Weights & Biases as well (the optional extra: `pip install 'areal-proxy[wandb]'`); a resumed run
    continues its W&B run (the id is kept in run_dir/wandb_run_id)."""
    wandb_project: str = "areal-proxy"
    """W&B project of the run."""
    wandb_entity: str = ""
    """W&B entity (user or team); empty: the logged-in user's default entity."""
    wandb_run_name: str = ""
    """Name of the W&B run; empty: the name of run_dir."""
    wandb_mode: Literal["", "online", "offline"] = ""
    """online streams to the W&B server (needs `wandb login` or WANDB_API_KEY); offline writes the run
    locally only, to upload later with `wandb sync`; empty: the WANDB_MODE environment variable, else
    online."""
    wandb_dir: str = ""
    """Folder W&B writes its `wandb/` directory into; empty: run_dir (so run_dir/wandb)."""
    wandb_tags: list[str] = Field(default_factory=list)
    """Tags of the W&B run."""


class RunningMeanConfig(Section):
    """A baseline that needs no groups (online RL, where episodes come one at a time): each session's
    advantage is its reward less the running mean of the rewards seen before it under its key, an
    exponential moving average kept across steps and checkpoints. A key seen for the first time gets
    the mean over every key."""

    key: Literal["prompt", "task", "global"] = "prompt"
    """What shares a mean: the first request's conversation (`prompt`), the session's task id (`task`,
    falling back to the prompt), or one mean for everything (`global`)."""
    decay: float = Field(default=0.9, ge=0.0, lt=1.0)
    """Weight of the old mean at each update: m ← decay·m + (1 − decay)·r (0 uses the last reward alone)."""
    max_keys: int = Field(default=100_000, ge=1)
    """Means kept, least recently used dropped first (live traffic rarely repeats a prompt)."""


class PodsConfig(Section):
    """Max-variance down-sampling (PODS, arXiv 2504.13818): of each group whose rewards differ, only the
    sessions whose rewards vary most are trained, the advantages computed over them; the rest are skipped
    and counted. Halves a step's training at 4 of 8 where training, not sampling, is the bottleneck."""

    keep: int
    """Sessions trained of each group whose rewards differ (2 or more)."""

    @model_validator(mode="after")
    def _check(self) -> PodsConfig:
        if self.keep < 2:
            raise ValueError(
                f"trainer.pods.keep {self.keep} leaves every group fewer than two rewards, nothing to compare: "
                "use 2 or more, or leave [trainer.pods] out"
            )
        return self


class UnsolvedConfig(Section):
    """Negative sample reinforcement (Zhu et al. 2025, arXiv 2506.01347): a group failed every time (rewards
    all equal and below the mean of the sessions claimed with it, while other tasks were solved) is trained
    with a negative advantage instead of skipped, so a prompt nothing solves still teaches something and its
    answers do not drift unchecked."""

    advantage: float = Field(lt=0)
    """Advantage of every sample of an unsolved group (negative; measured to collapse at -0.2 with no
    bound on the share)."""
    share: float = Field(default=0.25, gt=0, le=1)
    """Most of a step's trained sessions that unsolved groups may make up; whole groups beyond it are
    skipped, so a step is mostly groups with a success to learn from, and one with none trains nothing
    (1: no bound)."""


class OverlongConfig(Section):
    """DAPO's overlong reward shaping (Yu et al. 2025, arXiv 2503.14476): a reply of |y| sampled tokens past
    max_tokens - buffer costs penalty · (|y| - (max_tokens - buffer)) / buffer, up to `penalty` at max_tokens
    and beyond; a session's reward and every return of its tokens gain the sum over its replies, before
    advantages. With `mask_truncated`, replies cut at their token limit are not trained (overlong filtering)."""

    max_tokens: int = Field(default=0, ge=0)
    """L_max: the reply length that costs the whole penalty, usually the agent's max_tokens (0: no length
    penalty)."""
    buffer: int = Field(default=0, ge=0)
    """L_cache: the last tokens before max_tokens over which the penalty grows linearly from 0 (0: only
    replies longer than max_tokens are penalised)."""
    penalty: float = Field(default=1.0, gt=0)
    """Penalty of a reply of max_tokens or more (DAPO: 1, against its ±1 correctness reward)."""
    mask_truncated: bool = False
    """Leave replies that stopped at their token limit (finish_reason "length") out of the loss; their
    session still counts in its group's advantages."""

    @model_validator(mode="after")
    def _check(self) -> OverlongConfig:
        if self.buffer > self.max_tokens:
            raise ValueError(
                f"trainer.overlong.buffer {self.buffer} must not exceed max_tokens {self.max_tokens}: "
                "the penalty grows over the last `buffer` tokens before max_tokens"
            )
        if not self.max_tokens and not self.mask_truncated:
            raise ValueError(
                "[trainer.overlong] does nothing: set max_tokens (the length penalty) or mask_truncated = true, "
                "or leave the section out"
            )
        return self


class CriticConfig(Section):
    """PPO with a critic (`trainer/critic.py`, `trainer/gae.py`): advantages from GAE over each session's tree."""

    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """GAE's discount γ, per token: below 1 it discounts a long reply hard."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0)
    """GAE's λ: 1 is the discounted return less the value, 0 the one-step TD error."""
    value_clip: float = Field(default=0.2, ge=0.0)
    """PPO value clipping ε_v: a value moves at most this far from the one the advantages used (0 disables)."""
    lr: float = Field(default=1e-4, gt=0.0)
    """Learning rate of the critic's AdamW (its value head, and its own model when `model` is set)."""
    model: str = ""
    """Empty: a value head on the policy model's last hidden state (detached: the value loss trains the head
    alone); else a separate small model (Hugging Face id or path) with its own head, trained with it."""
    whiten: bool = True
    """Whiten the GAE advantages over each step's trained tokens (mean 0, std 1)."""
    value_coef: float = Field(default=0.0, ge=0.0)
    """With `model` empty: above 0, this times the value loss joins the policy's loss, so it trains the
    policy's decoder too (shared body); 0 trains the head alone on the detached hidden state."""

    @model_validator(mode="after")
    def _check(self) -> CriticConfig:
        if self.value_coef and self.model:
            raise ValueError(
                f"trainer.critic.value_coef {self.value_coef} shares the policy's body, but trainer.critic.model "
                f"{self.model!r} is a separate critic: set value_coef = 0 or model = ''"
            )
        return self


class DpoConfig(Section):
    """Direct preference optimisation (Rafailov et al. 2023, arXiv 2305.18290; `trainer/preference.py`) on pairs
    the store already holds: sessions of one group (one task, one prompt) whose rewards differ, the higher one
    chosen. Used with trainer.algorithm = "dpo"."""

    beta: float = Field(default=0.1, gt=0)
    """β: the inverse temperature of the implicit reward β · log π/π_ref (larger: stays closer to the reference)."""
    reference: Literal["frozen", "none"] = "frozen"
    """frozen: log π_ref from a frozen copy of the starting weights (one more model in memory; with LoRA the same
    model with its adapters off, no copy); none: reference-free, the log π_ref terms dropped."""
    length_norm: bool = False
    """Divide each response's summed log-ratio by its token count (with reference = "none" and `target_margin`:
    SimPO, arXiv 2405.14734), so a long reply is not preferred for its length."""
    target_margin: float = Field(default=0.0, ge=0)
    """SimPO's γ: the chosen response must beat the rejected one by this much of β-scaled log-ratio (0: DPO)."""
    pairs: Literal["best_worst", "all"] = "best_worst"
    """Pairs per group: its best session against its worst, or every pair whose rewards differ (`max_pairs`)."""
    max_pairs: int = Field(default=0, ge=0)
    """With pairs = "all": the most pairs per group, largest reward gap first (0: no cap)."""
    min_gap: float = Field(default=0.0, ge=0)
    """A pair's rewards must differ by more than this (ties never pair)."""

    @model_validator(mode="after")
    def _check(self) -> DpoConfig:
        if self.max_pairs and self.pairs != "all":
            raise ValueError(
                f"trainer.dpo.max_pairs {self.max_pairs} caps pairs = 'all', but pairs is {self.pairs!r} (one pair "
                "a group): set pairs = 'all' or max_pairs = 0"
            )
        return self


class SftConfig(Section):
    """Supervised fine-tuning on the store's own episodes (`trainer/sft.py`): sessions whose reward reaches a
    threshold are trained with the token NLL of their sampled tokens (rejection-sampling fine-tuning, Yuan et al.
    2023, arXiv 2308.01825). Used with trainer.algorithm = "sft"."""

    min_reward: float = 1.0
    """Sessions whose reward is at least this are trained on (rejection sampling's acceptance test)."""
    per_group: int = Field(default=0, ge=0)
    """The most sessions trained of each group, highest reward first (1: best-of-n rejection sampling; 0: every
    session that passes `min_reward`)."""
    distinct: bool = True
    """Train a group's identical episodes (same tokens) once, so an easy prompt answered the same way n times does
    not count n times."""


class DistillConfig(Section):
    """On-policy distillation (`trainer/distill.py`): each sampled token's advantage is the teacher's logprob less
    the behaviour's, the per-token reverse-KL reward on the student's own samples. Used with
    trainer.algorithm = "distill"."""

    teacher: str = ""
    """The teacher: a Hugging Face id, a local model path, or a trainer checkpoint (its `model` folder is used);
    it must share the student's tokenizer."""
    reward_coef: float = Field(default=0.0, ge=0.0)
    """Add this many times each session's return to the token advantages (0: the teacher alone)."""
    whiten: bool = True
    """Centre the step's token rewards on their mean and divide by their std: a baseline and a scale, as GRPO's,
    which keep the policy gradient's variance and step size in check (the raw rewards are mostly negative,
    with long tails); off uses the rewards as they are."""


class TrainerConfig(Section):
    model: str = ""
    """Model to train; empty uses [engine] model."""
    device: Device = "cpu"
    """Device of the trainer."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype. bfloat16 keeps float32 optimizer state and a float32 master copy of the trained
    weights inside the optimizer, so small updates are not rounded away."""
    autocast_bf16: bool = False
    """Run forward/backward under bfloat16 autocast."""
    max_staleness: int = 1
    """Sessions sampled more than this many versions ago are dropped; 0 is on-policy."""
    max_steps: int = 0
    """Stop after this many steps (0 runs until the dataset is exhausted)."""
    max_minutes: float = Field(default=0.0, ge=0)
    """Stop after this many minutes of training, counted across resumes (0: no time limit)."""
    weight_sync_every: int = 1
    """Push weights to the engine every k steps."""
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
    batch: BatchConfig = Field(default_factory=BatchConfig)
    """What a step claims and trains, and how it is cut into forward passes."""
    loss: LossConfig = Field(default_factory=LossConfig)
    """The advantage estimator and the decoupled PPO loss (docs/trainer.md)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """The AdamW optimizer."""
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    """The learning rate over the run (`trainer/schedule.py`)."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Checkpoints under run_dir/checkpoints."""
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    """Activation memory: gradient checkpointing, microbatches sized from a memory estimate."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Metrics loggers: metrics.jsonl, TensorBoard, Weights & Biases."""
    lora: Strategy[LoraConfig] = None
    """Present: train low-rank adapters instead of every weight (off when absent or false)."""
    processes: int = Field(default=1, ge=1, le=1024)
    """Trainer processes (torch.distributed + FSDP2: parameters, gradients and optimizer state sharded across
    them; gloo on CPU, NCCL on CUDA, HCCL on NPU). One claims each batch and scatters it."""
    pods: Strategy[PodsConfig] = None
    """Present: train only the most varied sessions of each group (off when absent or false)."""
    unsolved: Strategy[UnsolvedConfig] = None
    """Present: train groups that failed every time with a negative advantage (off when absent or false)."""
    overlong: Strategy[OverlongConfig] = None
    """Present: penalise replies by their length, or leave truncated ones out (DAPO; off when absent or false)."""
    critic: Strategy[CriticConfig] = None
    """Present: PPO with a critic, advantages from GAE instead of the group estimator (off when absent or false)."""
    running_mean: Strategy[RunningMeanConfig] = None
    """Present: a running-mean baseline per prompt or task instead of the group's (online RL's ungrouped
    episodes; off when absent or false)."""
    algorithm: Literal["ppo", "dpo", "sft", "distill"] = "ppo"
    """How a step learns from its claimed sessions: decoupled PPO on group advantages, DPO on pairs of a group's
    sessions whose rewards differ ([trainer.dpo]), supervised fine-tuning on those whose reward passes a
    threshold ([trainer.sft]), or on-policy distillation from a teacher's token logprobs ([trainer.distill]);
    the same claims, checkpoints and weight pushes for each."""
    dpo: DpoConfig = Field(default_factory=DpoConfig)
    """DPO's pairs, β and reference (with algorithm = "dpo")."""
    sft: SftConfig = Field(default_factory=SftConfig)
    """Which sessions supervised fine-tuning trains on (with algorithm = "sft")."""
    distill: DistillConfig = Field(default_factory=DistillConfig)
    """The teacher of on-policy distillation (with algorithm = "distill")."""

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.schedule.shape != "constant" and not (self.max_steps or self.max_minutes):
            raise ValueError(
                f"trainer.schedule.shape {self.schedule.shape!r} decays the learning rate over the run's "
                "budget: set trainer.max_steps or trainer.max_minutes"
            )
        if self.critic is not None and (self.batch.style != "individual" or self.processes != 1):
            raise ValueError(
                "[trainer.critic] needs trainer.batch.style = 'individual' and trainer.processes = 1 "
                f"(got {self.batch.style!r} and {self.processes}): set them, or leave the section out"
            )
        if self.running_mean is not None and (self.critic is not None or self.unsolved is not None):
            raise ValueError(
                "[trainer.running_mean] is a baseline without groups; [trainer.critic] (a learned baseline) and "
                "[trainer.unsolved] (flat groups) would override or never see it: keep one of them"
            )
        if self.critic is not None and (self.unsolved is not None or (self.overlong and self.overlong.max_tokens)):
            raise ValueError(
                "[trainer.critic] takes advantages from GAE on the raw rewards: [trainer.unsolved]'s advantage and "
                "[trainer.overlong]'s length penalty (max_tokens) would be ignored; leave them out with the critic"
            )
        return self

    @model_validator(mode="after")
    def _check_algorithm(self) -> TrainerConfig:
        if self.algorithm == "ppo":
            return self
        if self.algorithm == "distill" and not self.distill.teacher:
            raise ValueError("trainer.algorithm 'distill' needs trainer.distill.teacher (a model id, path, checkpoint)")
        unused = {
            "[trainer.critic]": self.critic is not None,
            "[trainer.pods]": self.pods is not None,
            "[trainer.unsolved]": self.unsolved is not None,
            "[trainer.running_mean]": self.running_mean is not None,
            "trainer.loss.kl_coef": self.loss.kl_coef > 0,
        }
        ignored = [name for name, on in unused.items() if on]
        if ignored:
            raise ValueError(
                f"trainer.algorithm {self.algorithm!r} takes no group advantages and no KL penalty, so "
                f"{', '.join(ignored)} would be ignored: leave {'it' if len(ignored) == 1 else 'them'} out, or use "
                "algorithm = 'ppo' (DPO's tie to its reference is trainer.dpo.beta)"
            )
        if self.processes != 1:
            raise ValueError(
                f"trainer.algorithm {self.algorithm!r} runs in one trainer process (got trainer.processes "
                f"{self.processes}): set processes = 1, or use algorithm = 'ppo'"
            )
        return self
