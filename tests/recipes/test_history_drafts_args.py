"""recipes/history_drafts/measure.py: a bad flag, a missing or malformed --data, an output that exists or cannot be
written and --arctic without arctic-inference are each one usage error naming the flag, before any work."""

from __future__ import annotations

import importlib.util
import json
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROW = {"group": 0, "epoch": 0, "prompt": [1, 2], "response": [3, 4, 5, 3, 4, 5]}


def _measure(argv: list[str]) -> None:
    runpy.run_path(str(ROOT / "recipes/history_drafts/measure.py"))["main"](argv)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(ROW | {"epoch": 1}) + "\n")
    return path


def _refused(argv: list[str], said: str, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        _measure(argv)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and said in captured.err, captured.err
    assert captured.out == "" and "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("", "holds no rollouts; make them with --generate"),
        (json.dumps(ROW) + '\n{"group": 0, "epo', ":2: not a rollout (Unterminated string"),
        ('{"x": 1}\n', ":1: not a rollout (expected an object with group, epoch, prompt and response)"),
        (json.dumps(ROW | {"prompt": "abc"}) + "\n", ":1: not a rollout (group, epoch and token ids must be"),
    ],
)
def test_bad_data_is_refused_naming_the_line(content, said, tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl"
    path.write_text(content)
    _refused(["--data", str(path)], f"--data: {path}" + said if said.startswith(":") else said, capsys)


def test_bad_arguments_are_refused(data, tmp_path, capsys):
    _refused(
        ["--data", str(tmp_path / "nope.jsonl")], "--data: " + str(tmp_path / "nope.jsonl") + " is missing", capsys
    )
    _refused(["--prompts", "0"], "argument --prompts: must be >= 1, got 0", capsys)
    _refused(
        ["--data", str(data), "--json", str(data / "x")], f"argument --json: {data / 'x'}: {data} is not a", capsys
    )
    _refused(["--data", str(data), "--json", str(data)], f"argument --json: {data} exists; choose a new file", capsys)
    _refused(["--generate", "--data", str(data / "x")], f"--data: {data / 'x'}: {data} is not a directory", capsys)
    new = str(tmp_path / "new.jsonl")
    _refused(["--generate", "--data", new, "--json", new], "--json and --data name the same file", capsys)


def test_generate_keeps_existing_data(data, capsys):
    before = data.read_text()
    _refused(["--generate", "--data", str(data)], "exists; choose a new file, or drop --generate to measure it", capsys)
    assert data.read_text() == before


def test_arctic_without_arctic_inference_is_refused_before_the_replay(data, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "arctic_inference" else real(name)
    )
    _refused(["--data", str(data), "--arctic"], "--arctic needs arctic-inference", capsys)


def test_a_measure_writes_its_json(data, tmp_path, capsys):
    out = tmp_path / "table.json"
    _measure(["--data", str(data), "--json", str(out)])
    table = json.loads(out.read_text())
    assert len(table) == 8 and {row["backend"] for row in table} == {"fastrl"}
    assert "2 responses" in capsys.readouterr().out
