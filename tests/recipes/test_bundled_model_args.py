"""recipes/bundled_model: sft.py and evaluate.py refuse a bad flag or output with one usage error naming it, before
any model is built or loaded; an existing output is replaced only with --overwrite, and sft.py writes its model
through a staged directory."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "fastrl/assets/arith-tiny"
TINY = "--steps 3 --warmup-steps 1 --hidden-size 16 --num-layers 1 --num-heads 2 --num-kv-heads 1 "
TINY += "--intermediate-size 16 --threads 1"


@pytest.fixture(autouse=True)
def _beside(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "recipes/bundled_model"))  # sft.py imports sft_data from beside it


def _run(script: str, argv: list[str]) -> None:
    runpy.run_path(str(ROOT / "recipes/bundled_model" / script))["main"](argv)


def _refused(script: str, argv: list[str], said: str, capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        _run(script, argv)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and said in captured.err, captured.err
    assert "Traceback" not in captured.err
    return captured.out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--device", "tpu"], "argument --device: 'tpu' is not a torch device"),
        (["--threads", "0"], "argument --threads: must be >= 1, got 0"),
        (["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
        (["--num-heads", "0"], "argument --num-heads: must be >= 1, got 0"),
        (["--num-heads", "4", "--num-kv-heads", "3"], "--num-kv-heads 3 must divide --num-heads 4"),
        (["--steps", "50"], "--steps 50 must exceed --warmup-steps 100"),
        (["--max-positions", "100"], "--max-positions 100 is too short for the task"),
        (["--curriculum-hold", "0.9", "--curriculum-full", "0.5"], "--curriculum-hold 0.9 and --curriculum-full 0.5"),
        (["--min-lr-ratio", "2"], "--min-lr-ratio must be in [0, 1], got 2.0"),
    ],
)
def test_sft_refuses_a_bad_flag(argv, said, tmp_path, capsys):
    out = _refused("sft.py", [*argv, "--out", str(tmp_path / "model")], said, capsys)
    assert "model:" not in out and not (tmp_path / "model").exists()


def test_sft_refuses_an_output_it_cannot_write_before_training(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = _refused("sft.py", ["--out", str(afile / "x")], f"--out={afile / 'x'}: {afile} is not a directory", capsys)
    assert "model:" not in out


def test_sft_keeps_an_existing_model_without_overwrite(tmp_path, capsys):
    shipped = tmp_path / "shipped"
    shutil.copytree(MODEL, shipped)
    before = {p.name: p.read_bytes() for p in shipped.iterdir()}
    out = _refused(
        "sft.py",
        ["--out", str(shipped)],
        "is a directory that is not empty; choose a new one, or pass --overwrite",
        capsys,
    )
    assert "model:" not in out
    assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before


def test_sft_overwrite_replaces_the_model_and_its_stale_evaluation(tmp_path, capsys):
    out = tmp_path / "model"
    out.mkdir()
    (out / "eval.json").write_text("{}")  # the replaced model's evaluation
    (out / "notes.txt").write_text("mine")
    _run("sft.py", [*TINY.split(), "--out", str(out), "--overwrite"])
    assert "saved to" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert "eval.json" not in names and "notes.txt" in names and "model.safetensors" in names
    assert json.loads((out / "training.json").read_text())["config"]["hidden_size"] == 16
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 16
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--per-bucket", "0"], "argument --per-bucket: must be >= 1, got 0"),
        (["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
        (["--threads", "0"], "argument --threads: must be >= 1, got 0"),
        (["--model", "/nonexistent/model"], "argument --model: /nonexistent/model is missing"),
        (["--model", str(ROOT / "fastrl/assets/arith-tiny-drafter")], "is not a model directory: no weights"),
        (["--out", str(MODEL / "config.json"), "--overwrite"], "is the --model's config.json file"),
        (["--out", str(ROOT / "README.md" / "x.json")], "README.md is not a directory"),
    ],
)
def test_evaluate_refuses_a_bad_flag(argv, said, capsys):
    _refused("evaluate.py", argv, said, capsys)


def test_evaluate_keeps_an_existing_output_without_overwrite(tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    (model / "eval.json").write_text("finished")
    _refused("evaluate.py", ["--model", str(model)], "eval.json exists; choose a new file, or pass --overwrite", capsys)
    assert (model / "eval.json").read_text() == "finished"
    _run("evaluate.py", ["--model", str(model), "--per-bucket", "1", "--no-sampled", "--threads", "1", "--overwrite"])
    assert json.loads((model / "eval.json").read_text())["eval_config"]["per_bucket"] == 1
