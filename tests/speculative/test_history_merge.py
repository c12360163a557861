"""merge_history_states: several workers' history indexes folded into one, every group kept, each drafting as its
worker's index would, and the oldest evicted first when the one index is too small."""

from __future__ import annotations

import random

from fastrl.speculative.history import HistoryConfig, HistoryIndex, HistoryState, merge_history_states

CONFIG = HistoryConfig(max_key=2, max_match=4, max_candidates=8)


def _index(groups: list[tuple[list[int], list[list[int]]]], config: HistoryConfig = CONFIG) -> HistoryIndex:
    """An index that kept these responses, siblings interleaved token by token (so that orders matter)."""
    index = HistoryIndex(config)
    for g, (prompt, responses) in enumerate(groups):
        ids = [(g, r) for r in range(len(responses))]
        for seq in ids:
            index.start(seq, None, prompt)
        for t in range(max(map(len, responses), default=0)):
            for seq, response in zip(ids, responses, strict=True):
                if t < len(response):
                    index.extend(seq, response[t : t + 1])
        for seq in ids:
            index.finish(seq, keep=True)
    return index


def _drafts(index: HistoryIndex, prompts: list[list[int]]) -> list:
    out = []
    for p, prompt in enumerate(prompts):
        index.start(("probe", p), None, prompt)
        out.append(index.draft(("probe", p), 8, 4))
        index.finish(("probe", p), keep=False)
    return out


def _random_groups(rng: random.Random, first: int, count: int) -> list[tuple[list[int], list[list[int]]]]:
    return [
        ([first + g, *(rng.randrange(4) for _ in range(3))], [[rng.randrange(4) for _ in range(6)] for _ in range(3)])
        for g in range(count)
    ]


def test_every_slots_groups_are_kept_and_draft_as_their_slots_index_did() -> None:
    rng = random.Random(0)
    slots = [_random_groups(rng, 100 * s, 3 + s) for s in range(3)]
    states = [_index(groups).state() for groups in slots]
    merged = merge_history_states(states)
    assert sorted(map(tuple, (p for p, _ in merged.groups))) == sorted(tuple(p) for g in slots for p, _ in g)
    assert merged.num_tokens == sum(state.num_tokens for state in states)
    restored = HistoryIndex(CONFIG)
    restored.load_state(merged)
    for groups, state in zip(slots, states, strict=True):
        alone = HistoryIndex(CONFIG)
        alone.load_state(state)
        prompts = [prompt for prompt, _ in groups]
        assert _drafts(restored, prompts) == _drafts(alone, prompts)
    # the slots interleave from their most recent groups: slot 2's oldest comes first, every slot's newest last
    firsts = [p[0] for p, _ in merged.groups]
    assert firsts[0] == 200 and firsts[-3:] == [2, 103, 204]


def test_a_prompt_in_several_slots_is_one_group_with_every_response_in_arrival_order() -> None:
    prompt = [7, 1, 2, 3]
    a = _index([(prompt, [[1, 2, 3, 0], [1, 2, 0, 0]]), ([9, 9], [[9]])]).state()
    b = _index([(prompt, [[3, 3, 1, 2]])]).state()
    merged = merge_history_states([a, b])
    assert merged.groups == [([9, 9], [[9]]), (prompt, [[1, 2, 3, 0], [1, 2, 0, 0], [3, 3, 1, 2]])]
    assert merged.orders[1] == a.orders[0] + [(3, first, end) for text, first, end in b.orders[0] if text]
    both = _index([(prompt, [[1, 2, 3, 0], [1, 2, 0, 0]])])
    both.start("b", None, prompt)
    both.extend("b", [3, 3, 1, 2])
    both.finish("b", keep=True)
    restored = HistoryIndex(CONFIG)
    restored.load_state(merged)
    assert _drafts(restored, [prompt]) == _drafts(both, [prompt])


def test_a_state_without_orders_merges_text_by_text() -> None:
    a = HistoryState([([1, 2], [[3, 4]])])
    b = HistoryState([([1, 2], [[5]]), ([6], [])], orders=[[(0, 0, 2), (1, -1, 1)], [(0, 0, 1)]])
    merged = merge_history_states([a, b])
    # [1, 2] is a's newest group and b's oldest: it goes where a put it, before b's newest
    assert merged.groups == [([1, 2], [[3, 4], [5]]), ([6], [])]
    assert merged.orders == [[(0, 0, 2), (1, -1, 2), (2, -1, 1)], [(0, 0, 1)]]


def test_a_smaller_index_keeps_every_slots_most_recent_groups() -> None:
    rng = random.Random(1)
    slots = [_random_groups(rng, 100 * s, 6) for s in range(2)]
    states = [_index(groups).state() for groups in slots]
    per_group = states[0].num_tokens // 6 + CONFIG.max_match * 3  # prompt, responses and their prompt tails
    small = HistoryIndex(HistoryConfig(token_budget=6 * per_group, max_key=2, max_match=4, max_candidates=8))
    small.load_state(merge_history_states(states))
    kept = {p[0] for p, _ in small.state().groups}
    assert 0 < len(kept) < 12
    assert {5, 105} <= kept and not {0, 100} & kept  # the newest of both slots, not one slot's whole index
