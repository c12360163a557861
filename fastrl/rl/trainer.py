"""The GRPO trainer loop: sample problems, roll out n samples each on the backend, reward, update, push weights."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fastrl.adaptive.buckets import DEFAULT_BS_THRESHOLDS
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.rl.checkpoint import (
    TrainerState,
    load_training_checkpoint,
    read_trainer_state,
    save_training_checkpoint,
)
from fastrl.rl.grpo import group_advantages
from fastrl.rl.logprob_check import LogprobCheck, compare_logprobs, require_consistent, rollout_tolerance
from fastrl.rl.logprobs import pack_sequences
from fastrl.rl.metrics import (
    CORRECT_REWARD,
    MetricsLogger,
    StepMetrics,
    accuracy_by_bucket,
    decode_rows,
    mean_accept_length,
    percentile,
    worker_loss_fields,
)
from fastrl.rl.policy_update import PolicyUpdater, UpdateStats
from fastrl.rl.rollout_speed import step_speed_fields
from fastrl.rl.seeding import sample_seed, step_rng
from fastrl.rl.step_boundary import step_boundary
from fastrl.rl.task_protocol import RewardTask, TextTokenizer
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.rollout.backend import RolloutBackend
from fastrl.rollout.types import DrafterTrainingStats, RolloutBatch, RolloutRequest, RolloutResult
from fastrl.sampling.params import SamplingParams

TRUNCATED_REASONS = ("length", "context")


class OffPolicyRolloutError(RuntimeError):
    """The backend returned samples from a policy version other than the trainer's current one."""


LOG = logging.getLogger("fastrl.train")


@dataclass
class StepRollout:
    """One step's problems, requests and the backend's answer, with the decoded texts and rewards."""

    problems: list[Any]
    requests: list[RolloutRequest]
    batch: RolloutBatch
    texts: list[str]
    rewards: list[float]
    drafter: DrafterTrainingStats | None = None  # the rollout's co-training, once the backend finished it
    drafter_version: int | None = None


def check_resumable(path: str | Path, config: GRPOConfig, task: object = None, settings: dict | None = None) -> None:
    """ValueError naming the keys, with the checkpoint's values and these, when ``config`` differs from checkpoint
    ``path``'s in a key that changes the trajectory (anything but steps, checkpoint_every, checkpoint_dir, progress,
    logprob_tolerance), ``task``'s settings (``task_settings``) from those the checkpoint recorded, or ``settings``
    (the caller's other settings that change what the run computes: ``GRPOTrainer.settings``) from those it
    recorded. A checkpoint that recorded no task settings or no settings (written before they were kept) is not
    compared there, nor is a key of ``settings`` that only one side has (another fastrl version's)."""
    meta = read_trainer_state(path)
    saved = GRPOConfig(**meta["config"])
    keys = config.trajectory_differences(saved)
    if keys:  # named as `fastrl train` spells them (its rl section is this GRPOConfig)
        changes = _changes(asdict(saved), asdict(config), keys, "rl.")
        raise ValueError(
            f"cannot resume {path} exactly: GRPOConfig keys differ from the checkpoint's: "
            f"{['rl.' + k for k in keys]} ({changes})"
        )
    saved_task, now = meta.get("task"), task_settings(task)
    if isinstance(saved_task, dict) and now is not None and saved_task != now:
        keys = sorted(k for k in set(saved_task) | set(now) if saved_task.get(k) != now.get(k))
        changes = _changes(saved_task, now, keys, "task.")
        raise ValueError(
            f"cannot resume {path} exactly: the task's settings differ from the checkpoint's: "
            f"{['task.' + k for k in keys]} ({changes})"
        )
    recorded = meta.get("settings")
    if isinstance(recorded, dict) and settings is not None:
        keys = sorted(k for k in set(recorded) & set(settings) if recorded[k] != settings[k])
        if keys:
            raise ValueError(
                f"cannot resume {path} exactly: settings that change what the run computes differ from the "
                f"checkpoint's: {_changes(recorded, settings, keys)}"
            )


def _changes(saved: dict, now: dict, keys: list[str], prefix: str = "") -> str:
    """``prefix + key: value in the checkpoint, value now`` for each of ``keys`` (JSON-spelled values)."""
    return "; ".join(
        f"{prefix}{k}: {json.dumps(saved.get(k))} in the checkpoint, {json.dumps(now.get(k))} now" for k in keys
    )


def task_settings(task: object) -> dict | None:
    """The settings of ``task`` as a JSON dict (its dataclass ``config``), what a checkpoint records of it; None
    for a task without one."""
    config = getattr(task, "config", None)
    if not is_dataclass(config) or isinstance(config, type):
        return None
    return json.loads(json.dumps(asdict(config)))  # as the checkpoint holds it (tuples are lists)


class GRPOTrainer:
    """Synchronous, on-policy GRPO over a RolloutBackend.

    Every step: `prompts_per_step` problems from an RNG derived from (seed, step); `samples_per_prompt` requests
    each, with sampling seeds derived from (seed, step, prompt, sample); `backend.generate`; rewards of the decoded
    responses; group-normalised advantages; old log-probs recomputed and compared with the rollout's (metric,
    and LogprobMismatchError above `logprob_tolerance`); the policy update (AdamW); then the new weights go to the
    backend as version + 1, so the next rollout is on-policy. Versions count updates: the initial weights are 0.

    `train()` first pushes the trainer's weights to the backend (as the current version) so that both sides
    agree whatever the backend was built from. `save_checkpoint` / `resume` make a run of a + b steps equal to a
    run of a steps, a checkpoint, and b resumed steps.
    """

    def __init__(
        self,
        policy: CausalLM,
        tokenizer: TextTokenizer,
        task: RewardTask,
        backend: RolloutBackend,
        config: GRPOConfig,
        logger: MetricsLogger | None = None,
        bucket_thresholds: tuple[int, ...] = DEFAULT_BS_THRESHOLDS,
        settings: dict | None = None,
        drafter_config: ModelConfig | None = None,
    ) -> None:
        self.policy = policy
        self.drafter_config = drafter_config  # the backend's drafter's layer config (None: a fresh drafter's)
        # the caller's settings beyond ``config`` and the task's that change what the run computes (JSON values by
        # name; `fastrl train`'s drafter, strategy, rollout engine ...): checkpoints record them, resume compares them
        self.settings = settings
        self.bucket_thresholds = tuple(bucket_thresholds)  # batch-size buckets of the metrics' strategy choices
        self.last_rollout: StepRollout | None = None
        self.tokenizer = tokenizer
        self.task = task
        self.backend = backend
        self.config = config
        self.logger = logger
        self.updater = PolicyUpdater(policy, config)
        self.step = 0  # steps completed
        self.version = 0  # version of the policy's current weights
        self.device = next(policy.parameters()).device
        self._backend_synced = False
        # True from the moment a step starts to change the policy until its metrics are out (logged by ``train``):
        # the run's state is then between two steps, and an interrupt there has no consistent checkpoint to save
        # unless the update is done and the metrics still to be handed over (``finish_interrupted_step``)
        self.updating = False
        self._unlogged: Callable[[], StepMetrics] | None = None  # the updated step's metrics, not yet handed over

    # ---- the loop -------------------------------------------------------------------------------------------
    def train(self) -> list[StepMetrics]:
        """Run steps until `config.steps` are done; returns the metrics of the steps run by this call."""
        cfg = self.config
        if not self._backend_synced:
            self.sync_backend()
        history: list[StepMetrics] = []
        with tqdm(total=cfg.steps, initial=self.step, desc="grpo", unit="step", disable=not cfg.progress) as bar:
            while self.step < cfg.steps:
                start = time.perf_counter()
                rollout = self.rollout(self.step)  # an interrupt here finds the trainer between two steps
                with step_boundary():  # from here an interrupt waits for the step's metrics and checkpoint
                    metrics = self.update_step(rollout, start)
                    history.append(metrics)
                    self._hand_over(metrics)
                    bar.update(1)
                    bar.set_postfix({"reward": f"{metrics.reward_mean:.3f}"} | metrics.speed().postfix())
                    every = cfg.checkpoint_every
                    if every and cfg.checkpoint_dir and (self.step % every == 0 or self.step == cfg.steps):
                        self.save_checkpoint(Path(cfg.checkpoint_dir) / f"step_{self.step:06d}")
        return history

    def train_step(self) -> StepMetrics:
        """One GRPO step (rollout, update, weight push); returns its metrics."""
        start = time.perf_counter()
        metrics = self.update_step(self.rollout(self.step), start)
        self._unlogged, self.updating = None, False
        return metrics

    def finish_interrupted_step(self) -> bool:
        """After an interrupt: whether the trainer stands between two steps, where a checkpoint is consistent. An
        interrupt that came after a step's update, while its metrics were computed (before they reached the logger),
        finishes the step first: its metrics are computed and logged now, so that neither the update nor the
        step's metrics line is lost."""
        if self.updating and self._unlogged is not None:
            self._hand_over(self._unlogged())
        return not self.updating

    def _hand_over(self, metrics: StepMetrics) -> None:
        """Give the updated step's metrics to the logger; the step is then whole. An interrupt inside the logger
        leaves it unfinished (its line may be written: it is not written again)."""
        self._unlogged = None
        if self.logger is not None:
            self.logger.log(metrics, metrics.step)
        self.updating = False

    def update_step(self, rollout: StepRollout, start: float) -> StepMetrics:
        """The step's second half after its rollout (started at ``start``, perf_counter): advantages, log-prob
        check, policy update, weight push; returns the step's metrics. ``updating`` stays True: the caller ends the
        step once its metrics are out."""
        step = self.step
        self.last_rollout = rollout
        results = rollout.batch.results
        n = self.config.samples_per_prompt
        rewards = torch.tensor(rollout.rewards, dtype=torch.float32).view(-1, n)  # [G,n]
        advantages = group_advantages(rewards, self.config.scale_by_std, self.config.advantage_eps).view(-1)  # [N]
        update_start = time.perf_counter()
        sequences = pack_sequences(
            [r.prompt_ids for r in results],
            [r.token_ids for r in results],
            [q.params for q in rollout.requests],
            device=self.device,
        )
        prepared = self.updater.prepare(sequences, advantages)
        check = self.check_logprobs(results, prepared.old_logprobs, sequences.response_mask, step)
        self.updating = True
        stats = self.updater.update(prepared, step)
        stats.drift_kl = prepared.drift_kl
        update_time = time.perf_counter() - update_start
        rollout.drafter, rollout.drafter_version = self.backend.finish_rollout()  # may have overlapped the update
        rollout_version = self.version
        self.version += 1
        self.backend.update_policy(self.version, self.policy_state())
        self.step += 1

        def metrics() -> StepMetrics:
            return self._metrics(step, rollout_version, rollout, check, stats, update_time, time.perf_counter() - start)

        self._unlogged = metrics
        return metrics()

    def rollout(self, step: int) -> StepRollout:
        """Sample the step's problems, generate on the backend, decode and reward (no update)."""
        cfg = self.config
        rng = step_rng(cfg.seed, step)
        problems = [self.task.sample_problem(rng) for _ in range(cfg.prompts_per_step)]
        requests = []
        for group, problem in enumerate(problems):
            prompt_ids = list(self.tokenizer.encode(problem.prompt))
            for index in range(cfg.samples_per_prompt):
                params = SamplingParams(
                    max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    top_k=cfg.top_k,
                    seed=sample_seed(cfg.seed, step, group, index),
                )
                requests.append(RolloutRequest(f"step{step}-p{group}-s{index}", prompt_ids, params, group=group))
        batch = self.backend.generate(requests)
        self._check_results(requests, batch.results)
        texts = [self.tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in batch.results]
        rewards = [self._reward(problems[r.group], t, r.request_id) for r, t in zip(batch.results, texts, strict=True)]
        return StepRollout(problems=problems, requests=requests, batch=batch, texts=texts, rewards=rewards)

    def check_logprobs(
        self, results: list[RolloutResult], recomputed: torch.Tensor, mask: torch.Tensor, step: int
    ) -> LogprobCheck:
        """Compare the rollout's log-probs with `recomputed` ([N,T]); raises above the tolerance."""
        rollout = torch.zeros(mask.shape, dtype=torch.float32)
        for row, r in enumerate(results):
            rollout[row, : len(r.logprobs)] = torch.tensor(r.logprobs, dtype=torch.float32)
        check = compare_logprobs(rollout.to(recomputed.device), recomputed, mask)
        where = f"step {step}, policy version {self.version}, request {results[check.worst_row].request_id}"
        tolerance = self.config.logprob_tolerance
        require_consistent(check, rollout_tolerance(None) if tolerance is None else tolerance, where)
        return check

    # ---- weights and checkpoints ----------------------------------------------------------------------------
    def policy_state(self) -> dict[str, torch.Tensor]:
        """The policy's weights (HF names; detached views of the live parameters: the backend copies them)."""
        return {name: t.detach() for name, t in self.policy.state_dict().items()}

    def sync_backend(self) -> None:
        """Install the trainer's current weights on the backend as the current version."""
        self.backend.update_policy(self.version, self.policy_state())
        self._backend_synced = True

    def save_checkpoint(self, path: str | Path) -> Path:
        """Write a checkpoint of the run after `self.step` steps (see fastrl.rl.checkpoint for the layout)."""
        state = TrainerState(self.step, self.version, asdict(self.config), task_settings(self.task), self.settings)
        return save_training_checkpoint(
            path,
            state,
            self.policy,
            self.updater.optimizer,
            self.backend,
            self.updater.reference,
            self.tokenizer,
            self.drafter_config,
        )

    def resume(self, path: str | Path, strict: bool = True) -> None:
        """Continue from a checkpoint: restore every state, push the weights to the backend. With `strict`, a
        config, task or `settings` that differs from the checkpoint's in a key that changes the trajectory raises
        ValueError naming the keys (see `check_resumable`)."""
        if strict:
            check_resumable(path, self.config, self.task, self.settings)
        state = load_training_checkpoint(
            path, self.policy, self.updater.optimizer, self.backend, self.updater.reference
        )
        self.step = state.step
        self.version = state.policy_version
        self.sync_backend()

    # ---- internals ------------------------------------------------------------------------------------------
    def _reward(self, problem: Any, text: str, request_id: str) -> float:
        """The task's reward of one response as a float; ValueError naming the task and the request when it is not
        a finite number (a NaN would reach the advantages, the loss and every weight before anything noticed)."""
        value = self.task.reward(problem, text)
        try:  # a number of any kind (numpy, a 0-d tensor, a bool), not text that float() would parse
            number = math.nan if isinstance(value, (str, bytes)) else float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise ValueError(
                f"{type(self.task).__name__}.reward returned {value!r} ({type(value).__name__}) for {request_id}: "
                "a reward must be a finite number (the policy was not updated)"
            )
        return number

    def _check_results(self, requests: list[RolloutRequest], results: list[RolloutResult]) -> None:
        """The backend answered every request, in order, with the current policy version, without errors."""
        got = [r.request_id for r in results]
        want = [q.request_id for q in requests]
        if got != want:
            raise RuntimeError(
                f"backend returned results {got[:4]}... for requests {want[:4]}... (order or count differ)"
            )
        for r in results:
            if r.finish_reason == "error" or not r.token_ids:
                raise RuntimeError(
                    f"rollout of {r.request_id} failed on worker {r.worker_id} (finish reason {r.finish_reason!r}, "
                    f"{len(r.token_ids)} tokens): {r.error or 'no error message'}"
                )
            if len(r.logprobs) != len(r.token_ids):
                raise RuntimeError(
                    f"rollout of {r.request_id} has {len(r.logprobs)} log-probs for {len(r.token_ids)} tokens"
                )
            if r.policy_version != self.version:
                raise OffPolicyRolloutError(
                    f"{r.request_id} was generated by policy version {r.policy_version} on worker {r.worker_id}; "
                    f"the trainer is at version {self.version}"
                )

    def _metrics(
        self,
        step: int,
        version: int,
        rollout: StepRollout,
        check: LogprobCheck,
        stats: UpdateStats,
        update_time: float,
        step_time: float,
    ) -> StepMetrics:
        results = rollout.batch.results
        lengths = [len(r.token_ids) for r in results]
        rewards = torch.tensor(rollout.rewards, dtype=torch.float64)
        buckets = [self.task.size_bucket(rollout.problems[r.group]) for r in results]
        names = self.task.bucket_names() if hasattr(self.task, "bucket_names") else None
        drafter = rollout.drafter if rollout.drafter is not None else rollout.batch.drafter
        for failure in drafter.failures:  # the slice's or merge's work was dropped; the live drafter is whole
            LOG.warning(f"step {step}: drafter co-training failed, its updates dropped: {failure}")
        drafter_version = (
            rollout.drafter_version if rollout.drafter_version is not None else rollout.batch.drafter_version
        )
        return StepMetrics(
            step=step,
            policy_version=version,
            reward_mean=float(rewards.mean()),
            reward_std=float(rewards.std()) if len(rewards) > 1 else 0.0,
            accuracy=float((rewards >= CORRECT_REWARD).double().mean()),
            accuracy_by_bucket=accuracy_by_bucket(buckets, rollout.rewards, names),
            response_len_mean=sum(lengths) / len(lengths),
            response_len_p50=percentile(lengths, 50),
            response_len_p90=percentile(lengths, 90),
            response_len_max=max(lengths),
            truncated_fraction=sum(r.finish_reason in TRUNCATED_REASONS for r in results) / len(results),
            response_tokens=sum(lengths),
            rollout_time_s=rollout.batch.wall_time_s,
            tail_time_s=rollout.batch.tail_time_s,
            mean_accept_length=mean_accept_length([r.accept_lengths for r in results]),
            decode_rows=decode_rows([r.accept_lengths for r in results]),
            drafter_version=drafter_version,
            drafter_loss=drafter.loss,
            drafter_top1=drafter.top1,
            logprob_max_abs_diff=check.max_abs_diff,
            logprob_mean_abs_diff=check.mean_abs_diff,
            loss=stats.loss,
            pg_loss=stats.pg_loss,
            kl=stats.kl,
            clip_fraction=stats.clip_fraction,
            grad_norm=stats.grad_norm,
            lr=self.updater.optimizer.param_groups[0]["lr"],
            update_time_s=update_time,
            step_time_s=step_time,
            drafter_steps=drafter.steps,
            drafter_time_s=drafter.seconds,
            drafter_failures=len(drafter.failures),
            drafter_heldout_top1_before=drafter.heldout_top1_before,
            drafter_heldout_top1=drafter.heldout_top1,
            drift_kl=stats.drift_kl,
            **step_speed_fields(rollout.batch, self.bucket_thresholds),
            **worker_loss_fields(rollout.batch.replacements),
        )
