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


def test_groups_bench_rows_agree_with_plain(tmp_path):
    import torch

    from fastrl.bench.history_groups import bench_groups_bs1
    from fastrl.speculative.drafter import EagleDrafter

    make_hf_model("llama", seed=2).save_pretrained(tmp_path / "m")
    model = load_model(tmp_path / "m")
    torch.manual_seed(0)
    drafter = EagleDrafter(model.config)
    rows = bench_groups_bs1(
        model, drafter, None, [[5, 6, 7], [8, 9]], 2, ["suffix_4", "2_1_3+suffix_4", "bandit"],
        ["2_1_3", "suffix_4", "disable"], 12, 1, [1.0], 0,
    )  # fmt: skip
    assert [r.method for r in rows] == ["fastrl plain", "fastrl suffix_4", "fastrl 2_1_3+suffix_4", "fastrl bandit"]
    assert all(r.accept_length >= 1.0 and r.tok_s > 0 for r in rows)
