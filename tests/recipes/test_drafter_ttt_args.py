"""recipes/drafter_ttt: every bad flag and every output that cannot or must not be written is one usage error naming
it, before any model loads or any work runs (no traceback after a drafter trained or plain decoding ran)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRAFTER = str(ROOT / "fastrl/assets/arith-tiny-drafter")
MODEL = str(ROOT / "fastrl/assets/arith-tiny")
EXISTING = str(ROOT / "README.md")
UNDER_A_FILE = str(ROOT / "README.md" / "x.json")


def _main(script: str):
    return runpy.run_path(str(ROOT / "recipes/drafter_ttt" / script))["main"]


CASES = [
    ("paired_speed.py", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    ("paired_speed.py", ["--prompts", "0"], "argument --prompts: must be >= 1, got 0"),
    ("paired_speed.py", ["--strategies", "3_1_4", "bogus"], "argument --strategies: strategy 'bogus'"),
    ("paired_speed.py", ["--strategies", "3_1_4", "disable"], "--strategies: disable is plain decoding, which every"),
    ("paired_speed.py", ["--temperature", "-1"], "argument --temperature: must be a finite number >= 0"),
    ("paired_speed.py", ["--temperature", "1e-9"], "argument --temperature: must be 0 (greedy) or at least 1e-06"),
    ("paired_speed.py", ["--drafter", "/nonexistent/d"], "argument --drafter: /nonexistent/d is missing"),
    ("paired_speed.py", ["--drafter", MODEL], f"--drafter {MODEL}: {MODEL} is not a drafter checkpoint"),
    ("paired_speed.py", ["--prompts-file", "/nonexistent.jsonl"], "argument --prompts-file: /nonexistent.jsonl"),
    ("step_cost.py", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    ("step_cost.py", ["--steps", "0"], "argument --steps: must be >= 1, got 0"),
    ("step_cost.py", ["--steps", "3", "3"], "--steps: 3 is given twice"),
    ("step_cost.py", ["--tokens", "0"], "argument --tokens: must be >= 1, got 0"),
    ("fused_round_cost.py", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    ("fused_round_cost.py", ["--arms", "7_1_8"], "argument --arms: '7_1_8': expected STRATEGY:BATCH"),
    ("fused_round_cost.py", ["--arms", "bogus:1"], "argument --arms: 'bogus:1': strategy 'bogus'"),
    ("fused_round_cost.py", ["--arms", "7_1_8:0"], "argument --arms: '7_1_8:0': batch size must be >= 1, got 0"),
    ("fused_round_cost.py", ["--arms", "7_1_8:x"], "argument --arms: '7_1_8:x': batch size 'x' is not an integer"),
    ("side_by_side.py", [DRAFTER, "--strategies", "3_1_4", "bogus"], "argument --strategies: strategy 'bogus'"),
    ("side_by_side.py", [DRAFTER, "--prompts", "0"], "argument --prompts: must be >= 1, got 0"),
    ("side_by_side.py", [DRAFTER, "--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    ("side_by_side.py", ["/nonexistent/d"], "argument drafters: /nonexistent/d is missing"),
    ("side_by_side.py", [MODEL], "is not a drafter checkpoint"),
    ("side_by_side.py", [DRAFTER, DRAFTER], "is given twice"),
    ("side_by_side.py", [DRAFTER, "--out", EXISTING], "argument --out: " + EXISTING + " exists; choose a new file"),
    ("side_by_side.py", [DRAFTER, "--out", UNDER_A_FILE], "README.md is not a directory"),
    ("compare_losses.py", ["--arms", "ttt1", "foo"], "argument --arms: arm 'foo': expected ttt<K>"),
    ("compare_losses.py", ["--arms", "ttt0"], "argument --arms: arm 'ttt0'"),
    ("compare_losses.py", ["--arms", "ttt1", "ttt1"], "--arms: ttt1 is given twice"),
    ("compare_losses.py", ["--strategies", "bogus"], "argument --strategies: strategy 'bogus'"),
    ("compare_losses.py", ["--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
    ("compare_losses.py", ["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
    ("compare_losses.py", ["--out", EXISTING], "argument --out: " + EXISTING + " exists; choose a new file"),
    ("compare_losses.py", ["--out", UNDER_A_FILE], "README.md is not a directory"),
    ("compare_fused.py", ["--depths", "0"], "argument --depths: must be >= 1, got 0"),
    ("compare_fused.py", ["--held-out", "0"], "argument --held-out: must be >= 1, got 0"),
    ("compare_fused.py", ["--layers", "99"], "--layers 99: extra_layers [99] lie outside the policy's 6"),
    ("compare_fused.py", ["--layers", "2", "0"], "--layers 2 0: extra_layers must be distinct and ascending"),
    ("compare_fused.py", ["--check", "65"], "--check 65 must be <= --held-out 64"),
    ("compare_fused.py", ["--out", EXISTING], "argument --out: " + EXISTING + " exists; choose a new file"),
    ("compare_fused.py", ["--out", UNDER_A_FILE], "README.md is not a directory"),
]


@pytest.mark.parametrize(("script", "argv", "said"), CASES)
def test_a_bad_argument_is_one_usage_error_before_any_work(script, argv, said, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a default --out is made under runs/ here, not in the checkout
    with pytest.raises(SystemExit) as stopped:
        _main(script)(argv)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and said in captured.err, captured.err
    assert captured.out == "" and "Traceback" not in captured.err  # nothing measured, nothing trained


def test_an_existing_default_output_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs/drafter_ttt/compare.json"
    out.parent.mkdir(parents=True)
    out.write_text("finished")
    with pytest.raises(SystemExit):
        _main("compare_losses.py")(["--arms", "ttt1"])
    assert "runs/drafter_ttt/compare.json exists; choose a new file" in capsys.readouterr().err
    assert out.read_text() == "finished"


def test_side_by_side_writes_a_new_output(tmp_path, capsys):
    out = tmp_path / "sbs.json"
    _main("side_by_side.py")([DRAFTER, "--prompts", "1", "--repeats", "1", "--strategies", "3_1_4", "--out", str(out)])
    assert '"strategy": "3_1_4"' in out.read_text() and "| 0 | 3_1_4 |" in capsys.readouterr().out
