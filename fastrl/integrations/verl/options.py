"""The ``+actor_rollout_ref.rollout.custom.fastrl.*`` options of the verl backend, and the rollout-worker config
they make together with verl's own rollout settings. No verl import: the options validate anywhere."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.engine.config import EngineConfig
from fastrl.rollout.worker_config import RolloutWorkerConfig

ROLLOUT = "actor_rollout_ref.rollout."
PREFIX = f"{ROLLOUT}custom.fastrl."
CONTEXT_KEY = f"{ROLLOUT}max_model_len (or prompt_length + response_length)"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")


# Engine settings with an option of their own here (or taken from verl's rollout config): not in `engine`.
OWN_ENGINE_KEYS = frozenset({"max_batch_size", "device", "dtype", "seed", "max_model_len"})


@dataclass
class FastrlRolloutOptions:
    """fastrl's knobs inside verl; each invalid value raises ``ValueError`` naming its full key.

    strategy: ``"bandit"`` (default: the bucketed bandit picks a strategy per decode round), ``"ema"``, ``"disable"``
        or a fixed strategy (``"S_K_N"``, ``"suffix_N"``, ``"S_K_N+suffix_M"``). bandit / ema: their configs as
        dicts (fastrl's BanditConfig / EmaConfig keys).
    drafter_dir: a fastrl drafter checkpoint; ``""`` starts from a fresh drafter (co-training then teaches it).
    cotrain: keep verification hidden states and train the drafter on idle servers; at each ``sleep`` (the end of
        a rollout) the copies trained on every server are averaged into the next drafter version, pushed to all.
    slice_seconds, buffer_tokens, trainer: co-training slice length, feature-buffer size, drafter optimiser.
    max_batch_size: requests decoded at once per server (KV-cache slots); more wait in the server's queue.
    device: ``"auto"`` = cuda when the server sees a GPU, else cpu. dtype: ``"auto"`` = verl's rollout dtype on
        cuda, float32 on cpu.
    torch_threads, num_cpus: intra-op threads and Ray CPUs of each engine actor.
    engine: any other ``EngineConfig`` key (``page_size``, ``kv_cache_tokens``, ``cuda_graphs``, ``prefix_sharing``,
        ``history_tokens``) as a dict; the context length is verl's, and the keys above have their own options.
    seed: base seed of request seeds (a request's seed is derived from it and its request id, see
        ``requests.request_seed``); None takes verl's ``actor_rollout_ref.rollout.seed``.
    drafter_sync_timeout_s: how long a sleeping server waits for the other servers' co-trained drafters.
    export_dir: if set, every ``sleep`` writes each server's bandit state there (``bandit_state_<server>.json``),
        the input of ``fastrl export-drafter ... bandit_state=``.
    release_at_sleep: whether ``sleep`` gives the engine's device memory (KV pools, weights, CUDA graphs) back to
        the trainer until ``wake_up``: ``"auto"`` (default) as verl's ``rollout.free_cache_engine`` says in hybrid
        and colocated mode (never in standalone mode, whose devices are the rollout's own), or true / false.
    """

    strategy: str = "bandit"
    bandit: dict[str, Any] | None = None
    ema: dict[str, Any] | None = None
    drafter_dir: str = ""
    cotrain: bool = True
    slice_seconds: float = 0.25
    buffer_tokens: int = 262_144
    trainer: dict[str, Any] = field(default_factory=dict)
    max_batch_size: int = 64
    device: str = "auto"
    dtype: str = "auto"
    torch_threads: int = 1
    num_cpus: float = 1.0
    seed: int | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    drafter_sync_timeout_s: float = 60.0
    export_dir: str = ""
    release_at_sleep: bool | str = "auto"

    def __post_init__(self) -> None:
        if self.release_at_sleep != "auto" and not isinstance(self.release_at_sleep, bool):
            raise ValueError(f"{PREFIX}release_at_sleep must be 'auto', true or false, got {self.release_at_sleep!r}")
        if self.device not in DEVICES:
            raise ValueError(f"{PREFIX}device must be one of {list(DEVICES)}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"{PREFIX}dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        for key in ("bandit", "ema"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, Mapping):
                raise ValueError(f"{PREFIX}{key} must be a mapping of its config keys, got {value!r}")
        if not isinstance(self.trainer, Mapping):
            raise ValueError(f"{PREFIX}trainer must be a mapping of DrafterTrainerConfig keys, got {self.trainer!r}")
        known = {f.name for f in dataclasses.fields(DrafterTrainerConfig)}
        unknown = sorted(set(self.trainer) - known)
        if unknown:
            raise ValueError(f"{PREFIX}trainer: unknown keys {unknown} (known: {sorted(known)})")
        if not isinstance(self.engine, Mapping):
            raise ValueError(f"{PREFIX}engine must be a mapping of EngineConfig keys, got {self.engine!r}")
        known = {f.name for f in dataclasses.fields(EngineConfig)} - OWN_ENGINE_KEYS
        unknown = sorted(set(self.engine) - known)
        if unknown:
            raise ValueError(f"{PREFIX}engine.{unknown[0]}: not an engine key set here (known: {sorted(known)})")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"{PREFIX}seed must be null or an integer >= 0, got {self.seed!r}")
        timeout = self.drafter_sync_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise ValueError(f"{PREFIX}drafter_sync_timeout_s must be a finite number > 0, got {timeout!r}")
        if not isinstance(self.export_dir, str):
            raise ValueError(f"{PREFIX}export_dir must be a path or '', got {self.export_dir!r}")
        if self.export_dir:  # checked where the options are read (the driver), not after a whole rollout
            where = Path(self.export_dir).absolute()
            existing = next(p for p in (where, *where.parents) if p.exists())
            if not existing.is_dir():
                raise ValueError(f"{PREFIX}export_dir={self.export_dir}: {existing} is not a directory")

    @classmethod
    def from_custom(cls, custom: Mapping | None) -> FastrlRolloutOptions:
        """Read ``rollout.custom`` (verl's extension dict; its ``fastrl`` entry holds these options). Unknown keys
        raise ``ValueError`` naming them."""
        section = (custom or {}).get("fastrl")
        section = {} if section is None else section  # absent: every default; 0, false or "" is not a mapping
        if not isinstance(section, Mapping):
            raise ValueError(f"{PREFIX[:-1]} must be a mapping of options, got {section!r}")
        values = {str(k): _plain(v) for k, v in section.items()}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{PREFIX}{unknown[0]}: unknown option (known: {sorted(known)})")
        return cls(**values)

    def releases_at_sleep(self, free_cache_engine: bool, rollout_mode: str) -> bool:
        """Whether a server gives its device memory back at ``sleep`` (see ``release_at_sleep``); ``rollout_mode``
        is the name of verl's ``RolloutMode`` of the replica (HYBRID, COLOCATED or STANDALONE). ValueError for
        ``true`` beside ``free_cache_engine=false`` in hybrid or colocated mode: verl then never resumes the
        memory (no ``resume(tags=...)``, no ``wake_up``), so every rollout after the first sleep would wait."""
        shares_devices = rollout_mode in ("HYBRID", "COLOCATED")
        if self.release_at_sleep == "auto":
            return bool(free_cache_engine) and shares_devices
        if self.release_at_sleep is True and shares_devices and not free_cache_engine:
            raise ValueError(
                f"{PREFIX}release_at_sleep=true with actor_rollout_ref.rollout.free_cache_engine=false in "
                f"{rollout_mode.lower()} mode: verl then never gives the memory back (no resume, no wake_up), so "
                "rollouts after the first sleep would wait for ever; set free_cache_engine=true or leave "
                "release_at_sleep at auto"
            )
        return bool(self.release_at_sleep)

    def resolved_device(self, cuda_available: bool) -> str:
        """The device the engine runs on."""
        if self.device == "auto":
            return "cuda" if cuda_available else "cpu"
        return self.device

    def worker_config(
        self, model_dir: str, rollout_dtype: str, max_model_len: int, rollout_seed: int, device: str, calls: int
    ) -> RolloutWorkerConfig:
        """The engine-worker config of one server: ``rollout_dtype``, ``max_model_len`` and ``rollout_seed`` are
        verl's rollout settings, ``device`` the one the server runs on. Errors name the key the value came from
        (this section's, or verl's ``actor_rollout_ref.rollout.*``)."""
        dtype = self.dtype if self.dtype != "auto" else (rollout_dtype if device != "cpu" else "float32")
        try:
            engine = EngineConfig(
                **self.engine,
                max_batch_size=self.max_batch_size,
                max_model_len=max_model_len,
                device=device,
                dtype=dtype,
                seed=self.seed if self.seed is not None else rollout_seed,
            )
        except ValueError as err:  # "engine.KEY ...": an option of this section, verl's, or a key of the engine dict
            key = str(err).partition(" ")[0].removeprefix("engine.")
            name = self._engine_key_names().get(key, f"{PREFIX}engine.{key}")
            raise ValueError(f"{name}{str(err)[len(key) + len('engine.') :]}") from err
        try:
            return RolloutWorkerConfig(
                model_dir=model_dir,
                drafter_dir=self.drafter_dir,
                strategy=self.strategy,
                bandit=dict(self.bandit) if self.bandit is not None else None,
                ema=dict(self.ema) if self.ema is not None else None,
                engine=engine,
                torch_threads=self.torch_threads,
                num_cpus=self.num_cpus,
                num_gpus=0.0,  # the GPU is the trainer worker's (hybrid) or the replica's placeholder's
                max_concurrent_calls=max(calls, self.max_batch_size),
                cotrain=self.cotrain,
                buffer_tokens=self.buffer_tokens,
                trainer=DrafterTrainerConfig(**self.trainer),
                slice_seconds=self.slice_seconds,
            )
        except (TypeError, ValueError) as err:
            raise ValueError(rename_keys(str(err))) from err

    def _engine_key_names(self) -> dict[str, str]:
        """The key a user set for each engine setting ``worker_config`` fills itself: this section's option, or
        verl's rollout key when the option leaves it to verl (``seed: null``, ``dtype: auto``; the context is
        always verl's)."""
        return {
            "max_batch_size": f"{PREFIX}max_batch_size",
            "device": f"{PREFIX}device",
            "dtype": f"{PREFIX}dtype" if self.dtype != "auto" else f"{ROLLOUT}dtype",
            "seed": f"{PREFIX}seed" if self.seed is not None else f"{ROLLOUT}seed",
            "max_model_len": CONTEXT_KEY,
        }


def check_context(worker: RolloutWorkerConfig, max_positions: int) -> None:
    """ValueError naming verl's keys, in the driver, when the context verl asks of the servers exceeds the model's
    positions (the engine would serve a shorter one); the KV pool's fit is ``worker.check_files``'."""
    context = worker.engine.max_model_len
    if context is not None and context > max_positions:
        raise ValueError(
            f"{CONTEXT_KEY} = {context} exceeds the model's context of {max_positions} positions "
            "(max_position_embeddings)"
        )


def rename_keys(message: str) -> str:
    """The worker config's key names in an error message, as this section's keys."""
    for old, new in (
        ("engine.kv_cache_tokens =", f"{PREFIX}engine.kv_cache_tokens ="),  # the worker's own check of the pool
        ("rollout.worker: engine.", PREFIX),
        ("rollout.worker.model_dir", "actor_rollout_ref.model.path"),
        ("rollout.worker.", PREFIX),
        ("drafter_trainer.", f"{PREFIX}trainer."),
        ("BanditConfig.", f"{PREFIX}bandit."),
        ("EmaConfig.", f"{PREFIX}ema."),
    ):
        message = message.replace(old, new)
    section, colon, rest = message.partition(": ")
    return rest if colon and rest.startswith(section + ".") else message  # "K: K.x must ..." names K.x once


def _plain(value: object) -> object:
    """OmegaConf containers to plain Python (verl hands the section over as a DictConfig)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value
