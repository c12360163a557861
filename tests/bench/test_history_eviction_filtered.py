"""The history eviction benchmark counts the steps that filtered the n-gram lists, a pass that starts from no
dropped tokens (they are reset to none by the pass itself) included."""

from __future__ import annotations

import pytest

from fastrl.bench import history_eviction
from fastrl.speculative.history import HistoryIndex


@pytest.mark.parametrize(
    ("tokens", "response", "steps"),
    [(1000, 896, 5), (20000, 10000, 5), (5000, 400, 12), (20000, 100, 30)],
)
def test_filtered_counts_the_steps_with_a_filtering_pass(tokens, response, steps, monkeypatch):
    drafts = {"n": 0}  # the benchmark drafts once after the fill, then once at the end of each step
    passes: list[int] = []  # per filtering pass, the drafts made before it: 0 in the fill, 1 + i in step i
    remove, draft = HistoryIndex._remove_docs, HistoryIndex.draft

    def removing(index, group, docs):
        remove(index, group, docs)
        if docs and not group.dead:  # the dropped texts always join `dead`, unless the lists were filtered
            passes.append(drafts["n"])

    def drafting(index, *args, **kwargs):
        drafts["n"] += 1
        return draft(index, *args, **kwargs)

    monkeypatch.setattr(HistoryIndex, "_remove_docs", removing)
    monkeypatch.setattr(HistoryIndex, "draft", drafting)
    times, filtered = history_eviction.eviction_steps(tokens, response, steps, vocab=50)
    assert len(times) == steps == drafts["n"] - 1
    assert filtered == len({n for n in passes if n >= 1})
    if response > tokens // 4:  # every step's response evicts the previous one, which outweighs what is left
        assert filtered == steps
