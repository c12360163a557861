"""Configuration of the predictive bandit (``BanditSelector``), validated on construction."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from fastrl.adaptive.buckets import DEFAULT_BS_THRESHOLDS, BatchBuckets
from fastrl.json_values import is_int, is_real
from fastrl.strategy.strategy import DISABLE, Strategy, parse_strategy_space

REWARDS = ("goodput", "accept_length")
MAX_WINDOW_SIZE = 10**9
"""Largest ``window_size``: a billion rounds (11 days of 1 ms rounds) is a memory that never forgets a run; past
it the decay per round rounds to 1 and ``memory_rows`` to no float at all (1 followed by 400 zeros)."""
MAX_MIN_PULLS = 1000
"""Most timed rounds per arm and calibration batch size: every arm runs them at every size before the first decision,
so a calibration of more would outlast the rollouts it serves."""
CHANGEABLE_ON_LOAD = ("timeline_limit",)
"""Keys a bandit's state does not depend on: a state saved under other values of them loads (``fastrl train`` lets
``strategy.bandit.timeline_limit`` change on resume, ``fastrl.commands.train_setup.CHANGEABLE_ON_RESUME``)."""
MEMORY_ROWS_PER_ROUND = 4
"""Request rows of one ``window_size`` round: the acceptance memory is counted in rows, so a round at batch 64
weighs what 16 rounds at batch 4 do."""


@dataclass
class BanditConfig:
    """Knobs of ``BanditSelector``; every invalid value raises ``ValueError`` naming its key.

    ``reward``: ``"goodput"`` (default) is emitted tokens per second of wall time: the bandit predicts it for every
    arm as batch size * tokens per row / round time at the batch size at hand, so ``disable`` wins wherever
    speculation does not pay. ``"accept_length"`` is the mean tokens per request per round (`accept_length`), the
    seeds' reward: it ignores the round's cost, so it never prefers ``disable`` (which scores 1.0, the least any
    strategy can) and always prefers the largest tree, even where verifying it costs more than it saves.
    """

    strategies: list[str] = field(default_factory=lambda: ["8_4_32", "8_4_16", "8_4_8", "disable"])
    """The strategy space (the arms)."""
    bs_thresholds: list[int] = field(default_factory=lambda: list(DEFAULT_BS_THRESHOLDS))
    """Lower batch size of each bucket, strictly increasing from 1: [1], [2-4], [5-20], [21+] by default. Choices
    are made per batch size; buckets group the telemetry, the exported per-bucket winners and ``bucket_strategies``."""
    bucket_strategies: dict[int, list[str]] = field(default_factory=dict)
    """Arms per bucket (a list of strategy strings), keyed by the bucket's lower threshold (an int; in JSON its ASCII
    digits; buckets not listed hold every arm; None is taken as {}: a default of {} lets Hydra merge
    `bandit.bucket_strategies={1:[3_1_4]}` into it, which it cannot into None)."""
    epsilon: float = 0.1
    """Exploration: an arm other than the predicted best is pulled only while its optimistic goodput (every depth's
    acceptance raised to its one-sided ``1 - epsilon`` normal bound) still beats the best's prediction; 0 or 0.5
    and above never explore."""
    explore_within: float = 0.8
    """Only arms predicted at least this fraction of the best arm's goodput at the batch size at hand are explored
    there: a clearly worse arm is learned at batch sizes where it is close, where a pull costs little."""
    explore_budget: float | None = 0.05
    """Exploration spends at most this fraction of the time rounds took: every round learned from adds this
    fraction of its wall time to a credit, an arm is explored only while the credit covers the pull's predicted cost
    (the arm's round time less the time the best arm would take for the tokens the arm is predicted to emit), and
    every exploratory round takes its cost with the tokens it really emitted from the credit (its predicted round
    time less the time the best arm's predicted goodput needs for those tokens), so acceptance that flatters an arm
    cannot overspend it. So a run never pays more than this for learning, and an arm that costs 3x the best
    at batch 64 is learned at small batch sizes, where a pull costs little. None: no limit."""
    anchor_every: int = 64
    """A plain round every this many rounds that ran none (while the exploration credit covers its cost; 0: never):
    plain's round time is the reference of every speedup estimate, and measured beside the speculative rounds of
    the moment it follows the machine's state where the calibration, taken at another time, may not."""
    decide_every_s: float = 0.05
    """Seconds of rounds one exploit decision holds for at its batch size (ended early when the exploration credit
    comes to cover an arm that might beat it, or a plain anchor falls due): those rounds only queue their statistics,
    learned in order at the next decision, so batch-1 rounds of a few ms do not pay the selector's prediction of
    every arm (~0.2 ms) each time, while rounds longer than this (large batches) are each decided. Exploratory,
    anchor and untimed rounds are decided one at a time. 0: decide every round."""
    window_size: int = 128
    """Acceptance memory, in rounds of ``MEMORY_ROWS_PER_ROUND`` request rows: an arm's per-depth counts decay by
    exp(-rows / (4 window_size)) per round of its own (``rows`` its batch size) and 8x more slowly per round of
    another arm, so the estimate follows a drafter and a policy that change under training, and acceptance that
    changes along the rollouts, whatever the batch size; an arm left alone is tried again after many rows. At most
    ``MAX_WINDOW_SIZE``."""
    prior_rows: float = 4.0
    """Most weight, in request rows, of the acceptance the arm's family (the arms of its draft source whose trees
    contain it or that it contains) measured at a depth, in an arm's own estimate there; it fades as the arm's own
    rows accumulate: an arm never pulled is predicted from its family's rounds, a measured one from its own."""
    min_pulls: int = 3
    """Timed rounds of each arm at each calibration batch size (after one warm-up round); without a calibration,
    rounds an arm is pulled at the first chance so that its round time is measured."""
    calibrate: bool = True
    """Time every arm at a few batch sizes when an engine starts (cached per model, drafter, device and dtype)."""
    chain_depth: bool = True
    """Time a stopping chain (``S_1_N@P``) at the depth its rounds reach at each batch size, on the line through the
    calibrated fixed chains, and scale its tokens per row by what its rounds emitted at that batch size
    (``chain_depth``); False: by its own calibration and the pooled acceptance, as any arm."""
    reward: str = "goodput"
    """``"goodput"`` or ``"accept_length"`` (see the class docstring)."""
    bs_threshold: int | None = None
    """If set, rounds with a larger batch size decode plainly (``disable``) and are not learned from."""
    seed: int = 0
    """Seeds the calibration requests (their prompt tokens and sampling)."""
    timeline_limit: int = 100_000
    """Most recent choices kept for telemetry."""

    def __post_init__(self) -> None:
        if self.bucket_strategies is None:  # states saved before the default was {}
            self.bucket_strategies = {}
        if isinstance(self.bucket_strategies, Mapping):  # JSON turns the int keys into strings (ASCII digits only)
            self.bucket_strategies = {
                int(k) if isinstance(k, str) and k.isascii() and k.isdigit() else k: _listed(v)
                for k, v in self.bucket_strategies.items()
            }
        if isinstance(self.strategies, tuple):  # as lists, the form its JSON state reads back in (and compares)
            self.strategies = list(self.strategies)
        if isinstance(self.bs_thresholds, tuple):
            self.bs_thresholds = list(self.bs_thresholds)
        self.validate()

    @classmethod
    def from_dict(cls, values: dict) -> BanditConfig:
        """Build from a plain dict (e.g. a Hydra/JSON node); unknown keys raise ``ValueError`` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown BanditConfig keys: {unknown} (known: {sorted(known)})")
        return cls(**values)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid key."""
        for key in ("strategies", "bs_thresholds"):
            value = getattr(self, key)
            if not isinstance(value, Sequence) or (isinstance(value, str | bytes) and key == "bs_thresholds"):
                raise ValueError(f"BanditConfig.{key} must be a list, got {value!r}")
        try:
            parse_strategy_space(list(self.strategies) if not isinstance(self.strategies, str) else self.strategies)
        except ValueError as err:
            raise ValueError(f"BanditConfig.strategies: {err}") from err
        try:
            buckets = BatchBuckets(tuple(self.bs_thresholds))
        except (ValueError, TypeError) as err:
            raise ValueError(f"BanditConfig.bs_thresholds: {err}") from None
        if not is_real(self.epsilon) or math.isnan(self.epsilon):
            raise ValueError(f"BanditConfig.epsilon must be a number in [0, 1], got {self.epsilon!r}")
        if not is_int(self.min_pulls) or not 1 <= self.min_pulls <= MAX_MIN_PULLS:
            bounds = f"[1, {MAX_MIN_PULLS}]"
            raise ValueError(f"BanditConfig.min_pulls must be an integer in {bounds}, got {self.min_pulls!r}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"BanditConfig.epsilon must be in [0, 1], got {self.epsilon}")
        if not isinstance(self.chain_depth, bool):
            raise ValueError(f"BanditConfig.chain_depth must be true or false, got {self.chain_depth!r}")
        window = self.window_size
        if not is_int(window) or not 1 <= window <= MAX_WINDOW_SIZE:
            shown = f"an int of {len(str(window))} digits" if is_int(window) and window > 10**12 else repr(window)
            raise ValueError(f"BanditConfig.window_size must be an int in [1, {MAX_WINDOW_SIZE:_}], got {shown}")
        if self.reward not in REWARDS:
            raise ValueError(f"BanditConfig.reward must be one of {list(REWARDS)}, got {self.reward!r}")
        if self.bs_threshold is not None and (not is_int(self.bs_threshold) or self.bs_threshold < 1):
            raise ValueError(f"BanditConfig.bs_threshold must be None or an int >= 1, got {self.bs_threshold!r}")
        prior = self.prior_rows
        if not is_real(prior) or not 0 <= prior < math.inf:
            raise ValueError(f"BanditConfig.prior_rows must be a finite number >= 0, got {self.prior_rows!r}")
        within = self.explore_within
        if not is_real(within) or not 0.0 <= within <= 1.0:
            raise ValueError(f"BanditConfig.explore_within must be a number in [0, 1], got {within!r}")
        budget = self.explore_budget
        if budget is not None and (not is_real(budget) or not 0 <= budget < math.inf):
            raise ValueError(f"BanditConfig.explore_budget must be None or a finite number >= 0, got {budget!r}")
        anchor = self.anchor_every
        if not is_int(anchor) or anchor < 0:
            raise ValueError(f"BanditConfig.anchor_every must be an int >= 0, got {anchor!r}")
        every = self.decide_every_s
        if not is_real(every) or not 0 <= every < math.inf:
            raise ValueError(f"BanditConfig.decide_every_s must be a finite number >= 0, got {every!r}")
        if not isinstance(self.calibrate, bool):
            raise ValueError(f"BanditConfig.calibrate must be true or false, got {self.calibrate!r}")
        if not is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise ValueError(f"BanditConfig.seed must be an int in [0, 2**63), got {self.seed!r}")
        if not is_int(self.timeline_limit) or self.timeline_limit < 0:
            raise ValueError(f"BanditConfig.timeline_limit must be an int >= 0, got {self.timeline_limit!r}")
        if not isinstance(self.bucket_strategies, Mapping):
            raise ValueError(f"BanditConfig.bucket_strategies must be a mapping, got {self.bucket_strategies!r}")
        self._validate_bucket_strategies(buckets)

    def _validate_bucket_strategies(self, buckets: BatchBuckets) -> None:
        space = set(self.strategy_space())
        for low, names in self.bucket_strategies.items():
            key = f"BanditConfig.bucket_strategies[{low!r}]"
            if not is_int(low) or low not in buckets.thresholds:
                raise ValueError(
                    f"{key}: not a bucket threshold (an int, written in ASCII digits), thresholds are "
                    f"{list(buckets.thresholds)}"
                )
            if not isinstance(names, list):
                raise ValueError(f"{key} must be a list of strategy strings, got {names!r}")
            try:
                arms = parse_strategy_space(names)
            except ValueError as err:
                raise ValueError(f"{key}: {err}") from err
            outside = [str(a) for a in arms if a not in space]
            if outside:
                raise ValueError(f"{key}: arms {outside} are not in BanditConfig.strategies")

    def memory_rows(self) -> float:
        """The acceptance memory in request rows (``window_size`` rounds of ``MEMORY_ROWS_PER_ROUND`` rows)."""
        return float(MEMORY_ROWS_PER_ROUND * self.window_size)

    def exploration_z(self) -> float:
        """Standard errors an arm's acceptance is raised by when deciding whether to explore it (0: never)."""
        return NormalDist().inv_cdf(1.0 - self.epsilon) if 0.0 < self.epsilon < 0.5 else 0.0

    def strategy_space(self) -> list[Strategy]:
        """The parsed arms, in configured order."""
        return parse_strategy_space(list(self.strategies))

    def buckets(self) -> BatchBuckets:
        """The parsed batch-size buckets."""
        return BatchBuckets(tuple(self.bs_thresholds))

    def arms_per_bucket(self) -> list[list[Strategy]]:
        """Arms of each bucket, in bucket order (every arm where ``bucket_strategies`` says nothing)."""
        space = self.strategy_space()
        chosen = self.bucket_strategies or {}
        return [
            parse_strategy_space(list(chosen[low])) if low in chosen else list(space)
            for low in self.buckets().thresholds
        ]

    def all_strategies(self) -> list[Strategy]:
        """Every strategy the policy may return: the arms, plus ``disable`` when ``bs_threshold`` is set."""
        space = self.strategy_space()
        if self.bs_threshold is not None and DISABLE not in space:
            space.append(DISABLE)
        return space


def _listed(names: object) -> object:
    """A list-like ``bucket_strategies`` value (a Hydra ListConfig, a tuple) as a list; anything else as it is, for
    ``validate`` to name."""
    if isinstance(names, Iterable) and not isinstance(names, str | bytes | Mapping):
        return list(names)
    return names
