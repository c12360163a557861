"""Configuration of the EMA tier controller; reads SGLang's ``--speculative-adaptive-config`` JSON keys."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fastrl.json_values import is_int, is_real
from fastrl.strategy.strategy import MAX_STEPS

SGLANG_KEYS = ("candidate_steps", "ema_alpha", "warmup_batches", "update_interval", "down_hysteresis", "up_hysteresis")


@dataclass
class EmaConfig:
    """Knobs of ``EmaSelector`` (SGLang's names and defaults); invalid values raise ``ValueError`` naming the key.

    ``candidate_steps`` are the tiers: each ``S`` is the chain strategy ``S_1_{S+1}`` (``0`` means ``disable``).
    ``initial_steps`` (a fastrl addition; SGLang takes it from ``--speculative-num-steps``) snaps to the nearest
    tier (the lower one on a tie); ``None`` starts at the middle tier, as SGLang does.
    """

    candidate_steps: list[int] = field(default_factory=lambda: [1, 3, 7])
    ema_alpha: float = 0.2
    warmup_batches: int = 10
    update_interval: int = 5
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    initial_steps: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_json(cls, source: str | Path | dict) -> EmaConfig:
        """Build from a JSON file path or an already-parsed dict with SGLang's keys (plus ``initial_steps``).

        Unknown keys raise ``ValueError`` naming them. SGLang's newer per-batch-size sections (``{"1": {...}}``)
        are rejected: per-bucket strategy choice is the bandit's job here.
        """
        if isinstance(source, dict):
            values = dict(source)
        else:
            with open(source) as f:
                values = json.load(f)
            if not isinstance(values, dict):
                raise ValueError(f"EMA config {str(source)!r} must hold a JSON object, got {type(values).__name__}")
        sections = sorted(k for k in values if str(k).isdigit())
        if sections:
            raise ValueError(f"EMA config: per-batch-size sections {sections} are not supported; give flat keys")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown EMA config keys: {unknown} (known: {sorted(known)})")
        return cls(**values)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid key."""
        steps = self.candidate_steps
        if isinstance(steps, str) or not isinstance(steps, Sequence) or not steps:
            raise ValueError(f"EmaConfig.candidate_steps must be a non-empty list of ints >= 0, got {steps!r}")
        if any(not is_int(s) or not 0 <= s <= MAX_STEPS for s in steps):
            raise ValueError(
                f"EmaConfig.candidate_steps must be ints in [0, {MAX_STEPS}] (chain depths), got {steps!r}"
            )
        if len(set(steps)) != len(steps):
            raise ValueError(f"EmaConfig.candidate_steps has duplicates: {steps!r}")
        if not _is_number(self.ema_alpha) or not 0.0 < self.ema_alpha <= 1.0:
            raise ValueError(f"EmaConfig.ema_alpha must be in (0, 1], got {self.ema_alpha!r}")
        if not is_int(self.warmup_batches) or self.warmup_batches < 0:
            raise ValueError(f"EmaConfig.warmup_batches must be an int >= 0, got {self.warmup_batches!r}")
        if not is_int(self.update_interval) or self.update_interval < 1:
            raise ValueError(f"EmaConfig.update_interval must be an int >= 1, got {self.update_interval!r}")
        for name in ("down_hysteresis", "up_hysteresis"):
            if not _is_number(getattr(self, name)):
                raise ValueError(f"EmaConfig.{name} must be a finite number, got {getattr(self, name)!r}")
        if self.initial_steps is not None and (not is_int(self.initial_steps) or self.initial_steps < 0):
            raise ValueError(f"EmaConfig.initial_steps must be None or an int >= 0, got {self.initial_steps!r}")

    def tiers(self) -> list[int]:
        """The candidate steps, ascending."""
        return sorted(self.candidate_steps)

    def initial_tier(self) -> int:
        """Index into ``tiers()`` of the starting tier."""
        tiers = self.tiers()
        if self.initial_steps is None:
            return len(tiers) // 2
        return min(range(len(tiers)), key=lambda i: (abs(tiers[i] - self.initial_steps), tiers[i]))


def _is_number(value: object) -> bool:
    return is_real(value) and math.isfinite(value)
