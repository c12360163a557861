"""The bandit and the EMA controller against the simulated GRPO workloads, the per-bucket oracle, static
strategies and plain decoding."""

import functools
from pathlib import Path

import pytest

from fastrl.adaptive.acceptance import AcceptanceProfile
from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.cost_fits import h100_cost_model
from fastrl.adaptive.cost_model import CostModel, CostParams
from fastrl.adaptive.ema import EmaSelector
from fastrl.adaptive.ema_config import EmaConfig
from fastrl.adaptive.fixed import FixedSelector
from fastrl.adaptive.oracle import tokens_by_batch_size
from fastrl.adaptive.sim import DEFAULT_SIM_STRATEGIES, SimSettings, compare, main, simulate, simulated_calibration
from fastrl.adaptive.workload import Phase, Workload, standard_workloads
from fastrl.strategy.strategy import Strategy

SPACE = list(DEFAULT_SIM_STRATEGIES)
DOCS = Path(__file__).resolve().parents[2] / "docs"
COSTS = {
    "gpu-default": CostModel.default_gpu,
    "cpu-measured": lambda: CostModel.from_json(str(DOCS / "cpu_round_costs.json")),
    "h100-fitted": lambda: h100_cost_model(DOCS / "gpu" / "h100_results.json", [Strategy.parse(s) for s in SPACE]),
}
WORKLOADS = {w.name: w for w in standard_workloads(6)}
CASES = [(name, 0) for name in WORKLOADS] + [("drafter-improves", 1), ("policy-drift", 2)]


def settings_for(seed: int, cost: CostModel | None = None) -> SimSettings:
    return SimSettings(
        cost=cost or CostModel.default_gpu(), strategies=tuple(Strategy.parse(s) for s in SPACE), seed=seed
    )


def calibrated_bandit(settings: SimSettings, workload: Workload) -> dict:
    """The bandit as an engine starts it: calibrated (a few noisy rounds of every arm at a few batch sizes)."""
    calibration = simulated_calibration(settings, workload.requests_per_rollout)
    names = [str(s) for s in settings.strategies]
    return {"bandit": lambda: BanditSelector(BanditConfig(strategies=names), calibration=calibration)}


@functools.cache
def comparison(workload: str, seed: int, costs: str = "gpu-default"):
    settings = settings_for(seed, COSTS[costs]())
    return compare(WORKLOADS[workload], settings, calibrated_bandit(settings, WORKLOADS[workload]))


@pytest.mark.parametrize(("workload", "seed"), CASES)
def test_bandit_close_to_per_bucket_oracle(workload, seed):
    result = comparison(workload, seed)
    bandit = result.results["bandit"]
    assert bandit.goodput >= 0.97 * result.oracle.goodput


@pytest.mark.parametrize("costs", ["cpu-measured", "h100-fitted"])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_bandit_on_measured_costs_close_to_oracle_and_never_below_plain(workload, costs):
    """Cost models fitted to this CPU's measured round costs (docs/cpu_round_costs.json) and the H100's
    (docs/gpu/h100_results.json): speculation pays in few buckets there, and exploring must not cost more than it."""
    result = comparison(workload, 0, costs)
    bandit = result.results["bandit"]
    assert bandit.goodput >= 0.97 * result.oracle.goodput
    assert bandit.goodput >= result.plain.goodput
    assert bandit.goodput >= 0.98 * result.best_static.goodput


@pytest.mark.parametrize(("workload", "seed"), CASES)
def test_bandit_beats_best_static_strategy(workload, seed):
    result = comparison(workload, seed)
    best = result.best_static
    assert len(result.statics) == len(SPACE)
    assert result.results["bandit"].goodput > best.goodput
    assert result.oracle.goodput > best.goodput  # the oracle's own margin, so the workload does need adapting


@pytest.mark.parametrize(("workload", "seed"), CASES)
def test_bandit_never_far_below_plain_in_any_bucket(workload, seed):
    result = comparison(workload, seed)
    for label, mine, plain in zip(
        settings_for(seed).buckets.labels(), result.results["bandit"].buckets, result.plain.buckets, strict=True
    ):
        assert mine.rounds > 0 and plain.rounds > 0, label
        assert mine.goodput >= 0.97 * plain.goodput, label


def test_bandit_stays_plain_where_speculation_never_pays():
    """Compute-bound rounds (every token costs): plain decoding is best in every bucket; the bandit's tries and
    exploration cost less than 3% of it anywhere."""
    cost = CostModel(CostParams(saturation_tokens=1, draft_saturation_tokens=1))
    workload = Workload("compute-bound", (Phase(0, AcceptanceProfile(0.65)),), num_rollouts=12)
    settings = settings_for(0, cost)
    result = compare(workload, settings, calibrated_bandit(settings, workload))
    assert result.best_static.selector == "disable"
    for mine, plain in zip(result.results["bandit"].buckets, result.plain.buckets, strict=True):
        assert mine.goodput >= 0.97 * plain.goodput


def phase_steps(result, workload: Workload) -> list[list[int]]:
    """Chosen depths per rollout."""
    bounds = [*result.rollout_starts, len(result.choices)]
    return [[s.steps for s in result.choices[a:b]] for a, b in zip(bounds, bounds[1:], strict=False)]


def test_ema_tracks_phase_changes_in_simulation():
    def profile(hit):
        return AcceptanceProfile(hit, depth_decay=1.0, request_jitter=0.0)

    workload = Workload(
        "ema-phases",
        (Phase(0, profile(0.5)), Phase(2, profile(0.97)), Phase(4, profile(0.1))),
        num_rollouts=6,
        requests_per_rollout=16,
        median_length=200,
    )
    settings = SimSettings(cost=CostModel.default_gpu(), strategies=(), record_choices=True)
    result = simulate(EmaSelector(EmaConfig()), workload, settings)
    per_rollout = phase_steps(result, workload)
    assert set(per_rollout[1]) == {3}  # mediocre acceptance: the middle tier throughout
    rising = per_rollout[2]
    assert rising.index(7) <= 40 and set(rising[rising.index(7) :]) == {7}
    falling = per_rollout[4]
    assert falling[0] == 7 and falling.index(1) <= 40 and set(falling[falling.index(1) :]) == {1}
    mean = [sum(steps) / len(steps) for steps in per_rollout]
    assert mean[3] > mean[1] > mean[5]


def test_simulation_is_deterministic_and_uses_common_lengths():
    workload = WORKLOADS["stationary"]
    settings = settings_for(4)
    a = simulate(BanditSelector(BanditConfig(strategies=SPACE)), workload, settings)
    b = simulate(BanditSelector(BanditConfig(strategies=SPACE)), workload, settings)
    assert (a.tokens, a.time_s, a.rounds) == (b.tokens, b.time_s, b.rounds)
    recorded = SimSettings(cost=settings.cost, strategies=settings.strategies, seed=4, record_choices=True)
    plain = simulate(FixedSelector("disable"), workload, recorded)
    tree = simulate(FixedSelector("8_4_32"), workload, recorded)
    assert plain.tokens == tree.tokens  # same responses, whatever the strategy
    assert plain.tokens == sum(plain.batch_sizes)  # plain decoding: one token per running request per round
    assert plain.batch_sizes[0] == workload.requests_per_rollout and plain.batch_sizes[-1] == 1
    assert len(plain.rollout_starts) == workload.num_rollouts
    assert tree.rounds < plain.rounds / 2


def test_tokens_by_batch_size():
    assert tokens_by_batch_size([3, 1, 2]) == {3: 3, 2: 2, 1: 1}
    assert tokens_by_batch_size([5, 5, 2]) == {3: 6, 2: 6}
    lengths = [7, 100, 3, 3, 40]
    assert sum(tokens_by_batch_size(lengths).values()) == sum(lengths)


def test_main_prints_the_table(capsys):
    main(["--rollouts", "2", "--seed", "1"])
    out = capsys.readouterr().out
    for name in WORKLOADS:
        assert f"workload: {name}" in out
    for row in ("bandit", "ema [1,3,7]", "oracle/bucket", "static ", "plain"):
        assert row in out
