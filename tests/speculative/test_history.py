"""History index: drafts from prompt, live siblings and kept responses; ranking; budget; padded draft trees."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.speculative.history import (
    HistoryConfig,
    HistoryDraft,
    HistoryIndex,
    history_draft_tree,
    pad_draft,
    prompt_group_key,
    rank_continuations,
)
from fastrl.speculative.verify_tree import verify_tree


def _paths(draft: HistoryDraft) -> list[list[int]]:
    """Token path from the root to every node (root token first)."""
    paths = [[draft.tokens[0]]]
    for i in range(1, draft.num_nodes):
        paths.append(paths[draft.parents[i]] + [draft.tokens[i]])
    return paths


def _occurs(needle: list[int], texts: list[list[int]]) -> bool:
    n = len(needle)
    return any(text[i : i + n] == needle for text in texts for i in range(len(text) - n + 1))


def _well_formed(draft: HistoryDraft, max_nodes: int, max_depth: int) -> None:
    assert draft.parents[0] == -1
    assert 1 <= draft.num_nodes <= max_nodes
    assert all(0 <= draft.parents[i] < i for i in range(1, draft.num_nodes))
    assert draft.max_depth <= max_depth
    for node in range(draft.num_nodes):  # children of a node carry distinct tokens
        kids = [draft.tokens[i] for i in range(1, draft.num_nodes) if draft.parents[i] == node]
        assert len(kids) == len(set(kids))
    for i in range(1, draft.num_nodes):  # weights never grow down the tree
        assert draft.weights[i] <= draft.weights[draft.parents[i]]


# ---- ranking ------------------------------------------------------------------------------------------------


def test_rank_continuations_frequency_and_ancestor_closure():
    conts = [([5, 6, 7], 1.0), ([5, 6, 8], 1.0), ([5, 9], 1.0), ([4], 0.5)]
    tree = rank_continuations(3, conts, max_nodes=4)
    assert tree.tokens == (3, 5, 6, 9)  # 5 (3.0), 6 (2.0), then 9 (1.0) before 7/8 (1.0, created later)
    assert tree.parents == (-1, 0, 1, 1)
    assert tree.weights == (3.5, 3.0, 2.0, 1.0)
    full = rank_continuations(3, conts, max_nodes=100)
    assert full.num_nodes == 7  # the whole trie: 5, 4, 6, 9, 7, 8 plus the root
    assert full.tokens[1:3] == (5, 4)  # breadth-first, children heaviest first


def test_rank_continuations_chain_follows_heaviest_child():
    conts = [([1, 2, 3], 1.0), ([1, 2, 4], 2.0), ([7, 8], 2.5)]
    chain = rank_continuations(0, conts, max_nodes=10, chain=True)
    assert chain.tokens == (0, 1, 2, 4)
    assert chain.parents == (-1, 0, 1, 2)
    assert rank_continuations(0, conts, max_nodes=3, chain=True).tokens == (0, 1, 2)
    assert rank_continuations(0, [], max_nodes=8).tokens == (0,)
    with pytest.raises(ValueError, match="max_nodes"):
        rank_continuations(0, conts, max_nodes=0)


# ---- index --------------------------------------------------------------------------------------------------


def test_sibling_continuation_is_drafted_live():
    index = HistoryIndex()
    prompt = [1, 2, 3]
    index.start("a", None, prompt)
    index.start("b", None, prompt)
    index.extend("a", [10, 11, 12, 13])
    # b has emitted nothing yet: its text ends with the prompt, a's response starts right after it
    assert index.draft("b", max_nodes=8, max_depth=8).tokens == (3, 10, 11, 12, 13)
    index.extend("b", [10, 11])
    draft = index.draft("b", max_nodes=3, max_depth=8)
    assert draft.tokens == (11, 12, 13)
    assert draft.max_depth == 2
    assert index.draft("b", max_nodes=8, max_depth=1).tokens == (11, 12)


def test_kept_responses_serve_the_next_step_and_discarded_do_not():
    index = HistoryIndex()
    prompt = [4, 5, 6]
    index.start(0, None, prompt)
    index.extend(0, [7, 8, 9])
    index.finish(0, keep=True)
    index.start(1, None, prompt)
    index.extend(1, [20, 21])
    index.finish(1, keep=False)
    index.start(2, prompt_group_key(prompt), prompt)
    assert index.draft(2, 8, 8).tokens == (6, 7, 8, 9)  # the discarded 20, 21 are gone
    index.start(3, None, [9, 9, 6])  # another group: sees nothing of the first
    assert index.draft(3, 8, 8).tokens == (6,)


def test_own_text_is_a_source():
    index = HistoryIndex()
    index.start("s", "g", [1])
    index.extend("s", [5, 6, 7, 8, 5, 6])
    assert index.draft("s", 4, 4).tokens == (6, 7, 8, 5)


def test_lifecycle_errors_and_config_validation():
    index = HistoryIndex()
    index.start("s", "g", [1, 2])
    with pytest.raises(ValueError, match="already started"):
        index.start("s", "g", [1, 2])
    with pytest.raises(ValueError, match="not started"):
        index.extend("t", [1])
    with pytest.raises(ValueError, match="empty prompt"):
        index.start("u", "g", [])
    with pytest.raises(ValueError, match="max_depth"):
        index.draft("s", 4, 0)
    for bad in ({"token_budget": 0}, {"max_key": 0}, {"max_key": 8, "max_match": 4}, {"match_base": 0.5}):
        with pytest.raises(ValueError, match="history config"):
            HistoryConfig(**bad)
    for base in (True, "2", None, float("nan"), float("inf"), 1e30):  # 1e30 ** 16 overflows a float mid-round
        with pytest.raises(ValueError, match="history config: match_base"):
            HistoryConfig(match_base=base)
    HistoryConfig(match_base=1e19)  # ** 16 * 16 = 1.6e305: finite
    with pytest.raises(ValueError, match=r"match_base \*\* max_match \* max_candidates must be finite"):
        HistoryConfig(match_base=1e19, max_match=17)
    with pytest.raises(ValueError, match=r"must be finite, got 1e\+19 \*\* 16 \* 20000"):
        HistoryConfig(match_base=1e19, max_candidates=20_000)


def test_token_budget_evicts_least_recently_used_groups():
    budget = 200
    index = HistoryIndex(HistoryConfig(token_budget=budget, max_match=4))
    for group in range(40):
        prompt = [group, group + 1, group + 2]
        for sample in range(3):
            seq = (group, sample)
            index.start(seq, None, prompt)
            index.extend(seq, [(group * 7 + sample + t) % 50 for t in range(10)])
            index.finish(seq, keep=True)
            assert index.num_tokens <= budget
        if group >= 1:
            index.start("probe", None, [0, 1, 2])  # keeps group 0 recently used
            index.finish("probe", keep=False)
            assert index.num_tokens <= budget
    assert index.has_group((0, 1, 2))
    assert index.has_group((39, 40, 41))
    assert not index.has_group((1, 2, 3))
    assert index.num_tokens == sum(g.num_tokens for g in index._groups.values())


def test_budget_drops_oldest_kept_responses_of_live_groups():
    index = HistoryIndex(HistoryConfig(token_budget=60, max_key=2, max_match=2))
    index.start("live", "g", [1, 2])
    for i in range(10):
        index.start(i, "g", [1, 2])
        index.extend(i, [100 + i] * 10)
        index.finish(i, keep=True)
        assert index.num_tokens <= 60
    assert index.draft("live", 4, 4, chain=True).tokens == (2, 109, 109, 109)  # most recent first on ties
    survivors = set(index.draft("live", 32, 1).tokens[1:])
    assert 109 in survivors and 100 not in survivors  # the oldest responses went first
    index.extend("live", [5] * 100)  # live text may exceed the budget: nothing else is left to evict
    index.start("late", "g", [1, 2])
    assert index.num_tokens > 60
    assert index.draft("late", 3, 3).tokens == (2, 5, 5)


texts = st.lists(st.integers(0, 5), min_size=0, max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    responses=st.lists(texts, min_size=1, max_size=4),
    old=st.lists(texts, max_size=2),
    max_nodes=st.integers(1, 12),
    max_depth=st.integers(1, 6),
    chain=st.booleans(),
)
def test_drafts_are_well_formed_sourced_and_deterministic(prompt, responses, old, max_nodes, max_depth, chain):
    def replay() -> list[HistoryDraft]:
        index = HistoryIndex(HistoryConfig(max_key=3, max_match=5, max_candidates=8))
        for i, response in enumerate(old):
            index.start(("old", i), None, prompt)
            index.extend(("old", i), response)
            index.finish(("old", i), keep=True)
        for i in range(len(responses)):
            index.start(i, None, prompt)
        drafts = []
        longest = max(len(r) for r in responses)
        for t in range(longest + 1):  # interleaved: one token per live sibling per round
            for i, response in enumerate(responses):
                if t < len(response):
                    index.extend(i, [response[t]])
                if t <= len(response):
                    drafts.append(index.draft(i, max_nodes, max_depth, chain=chain))
        return drafts

    drafts = replay()
    sources = [prompt] + [prompt + r for r in responses + old]
    for draft in drafts:
        _well_formed(draft, max_nodes, max_depth)
        if chain:
            assert draft.parents == tuple(range(-1, draft.num_nodes - 1))
        for path in _paths(draft)[1:]:
            assert _occurs(path, sources)
    assert drafts == replay()


@pytest.mark.parametrize("seed", range(4))
def test_indexing_on_draft_equals_indexing_on_arrival(seed):
    """Text is indexed when its group is next drafted, in arrival order: every draft, and what the budget keeps,
    equal an index that indexes every token as it arrives (seeded random starts, extends, drafts and finishes of
    sequences in three groups; small budgets evict groups and kept responses; two candidates per draft, so the
    order of occurrences decides which are drafted)."""
    rng = random.Random(seed)
    prompts = [[1, 2, 3], [4, 5], [0, 1, 2, 3, 4, 5, 0, 1]]
    for _ in range(150):
        config = HistoryConfig(token_budget=rng.randint(8, 80), max_key=3, max_match=5, max_candidates=2)
        lazy, eager = HistoryIndex(config), HistoryIndex(config)
        live: set[int] = set()
        for _ in range(40):
            op, seq, group = rng.choice(["start", "extend", "draft", "finish"]), rng.randint(0, 5), rng.randint(0, 2)
            tokens, keep = [rng.randint(0, 5) for _ in range(rng.randint(0, 6))], rng.random() < 0.7
            drafts = []
            for index in (lazy, eager):
                if op == "start" and seq not in live:
                    index.start(seq, None, prompts[group])
                elif op == "extend" and seq in live:
                    index.extend(seq, tokens)
                elif op == "draft" and seq in live:
                    drafts.append(index.draft(seq, 6, 4))
                elif op == "finish" and seq in live:
                    index.finish(seq, keep=keep)
            for pending in eager._groups.values():  # the reference: everything indexed as soon as it arrives
                eager._index_pending(pending)
            if op == "start":
                live.add(seq)
            elif op == "finish":
                live.discard(seq)
            assert drafts[:1] == drafts[1:]
            assert (lazy.num_tokens, lazy.num_groups) == (eager.num_tokens, eager.num_groups)


@pytest.mark.parametrize("seed", range(6))
def test_dropped_texts_leave_drafts_as_if_never_there(seed):
    """Responses dropped from a group (``finish(keep=False)``; eviction takes the same path) leave every later draft
    equal to an index that never saw them, before and after their occurrences are filtered out (seeded random
    interleavings of live siblings in two groups, some of them discarded; a large budget, so nothing is evicted)."""
    rng = random.Random(seed)
    prompts = [[1, 2, 3, 1], [2, 2]]
    filtered = skipped = compared = 0
    for _ in range(60):
        config = HistoryConfig(token_budget=10**6, max_key=3, max_match=6, max_candidates=rng.choice([1, 2, 4, 16]))
        full, reference = HistoryIndex(config), HistoryIndex(config)
        doomed = {seq for seq in range(8) if rng.random() < 0.3}
        for index in (full, reference):  # both groups held from the start, by a sequence that never finishes
            for group, prompt in enumerate(prompts):
                index.start(("anchor", group), None, prompt)
        live: set[int] = set()
        for _ in range(80):
            op, seq, group = (
                rng.choice(["start", "extend", "extend", "draft", "finish"]),
                rng.randrange(8),
                rng.randrange(2),
            )
            tokens = [rng.randrange(4) for _ in range(rng.randint(1, 8))]
            if op == "start" and seq not in live:
                for index in (full, reference) if seq not in doomed else (full,):
                    index.start(seq, None, prompts[group])
                live.add(seq)
            elif op == "extend" and seq in live:
                for index in (full, reference) if seq not in doomed else (full,):
                    index.extend(seq, tokens)
            elif op == "finish" and seq in live:
                full.finish(seq, keep=seq not in doomed)
                if seq not in doomed:
                    reference.finish(seq, keep=True)
                live.discard(seq)
                doomed.discard(seq)  # a later start of this id is a new, kept sequence
                skipped += any(g.dead for g in full._groups.values())
            elif op == "draft" and seq in live and seq not in doomed:
                drafts = full.draft(seq, 8, 4), reference.draft(seq, 8, 4)
                if not doomed & live:  # a doomed sequence still decoding is visible to its siblings
                    compared += 1
                    assert drafts[0] == drafts[1]
        for seq in doomed & live:
            full.finish(seq, keep=False)
        assert full.num_tokens == reference.num_tokens
        filtered += sum(not g.dead for g in full._groups.values())
    assert (
        compared > 100 and skipped and filtered
    )  # both states were reached: dead occurrences skipped, and filtered out


# ---- padded batched trees -----------------------------------------------------------------------------------


def _walk(draft: HistoryDraft, targets: list[int]) -> int:
    """Accepted drafts by the exact rule on the unpadded draft (targets[i] = the policy's token at node i)."""
    node, depth = 0, 0
    while True:
        nxt = [i for i in range(1, draft.num_nodes) if draft.parents[i] == node and draft.tokens[i] == targets[node]]
        if not nxt:
            return depth
        node, depth = nxt[0], depth + 1


def test_pad_rule():
    padded = pad_draft(HistoryDraft((4, 5, 6), (-1, 0, 1), (2.0, 2.0, 1.0)), 5)
    assert padded.tokens == (4, 5, 6, 5, 5)
    assert padded.parents == (-1, 0, 1, 0, 0)
    root_only = pad_draft(HistoryDraft((4,), (-1,), (0.0,)), 3)
    assert root_only.tokens == (4, 4, 4)
    with pytest.raises(ValueError, match="does not fit"):
        pad_draft(padded, 4)
    with pytest.raises(ValueError, match="exceeds max_depth"):
        history_draft_tree([HistoryDraft((4, 5, 6), (-1, 0, 1), (1.0, 1.0, 1.0))], 4, max_depth=1)
    with pytest.raises(ValueError, match="num_nodes >= 2"):
        history_draft_tree([root_only], 1, max_depth=1)


@settings(max_examples=80, deadline=None)
@given(
    conts=st.lists(st.tuples(st.lists(st.integers(0, 3), max_size=5), st.floats(0.5, 4.0)), max_size=6),
    extra=st.integers(0, 6),
    data=st.data(),
)
def test_pads_are_never_on_the_accepted_path(conts, extra, data):
    draft = rank_continuations(data.draw(st.integers(0, 3)), conts, max_nodes=8)
    num_nodes = max(draft.num_nodes, 2) + extra
    tree = history_draft_tree([draft, draft], num_nodes, max_depth=5)
    assert tree.tokens.shape == (2, num_nodes) and tree.ancestors.shape == (2, num_nodes, num_nodes)
    real = max(draft.num_nodes, 2)  # a root-only draft gets one real guess node
    targets = torch.tensor([data.draw(st.lists(st.integers(0, 3), min_size=num_nodes, max_size=num_nodes))] * 2)
    # targets at the pads equal node 1's would-be target, as the policy would give (same parent, same token)
    targets[:, real:] = targets[:, 1:2]
    acc = verify_tree(tree, targets, max_depth=5)
    assert (acc.path < real).all()
    expected = _walk(pad_draft(draft, real), targets[0].tolist())
    assert acc.accepted.tolist() == [expected, expected]


def test_batched_tree_matches_drafts():
    a = HistoryDraft((1, 2, 3, 4), (-1, 0, 0, 1), (3.0, 2.0, 1.0, 1.0))
    b = HistoryDraft((7,), (-1,), (0.0,))
    tree = history_draft_tree([a, b], 6, max_depth=3)
    assert tree.tokens.tolist() == [[1, 2, 3, 4, 2, 2], [7, 7, 7, 7, 7, 7]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 0, 0], [-1, 0, 0, 0, 0, 0]]
    assert tree.depths.tolist() == [[0, 1, 1, 2, 1, 1], [0, 1, 1, 1, 1, 1]]
    assert tree.ancestors[0, 3].tolist() == [True, True, False, True, False, False]


@pytest.mark.parametrize("seed", range(20))
def test_ancestors_walked_to_the_drafts_depth_equal_the_full_walk(seed):
    """The tree's ancestors come from a walk as deep as its drafts reach; they equal a walk of N - 1 steps."""
    from fastrl.speculative.draft_tree import ancestor_matrix

    rng = random.Random(seed)
    num_nodes = rng.randint(2, 40)
    drafts = []
    for _ in range(rng.randint(1, 5)):
        size = rng.randint(1, num_nodes)
        parents = [-1] + [rng.randrange(i) for i in range(1, size)]
        drafts.append(HistoryDraft(tuple(rng.randrange(9) for _ in range(size)), tuple(parents), (1.0,) * size))
    deepest = max(max(d.depths) for d in drafts)
    tree = history_draft_tree(drafts, num_nodes, max_depth=max(deepest, 1) + rng.randint(0, 5))
    assert torch.equal(tree.ancestors, ancestor_matrix(tree.parents, num_nodes - 1))
