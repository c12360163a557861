"""What a fastrl server reports about itself (tests, logs, the recipe's smoke run)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerReport:
    """One server's state: weight versions, verl's global step, work in flight and co-training so far."""

    name: str
    policy_version: int
    drafter_version: int
    global_steps: int | None
    in_flight: int
    cotrain_steps: int
    rollouts: int
    strategy_rounds: dict[str, int]
