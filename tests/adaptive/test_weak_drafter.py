"""A weak drafter at batch 1, where plain decoding is the best arm (SmolLM2 with its shipped drafter: 1.2-1.4 tokens
per row, a speculative round 1.6-4x a plain one): an arm's acceptance follows its own rows and its source's, not an
uninformed 1/2 at the depths no row reached, so a clearly losing arm stops being explored and the bandit stays on
plain."""

import functools

import pytest

from fastrl.adaptive.acceptance import AcceptanceProfile
from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.depth_acceptance import DepthAcceptance
from fastrl.adaptive.sim import SimSettings, compare, simulated_calibration
from fastrl.adaptive.workload import Phase, Workload
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

PLAIN_S = 0.062
"""A plain SmolLM2 round at batch 1 on this CPU, lightly loaded."""
RATIOS = {"disable": 1.0, "3_1_4": 1.66, "5_1_6": 2.1, "7_1_8": 2.13, "8_4_32": 4.4}
"""Round time over a plain round's, as measured at batch 1 (calibration and `fastrl generate` round logs)."""
ARMS = list(RATIOS)
SHORT, MID, LONG, TREE = (Strategy.parse(s) for s in ("3_1_4", "5_1_6", "7_1_8", "8_4_32"))


def smollm2_costs() -> CostModel:
    """Round times at batch 1-4 in the measured ratios (a few percent more per row)."""
    points = [(Strategy.parse(a), b, PLAIN_S * r * (1 + 0.02 * (b - 1))) for a, r in RATIOS.items() for b in (1, 2, 4)]
    return CostModel.fit(points)


def rows_of(strategy: Strategy, accepted: list[int]) -> RoundStats:
    """One round per row at batch 1."""
    return RoundStats(strategy, 1, [strategy.max_tree_nodes - 1], accepted, [a + 1 for a in accepted], 0.1)


def test_a_chain_that_misses_at_depth_one_is_not_assumed_to_hit_half_the_time_deeper():
    """Rows of the 3-deep chain accept 1 in 5 at depth 1: the 7-deep chain, never pulled, drafts the same greedy
    path and is predicted like it (about 1.25 tokens a row), not lifted by 1/2 at depths 4-7."""
    acceptance = DepthAcceptance([SHORT, MID, LONG, TREE, DISABLE], prior_rows=4.0, memory_rows=32)
    for i in range(20):
        acceptance.observe(rows_of(SHORT, [1 if i % 5 == 0 else 0]))
    for arm in (SHORT, MID, LONG):
        assert acceptance.tokens_per_row(arm) == pytest.approx(1.25, abs=0.08), arm
    assert acceptance.tokens_per_row(LONG, z=1.28) < 1.6  # its optimistic bound is below its 2.1x cost
    assert acceptance.hazards(LONG)[4] < 0.3  # depth 5, never reached: the depths before's rate, not 1/2


def test_own_rows_outweigh_the_family_as_they_accumulate():
    """The 7-deep chain's own rows accept 0.2 a row while the wide tree that holds it accepted 3 a row: the chain's
    prediction moves from the tree's toward its own as its rows accumulate."""
    acceptance = DepthAcceptance([LONG, TREE, DISABLE], prior_rows=4.0, memory_rows=1e9)
    for _ in range(30):
        acceptance.observe(rows_of(TREE, [3]))
    errors = []
    for i in range(40):
        acceptance.observe(rows_of(LONG, [1 if i % 5 == 0 else 0]))
        errors.append(abs(acceptance.tokens_per_row(LONG) - 1.2))
    assert errors[39] < errors[9] < errors[1]
    assert errors[39] < 0.12


def test_plain_rounds_do_not_make_a_measured_arm_unknown_again_within_a_run():
    """Forgetting follows the arm's own rounds: a hundred plain rounds (memory 32, `fastrl generate`'s) leave most
    of the chain's 20 rows, so it is not re-explored as if never tried; its own rounds replace its rows fast."""
    acceptance = DepthAcceptance([SHORT, LONG, DISABLE], prior_rows=4.0, memory_rows=32)
    for _ in range(20):
        acceptance.observe(rows_of(SHORT, [0]))
    for _ in range(100):
        acceptance.observe(RoundStats(DISABLE, 1, [0], [0], [1], 0.06))
    assert acceptance.rows(SHORT) > 8.0  # forgetting at memory 32 over those rounds would leave 0.6
    for _ in range(64):  # the chain's own rows, all accepting 2: the old misses fade within its memory
        acceptance.observe(rows_of(SHORT, [2]))
    assert acceptance.tokens_per_row(SHORT) > 2.5


@functools.cache
def weak_comparison(seed: int, top1_hit: float):
    settings = SimSettings(cost=smollm2_costs(), strategies=tuple(Strategy.parse(a) for a in ARMS), seed=seed)
    workload = Workload(
        "weak-drafter-batch-1",
        (Phase(0, AcceptanceProfile(top1_hit), "weak"),),
        num_rollouts=6,
        requests_per_rollout=1,
        median_length=64,
        length_sigma=0.3,
        min_length=8,
    )
    calibration = simulated_calibration(settings, 1)
    config = BanditConfig(strategies=ARMS, window_size=32)  # `fastrl generate`'s acceptance memory
    return compare(workload, settings, {"bandit": lambda: BanditSelector(config, calibration=calibration)})


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("top1_hit", [0.15, 0.2])
def test_weak_drafter_at_batch_one_stays_on_plain(seed, top1_hit):
    """About 350 rounds at batch 1: plain is the oracle's choice, and the bandit pays little more than learning
    that: 0.972-0.984x plain over these cases (the round-3 estimate, lifted by 1/2 at unreached depths and forgetting
    within 32 rounds, reached 0.79-0.82x plain here, as on SmolLM2)."""
    result = weak_comparison(seed, top1_hit)
    bandit = result.results["bandit"]
    assert result.best_static.selector == "disable"
    assert bandit.goodput >= 0.97 * result.plain.goodput
