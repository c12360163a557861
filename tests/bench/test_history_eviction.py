"""The history eviction benchmark runs its steps, reaches the filtering pass, and refuses a bad flag."""

from __future__ import annotations

import pytest

from fastrl.bench import history_eviction


def test_steps_evict_and_filter(capsys):
    times, filtered = history_eviction.eviction_steps(tokens=5000, response=400, steps=12, vocab=7)
    assert len(times) == 12 and all(t > 0 for t in times)
    assert 1 <= filtered < 12  # dropped responses are mostly skipped, now and then filtered out
    history_eviction.main(["--tokens", "2000", "--response", "300", "--steps", "3"])
    assert "3 evicting steps at 2000 tokens: median" in capsys.readouterr().out


def test_a_bad_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stopped:
        history_eviction.main(["--tokens", "10"])
    assert stopped.value.code == 2 and "argument --tokens: must be >= 1000, got 10" in capsys.readouterr().err
