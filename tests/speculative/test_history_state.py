"""A history index's state (`HistoryIndex.state` / `load_state`): what carries its kept responses through a
checkpoint. Round trips are exact; a restored index drafts as the original does, siblings emitted interleaved
included (the state keeps the order the texts arrived in); a state without that order (an older checkpoint's) still
loads; budgets apply on load; an order that does not cover its texts is refused."""

import random

import pytest

from fastrl.speculative.history import HistoryConfig, HistoryIndex, HistoryState
from tests.speculative.test_history import _occurs, _paths


def _fill(index: HistoryIndex, rng: random.Random, groups: int, interleave: bool) -> None:
    """Random groups of kept (and some discarded) responses, siblings emitted in interleaved pieces or one by one."""
    for g in range(groups):
        prompt = [rng.randrange(1, 9) for _ in range(rng.randint(1, 20))]
        seqs = [f"g{g}-s{i}" for i in range(rng.randint(1, 4))]
        texts = {s: [rng.randrange(1, 9) for _ in range(rng.randint(0, 30))] for s in seqs}
        for s in seqs:
            index.start(s, None, prompt)
        if interleave:
            while any(texts.values()):
                for s in seqs:
                    piece, texts[s] = texts[s][:3], texts[s][3:]
                    index.extend(s, piece)
        else:
            for s in seqs:
                index.extend(s, texts[s])
        for s in seqs:
            index.finish(s, keep=rng.random() < 0.8)


@pytest.mark.parametrize("seed", range(40))
def test_state_round_trips_and_restored_indexes_draft_from_the_same_texts(seed):
    rng = random.Random(seed)
    config = HistoryConfig(token_budget=rng.choice([60, 400, 100_000]), max_key=3, max_match=rng.choice([3, 8]))
    original = HistoryIndex(config)
    _fill(original, rng, rng.randint(1, 8), interleave=seed % 2 == 1)
    state = original.state()
    restored = HistoryIndex(config)
    restored.load_state(state)
    assert restored.state() == state
    tail = config.max_match  # each response is held after a copy of its prompt's last max_match tokens
    held = sum(len(p) + sum(min(tail, len(p)) + len(r) for r in responses) for p, responses in state.groups)
    assert restored.num_tokens == held <= config.token_budget
    for i, (prompt, responses) in enumerate(state.groups):  # a new sequence of each group drafts from its texts
        for index in (original, restored):
            index.start(f"new{i}", None, prompt)
        a, b = original.draft(f"new{i}", 12, 4), restored.draft(f"new{i}", 12, 4)
        assert a == b  # the texts indexed in the order they arrived: siblings interleaved as they were emitted
        texts = [prompt] + [prompt + response for response in responses]  # a group's prompt is one of its texts
        for path in _paths(b):
            assert _occurs(path, texts), f"restored draft path {path} is in none of the group's texts"


@pytest.mark.parametrize("seed", range(10))
def test_a_state_without_orders_loads_text_by_text(seed):
    rng = random.Random(seed)
    config = HistoryConfig(max_key=3, max_match=4)
    original = HistoryIndex(config)
    _fill(original, rng, 4, interleave=True)
    state = original.state()
    older = HistoryState(state.groups)  # as a checkpoint written before orders were kept
    restored = HistoryIndex(config)
    restored.load_state(older)
    assert restored.state().groups == state.groups
    sequential = HistoryIndex(config)
    for g, (prompt, responses) in enumerate(state.groups):  # what it equals: each response emitted whole, in turn
        if not responses:  # a group whose responses were all dropped: its prompt alone
            sequential.start((g, "dropped"), None, prompt)
            sequential.finish((g, "dropped"), keep=False)
        for j, response in enumerate(responses):
            sequential.start((g, j), None, prompt)
            sequential.extend((g, j), response)
            sequential.finish((g, j), keep=True)
    for i, (prompt, _) in enumerate(state.groups):
        for index in (restored, sequential):
            index.start(f"new{i}", None, prompt)
        assert restored.draft(f"new{i}", 12, 4) == sequential.draft(f"new{i}", 12, 4)


def test_an_order_that_does_not_cover_its_texts_is_refused():
    groups = [([1, 2, 3], [[4, 5], [6]])]
    HistoryState(groups, [[(0, 0, 3), (1, -1, 0), (2, -1, 1), (1, 0, 2)]])  # a valid interleaving
    for order, said in (
        ([(0, 0, 3), (1, -1, 2), (2, -1, 0)], "does not cover its texts"),  # response 2's token missing
        ([(0, 0, 3), (1, 0, 2), (2, -1, 1)], "does not continue"),  # response 1 must start at -1
        ([(0, 0, 3), (3, -1, 1)], "does not continue"),  # no third response
        ([(0, 0, 3), (1, -1, 2), (1, 1, 2), (2, -1, 1)], "does not continue"),  # overlaps
    ):
        with pytest.raises(ValueError, match=said):
            HistoryState(groups, [order])
    with pytest.raises(ValueError, match="2 orders for 1 groups"):
        HistoryState(groups, [[], []])


def test_load_applies_the_budget_oldest_first_and_refuses_live_sequences():
    big = HistoryIndex(HistoryConfig(token_budget=100_000))
    _fill(big, random.Random(3), 6, interleave=False)
    state = big.state()
    small = HistoryIndex(HistoryConfig(token_budget=state.num_tokens // 2))
    small.load_state(state)
    kept = small.state()
    assert small.num_tokens <= state.num_tokens // 2 and len(kept.groups) < len(state.groups)
    assert kept.groups == state.groups[-len(kept.groups) :]  # the oldest groups went, the most recent stayed whole
    small.start("live", None, [1, 2, 3])
    with pytest.raises(ValueError, match="1 sequences are live"):
        small.load_state(state)
    empty = HistoryIndex()
    empty.load_state(HistoryState([]))
    assert empty.num_tokens == 0 and empty.num_groups == 0


def test_a_group_with_its_own_key_is_refused():
    index = HistoryIndex()
    index.start("a", "my-key", [1, 2, 3])
    index.extend("a", [4, 5])
    index.finish("a", keep=True)
    with pytest.raises(ValueError, match="'my-key' is not keyed by its prompt"):
        index.state()


def test_a_group_whose_responses_were_all_dropped_keeps_its_place_through_a_state():
    """Such a group counts in the token budget and the eviction order; a state without it let the restored index
    evict another group than the original did, and then draft differently."""
    config = HistoryConfig(token_budget=40, max_key=3, max_match=4)
    original = HistoryIndex(config)
    for name, prompt, response, keep in (("a", [1, 2, 3, 4], [5] * 10, False), ("b", [6, 7, 8], [9] * 12, True)):
        original.start(name, None, prompt)
        original.extend(name, response)
        original.finish(name, keep=keep)
    state = original.state()
    assert state.groups[0] == ([1, 2, 3, 4], [])
    restored = HistoryIndex(config)
    restored.load_state(state)
    assert restored.state() == state and restored.num_tokens == original.num_tokens
    for index in (original, restored):  # a new group over the budget: both evict the same one
        index.start("c", None, [3, 3, 3, 3, 3, 3, 3, 3])
        index.extend("c", [4] * 10)
        index.finish("c", keep=True)
    assert restored.state() == original.state()
    for index in (original, restored):
        index.start("b2", None, [6, 7, 8])
    assert restored.draft("b2", 12, 4) == original.draft("b2", 12, 4)
