"""BEG: a bucketed epsilon-greedy bandit that picks the speculation strategy of every decode round.

Rounds are grouped by batch size into buckets (``bs_thresholds``); each bucket runs its own epsilon-greedy bandit
over its arms and a sliding window of each arm's last ``window_size`` rounds. Departures from the published
implementation, whose default gave each bucket a single arm so that it never explored:

* every bucket may hold any set of arms (all of them by default);
* a bucket first tries each of its arms once, round-robin in arm order, before it exploits;
* an arm with no rounds in a bucket borrows the estimate of the nearest bucket that has some, and a bucket's
  first few rounds of an arm are shrunk toward that neighbour's accept length (``borrow_rows``);
* the estimate is decomposed: accept length from the window (it hardly depends on the batch size) over the round
  time measured at the batch size at hand (interpolated between measured batch sizes). A bucket spans a range of
  batch sizes and the batch decays while an arm waits for its next pull, so a plain mean of past goodputs would
  compare arms measured at different batch sizes;
* exploration is cost- and value-aware (``cost_aware_exploration``): the time it loses to one arm is bounded.

With these, on the simulated GRPO workloads (``python -m fastrl.adaptive.sim``) the bandit reaches the per-bucket
oracle's goodput and beats every single static strategy.
"""

from __future__ import annotations

import dataclasses
import random

from fastrl.adaptive.arm_rewards import ArmRewards, RoundSample
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.bandit_telemetry import ArmTelemetry, BanditTelemetry, BucketTelemetry, ChoiceRecord
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

STATE_VERSION = 1


class BanditSelector:
    """A ``StrategySelector``: one epsilon-greedy bandit per batch-size bucket (see the module docstring)."""

    def __init__(self, config: BanditConfig | None = None) -> None:
        self.config = config or BanditConfig()
        self.config.validate()
        self._buckets = self.config.buckets()
        self._arms = self.config.arms_per_bucket()
        self._strategies = self.config.all_strategies()
        self._rewards = [{arm: ArmRewards(self.config.window_size) for arm in arms} for arms in self._arms]
        self._bucket_rounds = [0] * len(self._arms)
        self._last_batch = list(self._buckets.thresholds)
        self._rng = random.Random(self.config.seed)
        self._round = 0
        self._timeline: list[ChoiceRecord] = []

    @property
    def strategies(self) -> list[Strategy]:
        """Every strategy ``choose`` may return."""
        return list(self._strategies)

    def choose(self, batch_size: int) -> Strategy:
        """Epsilon-greedy over the arms of ``batch_size``'s bucket, after each was tried once."""
        bucket = self._buckets.index(batch_size)
        threshold = self.config.bs_threshold
        if threshold is not None and batch_size > threshold:
            return self._record(batch_size, bucket, DISABLE, "bs_threshold")
        arms = self._arms[bucket]
        if self.config.explore_untried:
            fewest = min(arms, key=lambda a: self._rewards[bucket][a].pulls)  # round-robin, first arm on ties
            if self._rewards[bucket][fewest].pulls < self.config.min_pulls:
                return self._record(batch_size, bucket, fewest, "untried")
        greedy = self._greedy(bucket, batch_size)
        if self.config.epsilon > 0 and self._rng.random() < self.config.epsilon:
            candidate = arms[self._rng.randrange(len(arms))]
            if self._worth_exploring(bucket, candidate, greedy, batch_size):
                return self._record(batch_size, bucket, candidate, "explore")
        return self._record(batch_size, bucket, greedy, "exploit")

    def _worth_exploring(self, bucket: int, candidate: Strategy, greedy: Strategy, batch_size: int) -> bool:
        """Keep an exploration candidate with probability min(1, t_g / t_c) * min(1, v_c / v_g) (``t``: round time
        at this batch size, ``v``: estimated reward; ``g`` the greedy arm, ``c`` the candidate).

        The time factor spends exploration in proportion to time rather than rounds (at batch 256 a 32-token tree
        round costs dozens of plain rounds); the value factor explores an arm in proportion to how close it is
        to the best. The fraction of time lost to exploring one arm, (epsilon / arms) * r * (1 - r) with
        r = v_c / v_g, is then at most epsilon / (4 * arms), while arms near the best, the ones that may overtake
        it when acceptance drifts, are explored at nearly the full rate.
        """
        if not self.config.cost_aware_exploration or candidate == greedy:
            return True
        keep = 1.0
        mine, theirs = self.round_time(bucket, candidate, batch_size), self.round_time(bucket, greedy, batch_size)
        if mine is not None and theirs is not None:
            keep *= min(1.0, theirs / mine)
        value, _ = self.estimate(bucket, candidate, batch_size)
        best, _ = self.estimate(bucket, greedy, batch_size)
        if value is not None and best is not None and best > 0:
            keep *= min(1.0, value / best)
        return keep >= 1.0 or self._rng.random() < keep

    def observe(self, stats: RoundStats) -> None:
        """Credit the round's reward to its strategy in its batch size's bucket (rounds past ``bs_threshold``
        and strategies outside the bucket's arms are not learned from)."""
        threshold = self.config.bs_threshold
        if threshold is not None and stats.batch_size > threshold:
            return
        bucket = self._buckets.index(stats.batch_size)
        rewards = self._rewards[bucket].get(stats.strategy)
        if rewards is None:
            return
        accept_sum = stats.mean_accept_length * stats.batch_size
        rewards.add(RoundSample(stats.batch_size, stats.wall_time_s, accept_sum, self.reward(stats)))
        self._bucket_rounds[bucket] += 1
        self._last_batch[bucket] = stats.batch_size

    def reward(self, stats: RoundStats) -> float:
        """The configured reward of one round (see ``BanditConfig``)."""
        if self.config.reward == "accept_length":
            return stats.mean_accept_length
        return stats.goodput

    def estimate(self, bucket: int, arm: Strategy, batch_size: int) -> tuple[float | None, int | None]:
        """Estimated reward of ``arm`` at ``batch_size`` in ``bucket``, and the neighbouring bucket whose data it
        leans on (None when it uses only its own, or when no bucket has data).

        The estimate is decomposed. Accept length (tokens per request per round) is the window's rows-weighted
        mean, shrunk toward the nearest bucket that measured the arm with a prior worth ``borrow_rows`` rows
        (acceptance hardly depends on the batch size, so a bucket's first noisy rounds lean on its neighbour;
        with no rounds of its own, a bucket borrows the neighbour's estimate outright). Round time is the arm's
        measured time at this batch size, interpolated between the nearest measured ones (see ``round_time``):
        rewards in one bucket come from different batch sizes (the batch decays while an arm waits for its next
        pull), and this compares every arm at the batch size at hand. ``goodput`` = batch size * accept length /
        round time (tokens per second); ``accept_length`` = accept length.
        """
        own = self._rewards[bucket][arm]
        neighbour = self._neighbour(bucket, arm) if self.config.borrow_neighbours else None
        if not len(own) and neighbour is None:
            return None, None
        if len(own):
            accept_length = own.accept_length()
            if neighbour is not None:
                prior, rows = self._rewards[neighbour][arm], self.config.borrow_rows
                accept_length = (own.accept_sum() + rows * prior.accept_length()) / (own.rows() + rows)
        else:
            accept_length = self._rewards[neighbour][arm].accept_length()
        if self.config.reward == "accept_length":
            return accept_length, neighbour
        seconds = self.round_time(bucket if len(own) else neighbour, arm, batch_size)
        return batch_size * accept_length / seconds, neighbour

    def round_time(self, bucket: int, arm: Strategy, batch_size: int) -> float | None:
        """Round time of ``arm`` at ``batch_size`` from ``bucket``'s measurements (None if it has none).

        Linear between the nearest measured batch sizes; outside them, the nearest measurement scaled by how the
        time of the most-pulled arm measured at both batch sizes changes between them (unscaled if none is).
        """
        rewards = self._rewards[bucket][arm]
        seconds = rewards.interpolated_time(batch_size)
        if seconds is not None:
            return seconds
        nearest = rewards.nearest_size(batch_size)
        if nearest is None:
            return None
        references = sorted(self._rewards[bucket].items(), key=lambda item: -item[1].pulls)
        for other, reference in references:
            if other == arm:
                continue
            here, there = reference.interpolated_time(batch_size), reference.interpolated_time(nearest)
            if here is not None and there is not None:
                return rewards.times[nearest] * here / there
        return rewards.times[nearest]

    def _neighbour(self, bucket: int, arm: Strategy) -> int | None:
        """The nearest other bucket with rounds of ``arm`` (more rows wins at equal distance)."""
        for distance in range(1, len(self._arms)):
            found = [
                other
                for other in (bucket - distance, bucket + distance)
                if 0 <= other < len(self._arms) and arm in self._rewards[other] and len(self._rewards[other][arm])
            ]
            if found:
                return max(found, key=lambda other: self._rewards[other][arm].rows())
        return None

    def _greedy(self, bucket: int, batch_size: int) -> Strategy:
        """The arm with the best estimate (first in arm order on ties; the first arm if none has an estimate)."""
        best_arm, best_value = self._arms[bucket][0], None
        for arm in self._arms[bucket]:
            value, _ = self.estimate(bucket, arm, batch_size)
            if value is not None and (best_value is None or value > best_value):
                best_arm, best_value = arm, value
        return best_arm

    def _record(self, batch_size: int, bucket: int, strategy: Strategy, reason: str) -> Strategy:
        if self.config.timeline_limit > 0:
            self._timeline.append(ChoiceRecord(self._round, batch_size, bucket, strategy, reason))
            if len(self._timeline) > self.config.timeline_limit:
                del self._timeline[: len(self._timeline) - self.config.timeline_limit]
        self._round += 1
        return strategy

    def telemetry(self) -> BanditTelemetry:
        """Per (bucket, arm) pulls and mean rewards, and the timeline of recent choices."""
        buckets = []
        for index, arms in enumerate(self._arms):
            rows = []
            for arm in arms:
                rewards = self._rewards[index][arm]
                value, source = self.estimate(index, arm, self._last_batch[index])
                rows.append(
                    ArmTelemetry(arm, rewards.pulls, rewards.window_mean(), rewards.all_time_mean(), value, source)
                )
            buckets.append(BucketTelemetry(index, self._buckets.label(index), self._bucket_rounds[index], rows))
        return BanditTelemetry(buckets, list(self._timeline))

    def state_dict(self) -> dict:
        """Config, RNG state, every window and total, and the timeline: a resumed run continues identically."""
        version, internal, gauss = self._rng.getstate()
        return {
            "version": STATE_VERSION,
            "config": dataclasses.asdict(self.config),
            "rng": [version, list(internal), gauss],
            "round": self._round,
            "bucket_rounds": list(self._bucket_rounds),
            "last_batch": list(self._last_batch),
            "rewards": [{str(arm): r.state() for arm, r in bucket.items()} for bucket in self._rewards],
            "timeline": [[c.round, c.batch_size, c.bucket, str(c.strategy), c.reason] for c in self._timeline],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``; the saved config must equal this policy's."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"bandit state version {state.get('version')!r} != {STATE_VERSION}")
        saved = BanditConfig.from_dict(state["config"])
        if saved != self.config:
            raise ValueError("bandit state_dict was saved with a different BanditConfig")
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self._round = int(state["round"])
        self._bucket_rounds = [int(n) for n in state["bucket_rounds"]]
        self._last_batch = [int(n) for n in state["last_batch"]]
        for bucket, saved_bucket in zip(self._rewards, state["rewards"], strict=True):
            for arm, rewards in bucket.items():
                rewards.load(saved_bucket[str(arm)])
        self._timeline = [
            ChoiceRecord(int(r), int(b), int(k), Strategy.parse(s), reason) for r, b, k, s, reason in state["timeline"]
        ]
