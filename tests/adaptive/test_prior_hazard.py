"""The drafter's held-out acceptance as the bandit's cold-start prior, and acceptance memory counted in rows."""

import json
import random
import shutil

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.depth_acceptance import DepthAcceptance, geometric_hazard
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.calibration import calibrate_engine, ragged_length
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter_checkpoint import METRICS_FILE, chain_prior_hazard, load_drafter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy

CHAIN, LONG = Strategy.parse("3_1_4"), Strategy.parse("7_1_8")


def chain_tokens(hazard: float, steps: int) -> float:
    return sum(hazard**d for d in range(steps + 1))


def test_geometric_hazard_inverts_the_chain_length():
    rng = random.Random(0)
    for _ in range(200):
        steps, hazard = rng.randint(1, 15), rng.uniform(0.01, 0.99)
        assert geometric_hazard(steps, chain_tokens(hazard, steps)) == pytest.approx(hazard, abs=1e-9)
    assert geometric_hazard(3, 0.5) == pytest.approx(0.0, abs=1e-9)  # below one token: nothing accepted
    assert geometric_hazard(3, 9.0) == pytest.approx(1.0, abs=1e-9)  # above the chain: everything
    with pytest.raises(ValueError, match="steps"):
        geometric_hazard(0, 1.0)


def write_metrics(directory, records) -> None:
    (directory / METRICS_FILE).write_text(json.dumps({"accept_lengths": records}))


def test_chain_prior_hazard_reads_the_fixed_chains_of_a_checkpoint(tmp_path):
    records = [
        {"strategy": "3_1_4", "temperature": 0.0, "mean_accept_length": chain_tokens(0.6, 3)},
        {"strategy": "7_1_8", "temperature": 1.0, "mean_accept_length": chain_tokens(0.8, 7)},
        {"strategy": "8_4_32", "temperature": 0.0, "mean_accept_length": 6.1},  # a tree: not a chain's hazard
        {"strategy": "12_1_13@0.3", "temperature": 0.0, "mean_accept_length": 2.0},  # stops early: neither
    ]
    write_metrics(tmp_path, records)
    assert chain_prior_hazard(tmp_path / METRICS_FILE) == pytest.approx(0.7, abs=1e-9)
    write_metrics(tmp_path, records[2:])
    assert chain_prior_hazard(tmp_path / METRICS_FILE) is None
    # not measured (no decode round: every held-out response ended at once): no evidence, not "accepts nothing"
    unmeasured = {"strategy": "5_1_6", "temperature": 0.0, "mean_accept_length": 0.0, "mean_accepted_drafts": 0.0}
    write_metrics(tmp_path, [*records, unmeasured])
    assert chain_prior_hazard(tmp_path / METRICS_FILE) == pytest.approx(0.7, abs=1e-9)
    assert chain_prior_hazard(tmp_path / "absent.json") is None
    for bad in ('{"accept_lengths": [{"strategy": "3_1_4"}]}', "[1, 2]", "{not json", '{"accept_lengths": 3}'):
        (tmp_path / METRICS_FILE).write_text(bad)
        with pytest.raises(ValueError, match=METRICS_FILE):
            chain_prior_hazard(tmp_path / METRICS_FILE)


def test_the_prior_reads_the_uncut_accepted_drafts_where_a_checkpoint_has_them(tmp_path):
    """The accept length a new train-drafter writes is cut where requests finished; the prior is read from the
    uncut figure beside it, as the bandit's own per-depth counts are (from the cut one it came out low, more so the
    shorter the responses)."""
    cut, uncut = chain_tokens(0.5, 3), chain_tokens(0.7, 3)
    record = {"strategy": "3_1_4", "temperature": 0.0, "mean_accept_length": cut}
    write_metrics(tmp_path, [record | {"mean_accepted_drafts": uncut - 1.0}])
    assert chain_prior_hazard(tmp_path / METRICS_FILE) == pytest.approx(0.7, abs=1e-9)
    write_metrics(tmp_path, [record])  # written before the figure was kept: its accept length counted uncut
    assert chain_prior_hazard(tmp_path / METRICS_FILE) == pytest.approx(0.5, abs=1e-9)


def test_measured_rounds_give_both_figures_from_one_run():
    from fastrl.cotrain.accept_eval import measure_rounds
    from fastrl.engine.engine import GenerateInput
    from fastrl.sampling.params import SamplingParams

    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    rng = random.Random(4)
    inputs = [
        GenerateInput([1, *(rng.randrange(3, 40) for _ in range(6))], SamplingParams(max_new_tokens=n, temperature=0))
        for n in (5, 9, 13, 30)
    ]
    totals = measure_rounds(policy, drafter, inputs, "7_1_8", EngineConfig(max_batch_size=1))
    assert totals.mean_accept_length == totals.emitted / totals.rows
    assert totals.mean_accepted_drafts == totals.accepted / totals.rows
    assert 1.0 + totals.mean_accepted_drafts > totals.mean_accept_length  # short budgets cut some accepted paths


def test_an_engine_starts_its_bandit_from_the_drafters_prior(tmp_path):
    """A drafter checkpoint whose metrics say its chains hit 0.9 per depth: before any round, every EAGLE chain is
    predicted at the geometric chain length of 0.9, where a drafter without metrics starts at 1/2."""
    policy = load_model(bundled_model_dir())
    shutil.copytree(bundled_drafter_dir(), tmp_path / "drafter")
    write_metrics(
        tmp_path / "drafter", [{"strategy": "5_1_6", "temperature": 1.0, "mean_accept_length": chain_tokens(0.9, 5)}]
    )
    drafter = load_drafter(tmp_path / "drafter", policy)[0]
    assert drafter.prior_hazard == pytest.approx(0.9, abs=1e-4)
    config = BanditConfig(strategies=["3_1_4", "7_1_8", "disable"], calibrate=False)
    engine = Engine(policy, EngineConfig(max_batch_size=2), drafter=drafter, selector=BanditSelector(config))
    calibrate_engine(engine)
    for arm in (CHAIN, LONG):
        expected = chain_tokens(0.9, arm.steps)
        assert engine.selector.acceptance.tokens_per_row(arm) == pytest.approx(expected, abs=1e-3)
    (tmp_path / "drafter" / METRICS_FILE).unlink()
    plain_start = BanditSelector(config)
    without = load_drafter(tmp_path / "drafter", policy)[0]
    calibrate_engine(Engine(policy, EngineConfig(max_batch_size=2), drafter=without, selector=plain_start))
    assert plain_start.acceptance.tokens_per_row(CHAIN) == pytest.approx(chain_tokens(0.5, 3), abs=1e-3)


def rows(strategy: Strategy, accepted: list[int]) -> RoundStats:
    batch = len(accepted)
    return RoundStats(strategy, batch, [strategy.steps] * batch, accepted, [a + 1 for a in accepted], 0.01)


def test_acceptance_memory_is_counted_in_rows():
    """Ten rounds at batch 64 that accept everything, then 128 rounds at batch 1 that accept nothing (the long
    tail's easy last tokens, the other way round): with a memory of 64 rows the estimate follows the newer rows;
    counted in rounds, the 640 old rows would still outweigh them."""
    acceptance = DepthAcceptance([CHAIN], prior_rows=4.0, memory_rows=64.0)
    for _ in range(10):
        acceptance.observe(rows(CHAIN, [3] * 64))
    assert acceptance.tokens_per_row(CHAIN) > 3.9
    for _ in range(128):
        acceptance.observe(rows(CHAIN, [0]))
    assert acceptance.tokens_per_row(CHAIN) < 2.0


def test_calibration_rows_are_ragged():
    assert ragged_length(64, 0, 1) == 64
    lengths = [ragged_length(64, row, 64) for row in range(64)]
    assert lengths[0] == 16 and lengths[-1] == 64
    assert lengths == sorted(lengths) and len(set(lengths)) > 40
    assert all(ragged_length(1, row, 8) == 1 for row in range(8))
