"""What a rollout worker reports about itself: versions, load, decode rounds, co-training data."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WorkerStats:
    """A worker's counters since it started.

    ``mean_batch_size`` and ``mean_accept_length`` (tokens per row per round, row-weighted: `accept_length`) are
    over all its decode rounds; ``strategy_rounds`` counts rounds per strategy name; ``memory_released`` names the
    parts of the engine's device memory given back and not yet restored (``Engine.release_memory``).
    """

    worker_id: str
    policy_version: int
    drafter_version: int
    requests_served: int
    running_requests: int
    rounds: int
    tokens_emitted: int
    mean_batch_size: float
    mean_accept_length: float
    strategy_rounds: dict[str, int] = field(default_factory=dict)
    buffer_sequences: int = 0
    buffer_tokens: int = 0
    cotrain_steps: int = 0
    memory_released: list[str] = field(default_factory=list)


@dataclass
class WorkerHealth:
    """Whether a worker can serve: ``ok`` is False once its stepping loop has failed (``error`` says why);
    ``stalled_s`` is how long it has had unfinished requests without finishing an engine step (0 when idle);
    ``training_stalled_s`` how long a co-training call in flight has gone without starting a drafter step (0 when
    none runs)."""

    worker_id: str
    ok: bool
    running_requests: int
    error: str | None = None
    stalled_s: float = 0.0
    training_stalled_s: float = 0.0
