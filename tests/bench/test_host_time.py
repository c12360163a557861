"""The host-time suite runs plain and speculative rounds and reports one row per strategy; its clock counts nested
forwards once."""

from __future__ import annotations

import math

import torch

from fastrl.bench.host_time import ForwardClock, bench_host_time, main, parse_arguments
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import make_hf_model


def test_host_time_rows_for_plain_and_speculative(tmp_path):
    make_hf_model("llama", seed=3).save_pretrained(tmp_path)
    model = load_model(tmp_path)
    torch.manual_seed(0)
    drafter = EagleDrafter(model.config)
    rows = bench_host_time(model, drafter, ["disable", "3_1_4"], batches=(2, 4), lengths=(8, 24), length_batch=2)
    assert [r.strategy for r in rows] == ["disable", "3_1_4"]
    for r in rows:
        assert r.small_batch_us > 0 and r.large_batch_us > 0 and r.long_vs_short > 0
        assert math.isfinite(r.per_row_us)


def test_forward_clock_counts_nested_modules_once():
    outer = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    clock = ForwardClock([outer, outer[0]])
    outer(torch.randn(3, 4))
    assert clock.inside > 0
    clock.remove()
    before = clock.inside
    outer(torch.randn(3, 4))
    assert clock.inside == before


def test_the_script_parses_its_documented_forms_and_runs_throughput(capsys):
    args, model_dir = parse_arguments(["throughput", "1,64,256", "64"])
    assert (args.command, args.batches, args.new_tokens) == ("throughput", [1, 64, 256], 64)
    assert model_dir is not None and (model_dir / "config.json").is_file()
    args, model_dir = parse_arguments(["host", "disable,3_1_4"])
    assert (args.command, args.strategies) == ("host", ["disable", "3_1_4"])
    assert parse_arguments(["gumbel"])[1] is None
    main(["throughput", "1,2", "4"])
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["batch 1", "batch 2"] and all(
        "tok/CPU-s (throughput)" in x for x in out
    )
