"""Configuration of one rollout worker: the models it serves, how it decodes, and how it co-trains the drafter."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.adaptive.factory import build_selector
from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.cotrain.schedule import CotrainSchedule
from fastrl.engine.config import EngineConfig
from fastrl.engine.kv_budget import check_kv_cache_tokens, context_length, round_lookahead
from fastrl.json_values import is_real
from fastrl.models.checkpoint import read_config, weight_files
from fastrl.speculative.drafter_checkpoint import check_drafter_files
from fastrl.strategy.selector import StrategySelector


@dataclass
class RolloutWorkerConfig:
    """What a rollout worker loads and how it runs; every invalid value raises ``ValueError`` naming its key.

    model_dir: HF checkpoint directory of the policy (config.json + safetensors).
    drafter_dir: drafter checkpoint directory (``save_drafter`` layout); ``""`` = no checkpoint: a freshly
        initialised drafter (seeded by ``seed``, so every worker starts from the same weights) when a speculative
        strategy or co-training needs one, else none.
    strategy, bandit, ema: the strategy selector, as ``build_selector(strategy, bandit, ema)`` takes them
        (``"disable"``, ``"S_K_N"``, ``"suffix_N"``, ``"S_K_N+suffix_M"``, ``"bandit"``, ``"ema"``).
    engine: the worker's engine (``EngineConfig``, or a dict of its keys): batch size, context length, device,
        dtype, seed (also the seed of a fresh drafter and of co-training), KV pages, CUDA graphs, prefix sharing,
        history budget. Every engine setting reaches the worker through it.
    torch_threads: intra-op threads of the worker process (``torch.set_num_threads``).
    num_cpus, num_gpus: Ray resources of the worker actor.
    max_concurrent_calls: request-API calls one actor serves at once (its default concurrency group).
    cotrain: keep verification hidden states and train the drafter on them in idle time slices.
    buffer_tokens: capacity of the worker's feature buffer, in tokens.
    retention_versions: policy versions kept in the buffer (the newest N; 0 keeps every version).
    recency_decay: sampling weight of a sequence is ``recency_decay ** (newest_version - its_version)``.
    trainer: the drafter optimiser (``max_tokens_per_batch`` also bounds one sampled batch's padded entries).
    slice_seconds: length of one co-training slice (the tail can end at most one training step later).
    schedule: how many updates a rollout buys (fastrl.cotrain.schedule). The default here is the wall-clock
        ``time`` mode with nothing held out (what a server without rollout boundaries, e.g. verl's, can run);
        ``fastrl train`` defaults to the reproducible ``steps`` mode, whose quota the Ray manager and the local
        backend close at the end of every rollout (``finish_drafter_round``).
    max_round_records: decode-round records a worker keeps until they are collected.
    """

    model_dir: str
    drafter_dir: str = ""
    strategy: str = "disable"
    bandit: BanditConfig | dict | None = None
    ema: EmaConfig | dict | str | None = None
    engine: EngineConfig | dict = field(default_factory=EngineConfig)
    torch_threads: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_concurrent_calls: int = 64
    cotrain: bool = True
    buffer_tokens: int = 262_144
    retention_versions: int = 0
    recency_decay: float = 1.0
    trainer: DrafterTrainerConfig = field(default_factory=DrafterTrainerConfig)
    slice_seconds: float = 0.25
    schedule: CotrainSchedule = field(default_factory=lambda: CotrainSchedule(mode="time", heldout_fraction=0.0))
    max_round_records: int = 100_000

    def __post_init__(self) -> None:
        if not isinstance(self.model_dir, str) or not self.model_dir:
            raise ValueError(f"rollout.worker.model_dir must name a checkpoint directory, got {self.model_dir!r}")
        if not isinstance(self.drafter_dir, str):
            raise ValueError(f"rollout.worker.drafter_dir must be a path or '', got {self.drafter_dir!r}")
        if isinstance(self.engine, dict):
            known = {f.name for f in fields(EngineConfig)}
            unknown = sorted(set(self.engine) - known)
            if unknown:
                raise ValueError(f"rollout.worker.engine.{unknown[0]}: unknown key (known: {sorted(known)})")
            try:
                self.engine = EngineConfig(**self.engine)
            except ValueError as err:
                raise ValueError(f"rollout.worker: {err}") from err
        if not isinstance(self.engine, EngineConfig):
            raise ValueError(f"rollout.worker.engine must be an EngineConfig or a dict, got {type(self.engine)}")
        self._check_selector_configs()
        try:
            self.build_strategy_selector()
        except ValueError as err:
            raise ValueError(f"rollout.worker.strategy: {err}") from err
        _check_int("torch_threads", self.torch_threads, 1)
        _check_int("max_concurrent_calls", self.max_concurrent_calls, 1)
        _check_int("buffer_tokens", self.buffer_tokens, 2)
        _check_int("retention_versions", self.retention_versions, 0)
        _check_int("max_round_records", self.max_round_records, 1)
        for key in ("num_cpus", "num_gpus"):
            value = getattr(self, key)
            if not _is_number(value) or not 0 <= value < math.inf:  # Ray counts resources in finite units
                raise ValueError(f"rollout.worker.{key} must be a finite number >= 0, got {value!r}")
        if not _is_number(self.recency_decay) or not 0 < self.recency_decay <= 1:
            raise ValueError(f"rollout.worker.recency_decay must be in (0, 1], got {self.recency_decay!r}")
        if not _is_number(self.slice_seconds) or not 0 < self.slice_seconds < math.inf:
            raise ValueError(f"rollout.worker.slice_seconds must be a finite number > 0, got {self.slice_seconds!r}")
        if not isinstance(self.cotrain, bool):
            raise ValueError(f"rollout.worker.cotrain must be a bool, got {self.cotrain!r}")
        if isinstance(self.trainer, dict):
            self.trainer = DrafterTrainerConfig(**self.trainer)
        if isinstance(self.schedule, dict):
            self.schedule = CotrainSchedule(**self.schedule)
        if not isinstance(self.schedule, CotrainSchedule):
            raise ValueError(f"rollout.worker.schedule must be a CotrainSchedule, got {type(self.schedule)}")
        if not isinstance(self.trainer, DrafterTrainerConfig):
            raise ValueError(f"rollout.worker.trainer must be a DrafterTrainerConfig, got {type(self.trainer)}")

    def _check_selector_configs(self) -> None:
        """The bandit and EMA configs given as dicts, checked whichever selector the strategy names (a bad key of the
        one not in use was accepted, and then blamed on ``strategy`` once it was)."""
        checks = (("bandit", lambda v: BanditConfig.from_dict(v).validate()), ("ema", EmaConfig.from_json))
        for key, check in checks:
            value = getattr(self, key)
            if isinstance(value, dict):
                try:
                    check(value)
                except (TypeError, ValueError) as err:
                    raise ValueError(f"rollout.worker.{key}: {err}") from None

    def check_files(self) -> None:
        """ValueError naming the key and the file when ``model_dir`` or ``drafter_dir`` is not a readable checkpoint
        that fits the other (checked in the driver, so that a bad path is one clear error, not an actor traceback)."""
        try:
            policy = read_config(self.model_dir)
            weight_files(Path(self.model_dir))
        except ValueError as err:
            raise ValueError(f"rollout.worker.model_dir: {err}") from None
        if self.drafter_dir:
            try:
                check_drafter_files(self.drafter_dir, policy)
            except ValueError as err:
                raise ValueError(f"rollout.worker.drafter_dir: {err}") from None
        if self.engine.kv_cache_tokens is not None:  # what each engine would refuse as it starts, said once here
            check_kv_cache_tokens(
                "engine.kv_cache_tokens",
                self.engine.kv_cache_tokens,
                context_length(self.engine.max_model_len, policy.max_position_embeddings),
                round_lookahead(self.build_strategy_selector().strategies),
                self.engine.page_size,
            )

    def build_strategy_selector(self) -> StrategySelector:
        """A fresh strategy selector (each worker owns one)."""
        return build_selector(self.strategy, self.bandit, self.ema)

    def checked_selector_states(self, state: object) -> list[dict]:
        """The per-worker states of a backend's ``selector_state()`` (``{"workers": [state, ...]}``), each loaded
        into a fresh selector of this config first: ValueError naming the entry (``workers[i]``) and what is wrong,
        before any worker loads one (a damaged checkpoint used to fail mid-load or rounds later)."""
        states = state.get("workers") if isinstance(state, dict) else None
        if not isinstance(states, list) or not states:
            raise ValueError("expected {'workers': [state, ...]} as returned by selector_state()")
        for i, worker_state in enumerate(states):
            try:
                if not isinstance(worker_state, dict):
                    raise ValueError(f"a selector state is an object, got {worker_state!r}"[:200])
                self.build_strategy_selector().load_state_dict(worker_state)
            except ValueError as err:
                raise ValueError(f"workers[{i}]: {err}") from None
            except (KeyError, TypeError, AttributeError, IndexError) as err:  # a layout no check foresaw
                raise ValueError(f"workers[{i}]: {type(err).__name__}: {err}") from None
        return states

    def needs_drafter(self) -> bool:
        """True when an EAGLE strategy (alone or in a hybrid) or co-training needs a drafter."""
        speculative = any(s.uses_drafter for s in self.build_strategy_selector().strategies)
        return speculative or self.cotrain or bool(self.drafter_dir)


def _is_number(value: object) -> bool:
    return is_real(value) and not math.isnan(value)


def _check_int(key: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"rollout.worker.{key} must be an integer >= {minimum}, got {value!r}")
