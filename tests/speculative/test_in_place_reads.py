"""Speculative rounds read their keys in place when the rows are consecutive slots at home and every entry a forward
writes lies in pages the rows hold (`InPlaceReads`): what they draft, accept and emit is bitwise what the same
rounds give when every forward gathers its keys (the same pool without home pages)."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_model_dir
from fastrl.commands.engine_setup import resolve_drafter
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative import round as spec_round
from fastrl.speculative.round import InPlaceReads
from fastrl.speculative.runtime import StrategyRuntime
from fastrl.strategy.strategy import Strategy


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir()).double()
    return policy, resolve_drafter("", bundled_model_dir(), policy, True)


def runtime(strategy: str) -> StrategyRuntime:
    return StrategyRuntime.build(Strategy.parse(strategy), torch.device("cpu"))


def test_the_rule_follows_what_the_scheduler_holds_past_each_row():
    chain, tree = runtime("5_1_6"), runtime("8_4_32")
    assert InPlaceReads.decide(3, [40], chain, 9) == InPlaceReads(verify=3, draft=3)
    # the drafter writes past the longest row: a row 5 shorter holds entries up to its n + 8 only
    assert InPlaceReads.decide(3, [40, 35], chain, 9) == InPlaceReads(verify=3, draft=None)
    assert InPlaceReads.decide(3, [40, 36], chain, 9) == InPlaceReads(verify=3, draft=3)
    # 32 tree nodes at n .. n + 31 and expansions 28 entries past base: neither fits 9 held entries
    assert InPlaceReads.decide(3, [40], tree, 9) == InPlaceReads(verify=None, draft=None)
    assert InPlaceReads.decide(0, [40, 40], tree, 33) == InPlaceReads(verify=0, draft=0)


def _inputs(vocab: int, count: int, seed: int, temperature: float) -> list[GenerateInput]:
    rng = random.Random(seed)
    return [
        GenerateInput(
            [rng.randrange(3, vocab) for _ in range(rng.randint(3, 40))],
            SamplingParams(
                max_new_tokens=rng.choice([20, 45, 70]), temperature=temperature, seed=seed * 100 + i, ignore_eos=True
            ),
            request_id=f"r{i}",
        )
        for i in range(count)
    ]


def _run(policy, drafter, strategy: str, batch: int, inputs, home: bool, page_size: int) -> tuple[list, list, int]:
    """Outputs, every speculative round's draft trees and how many forwards read keys in place."""
    # In-place reads are PagedSdpa's (the CPU kernel follows the page table itself, tests/models/test_cpu_attention)
    config = EngineConfig(
        max_batch_size=batch, max_model_len=256, dtype="float64", page_size=page_size, attention_kernel=False
    )
    engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(strategy))
    if not home:  # the same pool, handed out without home pages: every forward gathers
        config = EngineConfig(**{**config.__dict__, "kv_cache_tokens": engine.runner.pool.num_pages * page_size})
        engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(strategy))
    views = [0]
    for cache in engine.runner.caches:
        read = cache.home_view

        def counted(*args, read=read):
            views[0] += 1
            return read(*args)

        cache.home_view = counted
    trees = []
    draft_trees = spec_round.draft_trees

    def recorded(*args, **kwargs):  # the real drafting, its trees kept
        draft = draft_trees(*args, **kwargs)
        trees.append(draft.tree.tokens.tolist())
        return draft

    spec_round.draft_trees = recorded
    try:
        outputs = engine.generate(inputs)
    finally:
        spec_round.draft_trees = draft_trees
    return [(o.token_ids, o.logprobs) for o in outputs], trees, views[0]


@pytest.mark.parametrize("page_size", [1, 8])
@pytest.mark.parametrize(
    ("strategy", "batch", "temperature", "seed"),
    [("3_1_4", 1, 0.0, 1), ("5_1_6", 1, 1.0, 2), ("2_2_4", 1, 1.0, 3), ("7_1_8", 3, 1.0, 4), ("3_1_4", 4, 0.0, 5)],
)
def test_rounds_that_read_in_place_equal_rounds_that_gather(models, strategy, batch, temperature, seed, page_size):
    """Page size 1 holds exactly what the scheduler reserves past each row: a forward let read in place while it
    writes past that (a tree's last nodes, the drafter's expansions past a shorter row) would read what it did not
    write, and draft, accept or emit otherwise."""
    policy, drafter = models
    inputs = _inputs(policy.config.vocab_size, 2 * batch, seed, temperature)
    got, got_spec, views = _run(policy, drafter, strategy, batch, inputs, True, page_size)
    want, want_spec, none = _run(policy, drafter, strategy, batch, inputs, False, page_size)
    assert none == 0 and views > 0  # the home pool read in place (plain prefix rounds excluded: all speculative)
    assert len(got_spec) > 10 and got_spec == want_spec  # the drafter read the same keys: the same trees
    assert got == want


def test_a_batch_of_rows_at_home_reads_in_place_in_speculative_rounds(models):
    """At batch 1 every forward of a chain round reads in place: the policy's layers and the drafter's steps."""
    policy, drafter = models
    inputs = _inputs(policy.config.vocab_size, 1, 9, 0.0)
    _, trees, views = _run(policy, drafter, "5_1_6", 1, inputs, True, 16)
    layers = policy.config.num_hidden_layers
    assert views >= len(trees) * (layers + 5)  # per round: the verify's layers, catch-up and 4 drafter steps
