"""From a TrainConfig to the live parts of a run: policy, tokenizer, task, rollout backend."""

from __future__ import annotations

import json
import os
from dataclasses import fields, is_dataclass, replace
from pathlib import Path

import torch

from fastrl.commands.engine_setup import drafter_dir as shipped_or_given
from fastrl.commands.engine_setup import resolve_model_dir
from fastrl.commands.train_config import FRESH_DRAFTER, TrainConfig
from fastrl.models.checkpoint import read_config
from fastrl.models.config import ModelConfig
from fastrl.rl.task_protocol import TextTokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.rollout.backend import RolloutBackend
from fastrl.rollout.local import LocalRollout
from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.manager_config import RolloutManagerConfig, check_fit
from fastrl.rollout.worker_config import RolloutWorkerConfig
from fastrl.speculative.drafter_checkpoint import check_drafter_files, read_drafter_info

# Keys of model, drafter, strategy and rollout that a resume may change: they change speed, telemetry, drafts or where
# the work runs, not what the run computes (the rollouts' tokens do not depend on batch layout, device or kernels: see
# EngineConfig; max_batch_size orders the responses a history index keeps by when they finish, which changes drafts,
# not tokens; drafter.slice_seconds paces the `steps` schedule's updates, not their number). A co-trained run's
# rollout.num_workers is checked when its co-training state is loaded (one state per worker).
CHANGEABLE_ON_RESUME = (
    "drafter.slice_seconds",
    "strategy.bandit.timeline_limit",
    "rollout.backend",
    "rollout.num_workers",
    "rollout.ray_address",
    "rollout.ray_num_cpus",
    "rollout.torch_threads",
    "rollout.cotrain_in_tail",
    "rollout.overlap_drafter_round",
    "rollout.restart_failed_workers",
    "rollout.round_timeout_s",
    "rollout.engine.max_batch_size",
    "rollout.engine.device",
    "rollout.engine.seed",  # unused: the engines take rl.seed
    "rollout.engine.cuda_graphs",
    "rollout.engine.prefix_sharing",
    "rollout.engine.page_size",
    "rollout.engine.kv_cache_tokens",
    "rollout.engine.attention_kernel",
    "rollout.engine.layer_kernels",
    "rollout.engine.admit_batch",
    "rollout.engine.drafter_backlog",  # when the drafter reads a plain stretch (drafts only by rounding, not tokens)
    "rollout.engine.history_tokens",  # the history index's budget: which responses it keeps (drafts, not tokens)
    "model.path",  # the checkpoint holds the policy: a moved model directory resumes (its config must fit the weights)
)
RESULT_GROUPS = ("model", "drafter", "strategy", "rollout")  # rl.* and task.* are the trainer's own to check


def model_dir(cfg: TrainConfig) -> Path:
    """The policy checkpoint directory (ValueError naming model.path when it is not a readable checkpoint)."""
    return resolve_model_dir(cfg.model.path, "model.path")


def drafter_layer_config(cfg: TrainConfig) -> ModelConfig | None:
    """The layer config of the drafter the run's workers load (its checkpoint's, which may differ from the policy's
    in keys of no shape: rope, norm epsilon), for the run's checkpoints; None for a fresh drafter."""
    directory = drafter_dir(cfg)
    return read_drafter_info(directory).layer_config if directory else None


def drafter_dir(cfg: TrainConfig) -> str:
    """The drafter checkpoint directory ('' = a fresh drafter): drafter.path, or the one shipped for the model (the
    bundled model's, a named model's), as every other command resolves it."""
    if cfg.drafter.path == FRESH_DRAFTER:
        return ""
    found = shipped_or_given(cfg.drafter.path, model_dir(cfg))
    if found is None:
        raise ValueError(
            f"drafter.path: no drafter ships with {model_dir(cfg)}; give drafter.path=DIR or drafter=fresh"
        )
    return str(found)


def result_settings(cfg: TrainConfig) -> dict[str, object]:
    """The run's settings outside rl.* and task.* that change what it computes (its policy, its drafter, its
    rollouts or the state its checkpoints hold): every key of model, drafter, strategy and rollout but those in
    CHANGEABLE_ON_RESUME, as dotted keys with JSON values. A checkpoint records them; a resume with other values is
    refused (``fastrl.rl.trainer.check_resumable``)."""
    settings: dict[str, object] = {}

    def add(prefix: str, node: object) -> None:
        for f in fields(node):
            key, value = f"{prefix}.{f.name}", getattr(node, f.name)
            if key in CHANGEABLE_ON_RESUME:
                continue
            if is_dataclass(value):
                add(key, value)
            else:
                settings[key] = json.loads(json.dumps(value))  # as the checkpoint holds it (tuples are lists)

    for group in RESULT_GROUPS:
        add(group, getattr(cfg, group))
    return settings


def worker_config(cfg: TrainConfig) -> RolloutWorkerConfig:
    """What every rollout worker loads and how it decodes and co-trains."""
    d = cfg.drafter
    return RolloutWorkerConfig(
        model_dir=str(model_dir(cfg)),
        drafter_dir=drafter_dir(cfg),
        strategy=cfg.strategy.name,
        bandit=cfg.strategy.bandit,
        ema=cfg.strategy.ema,
        engine=replace(cfg.rollout.engine, seed=cfg.rl.seed),
        torch_threads=cfg.rollout.torch_threads,
        cotrain=d.cotrain,
        buffer_tokens=d.buffer_tokens,
        retention_versions=d.retention_versions,
        recency_decay=d.recency_decay,
        trainer=d.trainer,
        slice_seconds=d.slice_seconds,
        schedule=d.cotrain_schedule(),
    )


def build_backend(cfg: TrainConfig) -> RolloutBackend:
    """Ray workers or an in-process engine, as `rollout.backend` says."""
    worker = worker_config(cfg)
    if cfg.drafter.path not in ("", FRESH_DRAFTER):
        try:
            check_drafter_files(cfg.drafter.path, read_config(worker.model_dir))
        except ValueError as err:
            raise ValueError(f"drafter.path={cfg.drafter.path}: {err}") from None
    worker.check_files()
    manager = manager_config(cfg, worker)  # rollout.* checked for either backend
    if cfg.rollout.backend == "local":
        return LocalRollout(worker, seed=cfg.rl.seed)
    return RayRolloutManager(manager)


def manager_config(cfg: TrainConfig, worker: RolloutWorkerConfig) -> RolloutManagerConfig:
    """The Ray manager's settings from rollout.*; ValueError naming the key of an invalid one. `rollout=local` reads
    few of them, but a value `rollout=ray` refuses (a round_timeout_s of nan or 0) is refused for it too."""
    return RolloutManagerConfig(
        worker=worker,
        num_workers=cfg.rollout.num_workers,
        ray_address=cfg.rollout.ray_address,
        ray_num_cpus=cfg.rollout.ray_num_cpus,
        cotrain_in_tail=cfg.rollout.cotrain_in_tail,
        overlap_drafter_round=cfg.rollout.overlap_drafter_round,
        restart_failed_workers=cfg.rollout.restart_failed_workers,
        round_timeout_s=cfg.rollout.round_timeout_s,
        seed=cfg.rl.seed,
    )


def check_local_cluster_fit(cfg: TrainConfig) -> None:
    """ValueError before any work (no model loaded, no Ray started) when a rollout.* key is invalid, for either
    backend (``manager_config``), or when the workers of `rollout.backend=ray` ask a local Ray (no
    `rollout.ray_address`) for more CPUs or GPUs than it will have: `rollout.ray_num_cpus` or every core, and this
    machine's GPUs. A cluster being joined is checked once Ray knows its resources."""
    worker = worker_config(cfg)
    manager_config(cfg, worker)
    if cfg.rollout.backend != "ray" or cfg.rollout.ray_address:
        return
    total = {"CPU": float(cfg.rollout.ray_num_cpus or os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
    check_fit(cfg.rollout.num_workers, worker.num_cpus, worker.num_gpus, total)


def build_task(cfg: TrainConfig) -> ArithChainTask:
    """The bundled reasoning task."""
    return ArithChainTask(cfg.task)


def check_context(cfg: TrainConfig, task: ArithChainTask, tokenizer: TextTokenizer) -> None:
    """ValueError before any worker starts, naming the key: a new run's `rollout.engine.max_model_len` past the
    policy's `max_position_embeddings` (an engine would lower it unsaid; a run started with one before this check
    resumes as it ran, at the policy's positions), or a context (the engines': `max_model_len`, at most the policy's
    positions) that leaves the task's longest prompt no room for a response: every rollout of it would fail at run
    time. A tokenizer that splits another prompt into more tokens than the longest one can still fail a request;
    the trainer then names it."""
    policy = model_dir(cfg)
    positions = read_config(policy).max_position_embeddings
    limit = cfg.rollout.engine.max_model_len
    if limit is not None and limit > positions and not cfg.resume:
        raise ValueError(
            f"rollout.engine.max_model_len={limit} exceeds the policy's {positions} positions "
            f"(max_position_embeddings in {policy}/config.json); give at most {positions}, or leave it unset"
        )
    context, remedy = f"rollout.engine.max_model_len={limit}", "raise rollout.engine.max_model_len or lower task.n_max"
    if limit is None or limit >= positions:
        limit = positions
        context, remedy = f"the policy's context ({positions} positions, {policy})", "lower task.n_max"
    prompt = task.longest_prompt()
    tokens = len(tokenizer.encode(prompt))
    if tokens >= limit:
        raise ValueError(
            f"{context} leaves no room for a response: the task's longest prompt ({prompt[:40]!r}..., "
            f"task.n_max={cfg.task.n_max}) is {tokens} tokens; {remedy}"
        )
