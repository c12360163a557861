"""Bounds and early checks of the decode commands (issue 27, cases 7, 8, 10): limits named with their key before any
work, a full disk is one line saying what is kept, a prompts line with an unknown key names the key and the line,
default seeds do not depend on blank lines, a model config that cannot be built names the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastrl.cli import main
from fastrl.commands.decode_config import MAX_REQUESTS


def _prompts(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _generate(model_dir, prompts, out, *extra) -> int:
    return main(["generate", f"model={model_dir}", f"prompts={prompts}", f"output={out}", "max_new_tokens=4",
                 "progress=false", *extra])  # fmt: skip


@pytest.mark.parametrize(
    "extra, lines, message",
    [
        (["n=100000000"], 1, f"generate.n (samples per prompt) must be in [1, {MAX_REQUESTS}], got 100000000"),
        ([f"n={MAX_REQUESTS // 2}"], 3, f"generate.n={MAX_REQUESTS // 2}: 3 prompts x n = "),
        (["max_new_tokens=100000000000"], 1, "generate.max_new_tokens must be <= 1048576"),
        ([], 0, "generate.prompts={p}: the file has no prompt lines"),
    ],
)
def test_limits_are_named_before_any_work(model_dir, tmp_path, capsys, extra, lines, message):
    prompts = _prompts(tmp_path / "in.jsonl", ['{"prompt_ids": [5, 6]}'] * lines + ([""] if not lines else []))
    out = tmp_path / "out.jsonl"
    assert _generate(model_dir, prompts, out, *extra) == 2
    err = capsys.readouterr().err
    assert message.format(p=prompts) in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_full_disk_is_one_line_saying_what_is_kept(model_dir, tmp_path, capsys):
    prompts = _prompts(tmp_path / "in.jsonl", ['{"prompt_ids": [5, 6]}', '{"prompt_ids": [7, 8]}'])
    assert _generate(model_dir, prompts, "/dev/full") == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "fastrl generate: error: no space left writing /dev/full; 0 of 2 results are kept; run the same command again"
    )


def test_a_full_disk_at_the_rewrite_in_prompt_order_keeps_the_stats_and_the_bandit_state(tmp_path, capsys, monkeypatch):
    """The rewrite of a finished output in prompt order needs a second copy of it: where the disk could not hold
    one, the run ended before it wrote its stats and bandit state, and a rerun failed the same way, never writing
    them. They are written first now, and the error says every result is in the output."""
    import errno

    from fastrl.assets_path import bundled_model_dir
    from fastrl.atomic_files import no_space
    from fastrl.commands.result_stream import ResultStream

    def full(self):  # what the rewrite's atomic write raises on a full disk
        self.close()
        raise no_space(OSError(errno.ENOSPC, "No space left on device"), f"{self.target.path}; it is left as it was")

    monkeypatch.setattr(ResultStream, "finish", full)
    prompts = _prompts(tmp_path / "in.jsonl", ['{"prompt_ids": [5, 6]}', '{"prompt_ids": [7, 8]}'])
    out, stats, state = tmp_path / "out.jsonl", tmp_path / "stats.json", tmp_path / "bandit.json"
    extra = [f"stats_output={stats}", f"bandit_state={state}", "strategy=bandit"]
    assert _generate(bundled_model_dir(), prompts, out, *extra) == 2
    err = capsys.readouterr().err
    assert f"no space left writing {out}; it is left as it was (every result is in it" in err
    assert len(out.read_text().splitlines()) == 2
    assert json.loads(stats.read_text())["round_log"] and json.loads(state.read_text())


def test_an_unknown_key_in_a_prompts_line_names_the_key_and_the_line(model_dir, tmp_path, capsys):
    prompts = _prompts(tmp_path / "in.jsonl", ['{"prompt_ids": [5, 6]}', '{"prompt_ids": [5, 6], "sed": 4}'])
    assert _generate(model_dir, prompts, tmp_path / "out.jsonl") == 2
    assert f"{prompts}:2: unknown key 'sed'" in capsys.readouterr().err


def test_default_seeds_do_not_depend_on_blank_lines(model_dir, tmp_path):
    lines = ['{"prompt_ids": [5, 6]}', '{"prompt_ids": [7, 8]}', '{"prompt_ids": [9, 10]}']
    plain = _prompts(tmp_path / "plain.jsonl", lines)
    gappy = _prompts(tmp_path / "gappy.jsonl", [lines[0], "", "   ", lines[1], "", lines[2]])
    outs = []
    for prompts in (plain, gappy):
        out = tmp_path / f"{prompts.stem}.out.jsonl"
        assert _generate(model_dir, prompts, out, "seed=7") == 0
        outs.append([json.loads(x) for x in out.read_text().splitlines()])
    assert [r["seed"] for r in outs[1]] == [r["seed"] for r in outs[0]] == [7, 8, 9]
    assert [r["token_ids"] for r in outs[1]] == [r["token_ids"] for r in outs[0]]


def test_a_model_config_that_cannot_be_built_names_the_file_and_the_key(model_dir, tmp_path, capsys):
    bad = tmp_path / "bad_model"
    bad.mkdir()
    for f in Path(model_dir).iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    config = json.loads((bad / "config.json").read_text())
    config["hidden_size"] += 1
    config["head_dim"] = 8
    (bad / "config.json").write_text(json.dumps(config))
    prompts = _prompts(tmp_path / "in.jsonl", ['{"prompt_ids": [5, 6]}'])
    assert _generate(bad, prompts, tmp_path / "out.jsonl") == 2
    err = capsys.readouterr().err
    assert (
        f"{bad / 'config.json'}: hidden_size ({config['hidden_size']}) is not a multiple of num_attention_heads" in err
    )
    assert "Traceback" not in err


def test_a_full_disk_deep_in_any_command_is_one_line(monkeypatch, capsys):
    """Where a command meets a full disk outside its guarded outputs (train-drafter's stream, a train checkpoint),
    the OSError is one line naming the file (it was a traceback); another OSError stays what it is."""
    import errno

    from fastrl import cli

    def full(overrides):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/d.stream/resume.tmp/optimizer.pt")

    monkeypatch.setattr(cli, "_train_drafter", full)
    assert cli.main(["train-drafter"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "fastrl train-drafter: error: no space left writing /runs/d.stream/resume.tmp/optimizer.pt: free some space "
        "and run the command again (finished work it saved is kept)"
    )

    def other(overrides):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(cli, "_train_drafter", other)
    with pytest.raises(OSError, match="Input/output error"):
        cli.main(["train-drafter"])


@pytest.mark.parametrize("key", ["output", "prompts"])
def test_a_file_name_longer_than_the_file_system_takes_is_one_line(tmp_path, capsys, monkeypatch, key):
    """ENAMETOOLONG from the path checks was a traceback in every command."""
    monkeypatch.chdir(tmp_path)
    prompts = _prompts(tmp_path / "in.jsonl", ['{"prompt_ids": [5, 6]}'])
    long = "a" * 256 + ".jsonl"
    paths = {"prompts": prompts, "output": tmp_path / "out.jsonl"} | {key: long}
    assert _generate("", paths["prompts"], paths["output"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"fastrl generate: error: {long}: a file name in it is too long for the file system"
