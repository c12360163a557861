"""recipes/selector_budget: cold_start.py and compare.py refuse a bad flag with one usage error naming it, before
any model loads or any simulation runs."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _main(script: str):
    return runpy.run_path(str(ROOT / "recipes/selector_budget" / script))["main"]


@pytest.mark.parametrize(
    ("script", "argv", "said"),
    [
        ("cold_start.py", ["--requests", "0"], "argument --requests: must be >= 1, got 0"),
        ("cold_start.py", ["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
        ("cold_start.py", ["--runs", "0"], "argument --runs: must be >= 1, got 0"),
        ("cold_start.py", ["--arms", "bogus"], "--arms bogus: BanditConfig.strategies: strategy 'bogus'"),
        ("cold_start.py", ["--temperature", "-1"], "argument --temperature: must be a finite number >= 0, got -1"),
        ("cold_start.py", ["--temperature", "1e-9"], "argument --temperature: must be 0 (greedy) or at least 1e-06"),
        ("cold_start.py", ["--model", "/etc/passwd/x"], "--model /etc/passwd/x: checkpoint directory"),
        ("cold_start.py", ["--drafter", "/nonexistent/d"], "argument --drafter: /nonexistent/d is missing"),
        ("cold_start.py", ["--prompts-file", "/nonexistent.jsonl"], "argument --prompts-file: /nonexistent.jsonl"),
        ("compare.py", ["-1"], "argument budgets: each must be a finite number >= 0, got -1.0"),
        ("compare.py", ["nan"], "argument budgets: each must be a finite number >= 0, got nan"),
        ("compare.py", ["0.05,inf"], "argument budgets: each must be a finite number >= 0, got inf"),
        ("compare.py", ["0.05,x"], "argument budgets: comma-separated numbers, got '0.05,x'"),
        ("compare.py", ["0.05,0.05"], "argument budgets: a budget is given twice"),
    ],
)
def test_a_bad_argument_is_one_usage_error(script, argv, said, capsys):
    with pytest.raises(SystemExit) as stopped:
        _main(script)(argv)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and said in captured.err, captured.err
    assert captured.out == "" and "Traceback" not in captured.err


@pytest.mark.parametrize(("content", "said"), [("", "holds no prompts"), ('{"x": 1}\n', ".jsonl:1: each line needs")])
def test_a_bad_prompts_file_is_refused_before_the_model_loads(content, said, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(content)
    with pytest.raises(SystemExit) as stopped:
        _main("cold_start.py")(["--prompts-file", str(prompts)])
    assert stopped.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("script", ["recipes/selector_budget/cold_start.py", "recipes/drafter_ttt/paired_speed.py"])
@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('{"prompt_ids": []}', ".jsonl:2: empty prompt"),
        ('{"prompt_ids": [91]}', ".jsonl:2: prompt token ids out of the vocabulary [0, 91)"),
        ('{"prompt_ids": [' + ",".join(["5"] * 1024) + "]}", ".jsonl:2: prompt has 1024 tokens"),
    ],
)
def test_a_prompt_the_policy_cannot_run_is_refused_before_the_model_loads(script, line, said, tmp_path, capsys):
    """Such a line ran as an error request with no tokens, and the script printed its table as if every request ran
    (paired_speed's equal-to-plain check passed on two empty outputs)."""
    import fastrl.commands.engine_setup as engine_setup

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1+1="}\n' + line + "\n")  # text on the bundled model: tokenized as is
    main = runpy.run_path(str(ROOT / script))["main"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_setup, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
        with pytest.raises(SystemExit) as stopped:
            main(["--prompts-file", str(prompts)])
    assert stopped.value.code == 2 and said in capsys.readouterr().err
