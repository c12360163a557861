"""What a fastrl server reports about itself (tests, logs, the recipe's smoke run)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServerReport:
    """One server's state: weight versions, verl's global step, work in flight, co-training so far, and the parts
    of its engine's device memory released at its last sleep and not yet back."""

    name: str
    policy_version: int
    drafter_version: int
    global_steps: int | None
    in_flight: int
    cotrain_steps: int
    rollouts: int
    strategy_rounds: dict[str, int]
    memory_released: list[str] = field(default_factory=list)
