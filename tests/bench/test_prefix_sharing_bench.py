"""The prefix-sharing benchmark runs both sides on the same batch and checks they agree (no timing asserted)."""

from __future__ import annotations

import pytest

from fastrl.bench.prefix_sharing import bench_prefix_sharing
from fastrl.commands.bench_config import BenchConfig
from fastrl.models.checkpoint import load_model
from tests.helpers import make_hf_model


def test_rows_and_work(tmp_path):
    make_hf_model("llama", seed=1).save_pretrained(tmp_path)
    model = load_model(tmp_path)
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    rows = bench_prefix_sharing(model, prompts, [1, 3], repeats=1)
    assert [r.samples_per_prompt for r in rows] == [1, 3]
    assert all(r.rows_computed == len(prompts) for r in rows)
    assert rows[1].prompt_tokens == 3 * 9
    assert all(r.unshared_s > 0 and r.shared_s > 0 for r in rows)


@pytest.mark.parametrize(
    "overrides, key",
    [({"prefix_sharing_group_sizes": [0]}, "prefix_sharing_group_sizes"), ({"suites": ["x"]}, "suites")],
)
def test_bad_config_names_the_key(overrides, key):
    with pytest.raises(ValueError, match=key):
        BenchConfig(**overrides)
