"""EMA tier controller: SGLang's update rule, config loading, phase tracking."""

import json
import random

import pytest

from fastrl.adaptive.ema import EmaSelector, chain_strategy
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy


def round_with(strategy: Strategy, accepted: list[int]) -> RoundStats:
    drafted = 0 if strategy.is_disabled else strategy.num_draft_tokens - 1
    return RoundStats(strategy, len(accepted), [drafted] * len(accepted), accepted, [a + 1 for a in accepted], 0.01)


def chain_round(policy: EmaSelector, rng: random.Random, hit: float, batch: int = 4) -> int:
    """One round where each draft token is accepted with probability ``hit`` until the first miss."""
    strategy = policy.choose(batch)
    accepted = []
    for _ in range(batch):
        n = 0
        while n < strategy.steps and rng.random() < hit:
            n += 1
        accepted.append(n)
    policy.observe(round_with(strategy, accepted))
    return strategy.steps


def test_defaults_match_sglang():
    config = EmaConfig()
    assert config.candidate_steps == [1, 3, 7]
    assert (config.ema_alpha, config.warmup_batches, config.update_interval) == (0.2, 10, 5)
    assert (config.down_hysteresis, config.up_hysteresis) == (-0.25, 0.0)
    policy = EmaSelector(config)
    assert policy.current_steps == 3  # the middle tier
    assert policy.ema_accept == 2.0  # neutral start: steps - 1
    assert policy.strategies == [Strategy(1, 1, 2), Strategy(3, 1, 4), Strategy(7, 1, 8)]
    assert policy.choose(1) == policy.choose(64) == Strategy(3, 1, 4)


def test_chain_strategy():
    assert chain_strategy(0) == DISABLE
    assert chain_strategy(5) == Strategy(5, 1, 6)


@pytest.mark.parametrize(("initial", "expected"), [(1, 1), (2, 1), (4, 3), (5, 3), (6, 7), (100, 7), (0, 1)])
def test_initial_steps_snap_to_nearest_tier(initial, expected):
    assert EmaSelector(EmaConfig(initial_steps=initial)).current_steps == expected


def test_ema_update_and_schedule():
    policy = EmaSelector(EmaConfig(initial_steps=3))
    strategy = policy.choose(2)
    # all drafts accepted: EMA rises toward 3 but no decision during the 10 warm-up rounds
    for i in range(10):
        policy.observe(round_with(strategy, [3, 3]))
        assert policy.current_steps == 3, i
    assert policy.ema_accept == pytest.approx(3 - 0.8**10)
    # rounds 11-14: still no decision (every 5th round after warm-up)
    for _ in range(4):
        policy.observe(round_with(strategy, [3, 3]))
        assert policy.current_steps == 3
    policy.observe(round_with(strategy, [3, 3]))  # round 15: ema > 3 - 0.5 + 0 -> up one tier
    assert policy.current_steps == 7


def test_step_down_needs_hysteresis_margin():
    # at tier 7 the drop threshold to tier 3 is 3 - 0.5 - 0.25 = 2.25; the rise threshold is 6.5
    policy = EmaSelector(EmaConfig(initial_steps=7, warmup_batches=0, update_interval=1, ema_alpha=1.0))
    policy.observe(round_with(Strategy(7, 1, 8), [2, 3]))  # ema 2.5 > 2.25: stay
    assert policy.current_steps == 7
    policy.observe(round_with(Strategy(7, 1, 8), [2, 2]))  # ema 2.0 <= 2.25: down to 3, not further
    assert policy.current_steps == 3
    policy.observe(round_with(Strategy(3, 1, 4), [0, 1]))  # 0.5 > 0.25 (drop to 1), <= 2.5 (rise): stay
    assert policy.current_steps == 3
    policy.observe(round_with(Strategy(3, 1, 4), [0, 0]))  # 0 <= 0.25: down to 1
    assert policy.current_steps == 1
    policy.observe(round_with(Strategy(1, 1, 2), [1, 1]))  # 1.0 > 0.5: up to 3 (and 1.0 <= 2.5: not 7)
    assert policy.current_steps == 3


def test_multi_tier_drop_in_one_update():
    policy = EmaSelector(EmaConfig(initial_steps=7, warmup_batches=0, update_interval=1, ema_alpha=1.0))
    policy.observe(round_with(Strategy(7, 1, 8), [0, 0, 0]))
    assert policy.current_steps == 1


def test_zero_tier_probes_upward():
    config = EmaConfig(candidate_steps=[0, 2], initial_steps=0, warmup_batches=0, update_interval=2, ema_alpha=1.0)
    policy = EmaSelector(config)
    assert policy.choose(8) == DISABLE
    assert policy.ema_accept == -1.0
    policy.observe(round_with(DISABLE, [0] * 8))
    assert policy.current_steps == 0
    policy.observe(round_with(DISABLE, [0] * 8))  # update: probe tier 2 with a neutral EMA
    assert policy.current_steps == 2
    assert policy.ema_accept == 1.0
    for _ in range(2):
        policy.observe(round_with(Strategy(2, 1, 3), [0] * 8))
    assert policy.current_steps == 0  # nothing accepted (ema <= 0.5 - 0.25): back to plain decoding


def test_tracks_acceptance_phases_within_bounded_rounds():
    """Acceptance rises: the depth climbs to the top tier; it falls: the depth drops to the bottom, each within
    a bounded number of rounds (EMA half-life ~3 rounds, decisions every 5)."""
    rng = random.Random(0)
    policy = EmaSelector(EmaConfig())
    history = [chain_round(policy, rng, hit=0.5) for _ in range(100)]
    assert history[-1] == 3  # mediocre acceptance keeps the middle tier
    rise = [chain_round(policy, rng, hit=0.97) for _ in range(60)]
    assert rise[-1] == 7
    assert rise.index(7) <= 40
    assert all(s == 7 for s in rise[rise.index(7) :])
    fall = [chain_round(policy, rng, hit=0.05) for _ in range(60)]
    assert fall[-1] == 1
    assert fall.index(1) <= 40
    assert fall.index(3) < fall.index(1)  # steps down through the middle tier
    back = [chain_round(policy, rng, hit=0.97) for _ in range(80)]
    assert back[-1] == 7


def test_state_dict_round_trip_continues_identically():
    rng = random.Random(1)
    policy = EmaSelector(EmaConfig())
    for _ in range(23):
        chain_round(policy, rng, hit=0.9)
    state = json.loads(json.dumps(policy.state_dict()))
    resumed = EmaSelector(EmaConfig())
    resumed.load_state_dict(state)
    rng_a, rng_b = random.Random(7), random.Random(7)
    a = [chain_round(policy, rng_a, hit=0.6) for _ in range(50)]
    b = [chain_round(resumed, rng_b, hit=0.6) for _ in range(50)]
    assert a == b
    assert policy.ema_accept == resumed.ema_accept
    said = (
        r"different EmaConfig: ema_alpha: saved 0.2, this selector's 0.5; initial_steps: saved None, this selector's 7$"
    )
    with pytest.raises(ValueError, match=said):  # every differing key, with both values
        EmaSelector(EmaConfig(ema_alpha=0.5, initial_steps=7)).load_state_dict(state)


def test_from_json_reads_sglang_keys(tmp_path):
    path = tmp_path / "adaptive.json"
    path.write_text(
        json.dumps(
            {
                "candidate_steps": [2, 4, 8],
                "ema_alpha": 0.3,
                "warmup_batches": 4,
                "update_interval": 2,
                "down_hysteresis": -0.5,
                "up_hysteresis": 0.1,
            }
        )
    )
    config = EmaConfig.from_json(path)
    assert config == EmaConfig([2, 4, 8], 0.3, 4, 2, -0.5, 0.1)
    assert EmaConfig.from_json(str(path)) == config
    assert EmaConfig.from_json({"ema_alpha": 0.5}).ema_alpha == 0.5
    assert EmaSelector(config).current_steps == 4


def test_from_json_rejects_unknown_keys(tmp_path):
    with pytest.raises(ValueError, match=r"unknown EMA config keys: \['alpha', 'tiers'\]"):
        EmaConfig.from_json({"alpha": 0.2, "tiers": [1], "ema_alpha": 0.2})
    with pytest.raises(ValueError, match="per-batch-size sections"):
        EmaConfig.from_json({"1": {"candidate_steps": [1, 3]}})
    path = tmp_path / "list.json"
    path.write_text("[1, 3, 7]")
    with pytest.raises(ValueError, match="JSON object"):
        EmaConfig.from_json(path)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"candidate_steps": []}, "candidate_steps"),
        ({"candidate_steps": [1, -1]}, "candidate_steps"),
        ({"candidate_steps": [1, 1]}, "candidate_steps"),
        ({"candidate_steps": [1.5]}, "candidate_steps"),
        ({"ema_alpha": 0.0}, "ema_alpha"),
        ({"ema_alpha": 1.5}, "ema_alpha"),
        ({"warmup_batches": -1}, "warmup_batches"),
        ({"update_interval": 0}, "update_interval"),
        ({"down_hysteresis": "x"}, "down_hysteresis"),
        ({"up_hysteresis": float("nan")}, "up_hysteresis"),
        ({"initial_steps": -2}, "initial_steps"),
    ],
)
def test_config_errors_name_the_key(values, key):
    with pytest.raises(ValueError, match=f"EmaConfig.{key}"):
        EmaConfig.from_json(values)


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("steps", 4, "steps is 4: expected one of the tiers"),
        ("steps", "3", "steps is '3'"),
        ("ema_accept", float("nan"), "ema_accept is nan"),
        ("ema_accept", -1.0, "ema_accept is -1.0"),
        ("rounds", -5, "rounds is -5"),
        ("rounds", 2.5, "rounds is 2.5"),
    ],
)
def test_a_damaged_state_is_refused_naming_the_entry(key, value, said):
    selector = EmaSelector(EmaConfig())
    state = json.loads(json.dumps(selector.state_dict()))
    with pytest.raises(ValueError, match=said):
        EmaSelector(EmaConfig()).load_state_dict(state | {key: value})


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"candidate_steps": [0, 2, 4], "initial_steps": 0},  # starts at tier 0: the EMA starts at -1
        {"candidate_steps": [0]},  # never leaves tier 0
        {"candidate_steps": [0, 3], "initial_steps": 0, "warmup_batches": 0, "update_interval": 1},
    ],
)
@pytest.mark.parametrize("rounds", [0, 1, 3, 40])
def test_every_state_a_selector_saves_loads_and_continues_identically(values, rounds):
    """A selector's own state loads, whatever its config and however far it ran (one starting at tier 0 saved
    ema_accept = -1, its neutral start there, and refused to load it)."""
    rng = random.Random(rounds)
    policy = EmaSelector(EmaConfig(**values))
    for _ in range(rounds):
        chain_round(policy, rng, hit=0.6)
    resumed = EmaSelector(EmaConfig(**values))
    resumed.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    assert resumed.state_dict() == policy.state_dict()
    rng_a, rng_b = random.Random(7), random.Random(7)
    assert [chain_round(policy, rng_a, hit=0.6) for _ in range(30)] == [
        chain_round(resumed, rng_b, hit=0.6) for _ in range(30)
    ]


def test_a_negative_ema_is_refused_away_from_tier_0s_start():
    """-1 is tier 0's start only: at another tier, or another negative value at tier 0, is a damaged state."""
    config = EmaConfig(candidate_steps=[0, 3], initial_steps=0)
    state = json.loads(json.dumps(EmaSelector(config).state_dict()))
    assert (state["steps"], state["ema_accept"]) == (0, -1.0)
    for steps, accept in ((3, -1.0), (0, -0.5)):
        with pytest.raises(ValueError, match=f"ema_accept is {accept} at steps {steps}: expected a finite number"):
            EmaSelector(config).load_state_dict(state | {"steps": steps, "ema_accept": accept})
