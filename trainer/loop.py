"""The asynchronous trainer: claim → select (advantages) → decoupled PPO step → push weights.

It runs as its own process beside the proxy and learns from whatever finished
sessions the store holds, while rollouts continue; which claimed sessions a step
trains is up to the selection strategies (`trainer/selection.py`). Staleness is bounded
twice: the proxy admits new sessions only while unconsumed ones are fewer than
(max_staleness + 1) × batch.size, and the claim drops any session whose oldest
token is more than max_staleness versions old. On start it resumes from the last
checkpoint and hands back sessions consumed after it, so a crash never trains a
session twice nor loses one; the engine is brought to the checkpoint's weights
under a fresh, higher version so versions stay monotonic.

With `trainer.processes` > 1 every process runs this loop's setup, and rank 0 alone talks to the
store and the proxy: it claims, then tells the other ranks what to do next (train these samples,
gather the weights for a push, checkpoint, stop), and they follow (`Trainer.follow`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from evaluation.during import PeriodicEval
from proxy.config import Config, public_config
from proxy.runtime.devices import DTYPES, select_device, warn_if_emulated_bf16
from proxy.runtime.model_files import resolve_model
from proxy.store.claims import claim_batch, end_step, mark_skipped, release_after, settle_through
from proxy.store.db import Database
from proxy.store.samples import SessionSamples, load_samples
from trainer import audit, checkpoint, critic, distill, distributed, policy, preference, sft
from trainer.batch import build_samples, pack
from trainer.metrics import MetricsSink, StallWatch
from trainer.schedule import lr_factor, progress
from trainer.selection import (
    ZERO_VARIANCE,
    RunningMeans,
    Selection,
    canonical_order,
    claim_policy,
    select,
    selectors,
)
from trainer.step import StepResult, recompute_proximal, train_step
from trainer.weights import WeightSync, default_weights_dir

log = logging.getLogger("areal_trainer")

# trainer.algorithm dpo / sft: its selectors, samples and optimizer steps replace PPO's. (distill keeps PPO's
# step and adds the teacher's token rewards to its advantages: `Trainer.distiller`.)
LEARNERS = {"dpo": preference.Dpo, "sft": sft.Sft}


PROXY_START_S = 600.0
"""How long a launcher waits for its proxy to answer (a first run converts the default model first)."""

WAIT_FOR_ENV = "AREAL_WAIT_FOR"
"""Set by the local launcher on the trainer processes it starts beside the proxy: the URL whose /health
they wait for before opening the store or converting the model, so that their imports (several seconds
of torch and transformers) overlap the proxy's start instead of following it."""


def wait_for(url: str, timeout: float, path: str = "/health") -> None:
    """Return once GET `url + path` answers 200; RuntimeError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + path, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}{path} did not answer in {timeout:.0f}s")
        time.sleep(0.2)


def proxy_url(cfg: Config) -> str:
    if cfg.proxy.public_url:
        return cfg.proxy.public_url
    host = "127.0.0.1" if cfg.proxy.host in ("0.0.0.0", "::") else cfg.proxy.host
    return f"http://{host}:{cfg.proxy.port}"


@dataclass
class _Batch:
    """What the next step trains: the claimed sessions, those kept to train with their group
    baseline and scale (groups are claimed whole, so these are final), what was skipped and why."""

    sessions: list[SessionSamples] = field(default_factory=list)
    kept: list[SessionSamples] = field(default_factory=list)
    baseline: dict[str, float] = field(default_factory=dict)
    scale: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, list[str]] = field(default_factory=dict)  # by the metric that counts them
    counts: dict[str, float] = field(default_factory=dict)  # the selectors' counts (and totals), logged with the step
    dropped: int = 0

    def add(self, claim: Selection) -> None:
        self.kept += claim.sessions
        self.baseline.update(claim.baseline)
        self.scale.update(claim.scale)
        for skip in claim.skips:
            self.skipped.setdefault(skip.counted_as, []).extend(skip.session_ids)
        for name, n in claim.counts.items():
            self.counts[name] = self.counts.get(name, 0) + n


class Trainer:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.tcfg = cfg.trainer
        self.run_dir = Path(self.tcfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rank = distributed.from_env()
        self.device = select_device(distributed.rank_device(self.tcfg.device, self.rank))
        self.sharded: distributed.Sharded | None = None
        self.step_optimizer: Any = None  # what train_step steps: the optimizer, or its FSDP wrapper
        # This step's weights, gathered once: (the whole model on rank 0, None elsewhere), or None.
        self._gathered: tuple[distributed.FullModel | None] | None = None
        if self.rank.distributed:
            distributed.check_supported(self.tcfg)
            distributed.init(self.rank, self.device, distributed.COLLECTIVE_TIMEOUT_S)
        self.db = Database(cfg.store) if self.rank.is_main else None
        weights_dir = (
            Path(self.tcfg.weights_dir)
            if self.tcfg.weights_dir
            else default_weights_dir(self.run_dir, cfg.engine.backend == "local")
        )
        # A local engine with a set dtype gets its weights written in that dtype (a bfloat16 one:
        # half the bytes of a float32 push); other engines cast on load as they are configured to.
        push_dtype = DTYPES.get(cfg.engine.dtype) if cfg.engine.backend == "local" else None
        self.sync = WeightSync(weights_dir, proxy_url(cfg), cfg.proxy.admin_key, dtype=push_dtype)
        self.metrics = MetricsSink(self.run_dir, self.tcfg.logging, public_config(cfg)) if self.rank.is_main else None
        self.stall = StallWatch(self.tcfg.stall_steps)
        learner = LEARNERS.get(self.tcfg.algorithm)
        self.learner = learner(self.tcfg) if learner is not None else None
        self.distiller = distill.Distill(self.tcfg) if self.tcfg.algorithm == "distill" else None
        # [trainer.running_mean]: online RL's baseline, its means saved in each checkpoint
        rm = self.tcfg.running_mean
        self.running_means = RunningMeans(rm.decay, rm.max_keys) if rm is not None else None
        chooser = self.learner or self.distiller
        self.selectors = chooser.selectors if chooser is not None else selectors(self.tcfg, self.running_means)
        self.claiming = claim_policy(self.tcfg)
        self.state = checkpoint.TrainerState()
        self.stopping = False
        self.policy: policy.Policy | None = None
        self.critic: critic.Critic | None = None  # [trainer.critic]: PPO with a value function
        self.model: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.pad_id = 0
        self.tokenizer: Any = None
        self.lr = self.tcfg.optim.lr  # the last step's learning rate
        self._clock = time.time()  # when the loop started, less the time of the runs it resumes
        self._dirty = False  # an optimizer step ran for a step not yet counted in self.state
        self.evals: PeriodicEval | None = None  # [eval] every_steps / every_minutes: rank 0 evaluates

    # -- setup ----------------------------------------------------------------------
    def setup(self) -> None:
        from transformers import AutoTokenizer

        torch.manual_seed(self.tcfg.seed)
        source = self.tcfg.model or self.cfg.engine.model
        base = resolve_model(source, self.cfg.engine.cache_dir)
        resume = checkpoint.latest(self.run_dir)
        warn_if_emulated_bf16(
            self.device,
            self.tcfg.dtype == "bfloat16" or self.tcfg.autocast_bf16,
            "trainer.dtype / trainer.autocast_bf16",
        )
        shard = self._shard if self.rank.distributed else None
        self.policy = policy.build(self.cfg, self.device, str(base), resume, shard)
        self.model, self.optimizer = self.policy.model, self.policy.optimizer
        if self.tcfg.critic is not None:
            self.critic = critic.build(self.tcfg.critic, self.model, self.device, resume)
        self.step_optimizer = self.optimizer
        if self.sharded is not None:
            self.step_optimizer = distributed.ShardedOptimizer(self.optimizer, self.sharded, self.tcfg.optim.grad_clip)
        n = torch.get_num_threads()
        threads = f", {n} CPU thread{'s' if n != 1 else ''}" if self.device.type == "cpu" else ""
        ranks = f", rank {self.rank.rank} of {self.rank.world}" if self.rank.distributed else ""
        log.info("training %s on %s (%s%s%s)", resume or base, self.device, self.tcfg.dtype, threads, ranks)
        tokenizer = AutoTokenizer.from_pretrained(base)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if not self.rank.is_main:
            if resume is not None:  # rank 0's resume push comes as a command
                self.state = checkpoint.load_state(resume, self.optimizer, self.model)
            return
        if resume is not None:
            self.state = checkpoint.load_state(resume, self.optimizer, self.model)
            if self.running_means is not None:
                self.running_means.load(self.state.baselines)
            released = self.db.transaction(lambda c: release_after(c, self.state.step))
            self.db.transaction(lambda c: settle_through(c, self.state.step))
            version = max(self.state.version, self.sync.engine_version()) + 1
            self._push(version)
            self.state.version = version
            log.info("resumed from %s (step %d); %d sessions handed back", resume.name, self.state.step, released)
            self._audit({"resume_from": self.state.step, "handed_back": released})
        else:
            # A run that died before its first checkpoint: what its steps claimed is not in any weights.
            released = self.db.transaction(lambda c: release_after(c, 0))
            if released:
                log.info("no checkpoint yet; %d sessions claimed by earlier steps handed back", released)
                self._audit({"resume_from": 0, "handed_back": released})
            self.state.version = self.sync.engine_version()
        if self.cfg.eval.periodic:
            self.evals = PeriodicEval(self.cfg, self.run_dir, proxy_url(self.cfg))
            self.evals.last_step = self.state.step
            if self.state.step == 0:  # the starting policy: where the curve begins
                self.evals.start(0, self.state.version, None)

    def _shard(self, model: Any) -> None:
        self.sharded = distributed.Sharded(model)

    # -- loop -----------------------------------------------------------------------
    def run(self) -> int:
        if not self.rank.is_main:
            return self.follow()
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        try:
            self.setup()
            return self._loop()
        finally:
            distributed.close()

    def _loop(self) -> int:
        self._clock = time.time() - self.state.elapsed_s
        idle_since = time.time()
        batch = _Batch()
        finished = False
        saved: Path | None = None
        try:
            while not self.stopping and not self._done():
                started = time.time()
                need = self.claiming.need(len(batch.kept))
                claim = self.db.transaction(
                    lambda c, need=need: claim_batch(
                        c,
                        step=self.state.step + 1,
                        batch_size=need,
                        current_version=self.state.version,
                        max_staleness=self.tcfg.max_staleness,
                    )
                )
                if claim.dropped_stale:
                    self.metrics.log(self.state.step, {"dropped_stale": len(claim.dropped_stale)})
                    batch.dropped += len(claim.dropped_stale)
                if not claim.session_ids:
                    if (self.run_dir / "STOP").exists():
                        break
                    time.sleep(self.tcfg.poll_interval_s)
                    self._tell("idle")  # the other ranks wait on a collective that has a timeout
                    continue
                self._add(batch, claim.session_ids)
                if not self.claiming.complete(len(batch.kept)):
                    continue  # DAPO: claim more until the batch is full of groups with reward variance
                self._train(batch, started - idle_since)
                batch = _Batch()
                idle_since = time.time()
            finished = True
        finally:
            if batch.sessions:
                # Claimed for a step that never ran: hand them back for the next run.
                self.db.transaction(lambda c: release_after(c, self.state.step))
            if self._dirty:
                # A step failed part-way: some of its minibatches are in the weights, not in
                # self.state. Saving them would train those sessions twice once handed back; the
                # next run resumes from the last checkpoint and hands back what came after it.
                log.warning("step %d failed part-way; its partial update is not checkpointed", self.state.step + 1)
            elif self.state.step > 0 and self.optimizer is not None and (finished or not self.rank.distributed):
                # (several processes: after an error, another rank may be gone, and saving is collective)
                self.state.elapsed_s = self._elapsed()
                saved = self._save()
            if self.evals is not None:
                if finished and not self.stopping and self.optimizer is not None:
                    self._final_eval(saved)
                self.evals.close(cancel=not finished or self.stopping)
            if finished:
                self._tell("stop")
            self.metrics.close()
            self.db.close()
            self.sync.discard()
        return 0

    def _done(self) -> bool:
        if self.tcfg.max_minutes > 0 and self._elapsed() >= 60.0 * self.tcfg.max_minutes:
            return True
        return self.tcfg.max_steps > 0 and self.state.step >= self.tcfg.max_steps

    def _elapsed(self) -> float:
        """Seconds the training loop has run, this run and those it resumes."""
        return time.time() - self._clock

    def _stop(self, *_: Any) -> None:
        self.stopping = True

    def _add(self, batch: _Batch, session_ids: list[str]) -> None:
        """Load claimed sessions into the next step's batch through the selectors; what they skip is
        recorded with its reason."""
        sessions = canonical_order(self.db.read(lambda c: load_samples(c, session_ids)))
        batch.sessions += sessions
        claim = select(sessions, self.selectors)
        for skip in claim.skips:
            self._skip(skip.session_ids, skip.reason)
        batch.add(claim)

    def _skip(self, session_ids: list[str], reason: str) -> None:
        """Skipped sessions stay claimed by the step until it ends (so admission control does not
        start episodes that would sample the weights the step replaces), unless the claim policy
        lets them go at once (DAPO's fill: the step itself waits for the episodes that replace them)."""
        settle = self.claiming.settles_skips_at_once
        self.db.transaction(lambda c: mark_skipped(c, session_ids, reason, settle=settle))

    def _train(self, batch: _Batch, waited: float) -> None:
        t0 = time.time()
        sessions, train_on = batch.sessions, batch.kept
        if (builder := self.learner or self.distiller) is not None:
            samples = builder.samples(train_on)
        else:
            samples = build_samples(train_on, self.tcfg.batch.style, batch.baseline, batch.scale)
        step = self.state.step + 1
        trained_version = self.state.version  # the policy these sessions are measured against
        self._dirty = True  # the weights move ahead of self.state until the step is counted
        self._set_lr(step)  # also where nothing trains: the step's metrics show its scheduled rate
        result = self._optimize(samples) if samples else None
        t_train = time.time() - t0
        skipped = [sid for ids in batch.skipped.values() for sid in ids]
        self._audit({"step": step, "trained": [s.session_id for s in train_on], "skipped": skipped})
        self.state.step = step
        self._dirty = False
        self.state.samples += len(samples)
        self.state.sessions_trained += len(train_on)
        push_s = 0.0
        pushed = result is not None and step % self.tcfg.weight_sync_every == 0
        if pushed:
            self._finish_eval(wait=True)  # an evaluation samples only the version it evaluates
            push_s = self._push(self.state.version + 1)
            self.state.version += 1
        self.db.transaction(lambda c: end_step(c, step))
        saved = None
        if step % self.tcfg.checkpoint.every == 0:
            self.state.elapsed_s = self._elapsed()
            saved = self._save()
        if pushed and self.evals is not None and self.evals.due(step):
            self._start_eval(step, saved)
        warning = self.stall.update(len(samples), [x.reward for x in sessions])
        self._log(
            step,
            trained_version,
            sessions,
            samples,
            result,
            batch.dropped,
            len(batch.skipped.get(ZERO_VARIANCE, [])),
            waited,
            t_train,
            push_s,
            extra=batch.counts,
        )
        if warning:
            log.warning(warning)
        self._finish_eval(wait=False)  # an evaluation that ended meanwhile is logged now

    def _start_eval(self, step: int, saved: Path | None) -> None:
        """Evaluate the weights just pushed; with `keep_best` their checkpoint is saved first."""
        assert self.evals is not None
        if self.cfg.eval.keep_best and saved is None:
            self.state.elapsed_s = self._elapsed()
            saved = self._save()
        self.evals.start(step, self.state.version, saved)

    def _finish_eval(self, *, wait: bool) -> None:
        if self.evals is None:
            return
        done = self.evals.collect(wait=wait)
        if done is None:
            return
        values = self.evals.metrics(done)
        self.metrics.log(done.step, values)
        if done.report is not None:
            acc = done.report["accuracy"]
            log.info(
                "eval of step %d (v%d): accuracy %.3f [%.3f, %.3f] over %d episodes",
                done.step,
                done.version,
                acc["value"],
                acc["low"],
                acc["high"],
                done.report["episodes"],
            )

    def _final_eval(self, saved: Path | None) -> None:
        """The run reached its budget: evaluate its last policy unless that version was evaluated."""
        assert self.evals is not None
        self._finish_eval(wait=True)
        if not self.cfg.eval.final or self.evals.last_version == self.state.version:
            return
        self._start_eval(self.state.step, saved)
        self._finish_eval(wait=True)

    def _optimize(self, samples: list) -> StepResult | None:
        if self.learner is not None:  # one process (config.py refuses more)
            return self.learner.train(
                self.model, self.optimizer, samples, self.device, self.policy.reference, self.pad_id
            )
        self._tell("train", samples, self.state.version, self.lr)
        return self._passes(samples)

    def _passes(self, samples: list) -> StepResult | None:
        """`epochs` passes over the step's samples, each of `minibatches` optimizer steps (several
        processes: each rank trains its share of every minibatch, `trainer/distributed.py`)."""
        b = self.tcfg.batch
        self._gathered = None  # the weights change
        batches = pack(samples, b.tokens_per_microbatch, self.pad_id)
        parts = [batches[i :: b.minibatches] for i in range(b.minibatches)]
        mine = distributed.shares(parts, self.rank) if self.sharded is not None else parts
        if self.critic is not None:  # GAE advantages replace the group estimator's (single process)
            tpm, agg = b.tokens_per_microbatch, self.cfg.rewards.aggregate
            critic.prepare(self.critic, self.model, batches, self.tcfg.critic, self.device, tpm, agg)
        taught = self.distiller.teach(batches, self.device) if self.distiller is not None else {}  # one process
        if b.minibatches * b.epochs > 1 and self.tcfg.loss.proximal == "recompute":
            own = [g for share in mine for g in share]
            if self.sharded is not None:
                distributed.recompute_proximal_sharded(
                    self.sharded, own, self.device, b.tokens_per_microbatch, self.tcfg.autocast_bf16
                )
            else:
                recompute_proximal(self.model, own, self.device, b.tokens_per_microbatch, self.tcfg.autocast_bf16)
        result = None
        for _ in range(b.epochs):
            for part, share in ((p, s) for p, s in zip(parts, mine) if p):
                args = (self.device, self.state.version, self.policy.reference)
                if self.sharded is not None:
                    result = distributed.train_step_sharded(
                        self.step_optimizer, part, share, self.tcfg, *args, keep_proximal=b.epochs > 1
                    )
                else:
                    result = train_step(
                        self.model, self.optimizer, part, self.tcfg, *args, keep_proximal=b.epochs > 1, **self._joint()
                    )
                if self.critic is not None:
                    result.stats.update(self._critic_step(part))
        if result is not None:
            result.stats.update(taught)
        return result

    def _joint(self) -> dict[str, Any]:
        """train_step's value arguments: [trainer.critic] with value_coef > 0 trains its head in the policy's step."""
        ccfg = self.tcfg.critic
        if self.critic is None or not ccfg.value_coef:
            return {}
        return {"value_head": self.critic.head, "value_coef": ccfg.value_coef, "value_clip": ccfg.value_clip}

    def _critic_step(self, part: list) -> dict[str, float]:
        """One update of [trainer.critic]'s value function on the groups the policy just trained on (with
        value_coef > 0, the step of its head on the gradients the policy's step left)."""
        if self.tcfg.critic.value_coef:
            return critic.step_head(self.critic, self.tcfg.optim.grad_clip)
        return critic.critic_step(
            self.critic,
            self.model,
            part,
            self.device,
            value_clip=self.tcfg.critic.value_clip,
            tokens_per_microbatch=self.tcfg.batch.tokens_per_microbatch,
            grad_clip=self.tcfg.optim.grad_clip,
        )

    # -- several processes ------------------------------------------------------------
    def follow(self) -> int:
        """A rank other than 0: set up like rank 0, then do what it says until it says stop. SIGTERM
        is left to rank 0 (which saves, collectively, before it stops everyone)."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.setup()
            while True:
                command, *args = distributed.broadcast(None, self.rank)
                if command == "stop":
                    return 0
                if command == "train":
                    samples, self.state.version, self.lr = args
                    for group in self.optimizer.param_groups:
                        group["lr"] = self.lr
                    self._passes(samples)
                elif command == "push":
                    self._full()
                elif command == "save":
                    (self.state,) = args
                    self._save()
        finally:
            distributed.close()

    def _tell(self, command: str, *args: Any) -> None:
        """Rank 0: what every other rank does next (nothing with one process)."""
        if self.rank.distributed and self.rank.is_main:
            distributed.broadcast((command, *args), self.rank)

    def _full(self) -> distributed.FullModel | None:
        """The whole model on rank 0, gathered once per step however many writes need it."""
        if self._gathered is None:  # a collective: every rank gathers at the same points
            self._gathered = (distributed.gather(self.model, self.rank),)
        return self._gathered[0]

    def _push(self, version: int) -> float:
        if self.sharded is None:
            return self.sync.push(self.policy, version)
        self._tell("push")
        return self.sync.push(self._full(), version)

    def _save(self) -> Path:
        if self.running_means is not None:
            self.state.baselines = self.running_means.state()
        if self.sharded is not None:
            self._tell("save", self.state)
            return checkpoint.save_sharded(
                self.run_dir,
                self.model,
                self.optimizer,
                self.state,
                self._full(),
                self.tcfg.checkpoint.keep,
                self.tokenizer if self.rank.is_main else None,
            )
        return checkpoint.save(
            self.run_dir,
            self.model,
            self.optimizer,
            self.state,
            self.tcfg.checkpoint.keep,
            self.tokenizer,
            write_model=self._write_model,
        )

    def _write_model(self, target: Path) -> None:
        """A checkpoint's model (`Policy.save_model`) and, with [trainer.critic], the critic beside it."""
        self.policy.save_model(target)
        if self.critic is not None:
            critic.save(self.critic, target)

    def _audit(self, entry: dict[str, Any]) -> None:
        """Append-only record of which sessions each step trained on (and of resumes)."""
        audit.record(self.run_dir, entry)

    def _set_lr(self, step: int) -> None:
        spent = progress(step - 1, self._elapsed(), self.tcfg.max_steps, self.tcfg.max_minutes)
        self.lr = self.tcfg.optim.lr * lr_factor(self.tcfg.schedule, step, spent)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def _log(
        self, step, version, sessions, samples, result, dropped, skipped, waited, t_train, push_s, extra=None
    ) -> None:  # noqa: ANN001
        rewards = [s.reward for s in sessions]
        staleness = [version - (s.min_version or 0) for s in sessions]
        values = {
            "version": self.state.version,
            "sessions": len(sessions),
            "samples": len(samples),
            "reward_mean": sum(rewards) / max(len(rewards), 1),
            "accuracy": sum(r > 0 for r in rewards) / max(len(rewards), 1),
            "staleness_mean": sum(staleness) / max(len(staleness), 1),
            "staleness_max": max(staleness, default=0),
            "dropped_stale": dropped,
            "skipped_zero_variance": skipped,
            "wait_s": waited,
            "train_s": t_train,
            "push_s": push_s,
            "samples_per_s": len(samples) / max(t_train + push_s, 1e-6),
            "lr": self.lr,
        }
        values.update(extra or {})
        if self.stall.stalled:
            values["stalled_steps"] = self.stall.empty
        if result is not None:
            values.update({"loss": result.loss, "grad_norm": result.grad_norm, "tokens": result.tokens, **result.stats})
        self.metrics.log(step, values)
        log.info(
            "step %d v%d reward %.3f acc %.2f sessions %d skipped %d stale %.1f train %.1fs push %.1fs",
            step,
            self.state.version,
            values["reward_mean"],
            values["accuracy"],
            len(sessions),
            skipped,
            values["staleness_mean"],
            t_train,
            push_s,
        )


def main(argv: list[str] | None = None) -> int:
    import argparse

    from proxy.config import load_config

    parser = argparse.ArgumentParser(prog="python -m trainer.loop", description="run the trainer process")
    parser.add_argument("--config", help="configuration file (TOML or the JSON a launcher writes)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    proxy = os.environ.get(WAIT_FOR_ENV)
    if proxy:  # started beside the proxy (`areal-proxy train`): the store and the model are ready once it answers
        wait_for(proxy, PROXY_START_S)  # (before logging is set up: its 503s are not worth a line each)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    return Trainer(cfg).run()


if __name__ == "__main__":
    raise SystemExit(main())
