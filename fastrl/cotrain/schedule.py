"""The co-training schedule: how many drafter updates each rollout buys, and the seeds that make them reproducible.

Two modes:

- ``steps`` (the default, reproducible): every worker takes exactly ``updates_per_rollout`` optimiser steps on its own
  copy of the drafter per rollout. They run in the idle slices of the rollout's tail; what the tail did not cover
  runs right after the rollout, before the new version is published (so the push never waits a step). Step ``k``
  of worker ``i`` draws its batch and its feature noise from seeds derived from (run seed, ``i``, ``k``), and the
  buffer holds a rollout's sequences in request-id order, so the trained weights are a function of the run's seed
  and step, whatever the wall clock did.
- ``time`` (not reproducible): workers train for as long as the tail lasts, in slices; nothing runs after it. How
  many steps a rollout buys depends on timing, so two identical runs differ in drafter metrics and accept lengths.

``heldout_fraction`` of the prompts (chosen by a hash of the prompt's tokens) are kept out of training; their features
measure the drafter's top-1 agreement with the policy before and after each rollout's update.
"""

from __future__ import annotations

import array
import hashlib
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

SCHEDULES = ("steps", "time")
SEED_MODULUS = 2**63
BATCH_STREAM = 1  # which sequences a step trains on
NOISE_STREAM = 2  # the step's feature noise


@dataclass
class CotrainSchedule:
    """How much a worker trains per rollout (see the module docstring). Invalid values raise ValueError naming
    the ``drafter.*`` key."""

    mode: str = "steps"
    updates_per_rollout: int = 8
    heldout_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.mode not in SCHEDULES:
            raise ValueError(f"drafter.schedule must be one of {list(SCHEDULES)}, got {self.mode!r}")
        u = self.updates_per_rollout
        if isinstance(u, bool) or not isinstance(u, int) or u < 0:
            raise ValueError(f"drafter.updates_per_rollout must be an integer >= 0, got {u!r}")
        f = self.heldout_fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not (math.isfinite(f) and 0 <= f < 1):
            raise ValueError(f"drafter.heldout_fraction must be a number in [0, 1), got {f!r}")

    @property
    def deterministic(self) -> bool:
        return self.mode == "steps"

    def quota(self, done: int) -> int | None:
        """Steps still due this rollout after ``done`` (None: no quota, the ``time`` mode)."""
        return max(0, self.updates_per_rollout - done) if self.deterministic else None

    def is_heldout(self, prompt: Sequence[int]) -> bool:
        """Whether the features of sequences of ``prompt`` (its token ids) are kept out of training: a pure function
        of the prompt, so that a GRPO group's samples, which share their prompt's entries, and the prompt's return
        in a later epoch, fall on one side (split by request, siblings trained on held-out entries bit for bit)."""
        if self.heldout_fraction <= 0:
            return False
        key = array.array("q", prompt).tobytes()
        return zlib.crc32(key) % 10_000 < round(self.heldout_fraction * 10_000)


def step_seed(seed: int, stream: int, worker_index: int, step: int) -> int:
    """A seed in [0, 2**63) that is a pure function of (run seed, stream, worker slot, the worker's step count)."""
    data = b"".join(struct.pack("<q", int(p) % SEED_MODULUS) for p in (seed, stream, worker_index, step))
    digest = hashlib.blake2b(data, digest_size=8, person=b"fastrl-cotrain").digest()
    return int.from_bytes(digest, "little") % SEED_MODULUS
