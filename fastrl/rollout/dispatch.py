"""Spreading a GRPO batch over workers: units of work that keep a prompt's group together, balanced by expected
work and sent back to the worker that served the same prompt before (its history index holds the earlier
responses); seeds for requests that bring none (so a request re-run elsewhere gives the same tokens)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

from fastrl.engine.request_checks import checked_params, checked_prompt
from fastrl.json_values import is_int
from fastrl.rollout.types import RolloutRequest

T = TypeVar("T")

PROMPT_TOKEN_WORK = 0.1  # a prompt token costs about a tenth of a decoded one (prefill is one batched pass)


@dataclass
class WorkUnit:
    """Requests sent to one worker in one call, as positions in the batch, with their expected work (tokens)."""

    indices: list[int]
    work: float
    prompt: tuple[int, ...] = ()


def expected_work(request: RolloutRequest) -> float:
    """Decode-token equivalents: max_new_tokens plus a little for the prompt."""
    return request.params.max_new_tokens + PROMPT_TOKEN_WORK * len(request.prompt_ids)


def make_units(requests: list[RolloutRequest], num_workers: int) -> list[WorkUnit]:
    """One unit per group (in order of first appearance); a group with more than a fair share of the batch's work
    (total / num_workers) is split into near-equal contiguous chunks so that no worker gets it all."""
    if num_workers < 1:
        raise ValueError(f"make_units: num_workers must be >= 1, got {num_workers}")
    groups: dict[int, list[int]] = {}
    for i, request in enumerate(requests):
        groups.setdefault(request.group, []).append(i)
    work = [expected_work(r) for r in requests]
    fair = sum(work) / num_workers
    units = []
    for indices in groups.values():
        total = sum(work[i] for i in indices)
        chunks = min(len(indices), math.ceil(total / fair - 1e-9)) if num_workers > 1 and total > fair else 1
        for part in contiguous_runs(indices, chunks):
            units.append(WorkUnit(part, sum(work[i] for i in part), tuple(requests[part[0]].prompt_ids)))
    return units


def contiguous_runs(items: list[T], parts: int) -> list[list[T]]:
    """``items`` cut into ``parts`` runs in order, of near-equal lengths (the first ``len % parts`` one longer)."""
    size, extra = divmod(len(items), parts)
    runs, start = [], 0
    for c in range(parts):
        end = start + size + (1 if c < extra else 0)
        runs.append(items[start:end])
        start = end
    return runs


def merge_units(units: list[WorkUnit], calls: int) -> list[WorkUnit]:
    """``units`` in at most ``calls`` units, each a run of consecutive ones (their requests in the same order, their
    work summed, the first one's prompt): a worker holds every part of its share until all have arrived, each part
    in one of its call threads, so a share of more parts than it has threads would never start."""
    if calls < 1:
        raise ValueError(f"merge_units: calls must be >= 1, got {calls}")
    if len(units) <= calls:
        return list(units)
    return [
        WorkUnit([i for unit in part for i in unit.indices], sum(unit.work for unit in part), part[0].prompt)
        for part in contiguous_runs(units, calls)
    ]


AffinitySnapshot = tuple[tuple[tuple[int, ...], int], ...]  # (prompt ids, worker slot), oldest first


class PromptAffinity:
    """The worker slot that last served each prompt, for the `capacity` most recently seen prompts."""

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError(f"PromptAffinity: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._home: OrderedDict[tuple[int, ...], int] = OrderedDict()

    def home(self, prompt: tuple[int, ...]) -> int | None:
        return self._home.get(prompt)

    def record(self, prompt: tuple[int, ...], slot: int) -> None:
        self._home[prompt] = slot
        self._home.move_to_end(prompt)
        while len(self._home) > self.capacity:
            self._home.popitem(last=False)

    def snapshot(self) -> AffinitySnapshot:
        """The table as it is now, least recently served first: a copy of its references (the prompts are tuples,
        shared), cheap to take after every rollout; ``state(snapshot)`` turns it into JSON when a checkpoint asks."""
        return tuple(self._home.items())

    def state(self, snapshot: AffinitySnapshot | None = None) -> list[list]:
        """``[[prompt ids, slot], ...]``, least recently served first (JSON-serialisable): of the table now, or of
        an earlier ``snapshot()``."""
        items = self._home.items() if snapshot is None else snapshot
        return [[list(prompt), slot] for prompt, slot in items]

    def fold(self, slots: int) -> None:
        """Send a prompt served by slot j to slot j % ``slots`` (a resumed run with fewer workers, whose history
        indexes were folded alike: ``RolloutManager.load_history_state``)."""
        self._home = OrderedDict((prompt, slot % slots) for prompt, slot in self._home.items())

    def load_state(self, entries: object) -> None:
        """Replace the table with what ``state()`` returned (ValueError when it is not such a list)."""
        if not isinstance(entries, list) or not all(_is_entry(e) for e in entries):
            raise ValueError("prompt affinity: expected [[prompt token ids, worker slot], ...]")
        self._home = OrderedDict((tuple(prompt), int(slot)) for prompt, slot in entries)
        while len(self._home) > self.capacity:
            self._home.popitem(last=False)


def _is_entry(entry: object) -> bool:
    if not isinstance(entry, list) or len(entry) != 2:
        return False
    prompt, slot = entry
    return isinstance(prompt, list) and all(is_int(t) for t in prompt) and is_int(slot) and slot >= 0


def assign_units(
    units: list[WorkUnit], load: dict[str, float], homes: dict[tuple[int, ...], str] | None = None
) -> list[tuple[str, WorkUnit]]:
    """Longest-processing-time-first: each unit (largest first) goes to the worker with the least load so far;
    ``load`` (worker id -> expected work already queued) is updated in place. Ties go to the earlier worker.

    ``homes`` (prompt -> worker id) sends a unit to the worker that served its prompt before when that costs the
    balance at most half the unit's work (its load is within that of the least loaded worker's)."""
    if not load:
        raise ValueError("assign_units: no workers")
    order = list(load)
    plan = []
    for unit in sorted(units, key=lambda u: -u.work):
        worker = min(order, key=lambda w: load[w])
        home = (homes or {}).get(unit.prompt)
        if home in load and load[home] <= load[worker] + 0.5 * unit.work:
            worker = home
        load[worker] += unit.work
        plan.append((worker, unit))
    return plan


def check_request_ids(requests: list[RolloutRequest]) -> None:
    """ValueError naming the first request id that appears twice."""
    seen: set[str] = set()
    for r in requests:
        if r.request_id in seen:
            raise ValueError(f"request id {r.request_id!r} appears twice in the batch")
        seen.add(r.request_id)


def check_prompts(requests: list[RolloutRequest]) -> None:
    """ValueError naming the first request whose prompt is not one row of integers, worded as the engine words it
    (``checked_prompt``): the driver refuses it before any worker sees the batch."""
    for r in requests:
        checked_prompt(r.prompt_ids, f"request {r.request_id!r}")


def with_seeds(requests: list[RolloutRequest], rng: random.Random) -> list[RolloutRequest]:
    """Copies of ``requests`` where those without a seed get one from ``rng`` (the others are returned as is); params
    of None become the defaults (with a seed), params that are not a SamplingParams a ValueError naming the request
    (``checked_params``; every request is checked before any seed is drawn)."""
    params = [checked_params(r.params, f"request {r.request_id!r}") for r in requests]
    out = []
    for r, p in zip(requests, params, strict=True):
        if p.seed is None:
            r = dataclasses.replace(r, params=dataclasses.replace(p, seed=rng.getrandbits(63)))
        out.append(r)
    return out
