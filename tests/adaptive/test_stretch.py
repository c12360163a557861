"""Exploit decisions that hold for a stretch of rounds: the rounds are queued, then learned exactly as one by one;
the stretch ends when its time is spent, at a batch size not near its own (or in another bucket), when the credit
covers a hopeful arm, or when a plain anchor falls due."""

import random

import pytest

from fastrl.adaptive.bandit import MAX_UNLEARNED, STRETCH_SLACK, BanditSelector, _Stretch
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.strategy.strategy import DISABLE, Strategy

from .test_bandit import SPACE, calibration, environment


def fed(rounds: int, seed: int, learn_each: bool) -> BanditSelector:
    """A bandit that decided once at batch 1 (a stretch longer than the run), then observed ``rounds`` rounds of
    mixed arms; `learn_each`: each learned as it is observed (the reference), else queued."""
    bandit = BanditSelector(BanditConfig(strategies=SPACE, decide_every_s=100.0), calibration(SPACE))
    bandit.choose(1)
    rng = random.Random(seed)
    for _ in range(rounds):
        bandit.observe(environment(Strategy.parse(rng.choice(SPACE)), rng.choice([1, 1, 3]), rng))
        if learn_each:
            bandit._learn()
    return bandit


@pytest.mark.parametrize("rounds", [0, 1, 7, MAX_UNLEARNED - 1, MAX_UNLEARNED, 3 * MAX_UNLEARNED + 5])
def test_queued_rounds_are_learned_as_one_by_one(rounds):
    queued, each = fed(rounds, rounds, learn_each=False), fed(rounds, rounds, learn_each=True)
    assert len(queued._unlearned) == rounds % MAX_UNLEARNED  # a full queue is learned at once
    assert not each._unlearned
    assert queued.acceptance.state() == each.acceptance.state()  # reading them learns the rest
    assert queued.times.state() == each.times.state()
    mine, theirs = queued.state_dict(), each.state_dict()
    for key in ("explore_credit", "pulls", "since_plain", "rewards", "acceptance", "times"):
        assert mine[key] == theirs[key], key


def test_a_stretch_holds_its_arm_at_its_batch_size_until_its_time_is_spent():
    config = BanditConfig(strategies=SPACE, decide_every_s=0.05, explore_budget=None, epsilon=0.0)
    bandit = BanditSelector(config, calibration(SPACE))
    rng = random.Random(0)
    first = bandit.choose(1)
    spent = 0.0
    while True:
        stats = environment(first, 1, rng)
        bandit.observe(stats)
        spent += stats.wall_time_s
        queued = len(bandit._unlearned)
        assert bandit.choose(1) == first
        if spent >= 0.05:
            assert not bandit._unlearned  # the decision after the stretch learned every queued round
            break
        assert len(bandit._unlearned) == queued  # undecided: nothing learned
    bandit.observe(environment(first, 1, rng))
    bandit.choose(2)  # another batch size: decided at once
    assert not bandit._unlearned
    reasons = [r.reason for r in bandit.telemetry().timeline]
    assert reasons[0] == reasons[-1] == "exploit" and set(reasons) == {"exploit", "held"}


def test_a_stretch_ends_when_the_credit_covers_a_hopeful_arm():
    """At the start no credit covers the pull of an arm that might beat the best: the stretch waits for it, and
    the round the credit covers it is decided (and explores), however long the stretch might have held."""
    config = BanditConfig(strategies=SPACE, decide_every_s=100.0, explore_budget=0.01, anchor_every=0)
    bandit = BanditSelector(config, calibration(SPACE))
    rng = random.Random(2)
    first = bandit.choose(1)
    cost = bandit._stretch.explore_cost
    assert cost is not None and cost > 0.0
    credit = 0.0
    for _ in range(200):
        stats = environment(first, 1, rng)
        bandit.observe(stats)
        credit += config.explore_budget * stats.wall_time_s
        strategy = bandit.choose(1)
        if credit >= cost:
            assert not bandit._unlearned  # decided
            assert bandit.telemetry().timeline[-1].reason == "explore" and strategy != first
            return
        assert strategy == first and bandit._unlearned
    raise AssertionError("the credit never covered the hopeful arm")


def test_a_stretch_ends_when_a_plain_anchor_falls_due():
    config = BanditConfig(strategies=SPACE, decide_every_s=100.0, anchor_every=16)
    bandit = BanditSelector(config, calibration(SPACE))
    rng = random.Random(2)
    for _ in range(100):  # until a speculative arm's exploit decision
        strategy = bandit.choose(1)
        if bandit._stretch is not None and strategy != DISABLE:
            break
        bandit.observe(environment(strategy, 1, rng))
    stretch, since = bandit._stretch, bandit.state_dict()["since_plain"]
    assert stretch.anchor_in == max(0, 16 - since)
    stretch.explore_cost = None  # no exploration waits: only the anchor ends it
    for _ in range(stretch.anchor_in):
        assert stretch.covers(1, 100.0)
        bandit.observe(environment(stretch.strategy, 1, rng))
    assert not stretch.covers(1, 100.0)
    assert not _Stretch(stretch.strategy, 8, 0.0).covers(9, 100.0)  # another batch size
    assert not _Stretch(stretch.strategy, 8, 0.0, seconds=0.05).covers(8, 0.05)  # its time spent


def test_the_stretch_survives_a_state_round_trip():
    config = BanditConfig(strategies=SPACE, decide_every_s=100.0)
    bandit = BanditSelector(config, calibration(SPACE))
    rng = random.Random(3)
    first = bandit.choose(4)
    bandit.observe(environment(first, 4, rng))
    restored = BanditSelector(config, calibration(SPACE))
    restored.load_state_dict(bandit.state_dict())
    assert restored.state_dict() == bandit.state_dict()
    assert restored.choose(4) == bandit.choose(4) == first
    assert isinstance(restored._stretch.strategy, Strategy)


def test_a_stretch_of_no_arm_of_the_bandit_is_refused_on_load():
    """A damaged state's stretch naming a strategy outside the arms loaded, and `choose` returned that strategy."""
    config = BanditConfig(strategies=SPACE, decide_every_s=100.0)
    bandit = BanditSelector(config, calibration(SPACE))
    bandit.observe(environment(bandit.choose(4), 4, random.Random(3)))
    state = bandit.state_dict()
    state["stretch"] = state["stretch"] | {"strategy": "12_4_64"}
    restored = BanditSelector(config, calibration(SPACE))
    with pytest.raises(ValueError, match=r"stretch.strategy 12_4_64 is none of the arms .* of batch size 4's bucket"):
        restored.load_state_dict(state)


def test_a_stretch_of_an_arm_of_another_bucket_or_of_negative_time_is_refused_on_load():
    """An arm of the bandit but not of the stretch's bucket was taken, and choose() returned it there; a stretch
    of -1e300 seconds held its arm for every later round."""
    from fastrl.adaptive.bandit_state_check import check_state_values

    config = BanditConfig(strategies=SPACE, bucket_strategies={1: [SPACE[0]]}, decide_every_s=100.0)
    bandit = BanditSelector(config, calibration(SPACE))
    bandit.observe(environment(bandit.choose(4), 4, random.Random(3)))
    state = bandit.state_dict()
    state["stretch"] = state["stretch"] | {"batch_size": 1, "strategy": str(SPACE[1])}
    restored = BanditSelector(config, calibration(SPACE))
    fresh = restored.state_dict()
    with pytest.raises(ValueError, match=rf"stretch.strategy {SPACE[1]} is none of the arms \['{SPACE[0]}'\] of"):
        restored.load_state_dict(state)
    assert restored.state_dict() == fresh  # refused before anything was loaded
    state = bandit.state_dict()
    for key, value in (("stretch", state["stretch"] | {"seconds": -1e300}), ("explore_seconds", -2.0)):
        with pytest.raises(ValueError, match=f"{key}.* expected a number >= 0"):
            check_state_values(state | {key: value})


def test_a_stretch_holds_at_batch_sizes_near_its_own_in_its_bucket():
    """A request finishing and the next one's admission move a batch by a row: a stretch at batch ``b`` holds within
    ``b // STRETCH_SLACK`` rows of it (exactly its own below ``STRETCH_SLACK``), and never into another bucket,
    whose arms may differ."""
    stretch = _Stretch(DISABLE, 2 * STRETCH_SLACK, 0.0)
    assert all(stretch.covers(b, 1.0) for b in (2 * STRETCH_SLACK - 2, 2 * STRETCH_SLACK + 2))
    assert not stretch.covers(2 * STRETCH_SLACK - 3, 1.0) and not stretch.covers(2 * STRETCH_SLACK + 3, 1.0)
    assert not _Stretch(DISABLE, STRETCH_SLACK - 1, 0.0).covers(STRETCH_SLACK, 1.0)
    config = BanditConfig(strategies=SPACE, bs_thresholds=[1, 33], decide_every_s=100.0, epsilon=0.0)
    bandit = BanditSelector(config, calibration(SPACE))
    rng = random.Random(0)
    first = bandit.choose(32)
    bandit.observe(environment(first, 32, rng))
    assert bandit.choose(31) == first and bandit.last_reason == "held"  # a row less: the same decision
    bandit.observe(environment(first, 31, rng))
    bandit.choose(33)  # a row more, but bucket 33+: decided afresh
    assert bandit.last_reason != "held" and not bandit._unlearned


def test_a_config_given_tuples_loads_its_own_saved_state():
    """Tuples passed validation, but the state saved from them (JSON lists) was refused by the same config: "saved
    [1, 2, 5, 21], this selector's (1, 2, 5, 21)"."""
    import json

    def config() -> BanditConfig:
        return BanditConfig(strategies=tuple(SPACE), bs_thresholds=(1, 2, 5, 21))

    state = json.loads(json.dumps(BanditSelector(config()).state_dict()))
    restored = BanditSelector(config())
    restored.load_state_dict(state)
    assert restored.state_dict() == state
