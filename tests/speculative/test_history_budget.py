"""HistoryIndex eviction: the same evictions, in the same order, as the rule it replaced (which scanned every group
on every over-budget start and finish), while visiting only the groups it needs; and a group's prompt is its own."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Iterator

import pytest

from fastrl.speculative.history import HistoryConfig, HistoryIndex


class _CountingGroups(OrderedDict):
    """The index's group map, counting the groups its walks visit."""

    visits = 0

    def items(self) -> Iterator[tuple[Hashable, object]]:  # type: ignore[override]
        for item in super().items():
            self.visits += 1
            yield item

    def values(self) -> Iterator[object]:  # type: ignore[override]
        for value in super().values():
            self.visits += 1
            yield value

    def __getitem__(self, key: Hashable) -> object:
        self.visits += 1
        return super().__getitem__(key)


class _Counted(HistoryIndex):
    """A HistoryIndex recording, per ``_enforce_budget`` call, how many groups it visited."""

    def __init__(self, config: HistoryConfig) -> None:
        super().__init__(config)
        self._groups = _CountingGroups()
        self.calls: list[int] = []  # groups visited per over-budget call

    def _enforce_budget(self) -> None:
        over = self.num_tokens > self.config.token_budget
        self._groups.visits = 0
        super()._enforce_budget()
        if over:
            self.calls.append(self._groups.visits)


class _OldRule(_Counted):
    """The reference: the eviction rule as it was, every group without a live sequence listed on every call."""

    def _enforce_budget(self) -> None:
        over = self.num_tokens > self.config.token_budget
        self._groups.visits = 0
        self._old_enforce_budget()
        if over:
            self.calls.append(self._groups.visits)

    def _old_enforce_budget(self) -> None:
        budget = self.config.token_budget
        if self.num_tokens <= budget:
            return
        for key in [k for k, g in self._groups.items() if not g.live]:
            self.num_tokens -= self._groups.pop(key).num_tokens
            if self.num_tokens <= budget:
                return
        for group in self._groups.values():
            drop: list[int] = []
            excess = self.num_tokens - budget
            while group.finished and excess > 0:
                doc = group.finished.pop(0)
                drop.append(doc)
                excess -= len(group.docs[doc])
            if drop:
                self._remove_docs(group, drop)
            if self.num_tokens <= budget:
                return


def _snapshot(index: HistoryIndex) -> tuple:
    """Everything eviction decides: which groups, in which order, their texts, kept and dead responses, tokens."""
    return (
        index.num_tokens,
        [
            (key, sorted(g.docs.items()), list(g.finished), sorted(g.dead), g.dead_tokens, sorted(g.live), g.num_tokens)
            for key, g in index._groups.items()
        ],
    )


def _check_counters(index: HistoryIndex) -> None:
    groups = dict(index._groups)
    assert index._idle_groups == sum(not g.live for g in groups.values())
    assert set(index._keeping) == {key for key, g in groups.items() if g.finished}
    assert [g.used for g in groups.values()] == sorted(g.used for g in groups.values())


@pytest.mark.parametrize("seed", range(12))
def test_evictions_equal_the_old_rules_on_random_operations(seed: int) -> None:
    rng = random.Random(seed)
    config = HistoryConfig(token_budget=rng.choice([30, 60, 120, 250]), max_key=2, max_match=4, max_candidates=4)
    new, old = _Counted(config), _OldRule(config)
    prompts = [[rng.randrange(1, 6) for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(2, 12))]
    prompts = list({tuple(p): p for p in prompts}.values())  # one prompt per group
    live: list[int] = []
    serial = 0
    for _ in range(400):
        op = rng.random()
        if not live and op < 0.2:  # a checkpoint round trip: the budget applies as the groups come back
            state = new.state()
            assert state == old.state()
            for index in (new, old):
                index.load_state(state)
        elif op < 0.3 or not live:
            prompt = rng.choice(prompts)
            for index in (new, old):
                index.start(serial, None, prompt)
            live.append(serial)
            serial += 1
        elif op < 0.6:
            seq, tokens = rng.choice(live), [rng.randrange(1, 6) for _ in range(rng.randint(1, 8))]
            for index in (new, old):
                index.extend(seq, tokens)
        elif op < 0.75:
            seq = rng.choice(live)
            assert new.draft(seq, 6, 3) == old.draft(seq, 6, 3)
        else:
            seq, keep = live.pop(rng.randrange(len(live))), rng.random() < 0.8
            for index in (new, old):
                index.finish(seq, keep=keep)
        assert _snapshot(new) == _snapshot(old)
        _check_counters(new)
    assert new.state() == old.state()
    assert len(new.calls) == len(old.calls) > 0


def test_groups_visited_per_call_stay_bounded_by_the_live_groups_not_the_groups_held() -> None:
    """Thousands of idle groups held, requests of fresh prompts (one live at a time besides a few long-lived ones):
    each over-budget call visits the live groups before the ones it evicts, and those, not every group."""
    rng = random.Random(0)
    config = HistoryConfig(token_budget=3000 * 20)
    new, old = _Counted(config), _OldRule(config)
    long_lived = 3
    for index in (new, old):
        for s in range(long_lived):  # live groups at the least-recently-used end, never drafted again
            index.start(("live", s), None, [9000 + s] * 6)
    for n in range(4000):
        prompt = [rng.randrange(8000) for _ in range(6)]
        response = [rng.randrange(8000) for _ in range(8)]
        for index in (new, old):
            index.start(n, None, prompt)
            index.extend(n, response)
            index.finish(n, keep=True)
        if n % 500 == 0:
            assert _snapshot(new) == _snapshot(old)
    assert new.num_groups > 2500
    assert _snapshot(new) == _snapshot(old)
    assert len(new.calls) == len(old.calls) > 1000
    assert max(old.calls) > 2500  # the old rule listed every group held
    assert max(new.calls) <= long_lived + 2  # the live groups first in line, then the one or two it evicts


def test_live_text_over_the_budget_is_not_walked_on_every_call() -> None:
    """Live text alone over the budget: once no kept response is left, a start or finish visits no group."""
    config = HistoryConfig(token_budget=200, max_match=4)
    new, old = _Counted(config), _OldRule(config)
    for index in (new, old):
        for s in range(100):
            index.start(s, None, [s + 1, s + 2, s + 3])
            index.extend(s, [7] * 4)
        for s in range(100, 150):
            index.start(s, None, [s % 100 + 1, s % 100 + 2, s % 100 + 3])  # a second live sibling: stays live
            index.finish(s, keep=True)
    assert _snapshot(new) == _snapshot(old)
    assert new.num_tokens > config.token_budget
    assert max(old.calls[-20:]) >= 100  # the old rule walked every live group
    assert max(new.calls[-20:]) <= 2  # the one group whose just-kept response goes (its sort key, then its texts)


def test_a_custom_group_key_held_with_another_prompt_is_refused_by_name() -> None:
    index = HistoryIndex()
    index.start("a", "grp", [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="'grp'.*another prompt"):
        index.start("b", "grp", [9, 9, 9, 7])
    assert not index.is_live("b")
    index.start("c", "grp", [1, 2, 3, 4, 5])  # the group's own prompt is fine
    index.finish("a", keep=True)
    index.finish("c", keep=False)
    with pytest.raises(ValueError, match="'grp'"):  # held without live sequences too
        index.start("d", "grp", [1, 2, 3])
    assert index.num_tokens == 5 + 5  # the prompt and a's kept text (its prompt tail): nothing of b's
    _check_counters(index)
