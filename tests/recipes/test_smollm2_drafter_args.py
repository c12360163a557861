"""recipes/smollm2_drafter: make_prompts.py, compare_vocab.py and the step-cost scripts refuse a bad argument with one
usage error naming it, before any model loads; outputs are never replaced by surprise."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes/smollm2_drafter"


@pytest.fixture(autouse=True)
def _beside(monkeypatch):
    monkeypatch.syspath_prepend(str(RECIPE))  # the cost scripts import shipped from beside them


def _main(script: str):
    return runpy.run_path(str(RECIPE / script))["main"]


def _refused(script: str, argv: list[str], said: str, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        _main(script)(argv)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and said in captured.err, captured.err
    assert captured.out == "" and "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("script", "argv", "said"),
    [
        ("drafter_step_cost.py", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        ("drafter_step_cost.py", ["--calls", "0"], "argument --calls: must be >= 1, got 0"),
        ("train_step_cost.py", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        ("train_step_cost.py", ["--sequences", "0"], "argument --sequences: must be >= 1, got 0"),
        ("train_step_cost.py", ["--length", "0"], "argument --length: must be >= 2, got 0"),
        ("compare_vocab.py", ["/nonexistent/run"], "argument run: /nonexistent/run is missing"),
        ("make_prompts.py", [], "the following arguments are required: out"),
        ("varied_prompts.py", [], "the following arguments are required: out"),
        ("varied_prompts.py", ["p.jsonl", "0"], "argument count: must be >= 1, got 0"),
    ],
)
def test_a_bad_argument_is_one_usage_error(script, argv, said, capsys):
    _refused(script, argv, said, capsys)


def test_make_prompts_answers_help_and_checks_its_count(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        _main("make_prompts.py")(["--help"])
    assert stopped.value.code == 0 and "OUT.jsonl" not in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no file named --help
    _refused("make_prompts.py", ["p.jsonl", "abc"], "argument count: 'abc' is not an integer", capsys)
    _refused("make_prompts.py", ["p.jsonl", "-5"], "argument count: must be >= 1, got -5", capsys)
    _refused("make_prompts.py", ["p.jsonl", "5", "x"], "argument seed: 'x' is not an integer", capsys)
    _refused("make_prompts.py", [str(tmp_path)], "is a directory; give a file name", capsys)
    assert list(tmp_path.iterdir()) == []


def test_make_prompts_keeps_other_prompts_and_reruns_in_place(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    _main("make_prompts.py")([str(out), "5", "1"])
    written = out.read_text()
    assert len(written.splitlines()) == 5 and "5 prompts written" in capsys.readouterr().out
    _main("make_prompts.py")([str(out), "5", "1"])  # the same prompts: a rerun of run.sh goes on
    assert "already holds these 5 prompts" in capsys.readouterr().out
    _refused(
        "make_prompts.py", [str(out), "6", "1"], "holds other prompts; choose a new file, or pass --overwrite", capsys
    )
    assert out.read_text() == written
    _main("make_prompts.py")([str(out), "6", "1", "--overwrite"])
    assert len(out.read_text().splitlines()) == 6


def test_varied_prompts_are_distinct_seeded_and_leave_out_the_held_out_ones():
    module = runpy.run_path(str(RECIPE / "varied_prompts.py"))
    words = module["vocabulary_words"](["Ġrefrigerator", "Ġcat", "ĠParis", "Ġbanana", "ban", "Ġtwo-way", "Ġmeadows"])
    assert words == ["banana", "meadows", "refrigerator"]  # whole lowercase words of 6+ letters, sorted
    make = module["varied_prompts"]
    first = make(300, 7, words, set())
    assert len(set(first)) == 300 and first == make(300, 7, words, set()) and first != make(300, 8, words, set())
    assert make(300, 7, words, set(first[:50]))[:10] == first[50:60]  # an excluded prompt is never written
    assert {p for p in first if "refrigerator" in p} and {p for p in first if p.startswith("Write a")}
    with pytest.raises(ValueError, match="no subject words"):
        make(3, 0, [], set())


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A recipe output directory around the bundled model and drafter (the real one needs SmolLM2)."""
    shutil.copytree(ROOT / "fastrl/assets/arith-tiny-drafter", tmp_path / "run/drafter")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "3+4="}\n{"prompt": "5+6="}\n')
    metrics = json.loads((tmp_path / "run/drafter/metrics.json").read_text())
    config = {"model": str(ROOT / "fastrl/assets/arith-tiny"), "prompts": str(prompts), "eval_prompts": 1}
    metrics["config"].update(config | {"seed": 0, "chat_template": False, "max_new_tokens": 8})
    (tmp_path / "run/drafter/metrics.json").write_text(json.dumps(metrics))
    return tmp_path / "run"


def test_compare_vocab_checks_the_run_before_loading(run, capsys):
    _refused("compare_vocab.py", [str(run.parent)], "drafter/metrics.json is missing: is", capsys)
    _refused("compare_vocab.py", [str(run), "--strategies", "bogus"], "argument --strategies: strategy 'bogus'", capsys)
    _refused(
        "compare_vocab.py", [str(run), "--temperatures", "-1"], "argument --temperatures: must be a finite", capsys
    )
    (run.parent / "prompts.jsonl").unlink()
    _refused("compare_vocab.py", [str(run)], "prompts.jsonl (from", capsys)


def test_compare_vocab_replaces_its_output_only_with_overwrite(run, capsys):
    out = run / "compare_vocab.json"
    out.write_text("finished")
    _refused("compare_vocab.py", [str(run)], f"{out} exists; pass --overwrite to replace it", capsys)
    assert out.read_text() == "finished"
    _main("compare_vocab.py")([str(run), "--strategies", "3_1_4", "--overwrite"])
    assert json.loads(out.read_text())["rows"][0]["strategy"] == "3_1_4"
