"""Structured config of `fastrl train` (composed from the conf/ groups model, drafter, strategy, rollout, rl, task,
logger)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.cotrain.schedule import CotrainSchedule
from fastrl.engine.config import EngineConfig
from fastrl.engine.machine import check_device
from fastrl.rl.tasks.config import TaskConfig
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.strategy.strategy import Strategy
from fastrl.telemetry.wandb_logger import WandbConfig

FRESH_DRAFTER = "fresh"
SELECTORS = ("bandit", "ema")  # strategy.name values that are selectors, not strategies
BACKENDS = ("ray", "local")


MODEL_SOURCES = ("bundled", "local")


@dataclass
class ModelSpec:
    """The policy checkpoint. name: ``bundled`` (the shipped model, unless ``path`` is given) or ``local`` (then
    ``path``, a local HF directory, is required)."""

    name: str = "bundled"
    path: str = ""

    def __post_init__(self) -> None:
        if self.name not in MODEL_SOURCES:
            raise ValueError(f"model.name must be one of {list(MODEL_SOURCES)}, got {self.name!r}")
        if self.name == "local" and not self.path:
            raise ValueError("model=local needs model.path=DIR (a local HF checkpoint directory)")


@dataclass
class DrafterSpec:
    """The drafter and its co-training.

    path: a drafter directory; "" = the drafter shipped for the model (the bundled model's, a named model's such
    as smollm2); "fresh" = a new random drafter.
    cotrain: train the drafter on the rollouts' hidden states during the tail (False: a frozen drafter).
    schedule: ``steps`` (reproducible: every worker takes ``updates_per_rollout`` drafter updates per rollout, in the
        tail's idle slices and, for what the tail did not cover, right after the rollout, before the new version is
        pushed) or ``time`` (train while the tail lasts: depends on wall-clock time, not reproducible).
        See fastrl.cotrain.schedule.
    updates_per_rollout: drafter optimiser steps per worker per rollout (``steps`` schedule).
    heldout_fraction: share of the prompts (by a hash of the prompt's tokens: a GRPO group stays on one side) kept
        out of co-training to measure the drafter's held-out top-1 before and after each rollout's update.
    """

    path: str = ""
    cotrain: bool = True
    buffer_tokens: int = 262_144
    retention_versions: int = 0
    recency_decay: float = 1.0
    slice_seconds: float = 0.25
    schedule: str = "steps"
    updates_per_rollout: int = 1
    heldout_fraction: float = 0.1
    trainer: DrafterTrainerConfig = field(default_factory=DrafterTrainerConfig)

    def __post_init__(self) -> None:
        self.cotrain_schedule()  # ValueError naming drafter.schedule / updates_per_rollout / heldout_fraction
        if self.trainer.seed != 0:
            raise ValueError(
                f"drafter.trainer.seed={self.trainer.seed}: co-training draws its batches and noise from rl.seed "
                "(drafter.trainer.seed is train-drafter's); leave it out"
            )

    def cotrain_schedule(self) -> CotrainSchedule:
        """The co-training schedule these keys describe."""
        return CotrainSchedule(self.schedule, self.updates_per_rollout, self.heldout_fraction)


@dataclass
class StrategySpec:
    """The strategy selector of every decode round: bandit | ema | disable | S_K_N, with the bandit's / EMA's keys."""

    name: str = "bandit"
    bandit: BanditConfig = field(default_factory=BanditConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)

    def __post_init__(self) -> None:
        if self.name in SELECTORS:
            return
        try:
            Strategy.parse(self.name)
        except ValueError as err:  # the parser names the rule the strategy breaks
            spelled = str(self.name).replace("-", "_")
            hint = f"; did you mean strategy.name={spelled}?" if parses_as_strategy(spelled) else ""
            raise ValueError(
                f"strategy.name={self.name}: expected {' | '.join(SELECTORS)}, disable or a strategy; {err}{hint}"
            ) from None


def parses_as_strategy(name: str) -> bool:
    """True when ``name`` is a strategy string (``Strategy.parse`` accepts it)."""
    try:
        Strategy.parse(name)
    except ValueError:
        return False
    return True


@dataclass
class RolloutSpec:
    """Where rollouts run: `ray` (worker actors; a local Ray is started when none runs, or join `ray_address`) or
    `local` (one engine in this process).

    engine: every rollout engine's settings (`EngineConfig`: max_batch_size, max_model_len, device, dtype,
    page_size, kv_cache_tokens, cuda_graphs, prefix_sharing, history_tokens, attention_kernel); its seed is
    `rl.seed`.
    engine.dtype is the rollout engines' compute dtype (their copy of the policy and drafter; training stays
    float32). The CPU default float64 makes a sample's rounding independent of how a round is composed (plain row or
    verify row, batch of 1 or 64): float32 rounding flips about one near-tie per 1e5 tokens between the two,
    float64's is ~1e9 times smaller. On a GPU use bfloat16 and accept near-tie flips (`fastrl check-exact`).

    overlap_drafter_round: the co-training a rollout's tail left undone (`drafter.schedule=steps`), the merge and
    the push run while the trainer updates the policy instead of before `generate` returns (same updates).
    """

    backend: str = "ray"
    num_workers: int = 2
    ray_address: str = ""
    ray_num_cpus: int | None = None
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(dtype="float64"))
    torch_threads: int = 1
    cotrain_in_tail: bool = True
    overlap_drafter_round: bool = True
    restart_failed_workers: bool = True

    round_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"rollout.backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.backend == "local" and self.num_workers != 1:
            raise ValueError(
                f"rollout.num_workers={self.num_workers}: rollout=local runs one engine in this process; use "
                "rollout=ray for more workers"
            )
        check_device("rollout.engine.device", self.engine.device)


@dataclass
class TrainConfig:
    """Keys of `fastrl train`."""

    model: ModelSpec = field(default_factory=ModelSpec)
    drafter: DrafterSpec = field(default_factory=DrafterSpec)
    strategy: StrategySpec = field(default_factory=StrategySpec)
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    rl: GRPOConfig = field(default_factory=GRPOConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    logger: WandbConfig = field(default_factory=WandbConfig)
    resume: str = ""
    checkpoint_on_interrupt: bool = True
    report: bool = True
    threads: int = 1

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1 (torch threads of the trainer), got {self.threads}")
