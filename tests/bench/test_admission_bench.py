"""The admission benchmark runs every setting on the same queue, checks their tokens agree and counts the work
(no timing asserted)."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.bench.admission import bench_admission, default_admit, main
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
        (["--admit", "1,x"], "argument --admit: integers separated by commas"),
        (["--admit", "0,2"], "argument --admit: each must be >= 1"),
        (["--admit", "1,9"], "in [1, --batch-size=8]"),
        (["--admit", "1,2", "--dtype", "f16"], "--dtype must be one of"),
        (["--temperature", "-1"], "--temperature must be a finite number >= 0, got -1.0"),
        (["--temperature", "1e-9"], "--temperature must be 0 (greedy) or at least 1e-06"),
        (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
        (["--model", "nonexist"], "--model=nonexist: checkpoint directory nonexist does not exist"),
        (["--device", "tpu"], "--device='tpu'"),
        (["--device", "cuda"], "--device=cuda: this machine has no CUDA device"),
        (["--batch-size", "10000000000"], "--batch-size=10000000000 needs a"),
    ],
)
def test_bad_settings_are_one_error_before_a_model_loads(flags, message, capsys, monkeypatch):
    """Each bad value is argparse's one line naming its flag (exit 2), no traceback, no model loaded; the default
    --admit fits the 8 slots, so it hides no later check."""
    import fastrl.models.checkpoint as checkpoint

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(SystemExit) as exit_:
        main(["--batch-size", "8", *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert message in err.strip().splitlines()[-1]


def test_the_default_admit_follows_the_batch_size():
    """Admission at once against in batches of an eighth of the slots (the engine's default), as 1,32 at 256."""
    assert default_admit(256) == [1, 32]
    assert default_admit(64) == [1, 8]
    assert default_admit(8) == default_admit(1) == [1]


def test_a_model_without_a_shipped_drafter_runs(tmp_path, capsys):
    """Admission decodes plainly: a checkpoint with no drafter shipped for it is fine (was refused, after loading,
    asking for a drafter= key the script does not have)."""
    import shutil

    from fastrl.assets_path import bundled_model_dir

    copy = shutil.copytree(bundled_model_dir(), tmp_path / "model")
    main(["--model", str(copy), "--requests", "4", "--batch-size", "2", "--max-new-tokens", "3", "--repeats", "1"])
    assert "4 requests on 2 slots (cpu, float32)" in capsys.readouterr().out
