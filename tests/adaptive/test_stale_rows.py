"""An idle arm's own rows are replaced (decayed as if it ran) while a running arm of its source stands more than
``STALE_Z`` standard errors from the rate it had when those rows were counted; otherwise they fade slowly."""

import pytest

import fastrl.adaptive.depth_acceptance as depth_acceptance
from fastrl.adaptive.depth_acceptance import DepthAcceptance
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

CHAIN, TREE, MID_TREE, HISTORY = (Strategy.parse(s) for s in ("3_1_4", "8_4_32", "8_4_16", "suffix_16"))
ARMS = [TREE, MID_TREE, CHAIN, HISTORY, DISABLE]
WEAK, STRONG = [0, 0, 1, 0, 2, 0, 0, 1], [3, 3, 2, 3, 1, 3, 3, 2]  # chain rows: ~1/3 a depth, then ~4/5


def rows_of(strategy: Strategy, accepted: list[int]) -> RoundStats:
    batch = len(accepted)
    return RoundStats(strategy, batch, [strategy.max_tree_nodes - 1] * batch, accepted, [a + 1 for a in accepted], 0.1)


def tried_then(chain_rows: list[int], monkeypatch=None) -> DepthAcceptance:
    """The chain and the tree run side by side on a weak drafter, then only the chain runs, its rows ``chain_rows``;
    with ``monkeypatch``, the rule is off (``STALE_Z`` infinite)."""
    if monkeypatch is not None:
        monkeypatch.setattr(depth_acceptance, "STALE_Z", float("inf"))
    acceptance = DepthAcceptance(ARMS, prior_rows=4.0, memory_rows=256)
    for _ in range(20):
        acceptance.observe(rows_of(CHAIN, WEAK))
        acceptance.observe(rows_of(TREE, [2, 1, 3, 0, 2, 1, 4, 1]))
    for _ in range(60):
        acceptance.observe(rows_of(CHAIN, chain_rows))
    return acceptance


def test_an_idle_tree_forgets_rows_counted_before_the_chain_moved(monkeypatch):
    moved, kept = tried_then(STRONG), tried_then(STRONG, monkeypatch)
    assert kept.rows(TREE) > 80.0  # idle decay alone: its ~118 rows fade by exp(-480 / 2048)
    assert moved.rows(TREE) < 0.3 * kept.rows(TREE)  # replaced at the chain's pace: exp(-480 / 256) of them left
    assert moved.rows(TREE) == pytest.approx(kept.rows(TREE) * 0.19, rel=0.5)
    # the fewer stale rows give way to the chain's higher hazards: the tree is predicted higher and less surely
    assert moved.tokens_per_row(TREE) > kept.tokens_per_row(TREE)
    spread = moved.tokens_per_row(TREE, 1.28) - moved.tokens_per_row(TREE)
    assert spread > kept.tokens_per_row(TREE, 1.28) - kept.tokens_per_row(TREE)


def test_rows_counted_under_the_same_acceptance_fade_slowly(monkeypatch):
    same, kept = tried_then(WEAK), tried_then(WEAK, monkeypatch)
    assert same.rows(TREE) == pytest.approx(kept.rows(TREE))
    assert same.rows(MID_TREE) == 0.0


def test_other_sources_and_loaded_rows_are_not_judged_stale(monkeypatch):
    moved = tried_then(STRONG)
    saved = moved.state()
    fresh = DepthAcceptance(ARMS, prior_rows=4.0, memory_rows=256)
    fresh.load(saved)
    before = fresh.rows(TREE)
    for _ in range(60):
        fresh.observe(rows_of(CHAIN, WEAK))  # no record of the chain's rate when the loaded rows were counted
    assert fresh.rows(TREE) == pytest.approx(before * 2.718281828 ** (-480 / 2048), rel=1e-6)
    history = DepthAcceptance(ARMS, prior_rows=4.0, memory_rows=256)
    for _ in range(20):
        history.observe(rows_of(CHAIN, WEAK))
        history.observe(rows_of(HISTORY, [1, 0, 2, 1]))
    rows = history.rows(HISTORY)
    for _ in range(60):
        history.observe(rows_of(CHAIN, STRONG))  # an EAGLE chain says nothing about history drafts
    assert history.rows(HISTORY) == pytest.approx(rows * 2.718281828 ** (-480 / 2048), rel=1e-6)
