"""The history eviction benchmark runs its steps, reaches the filtering pass, and refuses a bad flag."""

from __future__ import annotations

import pytest

from fastrl.bench import history_eviction
from fastrl.speculative.history import HistoryIndex


def test_steps_evict_and_filter(capsys):
    times, filtered = history_eviction.eviction_steps(tokens=5000, response=400, steps=12, vocab=7)
    assert len(times) == 12 and all(t > 0 for t in times)
    assert 1 <= filtered < 12  # dropped responses are mostly skipped, now and then filtered out
    history_eviction.main(["--tokens", "2000", "--response", "300", "--steps", "3"])
    assert "3 evicting steps at 2000 tokens: median" in capsys.readouterr().out


@pytest.mark.parametrize(("tokens", "response"), [(1000, 50), (200_000, 10), (1000, 896), (3000, 1)])
def test_the_fill_ends_and_every_step_evicts_older_responses_but_keeps_history(tokens, response, monkeypatch):
    held: list[tuple[int, int]] = []  # (tokens held, kept responses) after each finish
    finish = HistoryIndex.finish

    def counted(index, seq_id, keep):
        finish(index, seq_id, keep)
        group = next(iter(index._groups.values()))
        held.append((index.num_tokens, len(group.finished)))
        if len(held) > tokens:  # the fill adds at least one token per response: it never needs this many
            raise RuntimeError("the fill does not end")

    monkeypatch.setattr(HistoryIndex, "finish", counted)
    times, _ = history_eviction.eviction_steps(tokens=tokens, response=response, steps=3, vocab=50)
    assert len(times) == 3
    fill, steps = held[:-3], held[-3:]
    kept_before = [kept for _, kept in [fill[-1], *steps[:-1]]]
    assert all(after <= before for before, (_, after) in zip(kept_before, steps, strict=True))  # each step evicted
    assert all(0 < kept and num <= tokens for num, kept in steps)
    assert tokens - fill[-1][0] < 16 + min(1000, response)  # the fill stopped as the next response would not fit


def test_a_bad_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stopped:
        history_eviction.main(["--tokens", "10"])
    assert stopped.value.code == 2 and "argument --tokens: must be >= 1000, got 10" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        history_eviction.main(["--tokens", "1000", "--response", "897"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "argument --response: 897 leaves no kept history under --tokens 1000" in err
    assert "give at most 896" in err
    with pytest.raises(SystemExit) as stopped:
        history_eviction.main(["--tokens", str(10**15)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and f"argument --tokens: {10**15} tokens of history need about" in err
