"""The admission benchmark runs every setting on the same queue, checks their tokens agree and counts the work
(no timing asserted)."""

from __future__ import annotations

import random

import pytest

from fastrl.bench.admission import bench_admission, main
from fastrl.engine.engine import GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from tests.helpers import make_hf_model


def test_rows_count_fewer_prefill_calls_for_larger_batches(tmp_path):
    make_hf_model("llama", seed=1).save_pretrained(tmp_path)
    model = load_model(tmp_path)
    rng = random.Random(0)
    inputs = [
        GenerateInput(
            [rng.randrange(3, 90) for _ in range(4)], SamplingParams(max_new_tokens=rng.randint(2, 12), seed=i)
        )
        for i in range(24)
    ]
    rows = bench_admission(model, inputs, 6, [1, 4], repeats=2, device="cpu", dtype="float64")
    assert [r.admit_batch for r in rows] == [1, 4] and all(len(r.runs_s) == 2 for r in rows)
    assert rows[0].tokens == rows[1].tokens == sum(len(o.token_ids) for o in _plain(model, inputs))
    assert rows[1].prefill_calls < rows[0].prefill_calls
    assert all(r.identical == len(inputs) for r in rows)
    assert all(r.decode_rounds > 0 for r in rows)


def _plain(model, inputs):
    from fastrl.engine.config import EngineConfig
    from fastrl.engine.engine import Engine

    return Engine(model, EngineConfig(max_batch_size=len(inputs))).generate(inputs)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--admit", "1,x"], "integers separated by commas"),
        (["--admit", "1,9"], "in [1, --batch-size=8]"),
        (["--admit", "1,2", "--dtype", "f16"], "--dtype must be one of"),
    ],
)
def test_bad_settings_are_one_error(flags, message, capsys):
    with pytest.raises(SystemExit):
        main(["--batch-size", "8", *flags])
    assert message in capsys.readouterr().err
