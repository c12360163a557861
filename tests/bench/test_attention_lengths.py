"""The attention-length microbenchmark compares like with like: grouped attention gives padded attention's output."""

from __future__ import annotations

from fastrl.bench.attention_lengths import grouped_vs_padded, layout


def test_grouped_attention_runs_and_matches_padded_attention():
    padded, grouped = grouped_vs_padded([3, 9, 4, 17, 5, 2, 30, 8], groups=4)  # raises if the outputs differ
    assert padded > 0 and grouped > 0


def test_layout_times_the_view_the_contiguous_keys_and_the_copy():
    assert set(layout(batch=4, length=10, width=16)) == {"view", "contiguous", "copy to contiguous"}
