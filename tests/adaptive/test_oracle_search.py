"""The per-bucket oracle is searched by simulation under the run's common random numbers: it is at least as fast as
every fixed per-bucket table it tried (the analytic pick, every static strategy, one-cell changes among the arms its
analytic time puts within ``ORACLE_MARGIN``). Random case 45 is one where the analytic pick alone was not: the tail's
lone request accepts less than the jitter-averaged acceptance says, and speculation moves which batch sizes the
tokens are emitted at."""

import pytest

from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.oracle import OracleSelector, candidate_arms, search_table
from fastrl.adaptive.random_cases import random_case
from fastrl.adaptive.sim import DEFAULT_SIM_STRATEGIES, SimSettings, compare, simulate
from fastrl.strategy.strategy import DISABLE, Strategy

ARMS = tuple(map(Strategy.parse, DEFAULT_SIM_STRATEGIES))


@pytest.mark.parametrize("seed", [0, 1])
def test_oracle_beats_every_static_and_its_one_cell_changes_on_case_45(seed):
    params, workload = random_case(45)
    settings = SimSettings(
        cost=CostModel(params=params), strategies=ARMS, seed=seed, time_noise=0.0, record_choices=True
    )
    result = compare(workload, settings, {})
    for static in result.statics.values():  # plain was 1.09x the analytic oracle at seed 1
        assert result.oracle.time_s <= static.time_s, static.selector
    assert result.oracle_per_batch.time_s <= result.oracle.time_s
    oracle = result.oracle
    table = {(0, settings.buckets.index(b)): s for s, b in zip(oracle.choices, oracle.batch_sizes, strict=True)}
    assert len(table) == len(settings.buckets)  # one phase: one strategy per bucket, every bucket visited
    replayed = simulate(OracleSelector(table, settings.buckets), workload, settings)
    assert replayed.time_s == oracle.time_s
    for bucket in range(len(settings.buckets)):  # plain in one bucket: the change the analytic oracle missed
        changed = simulate(OracleSelector({**table, (0, bucket): DISABLE}, settings.buckets), workload, settings)
        assert oracle.time_s <= changed.time_s, bucket


def test_search_table_keeps_the_fastest_table_it_tried():
    cells = [(0, 0), (0, 1)]
    a, b, c = (Strategy.parse(s) for s in ("3_1_4", "8_4_8", "disable"))
    cost = {a: 3.0, b: 2.0, c: 1.0}
    tried = []

    def run_time(table):
        tried.append(dict(table))
        return sum(cost[s] for s in table.values()) + (2.0 if table[(0, 0)] == table[(0, 1)] else 0.0)

    start = dict.fromkeys(cells, a)
    table, seconds = search_table([start], {cell: [a, b, c] for cell in cells}, run_time)
    assert table == {(0, 0): c, (0, 1): b}  # plain in both would pay the penalty of equal cells
    assert seconds == min(run_time(t) for t in list(tried))
    with pytest.raises(ValueError, match="start"):
        search_table([], {}, run_time)


def test_candidate_arms_are_those_within_the_margin_best_first():
    a, b, c = (Strategy.parse(s) for s in ("3_1_4", "8_4_8", "disable"))
    times = {(0, 0): {a: 1.0, b: 1.05, c: 1.3}, (0, 1): {a: 9.0, b: 4.0, c: 4.1}}
    chosen = candidate_arms(times, 0.1)
    assert list(chosen) == [(0, 1), (0, 0)]  # the cell with the most time first
    assert chosen[(0, 0)] == [a, b] and chosen[(0, 1)] == [b, c]
    with pytest.raises(ValueError, match="margin"):
        candidate_arms(times, -0.1)
