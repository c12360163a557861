"""The bandit: picks the strategy of every decode round by predicted goodput, and explores only where it might win.

Goodput is decomposed: batch size x tokens per row / round time. Tokens per row come from per-depth acceptance
shared by every arm of one draft source (``DepthAcceptance``: a round of any EAGLE arm teaches all of them; an arm
never pulled is predicted from its family). Round time comes from a calibration at engine start times the machine's
current load times a slow per-arm bias, both learned from every round run (``RoundTimes``). Each round takes the arm
with the best predicted goodput at the batch size at hand, unless another arm predicted within ``explore_within`` of
it (or with fewer own rows than ``prior_rows``, whose prediction is only its prior) has an optimistic goodput (tokens
per row raised by its standard error, see ``BanditConfig.epsilon``) that beats that prediction and the exploration
credit (``explore_budget``) covers its predicted loss: then the most optimistic one is pulled to learn, and the
credit pays the loss with the tokens the round really emitted (its predicted time less the time the best arm's
predicted goodput needs for those tokens), so acceptance that flatters an arm cannot stretch exploration past the
budget, while the machine's load swings, which every arm shares, are not charged to exploration. Acceptance
does not depend on the batch size, so an arm predicted to lose clearly at one batch size is learned where it is
close (at small batch, where verifying a tree is nearly free), never where a pull is costly (a 32-token tree at
batch 256); an arm with no time at all (no calibration) is pulled ``min_pulls`` times to time it, then once near
each batch size its time there is still the prior's guess (``TIMED_LOG_STD``). Every
``anchor_every`` rounds without a plain round, one is run (credit permitting): plain's cost, the reference of the
speedup estimate, is then measured under the load of the moment.

An exploit decision holds for ``decide_every_s`` seconds of rounds at its batch size and those near it in its bucket
(a ``_Stretch``, ``STRETCH_SLACK``), unless the credit comes to cover an exploration or a plain anchor falls due;
those rounds' statistics are queued and learned, in order and exactly as one by one, at the next decision:
predicting every arm costs ~0.2 ms beside a model's forward, a few percent of a batch-1 round on a CPU, and nothing
beside a large batch's round.

Choices are per batch size; the buckets (``bs_thresholds``) group telemetry, the exported per-bucket winners and
``bucket_strategies``. The selector also knows what a plain round costs at every batch size, so it estimates what
plain decoding would have taken for each round's tokens (``plain_time_estimate``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fastrl.adaptive.arm_rewards import ArmRewards
from fastrl.adaptive.bandit_config import CHANGEABLE_ON_LOAD, BanditConfig
from fastrl.adaptive.bandit_state_check import STATE_VERSION, check_state_values, check_state_version
from fastrl.adaptive.bandit_telemetry import ArmTelemetry, BanditTelemetry, BucketTelemetry, ChoiceRecord
from fastrl.adaptive.catch_up import CatchUpCosts
from fastrl.adaptive.chain_depth import ChainRounds
from fastrl.adaptive.config_changes import check_same_config
from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.depth_acceptance import DepthAcceptance
from fastrl.adaptive.round_times import TIMED_LOG_STD, RoundTimes
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

RESUMED_KEYS = (
    "pulls",
    "round",
    "explore_credit",
    "explore_seconds",
    "since_plain",
    "bucket_rounds",
    "last_batch",
    "rewards",
    "timeline",
)
"""Entries ``load_state_dict`` restores besides what ``warm_start`` takes (a warm start reads states without them)."""
RESUMED_NULLABLE_KEYS = ("explore_best",)
"""Entries ``load_state_dict`` restores that may be null, but must be there."""
STRETCH_SLACK = 16
"""A stretch decided at batch size ``b`` also holds at batch sizes within ``b // STRETCH_SLACK`` of it (in its bucket):
in continuous batching a request finishing and the next one's admission move a batch of 16 between 15 and 16 every
few rounds, and deciding afresh at each move cost the bandit 0.5 ms a decision (167 of 400 decisions on 64 short
prompts x 4 at batch 16, where a plain round takes 3 ms). The simulator, where deciding is free, puts the bandit at
0.968-1.102x the per-bucket oracle with a slack of b // 8, 0.978-1.085x with b // 16, 0.983-1.098x with none
(`tests/adaptive/test_changing_load.py`'s nine cases)."""
MAX_UNLEARNED = 64
"""Most observed rounds queued unlearned (rounds of a stretch shorter than a ms each)."""
CHAIN_TOKENS_PRIOR = 8.0
"""Rounds of a stopping chain at a batch-size bin that weigh as much as no correction of its tokens per row there
(``ChainRounds.tokens_ratio``)."""


@dataclass
class _Stretch:
    """An exploit decision, what its rounds have taken so far, and what would change the decision without any
    learning: an exploration the credit comes to cover, or a plain anchor falling due."""

    strategy: Strategy
    batch_size: int
    credit: float
    """The exploration credit, counting the stretch's rounds (``observe`` adds them)."""
    explore_cost: float | None = None
    """The least credit a hopeful arm's pull (or a due anchor) waits for; None: none waits."""
    anchor_in: int | None = None
    """Rounds until a plain anchor falls due; None: none will."""
    seconds: float = 0.0
    rounds: int = 0

    def covers(self, batch_size: int, limit_s: float) -> bool:
        """True when a round at ``batch_size`` (within ``STRETCH_SLACK`` of the decision's) may run this decision's
        strategy undecided."""
        waiting = self.explore_cost is not None and self.credit >= self.explore_cost
        due = self.anchor_in is not None and self.rounds >= self.anchor_in
        near = abs(batch_size - self.batch_size) <= self.batch_size // STRETCH_SLACK
        return near and self.seconds < limit_s and not waiting and not due


class BanditSelector:
    """A ``StrategySelector`` choosing by predicted goodput per batch size (see the module docstring)."""

    def __init__(self, config: BanditConfig | None = None, calibration: CostModel | None = None) -> None:
        self.config = config or BanditConfig()
        self.config.validate()
        self._buckets = self.config.buckets()
        self._arms = self.config.arms_per_bucket()
        self._strategies = self.config.all_strategies()
        self._z = self.config.exploration_z()
        self._acceptance = DepthAcceptance(self._strategies, self.config.prior_rows, self.config.memory_rows())
        self._chain_rounds = ChainRounds()  # what stopping chains reached per batch-size bin (depth, tokens per row)
        self._times = RoundTimes(calibration, chain_depth=self.config.chain_depth, chains=self._chain_rounds)
        self._catch_up = CatchUpCosts()  # what a pull now costs its draft sources in catching up
        self._rewards = [{arm: ArmRewards() for arm in arms} for arms in self._arms]
        self._pulls = {arm: 0 for arm in self._strategies}
        self._bucket_rounds = [0] * len(self._arms)
        self._last_batch = list(self._buckets.thresholds)
        self._round = 0
        self._credit = 0.0  # seconds of exploration the budget still allows
        # When the round in flight explores: the best arm's predicted goodput and the pulled arm's predicted time.
        self._explore_best: float | None = None
        self._explore_seconds = 0.0
        self._timed_by_state: set[Strategy] = set()  # arms a warm start brought round times of
        self._since_plain = 0  # rounds learned from since the last plain one
        self._memo: dict[tuple[Strategy, int, float, float | None], float | None] = {}
        self._timeline: list[ChoiceRecord] = []
        self._unlearned: list[RoundStats] = []  # observed rounds not learned yet, oldest first
        self._stretch: _Stretch | None = None
        self._last_reason: str | None = None

    @property
    def acceptance(self) -> DepthAcceptance:
        """Per-depth acceptance of every arm, every observed round learned."""
        self._learn()
        return self._acceptance

    @property
    def times(self) -> RoundTimes:
        """Round times of every arm, every observed round learned."""
        self._learn()
        return self._times

    @property
    def last_reason(self) -> str | None:
        """Why the last choice was made (one of ``CHOICE_REASONS``; None before any)."""
        return self._last_reason

    @property
    def strategies(self) -> list[Strategy]:
        """Every strategy ``choose`` may return."""
        return list(self._strategies)

    def reached_depth(self, arm: Strategy, batch_size: int) -> float | None:
        """The mean depth the stopping chain ``arm`` reached in rounds at about ``batch_size`` (None before any)."""
        return self._chain_rounds.depth(arm, batch_size)

    @property
    def calibrated(self) -> bool:
        """Whether the round times start from a calibration (``set_calibration``, or a state that had one)."""
        return self._times.calibration() is not None

    def set_calibration(self, calibration: CostModel) -> None:
        """Use ``calibration``'s round times (what rounds taught so far keeps correcting them)."""
        self._learn()
        self._memo.clear()
        self._stretch = None
        self._times.set_calibration(calibration)

    def set_prior_hazard(self, hazard: float) -> None:
        """Start the drafter's arms from its held-out per-depth acceptance ``hazard`` (see ``DepthAcceptance``)."""
        self._learn()
        self._memo.clear()
        self._stretch = None
        self._acceptance.set_prior_hazard(hazard)

    def choose(self, batch_size: int) -> Strategy:
        """The arm of ``batch_size``'s bucket with the best predicted goodput, or one that might beat it (the
        current stretch's arm while it holds)."""
        bucket = self._buckets.index(batch_size)
        threshold = self.config.bs_threshold
        if threshold is not None and batch_size > threshold:
            return self._record(batch_size, bucket, DISABLE, "bs_threshold")
        stretch = self._stretch
        same_bucket = stretch is not None and self._buckets.index(stretch.batch_size) == bucket  # the same arms
        if same_bucket and stretch.covers(batch_size, self.config.decide_every_s):  # type: ignore[union-attr]
            return self._record(batch_size, bucket, stretch.strategy, "held")
        self._stretch = None
        self._learn()
        arms = self._arms[bucket]
        for arm in arms:
            if self._untimed(arm, batch_size):
                return self._record(batch_size, bucket, arm, "untimed")
        best, best_value = self._best(arms, batch_size, 0.0)
        waiting: list[Strategy] = []  # arms that might beat the best once the credit covers their pull
        if self._z > 0.0 and best_value is not None:
            floor = self.config.explore_within * best_value
            near = [arm for arm in arms if self._unknown(arm) or (self.predict(arm, batch_size) or 0.0) >= floor]
            # the most hopeful arm the credit covers: a costly hopeful arm (a deep tree at a large batch) does not
            # hold back a cheap one, whose pull teaches the acceptance that every arm of its source shares
            covered = [arm for arm in near if self._affordable(arm, batch_size, best_value)]
            hopeful, hope = self._best(covered, batch_size, self._z) if covered else (best, None)
            if hopeful != best and hope is not None and hope > best_value:
                self._explore(hopeful, batch_size, best_value)
                return self._record(batch_size, bucket, hopeful, "explore")
            hoping = [arm for arm in near if arm not in covered and arm != best]
            waiting = [arm for arm in hoping if (self.predict(arm, batch_size, self._z) or 0.0) > best_value]
        anchor = self._anchor_due(arms, best) and best_value is not None
        if anchor and self._affordable(DISABLE, batch_size, best_value):
            self._explore(DISABLE, batch_size, best_value)
            return self._record(batch_size, bucket, DISABLE, "anchor")
        if anchor:
            waiting.append(DISABLE)
        self._stretch = self._stretch_of(best, batch_size, bucket, best_value, waiting)
        return self._record(batch_size, bucket, best, "exploit")

    def _untimed(self, arm: Strategy, batch_size: int) -> bool:
        """True while ``arm`` (neither calibrated nor timed by a loaded state) needs a round at ``batch_size`` to be
        timed: its first ``min_pulls`` rounds, then one wherever its rounds left its time at this batch size as
        uncertain as the prior makes it (``TIMED_LOG_STD``): timed at the first, largest batch size only, a deep tree
        was priced at batch 1 as at 64 and never pulled where it wins."""
        if self._times.has_calibration(arm) or arm in self._timed_by_state:
            return False
        if self._pulls[arm] < self.config.min_pulls:
            return True
        spread = self._times.log_std(arm, batch_size)
        return spread is None or spread > TIMED_LOG_STD

    def _stretch_of(
        self, best: Strategy, batch_size: int, bucket: int, best_value: float | None, waiting: list[Strategy]
    ) -> _Stretch:
        """The stretch an exploit decision of ``best`` starts: it ends once the credit covers a ``waiting`` arm's
        pull or a plain anchor falls due, as deciding every round would then change the choice."""
        cost = None
        if waiting and best_value is not None:
            cost = min(self._exploration_cost(arm, batch_size, best_value) for arm in waiting)
        every, arms = self.config.anchor_every, self._arms[bucket]
        anchors = every > 0 and self.config.reward == "goodput" and self._z > 0.0 and DISABLE in arms
        # an anchor already due waits among `waiting` for the credit to cover it: its cost ends the stretch
        anchor_in = max(0, every - self._since_plain) if anchors and DISABLE not in waiting + [best] else None
        return _Stretch(best, batch_size, self._credit, cost, anchor_in)

    def _affordable(self, arm: Strategy, batch_size: int, best_value: float) -> bool:
        """True when the exploration credit covers the predicted loss of a round of ``arm`` (always without a
        budget)."""
        budget = self.config.explore_budget
        return budget is None or self._exploration_cost(arm, batch_size, best_value) <= self._credit

    def _explore(self, arm: Strategy, batch_size: int, best_value: float) -> None:
        """Remember what the exploratory round of ``arm`` is charged against when ``observe`` sees it: its predicted
        time and its sources' catch-up."""
        seconds = (self._times.seconds(arm, batch_size) or 0.0) + self._catch_up.seconds(arm)
        self._explore_best, self._explore_seconds = best_value, seconds

    def _anchor_due(self, arms: list[Strategy], best: Strategy) -> bool:
        """True when ``anchor_every`` rounds ran without a plain one and plain is an arm here but not the best (only
        for the goodput reward, and only when the bandit explores at all)."""
        every, goodput = self.config.anchor_every, self.config.reward == "goodput"
        due = every > 0 and self._since_plain >= every and goodput and self._z > 0.0
        return due and DISABLE in arms and best != DISABLE

    def predict(self, arm: Strategy, batch_size: int, z: float = 0.0) -> float | None:
        """Predicted reward of one round of ``arm`` at ``batch_size`` (goodput: tokens per second), its acceptance
        raised by ``z`` standard errors; None while the arm's round time is unknown. Memoised until a round is
        learned, per context of the round times (a plain-time estimate moves it between learned rounds)."""
        self._learn()
        key = (arm, batch_size, z, self._times.context)
        if key not in self._memo:
            tokens = self._tokens_per_row(arm, batch_size, z)
            if self.config.reward == "accept_length":
                self._memo[key] = tokens
            else:
                seconds = self._times.seconds(arm, batch_size)
                self._memo[key] = None if seconds is None else batch_size * tokens / seconds
        return self._memo[key]

    def _tokens_per_row(self, arm: Strategy, batch_size: int, z: float = 0.0) -> float:
        """Tokens a row emits in a round of ``arm`` at ``batch_size``: the per-depth acceptance's prediction, raised by
        ``z`` standard errors; a stopping chain's scaled by how its rounds at this batch size's bin emitted against
        its rounds at every size (``ChainRounds.tokens_ratio``, shrunk toward 1 by ``CHAIN_TOKENS_PRIOR``), as its
        stop depends on the batch size while the acceptance pools every size."""
        tokens = self._acceptance.tokens_per_row(arm, z)
        if arm.stops_early and self.config.chain_depth:
            ratio, rounds = self._chain_rounds.tokens_ratio(arm, batch_size)
            weight = rounds / (rounds + CHAIN_TOKENS_PRIOR)
            tokens *= weight * ratio + (1.0 - weight)
        return tokens

    def _unknown(self, arm: Strategy) -> bool:
        """True while the arm's own acceptance rests on fewer rows than its prior: its prediction is the prior's."""
        return not arm.is_disabled and self._acceptance.rows(arm) < self.config.prior_rows

    def _exploration_cost(self, arm: Strategy, batch_size: int, best_value: float) -> float:
        """Predicted seconds a round of ``arm`` loses against the best arm (whose goodput is ``best_value``), its
        draft sources' catch-up on the text emitted without them included (``CatchUpCosts``)."""
        seconds, value = self._times.seconds(arm, batch_size), self.predict(arm, batch_size)
        if seconds is None or value is None:
            return 0.0
        return max(0.0, seconds * (1.0 - value / best_value)) + self._catch_up.seconds(arm)

    def _best(self, arms: list[Strategy], batch_size: int, z: float) -> tuple[Strategy, float | None]:
        """The arm with the highest prediction (first in arm order on ties; the first arm if none has one)."""
        best, best_value = arms[0], None
        for arm in arms:
            value = self.predict(arm, batch_size, z)
            if value is not None and (best_value is None or value > best_value):
                best, best_value = arm, value
        return best, best_value

    def observe(self, stats: RoundStats) -> None:
        """Queue the round to learn from at the next decision (rounds past ``bs_threshold`` and strategies outside
        the arms teach nothing); ``MAX_UNLEARNED`` queued rounds are learned at once."""
        threshold = self.config.bs_threshold
        if (threshold is not None and stats.batch_size > threshold) or stats.strategy not in self._pulls:
            return
        stretch = self._stretch
        if stretch is not None:
            stretch.seconds += stats.wall_time_s
            stretch.rounds += 1
            stretch.credit += (self.config.explore_budget or 0.0) * stats.wall_time_s
        self._unlearned.append(stats)
        if len(self._unlearned) >= MAX_UNLEARNED:
            self._learn()

    def _learn(self) -> None:
        """Learn the queued rounds, oldest first."""
        if self._unlearned:
            rounds, self._unlearned = self._unlearned, []
            for stats in rounds:
                self._learn_round(stats)

    def _learn_round(self, stats: RoundStats) -> None:
        """Learn acceptance and round time from one round; its time without its ``catch_up_time_s`` (the history
        index, or after rounds without the drafter the drafter, catching up on text emitted before it: a drafter arm
        pulled among plain rounds would otherwise be timed by its catch-ups, or, were they left out, never)."""
        self._memo.clear()
        self._acceptance.observe(stats)
        self._times.observe_round(stats)
        self._catch_up.observe(stats)
        self._pulls[stats.strategy] += 1
        self._since_plain = 0 if stats.strategy.is_disabled else self._since_plain + 1
        if self.config.explore_budget is not None:
            self._credit += self.config.explore_budget * stats.wall_time_s
            if self._explore_best is not None:  # an exploratory round pays for the tokens it failed to emit
                self._credit -= max(0.0, self._explore_seconds - stats.total_emitted / self._explore_best)
        self._explore_best = None
        bucket = self._buckets.index(stats.batch_size)
        rewards = self._rewards[bucket].get(stats.strategy)
        if rewards is not None:
            rewards.add(self.reward(stats), 1.0 / self.config.window_size)
        self._bucket_rounds[bucket] += 1
        self._last_batch[bucket] = stats.batch_size

    def reward(self, stats: RoundStats) -> float:
        """The configured reward of one round (see ``BanditConfig``)."""
        return stats.mean_accept_length if self.config.reward == "accept_length" else stats.goodput

    def plain_time_estimate(self, stats: RoundStats) -> float:
        """Seconds plain decoding would have taken for a round's tokens: its own time for a plain round, else the
        plain round time at its batch size and context (as the rounds learned so far say: queued ones are not learned
        for it) x the tokens emitted per row (0.0 while plain's time is unknown)."""
        return self._times.plain_estimate(stats)

    def _record(self, batch_size: int, bucket: int, strategy: Strategy, reason: str) -> Strategy:
        self._last_reason = reason
        self._timeline.append(ChoiceRecord(self._round, batch_size, bucket, strategy, reason))
        self._trim_timeline()
        self._round += 1
        return strategy

    def _trim_timeline(self) -> None:
        """Keep the ``timeline_limit`` most recent choices (none for 0)."""
        excess = len(self._timeline) - self.config.timeline_limit
        if excess > 0:
            del self._timeline[:excess]

    def telemetry(self) -> BanditTelemetry:
        """Per (bucket, arm) pulls, mean rewards and the prediction at the bucket's last batch size; the timeline."""
        self._learn()
        buckets = []
        for index, arms in enumerate(self._arms):
            batch, rows = self._last_batch[index], []
            for arm in arms:
                r = self._rewards[index][arm]
                tokens, seconds = self._tokens_per_row(arm, batch), self._times.seconds(arm, batch)
                value = self.predict(arm, batch)
                rows.append(ArmTelemetry(arm, r.pulls, r.recent_mean(), r.all_time_mean(), value, tokens, seconds))
            buckets.append(BucketTelemetry(index, self._buckets.label(index), self._bucket_rounds[index], rows))
        return BanditTelemetry(buckets, list(self._timeline))

    def state_dict(self) -> dict:
        """Config, calibration, acceptance counts, round times, per-bucket rewards, the stretch in progress and the
        timeline (plain data; the queued rounds are learned first): a resumed run continues identically, and
        ``warm_start`` carries what was learned into another run."""
        self._learn()
        calibration = self._times.calibration()
        stretch = self._stretch
        return {
            "version": STATE_VERSION,
            "config": dataclasses.asdict(self.config),
            "calibration": None if calibration is None else calibration.rows(),
            "acceptance": self._acceptance.state(),
            "times": self._times.state(),
            "chain_rounds": self._chain_rounds.state(),
            "catch_up": self._catch_up.state(),
            "pulls": {str(arm): n for arm, n in self._pulls.items()},
            "round": self._round,
            "explore_credit": self._credit,
            "explore_best": self._explore_best,
            "explore_seconds": self._explore_seconds,
            "timed_by_state": sorted(str(arm) for arm in self._timed_by_state),
            "since_plain": self._since_plain,
            "bucket_rounds": list(self._bucket_rounds),
            "last_batch": list(self._last_batch),
            "rewards": [{str(arm): r.state() for arm, r in bucket.items()} for bucket in self._rewards],
            "timeline": [[c.round, c.batch_size, c.bucket, str(c.strategy), c.reason] for c in self._timeline],
            "stretch": None if stretch is None else dataclasses.asdict(stretch) | {"strategy": str(stretch.strategy)},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict`` exactly; the saved config must equal this selector's but in ``CHANGEABLE_ON_LOAD``
        (a smaller ``timeline_limit`` keeps the most recent choices of the saved timeline). Every entry is checked
        first (``check_state_values``): a damaged state is one ValueError naming its entry, and nothing is loaded."""
        check_same_config("bandit", check_state_values(state), self.config, CHANGEABLE_ON_LOAD)
        missing = [key for key in RESUMED_KEYS if state.get(key) is None]  # what warm_start may do without
        missing += [key for key in RESUMED_NULLABLE_KEYS if key not in state]
        if missing:
            raise ValueError(f"a bandit state to resume from needs {missing}")
        stretch = state.get("stretch")
        if stretch is not None:  # checked before anything is loaded
            arms = self._arms[self._buckets.index(stretch["batch_size"])]
            if Strategy.parse(stretch["strategy"]) not in arms:  # it would be chosen where its bucket has no such arm
                names = [str(arm) for arm in arms]
                raise ValueError(
                    f"stretch.strategy {stretch['strategy']} is none of the arms {names} of batch size "
                    f"{stretch['batch_size']}'s bucket"
                )
        for i, (bucket, saved) in enumerate(zip(self._rewards, state["rewards"], strict=True)):
            if set(saved) != {str(arm) for arm in bucket}:
                raise ValueError(
                    f"rewards[{i}] holds arms {sorted(saved)}, this bandit's bucket {i} has {sorted(map(str, bucket))}"
                )
        self.warm_start(state)
        self._pulls = {arm: int(state["pulls"].get(str(arm), 0)) for arm in self._strategies}
        timed = set(state.get("timed_by_state", []))  # absent from states saved before warm starts kept it
        self._timed_by_state = {arm for arm in self._strategies if str(arm) in timed}
        if "catch_up" in state:  # absent from states saved before catch-ups were charged
            self._catch_up.load(state["catch_up"])
        self._round = int(state["round"])
        self._credit = float(state["explore_credit"])
        best = state["explore_best"]
        self._explore_best = None if best is None else float(best)
        self._explore_seconds = float(state["explore_seconds"])
        self._since_plain = int(state["since_plain"])
        self._bucket_rounds = [int(n) for n in state["bucket_rounds"]]
        self._last_batch = [int(n) for n in state["last_batch"]]
        self._rewards = [
            {arm: ArmRewards.load(saved[str(arm)]) for arm in bucket}
            for bucket, saved in zip(self._rewards, state["rewards"], strict=True)
        ]
        self._timeline = [
            ChoiceRecord(int(r), int(b), int(k), Strategy.parse(s), reason) for r, b, k, s, reason in state["timeline"]
        ]
        self._trim_timeline()  # a state saved under a larger timeline_limit
        stretch = state.get("stretch")  # absent from states saved before stretches: decide at the next round
        self._stretch = (
            None if stretch is None else _Stretch(**(stretch | {"strategy": Strategy.parse(stretch["strategy"])}))
        )

    def warm_start(self, state: dict, calibration: bool = True) -> None:
        """Take the calibration, acceptance counts and round times of a saved state, whatever its config (arms
        outside this selector's are ignored): a new run or RL step starts from what an earlier one learned.
        ``calibration=False`` keeps this selector's own calibration (a run that measured its arms at its batch
        sizes keeps those, and learns only acceptance and round times from the state)."""
        check_state_version(state)
        self._learn()
        self._stretch = None
        if calibration and state.get("calibration"):
            self.set_calibration(CostModel.from_rows(state["calibration"], "bandit state calibration"))
        self._acceptance.load(state["acceptance"])
        self._times.load_state(state["times"])
        self._timed_by_state = {arm for arm in self._strategies if self._times.has_measured(arm)}  # no forced pulls
        self._chain_rounds.load(state.get("chain_rounds", {}))  # absent from states saved before stopping chains'
        self._catch_up = CatchUpCosts()
        if "catch_up" in state:  # the rates: what catching up costs this model and machine
            self._catch_up.load(state["catch_up"], backlog=False)
        self._memo.clear()
